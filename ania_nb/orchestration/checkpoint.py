"""Runs blocked on an approval: their checkpoint, suspension at shutdown, and resumption.

A main run keeps a `RunCheckpoint` while it runs: the loop's `RoundProgress` (the round in
flight) plus who runs it. The gate hands it to the approval manager, which stores it with the
request before the front end is told (``store.approvals``). When the Agent starts suspending
(`ApprovalSuspension.begin`, at shutdown), every run blocked *only* on approvals — every call of
its round that has not ended waits for a person, and one of those questions is stored — is
cancelled at once and ends ``interrupted`` with `SUSPENDED`, without a tool result; a run
that becomes so blocked later (a sibling call finishes, a new question is asked) is suspended
then. After a restart the stored checkpoint becomes a `Resumption`: the conversation up to and
including the assistant message with the tool calls, the round's finished results, and the
verdict on the pending call as the gate's decision — the resumed run finishes that round and
the loop goes on (`RunSpec.resume`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine.loop import GateDecision, ResumedRound, RoundProgress, ToolCall, ToolCallResult
from ..engine.messages import Message, for_storage
from ..errors import UsageError
from ..governance.approval import SUSPENDED
from ..governance.gate import refusal

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.callbacks import Verdict
    from ..tools import Role
    from .spec import RunSpec

__all__ = ["SUSPENDED", "ApprovalSuspension", "Resumption", "RunCheckpoint", "resumed_input"]

Save = Callable[[dict[str, Any]], Awaitable[object]]
CHECKPOINT_VERSION = 1
ROLES: frozenset[str] = frozenset({"member", "trusted", "admin"})
RESUMED_INPUT = "[resumed run {run}: {tool} {outcome}] {text}"


class ApprovalSuspension:
    """The live checkpoints of an Agent's main runs, and whether it is suspending them."""

    def __init__(self) -> None:
        self.on = False
        self._runs: set[RunCheckpoint] = set()

    def track(self, checkpoint: RunCheckpoint) -> None:
        """A run with a checkpoint started."""
        self._runs.add(checkpoint)

    def untrack(self, checkpoint: RunCheckpoint) -> None:
        """That run ended."""
        self._runs.discard(checkpoint)

    def begin(self) -> list[asyncio.Task[Any]]:
        """Suspend from now on; returns the tasks of the runs suspended at once."""
        self.on = True
        return [c.task for c in list(self._runs) if c.try_suspend() and c.task is not None]


class RunCheckpoint:
    """One main run's checkpoint (the `governance.approval.Checkpoint` the gate passes on)."""

    def __init__(self, spec: RunSpec, suspension: ApprovalSuspension) -> None:
        self.spec = spec
        self.progress = RoundProgress(on_change=self._changed)
        self.run_id: int | None = None
        self.task: asyncio.Task[Any] | None = None  # the run's task, cancelled to suspend it
        self._suspension = suspension
        self._stored: dict[str, Save] = {}  # calls whose request is in the store → its saver
        self._saving: set[asyncio.Task[object]] = set()
        self._finished = 0  # finished calls of the round, to notice a newly ended one
        self._snapped: dict[str, int] = {}  # call → finished calls in its first snapshot
        self._suspended = False

    @property
    def suspended(self) -> bool:
        """Whether the run is being (or was) suspended."""
        return self._suspended

    def snapshot(self, call_id: str) -> dict[str, Any] | None:
        """The run's state with ``call_id`` pending (JSON data), None outside a tool round."""
        progress, spec = self.progress, self.spec
        if progress.assistant is None or self.run_id is None:
            return None
        if call_id not in {c.id for c in progress.calls}:
            return None
        self._snapped.setdefault(call_id, len(progress.finished))
        conversation = progress.messages
        if conversation and conversation[0].get("role") == "system":
            conversation = conversation[1:]  # the system prompt is rebuilt when it resumes
        return {
            "version": CHECKPOINT_VERSION,
            "run_id": self.run_id,
            "text": spec.text,
            "sender": spec.sender,
            "requester": spec.requester,
            "requesters": list(spec.requesters),
            "role": spec.role,
            "plan_mode": spec.plan_mode,
            "model": spec.model,
            "conversation": [for_storage(m) for m in conversation],
            "assistant": for_storage(progress.assistant),
            "calls": [dataclasses.asdict(c) for c in progress.calls],
            "finished": [dataclasses.asdict(r) for r in progress.finished.values()],
            "pending": call_id,
        }

    def stored(self, call_id: str, save: Save) -> None:
        """``call_id``'s request is in the store; ``save`` rewrites the state stored with it."""
        self._stored[call_id] = save
        if self._snapped.pop(call_id, None) != len(self.progress.finished):
            self._save(call_id)  # a sibling ended while the row was being written
        self._changed()

    def asking(self, call_id: str, on: bool) -> None:
        """``call_id`` starts or stops waiting for a person."""
        self.progress.asking(call_id, on)

    def try_suspend(self) -> bool:
        """Suspend the run if it is blocked only on approvals (one of them stored)."""
        task = self.task
        if self._suspended or task is None or task.done():
            return False
        progress = self.progress
        if not progress.blocked_on_approval or not self._stored.keys() & progress.waiting:
            return False
        self._suspended = True
        task.cancel()
        return True

    def _changed(self) -> None:
        if len(self.progress.finished) != self._finished:
            self._finished = len(self.progress.finished)
            self._save()
        if self._suspension.on:
            self.try_suspend()

    def _save(self, only: str | None = None) -> None:
        """A call of the round ended: store it with every request still waiting (in order).

        After a kill -9 the resumed run must not run it again. The writes start now, before
        anything a suspension would write next (the store runs statements in order).
        """
        if self.progress.assistant is None:
            self._stored.clear()  # a new round: the old questions are over
            return
        waiting = self._stored.keys() & self.progress.waiting
        for call_id in waiting if only is None else waiting & {only}:
            snapshot = self.snapshot(call_id)
            if snapshot is not None:
                task = asyncio.ensure_future(self._stored[call_id](snapshot))
                self._saving.add(task)
                task.add_done_callback(self._saving.discard)


