"""One-shot runs: clock runs, subagents and team members, described by a `OneShotJob`.

A one-shot run has no history of its own (unless a caller continues one in ``conversation``),
uses the target session's tools minus what its kind may not use and what its role may not use
(the role of whoever started it: the clock task's creator, the parent run), lets only admins
approve tool calls (nobody stands behind it), reaches the front end only for images, files and
approvals, and reports to whoever started it. The Agent's host turns a job into a `RunSpec`
(`AgentHost.run_one_shot`); the clock and the agents packages build the jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..engine.callbacks import NO_CALLBACKS, Callbacks, RunEvent
from ..engine.usage import Usage
from .records import StoreRecord
from .run import RunServices
from .spec import RunSpec, callbacks_for
from .tool_view import front_end_view

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..engine.llm import LLMClient
    from ..store import Store
    from ..tools import Role, SessionToolExecutor, Tool
    from .records import RunRecorder
    from .spec import Conversation

SUBAGENT_TOOLS = ("subagent_run", "subagent_list", "subagent_cancel")
TEAM_TOOLS = ("team_run", "team_create", "team_list", "team_delete")
TODO_TOOLS = ("todo_write",)

OneShotKind = Literal["clock", "subagent", "team_member"]

# What each kind may not use: children never start children (no recursion) and have no todo
# list; teams are for main sessions; clock runs get the clock variant of the subagent tools
# through ``extra_tools``.
HIDDEN_BY_KIND: dict[str, frozenset[str]] = {
    "subagent": frozenset((*SUBAGENT_TOOLS, *TEAM_TOOLS, *TODO_TOOLS)),
    "team_member": frozenset((*SUBAGENT_TOOLS, *TEAM_TOOLS, *TODO_TOOLS)),
    "clock": frozenset((*SUBAGENT_TOOLS, *TEAM_TOOLS, *TODO_TOOLS)),
}


@dataclass
class OneShotJob:
    """What a clock run, a subagent or a team member is asked to do, and within what limits.

    ``system_prompt`` is complete (the caller composes role or base prompt and scene);
    ``timeout`` is already clamped and shrunk by the caller. ``callbacks`` are the front end's:
    images, files and approvals pass, intermediate text and live events are dropped — except
    that ``on_event`` receives the run's events (for nested transcripts). ``usage`` is the tally
    the run adds its tokens to. ``record`` defaults to a run-log record of ``session`` without
    history. ``extra_tools`` exist for this run only and win over the session's tools of the
    same name; ``hidden`` adds to the kind's hidden tools (`HIDDEN_BY_KIND`). ``role`` is the
    role of whoever the run acts for — the clock task's creator, the parent run's role — and
    decides which tools it may use; a builder that forgets it gets the least (``member``).
    """

    kind: OneShotKind
    session: str
    text: str
    system_prompt: str
    timeout: float
    callbacks: Callbacks = NO_CALLBACKS
    on_event: Callable[[RunEvent], Any] | None = None
    usage: Usage = field(default_factory=Usage)
    record: RunRecorder | None = None
    max_iterations: int | None = None
    conversation: Conversation | None = None
    extra_tools: Sequence[Tool] = ()
    hidden: frozenset[str] = frozenset()
    sender: str | None = None  # who the record names as the sender (e.g. ``clock:<task id>``)
    role: Role = "member"

    def hidden_tools(self) -> frozenset[str]:
        """Every tool name this run may not see."""
        return HIDDEN_BY_KIND[self.kind] | self.hidden


def one_shot_spec(
    job: OneShotJob,
    executor: SessionToolExecutor,
    store: Store,
    allowed: Callable[[str], bool] | None = None,
) -> RunSpec:
    """The `RunSpec` of ``job`` over ``executor`` (a fresh table of the target's tools).

    ``job.extra_tools`` are added to that table; the kind's hidden tools are hidden unless an
    extra tool of the same name replaces them; ``allowed`` is the role's filter by tool name.
    """
    for extra in job.extra_tools:
        executor.add(extra, replace=True)
    hidden = job.hidden_tools() - {t.name for t in job.extra_tools}
    callbacks = callbacks_for(job.kind, job.callbacks)
    if job.on_event is not None:
        callbacks = dataclasses.replace(callbacks, on_event=job.on_event)
    return RunSpec(
        kind=job.kind,
        session=job.session,
        text=job.text,
        system_prompt=job.system_prompt,
        tools=front_end_view(executor, callbacks, hidden, allowed),
        record=job.record or StoreRecord(store, job.session, history=False),
        conversation=job.conversation,
        sender=job.sender,
        admin_only_approval=True,  # nobody stands behind the run: only an admin may approve
        role=job.role,
        callbacks=callbacks,
        timeout=job.timeout,
        usage=job.usage,
    )


def one_shot_services(
    job: OneShotJob, services: RunServices, config: Config, llm: LLMClient | None
) -> RunServices:
    """The Agent's run services with the one-shot model (if it has its own) and round limit.

    The limit is the job's, else ``subagent.max_iterations`` / ``team.max_iterations`` for
    children and ``agent.max_iterations`` for clock runs.
    """
    rounds = job.max_iterations
    if rounds is None and job.kind == "subagent":
        rounds = config.subagent.max_iterations
    elif rounds is None and job.kind == "team_member":
        rounds = config.team.max_iterations
    elif rounds is None:
        rounds = config.agent.max_iterations
    limits = dataclasses.replace(services.limits, max_iterations=rounds)
    return dataclasses.replace(services, llm=llm or services.llm, limits=limits)
