"""`AgentHost`: what the clock, subagents and teams may ask of their Agent, and nothing more.

They sit in the orchestration layer and never import the façade. The `Agent` builds one host
from its parts (``agent.host``) and hands it to `Clock` and `Agents`: they can open the store,
run one-shot jobs through the one run path, queue synthetic messages, count background tokens,
hear stops, check quotas and ask for roles — but they never hold the Agent itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..engine.callbacks import NO_CALLBACKS, Callbacks
from .oneshot import OneShotJob, one_shot_services, one_shot_spec
from .run import execute_run
from .sessions import Pending

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..engine.usage import Usage
    from ..governance import Governance
    from ..result import RunResult
    from ..store import Store
    from ..tools import Role, SessionToolExecutor
    from .inbox import Inbound
    from .main_turn import Admission
    from .outbox import Outbox
    from .queues import SessionQueues
    from .run import RunServices
    from .runtime import Runtime
    from .sessions import SessionTable

log = logging.getLogger("ania_nb.agent")

Opener = Callable[[], Awaitable["tuple[Runtime, RunServices]"]]
QueueStored = Callable[[int, "Inbound"], Awaitable[bool]]


class AgentHost:
    """The Agent as the clock, subagents and teams see it (``agent.host``).

    Every argument is one of the Agent's parts or a callable reading its current state (the
    config and governance are replaced when saved settings change): ``open`` opens the Agent
    and returns its runtime and run services; ``tools(session)`` builds a fresh table of a
    session's tools; ``system_prompt()`` is the prompt every session's runs get; ``admit``
    says why new work is refused today (a quota), or None; ``queue_stored`` queues a message
    already in the durable inbox (see `queue_stored`).
    """

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        governance: Callable[[], Governance],
        open: Opener,
        tools: Callable[[str], SessionToolExecutor],
        system_prompt: Callable[[], str],
        sessions: SessionTable,
        queues: SessionQueues,
        outbox: Outbox,
        admit: Admission | None = None,
        queue_stored: QueueStored | None = None,
    ) -> None:
        """Serve the Agent whose parts these are; nothing opens until a method needs it."""
        self._config = config
        self._governance = governance
        self._open = open
        self._tools = tools
        self._system_prompt = system_prompt
        self._sessions = sessions
        self._queues = queues
        self._admit = admit
        self._queue_stored = queue_stored
        self.outbox = outbox  # where the final results of background work go
        self._stop_listeners: list[Callable[[str], object]] = []
        self._closed = False

    @property
    def config(self) -> Config:
        """The effective settings (with values saved by config_set once open)."""
        return self._config()

    async def open_store(self) -> Store:
        """The embedded store, opening the Agent first if needed."""
        runtime, _ = await self._open()
        return runtime.store

    def system_prompt_for(self, session: str) -> str:
        """The system prompt of a session's runs (base prompt + skills registry + scene)."""
        return self._system_prompt()

    def is_admin(self, who: str | None) -> bool:
        """Whether ``who`` is an admin (None is the trusted local user of a notebook)."""
        return self._governance().is_admin(who)

    def role_of(self, session: str, who: str | None) -> Role:
        """The role of sender ``who`` in ``session`` (None: the local user, an admin)."""
        return self._governance().roles.role_of(session, who)

    async def quota_denial(self, session: str) -> str | None:
        """Why new work for ``session`` is refused today (a daily token quota), or None."""
        return await self._admit(session) if self._admit is not None else None

    async def run_one_shot(self, job: OneShotJob) -> RunResult:
        """Run a clock run, subagent or team member (see `OneShotJob`) and return its outcome.

        The run uses a fresh table of the target session's tools (those ``job.role`` may use),
        the subagent model if one is configured, and only admins may approve its tool calls. A
        failure is in the result's status; cancelling the caller cancels the run.
        """
        runtime, services = await self._open()
        allowed = self._governance().roles.tool_filter(job.role)
        spec = one_shot_spec(job, self._tools(job.session), runtime.store, allowed)
        one_shot = one_shot_services(job, services, self.config, runtime.one_shot_llm)
        return await execute_run(spec, one_shot)

    def inject(
        self,
        session: str,
        text: str,
        *,
        sender: str = "subagent",
        callbacks: Callbacks | None = None,
        role: Role = "member",
    ) -> bool:
        """Queue a synthetic message (a background subagent's result) for ``session``.

        It is answered at once if the session is idle, else after the current reply, like any
        queued message; nobody awaits it, so the reply is published on `outbox`. ``role`` is
        the role of whoever started the work (the reply's run gets it). Returns False (and drops
        the message) when the session's queue is full or the Agent is closing.
        """
        if self._closed:
            return False
        future = asyncio.get_running_loop().create_future()
        pending = Pending(
            text, sender, (), callbacks or NO_CALLBACKS, future, synthetic=True, role=role
        )
        if self._queues.offer(self._sessions.open(session), pending):
            return True
        log.warning("queue of %s is full: a %s message was dropped", session, sender)
        return False

    async def queue_stored(self, inbox_id: int, inbound: Inbound) -> bool:
        """Queue a message the work itself stored in the durable inbox (a background result).

        Answered like a platform's message (batched, the run's steps settle the row and write
        the reply to the outbox), never dropped for a full queue. False when the Agent stopped
        queueing (closing, or a front end shutting down): the row waits for the next start.
        """
        if self._closed or self._queue_stored is None:
            return False
        return await self._queue_stored(inbox_id, inbound)

    def add_derived_usage(self, session: str, usage: Usage) -> None:
        """Show tokens of background work in ``session``'s next run record.

        They were counted toward quotas by the work's own run records; the next main run's
        usage includes them so the user sees what the conversation cost.
        """
        self._sessions.open(session).derived.include(usage)

    def on_stop(self, listener: Callable[[str], object]) -> None:
        """Call ``listener(session)`` on every stop (a truthy return: it stopped something)."""
        self._stop_listeners.append(listener)

    def stop(self, session: str) -> bool:
        """Tell every stop listener that ``session`` is stopped; True if one stopped something."""
        stopped = False
        for listener in list(self._stop_listeners):
            try:
                stopped = bool(listener(session)) or stopped
            except Exception:
                log.exception("a stop listener failed for %s", session)
        return stopped

    def close(self) -> None:
        """The Agent is closing: synthetic messages are refused from now on."""
        self._closed = True