@dataclass(frozen=True)
class Resumption:
    """A stored run to continue from its pending call (see the module docstring).

    ``decision`` is the gate's decision on the pending call: None lets it run (the verdict
    allowed it; PreToolUse hooks and the approval stage already ran), else its refusal.
    """

    request_id: str
    verdict: Verdict  # with its outcome: recorded on the row when the resumed run starts
    original_run: int | None
    text: str  # the original run's input
    sender: str | None
    requester: str | None
    requesters: tuple[str, ...]
    role: Role
    plan_mode: bool
    model: str | None
    conversation: list[Message]
    round: ResumedRound
    call_id: str
    tool: str
    outcome: str  # allowed, denied, timeout, …
    decision: GateDecision | None

    @classmethod
    def from_checkpoint(
        cls, request_id: str, data: dict[str, Any], verdict: Verdict, *, admin_only: bool
    ) -> Resumption:
        """Parse a stored checkpoint; `UsageError` names what is missing or malformed."""

        def broken(what: str) -> UsageError:
            return UsageError(f"approval row {request_id}: the stored run state {what}")

        if data.get("version") != CHECKPOINT_VERSION:
            raise broken(f"has version {data.get('version')!r}, not {CHECKPOINT_VERSION}")
        conversation, assistant = data.get("conversation"), data.get("assistant")
        if not isinstance(conversation, list) or not all(isinstance(m, dict) for m in conversation):
            raise broken("has no conversation")
        if not isinstance(assistant, dict) or not assistant.get("tool_calls"):
            raise broken("has no assistant message with tool calls")
        try:
            calls = [ToolCall(**c) for c in data.get("calls") or []]
            finished = {r.id: r for r in (ToolCallResult(**f) for f in data.get("finished") or [])}
        except TypeError as exc:
            raise broken(f"has a malformed tool call ({exc})") from None
        pending = data.get("pending")
        call = next((c for c in calls if c.id == pending), None)
        if call is None or pending in finished:
            raise broken(f"does not hold the pending call {pending!r}")
        role = data.get("role")
        requesters = data.get("requesters") or []
        run_id = data.get("run_id")
        return cls(
            request_id=request_id,
            verdict=verdict,
            original_run=run_id if isinstance(run_id, int) else None,
            text=str(data.get("text") or ""),
            sender=_text_or_none(data.get("sender")),
            requester=_text_or_none(data.get("requester")),
            requesters=tuple(r for r in requesters if isinstance(r, str)),
            role=role if role in ROLES else "member",  # type: ignore[arg-type]
            plan_mode=bool(data.get("plan_mode")),
            model=_text_or_none(data.get("model")),
            conversation=list(conversation),
            round=ResumedRound(assistant, calls, finished),
            call_id=call.id,
            tool=call.name,
            outcome=verdict.outcome or ("allowed" if verdict.allowed else "denied"),
            decision=None if verdict.allowed else refusal(verdict, admin_only=admin_only),
        )


def resumed_input(resumption: Resumption) -> str:
    """The resumed run's record input: links the original run, says what was decided."""
    return RESUMED_INPUT.format(
        run=resumption.original_run if resumption.original_run is not None else "?",
        tool=resumption.tool,
        outcome=resumption.outcome,
        text=resumption.text,
    )


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
