"""The Agent's side of `AgentHost`: what the clock, subagents and teams call back into.

A mixin of `Agent` (kept apart so the façade module stays about one thing): it opens the store,
runs one-shot jobs through the one run path, queues synthetic messages, counts background
tokens and relays stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .engine.callbacks import NO_CALLBACKS, Callbacks
from .engine.usage import Usage
from .orchestration import OneShotJob, Pending, Session, execute_run
from .orchestration.oneshot import one_shot_services, one_shot_spec
from .orchestration.outbox import reply_delivery
from .result import RunResult
from .store import Store

if TYPE_CHECKING:  # pragma: no cover
    from .clock import Clock
    from .config import Config
    from .governance import Governance
    from .orchestration import Outbox, RunServices, Runtime, SessionQueues
    from .quota import Quota
    from .tools import Role, SessionToolExecutor

log = logging.getLogger("ania_nb.agent")


class AgentHostMethods:
    """`AgentHost` for `Agent`: one-shot runs, synthetic messages, derived usage, stops."""

    if TYPE_CHECKING:  # provided by Agent
        config: Config
        outbox: Outbox
        governance: Governance
        _closed: bool
        _queues: SessionQueues
        quota: Quota
        clock: Clock
        _services: RunServices | None
        _stop_listeners: list[Callable[[str], object]]

        async def _ensure_open(self) -> Runtime: ...
        def _session_executor(self, name: str) -> SessionToolExecutor: ...
        def session(self, name: str) -> Session: ...
        @property
        def system_prompt(self) -> str: ...

    async def open_store(self) -> Store:
        """The embedded store, opening the Agent first if needed."""
        return (await self._ensure_open()).store

    def is_admin(self, who: str | None) -> bool:
        """Whether ``who`` is an admin (None is the trusted local user of a notebook)."""
        return self.governance.is_admin(who)

    def role_of(self, session: str, who: str | None) -> Role:
        """The role of sender ``who`` in ``session`` (None: the local user, an admin)."""
        return self.governance.roles.role_of(session, who)

    def system_prompt_for(self, session: str) -> str:
        """The system prompt of a session's runs (the same for every session today)."""
        return self.system_prompt

    async def run_one_shot(self, job: OneShotJob) -> RunResult:
        """Run a clock run, subagent or team member (see `OneShotJob`) and return its outcome.

        The run uses a fresh table of the target session's tools (those ``job.role`` may use),
        the subagent model if one is configured, and only admins may approve its tool calls. A
        failure is in the result's status; cancelling the caller cancels the run.
        """
        rt = await self._ensure_open()
        assert self._services is not None
        allowed = self.governance.roles.tool_filter(job.role)
        spec = one_shot_spec(job, self._session_executor(job.session), rt.store, allowed)
        services = one_shot_services(job, self._services, self.config, rt.one_shot_llm)
        return await execute_run(spec, services)

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
        the message) when the session's queue is full.
        """
        if self._closed:
            return False
        future = asyncio.get_running_loop().create_future()
        pending = Pending(
            text, sender, (), callbacks or NO_CALLBACKS, future, synthetic=True, role=role
        )
        if self._queues.offer(self.session(session), pending):
            return True
        log.warning("queue of %s is full: a %s message was dropped", session, sender)
        return False

    def _publish_reply(self, state: Session, batch: list[Pending], result: RunResult) -> None:
        """Publish the reply to injected messages (nobody awaits it) on the outbox."""
        self.outbox.publish_soon(reply_delivery(state.name, batch[0].sender or "synthetic", result))

    def add_derived_usage(self, session: str, usage: Usage) -> None:
        """Show tokens of background work in ``session``'s next run record.

        They were counted toward quotas by the work's own run records; the next main run's
        usage includes them so the user sees what the conversation cost.
        """
        self.session(session).derived.include(usage)

    async def _clock_command(self, session: str, args: str, sender: str | None) -> str:
        """``/clock …`` (registered as a slash command)."""
        return await self.clock.command(session, args, sender)

    async def _quota_command(self, session: str, args: str, sender: str | None) -> str:
        """``/quota …`` (registered as a slash command)."""
        from .quota.command import quota_command

        return await quota_command(self.quota, self.is_admin, session, args, sender)

    async def quota_denial(self, session: str) -> str | None:
        """Why new work for ``session`` is refused today (a daily token quota), or None."""
        denial = await self.quota.check(session)
        return denial.message if denial is not None else None

    def on_stop(self, listener: Callable[[str], object]) -> None:
        """Call ``listener(session)`` on every `stop` (a truthy return: it stopped something)."""
        self._stop_listeners.append(listener)
