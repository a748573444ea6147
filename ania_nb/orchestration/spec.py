"""`RunSpec`: the small, explicit description of one agent run.

A main chat turn, a clock run, a subagent and a team member differ only in these fields; one
run path (`execute_run`) executes any of them. Building a spec is the orchestration layer's job
(`Agent` for main turns; the clock and the agents packages for the others).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..engine.callbacks import Callbacks
from ..engine.usage import Usage

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.messages import Message
    from ..tools import Role, SessionToolExecutor
    from .checkpoint import Resumption
    from .records import RunRecorder
    from .tool_view import ToolView

AgentKind = Literal["main", "clock", "subagent", "team_member"]
ONE_SHOT_KINDS: frozenset[str] = frozenset({"clock", "subagent", "team_member"})


@dataclass
class Conversation:
    """A session's stored conversation as a run sees it: the cached history and its size."""

    history: list[Message] | None = None  # None until loaded from the store
    last_prompt_tokens: int = 0
    pending_tokens: int = 0  # estimated tokens appended since the last model call


@dataclass
class RunSpec:
    """Everything that makes one run differ from another.

    ``conversation`` is the session's history for main turns and None for one-shot runs (they
    start from the prompt alone). ``requester`` may answer approvals unless
    ``admin_only_approval`` (no person stands behind the run); ``role`` decides which tools the
    run may use (the highest of its requesters', or its creator's); ``callbacks`` are what
    reaches the front end (see `callbacks_for`); ``usage`` is the tally the run adds to (pass a
    shared one to account derived work); ``record`` writes the run's history and/or record.
    ``resume`` makes it a resumed run: no new user turn, the stored conversation, the stored
    round finished first (`orchestration.checkpoint`).
    """

    kind: AgentKind
    session: str
    text: str  # what the user (or the task) said: recorded and stored
    system_prompt: str
    tools: ToolView | SessionToolExecutor | None
    record: RunRecorder
    prompt: str | None = None  # what the model gets for this turn (text + injected context)
    images: Sequence[str] = ()
    conversation: Conversation | None = None
    sender: str | None = None  # for the record: every sender of a batch, comma-separated
    requester: str | None = None  # who may answer approvals besides admins
    requesters: tuple[str, ...] = ()  # a batch's senders: any of them may answer
    admin_only_approval: bool = False
    role: Role = "member"  # builders say whose run it is; a forgotten one may do least
    callbacks: Callbacks = field(default_factory=Callbacks)
    timeout: float = 600.0
    model: str | None = None  # a per-run model override
    plan_mode: bool = False  # plan mode for this run only (on top of the session's)
    usage: Usage = field(default_factory=Usage)
    deadline: float = 0.0  # time.monotonic() by which the run must end; 0 = now + timeout
    injected: dict[str, Any] | None = None  # auto-injected context, shown as a "knowledge" event
    resume: Resumption | None = None  # continue a stored run from its pending call instead

    def __post_init__(self) -> None:
        if not self.deadline:
            self.deadline = time.monotonic() + self.timeout

    @property
    def seconds_left(self) -> float:
        """Seconds until the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())


def callbacks_for(kind: AgentKind, callbacks: Callbacks) -> Callbacks:
    """What of the front end a run of ``kind`` may reach.

    Main runs reach all of it; one-shot runs only images, files and approvals (their final
    reply is delivered by whoever started them).
    """
    return callbacks if kind == "main" else callbacks.background()
