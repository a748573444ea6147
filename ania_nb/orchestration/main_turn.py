"""Main chat turns: a batch of a session's waiting messages becomes one `RunSpec`.

Governance prepares the prompt first (SessionStart, UserPromptSubmit, plan note, todo reminder);
a turn refused before it starts (a used-up quota, a UserPromptSubmit block) is only recorded —
the one path that does not enter `execute_run` — and the history is left as it was. The
run's role is the highest among its messages' (a sender's role in the chat, or the role an
injected message carries), and its tool view offers only what that role may use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import RunEvent
from ..governance.roles import highest
from ..result import RunResult, RunStatus
from ..store import OutboxRow
from .checkpoint import resumed_input
from .outbox import Delivery, Outbox, delivery_payload
from .queues import resolve
from .records import ResumedRecord, StoreRecord
from .run import RunServices, execute_run
from .sessions import Pending, Session, merge_batch, senders_of
from .spec import RunSpec
from .tool_view import front_end_view

if TYPE_CHECKING:  # pragma: no cover
    from ..governance import Governance
    from ..governance.roles import Roles
    from ..store import Store
    from ..tools import Role


@dataclass(frozen=True)
class TurnContext:
    """Context added to one turn's prompt (never stored): the block and what front ends show."""

    block: str
    event: dict[str, Any] = field(default_factory=dict)  # data of a "knowledge" RunEvent


ContextSource = Callable[[str, str], Awaitable["TurnContext | None"]]
Admission = Callable[[str], Awaitable["str | None"]]  # why a session may not run now, or None


async def answer_batch(
    state: Session,
    batch: list[Pending],
    *,
    governance: Governance,
    services: RunServices,
    store: Store,
    system_prompt: str,
    run_timeout: float,
    context: ContextSource | None = None,
    admit: Admission | None = None,
    shutting_down: Callable[[], bool] = lambda: False,
    outbox: Outbox | None = None,
) -> RunResult:
    """Answer every message of ``batch`` with one main run.

    ``admit(session)`` may refuse the run (a used-up quota): the batch and every message still
    queued get a ``denied`` result and nothing runs. ``context(session, text)`` may add a block
    to this turn's prompt (the knowledge base's auto-inject); the stored history keeps only the
    user's text. Messages from the durable inbox are marked by the run's steps and their reply
    is an outbox row of the finish step (`StoreRecord`), handed to ``outbox`` once written
    (claimed already when its chat's deliverer is idle: `Outbox.reserve`);
    ``shutting_down()`` notes on a reply whether the service was closing (a reply stopped by
    a shutdown says so).
    """
    text, images = merge_batch(batch)
    denied = await admit(state.name) if admit is not None else None
    if denied is not None:
        return await _denied(store, state, text, batch, denied)
    callbacks = batch[-1].callbacks
    plan = any(p.plan for p in batch)  # one message asking for plan mode restricts the batch
    extra = await context(state.name, text) if context is not None else None
    block = extra.block if extra is not None else ""
    prepared = await governance.before_turn(state.name, text, plan=plan, context=block)
    if prepared.blocked is not None:
        return await _refused(store, state.name, text, batch, prepared.blocked)
    roles = governance.roles
    role = batch_role(roles, state.name, batch)
    spec = RunSpec(
        kind="main",
        session=state.name,
        text=text,
        prompt=prepared.prompt,
        injected=extra.event if extra is not None and block else None,
        images=images,
        system_prompt=system_prompt,
        # what this front end can serve and this role may use
        tools=front_end_view(state.executor, callbacks, allowed=roles.tool_filter(role)),
        record=durable_record(store, state.name, batch, shutting_down, outbox),
        conversation=state.conversation,
        sender=senders_of(batch),
        requester=batch[-1].sender,
        requesters=tuple(dict.fromkeys(p.sender for p in batch if p.sender)),
        role=role,
        callbacks=callbacks,
        timeout=run_timeout,
        model=batch[-1].model,
        plan_mode=plan,
        usage=state.take_derived(),  # tokens of background work since the last run count here
    )
    return await execute_run(spec, services)


def reply_row(
    session: str, batch: list[Pending], outcome: RunResult, *, shutdown: bool = False
) -> OutboxRow:
    """The outbox row of a batch's reply: a neutral delivery the front end renders at send time.

    ``meta`` holds the run id, the batch's senders (whom a group reply mentions), the error,
    the inbox rows answered and whether the service was shutting down.
    """
    delivery = Delivery(
        session,
        outcome.text,
        "chat",
        title="reply",
        status=outcome.status,
        meta={
            "run_id": outcome.run_id,
            "senders": list(dict.fromkeys(p.sender for p in batch if p.sender)),
            "error": outcome.error,
            "inbox": [p.inbox_id for p in batch if p.inbox_id is not None],
            "shutdown": shutdown,
        },
    )
    return OutboxRow(session, "reply", delivery_payload(delivery), run_id=outcome.run_id)


def durable_record(
    store: Store,
    session: str,
    batch: list[Pending],
    shutting_down: Callable[[], bool],
    outbox: Outbox | None = None,
) -> StoreRecord:
    """The record sink of a main turn: with the inbox rows and reply row of durable messages.

    The reply row is written claimed when ``outbox`` may send it right after the commit.
    """
    inbox = tuple(p.inbox_id for p in batch if p.inbox_id is not None)
    if not inbox:
        return StoreRecord(store, session)

    def reply(outcome: RunResult) -> OutboxRow:
        row = reply_row(session, batch, outcome, shutdown=shutting_down())
        if outbox is not None and outbox.reserve(session):  # last: it must be handed off
            row = dataclasses.replace(row, claimed=True)
        return row

    def finished() -> None:
        for pending in batch:
            pending.settled = True

    written = outbox.handoff if outbox is not None else None
    return StoreRecord(store, session, inbox=inbox, reply=reply, finished=finished, written=written)


async def answer_resumed(
    state: Session,
    pending: Pending,
    *,
    governance: Governance,
    services: RunServices,
    store: Store,
    system_prompt: str,
    run_timeout: float,
) -> RunResult:
    """Continue a stored run from its pending call (``pending.resume``) as a new main run.

    No quota check and no prompt preparation: the run was admitted and prepared when it
    started; its role, requesters and plan mode are the stored ones. Its record is new; its
    input links the original run (`resumed_input`).
    """
    resume = pending.resume
    assert resume is not None
    callbacks = pending.callbacks
    allowed = governance.roles.tool_filter(resume.role)
    spec = RunSpec(
        kind="main",
        session=state.name,
        text=resumed_input(resume),
        system_prompt=system_prompt,
        tools=front_end_view(state.executor, callbacks, allowed=allowed),
        record=ResumedRecord(store, state.name),
        conversation=state.conversation,
        sender=resume.sender,
        requester=resume.requester,
        requesters=resume.requesters,
        role=resume.role,
        callbacks=callbacks,
        timeout=run_timeout,
        model=resume.model,
        plan_mode=resume.plan_mode,
        usage=state.take_derived(),
        resume=resume,
    )
    return await execute_run(spec, services)


def batch_role(roles: Roles, session: str, batch: list[Pending]) -> Role:
    """The highest role among the batch's messages (an injected one carries its own)."""
    return highest(roles.role_of(session, p.sender) if p.role is None else p.role for p in batch)


async def _denied(
    store: Store, state: Session, text: str, batch: list[Pending], reason: str
) -> RunResult:
    """A quota refused the turn: record it, drop the queue (its callers get the same answer)."""
    result = await _record_only(store, state.name, text, batch, "denied", reason)
    dropped, state.queue = state.queue, []
    for pending in dropped:
        resolve(pending, result)
    batch.extend(dropped)  # answered by this refusal too (the queue settles the whole batch)
    return result


async def _refused(
    store: Store, session: str, text: str, batch: list[Pending], reason: str
) -> RunResult:
    """A UserPromptSubmit hook blocked the turn: record it; the history is left as it was."""
    error = f"blocked by a UserPromptSubmit hook: {reason}"
    return await _record_only(store, session, text, batch, "error", error)


async def _record_only(
    store: Store, session: str, text: str, batch: list[Pending], status: RunStatus, error: str
) -> RunResult:
    """The one record-only path [design §1]: a turn refused before it starts.

    Nothing runs, so it does not enter `execute_run`: the run record is opened and closed with
    the refusal, and the front end sees what every run shows it — ``run_start`` (with the
    record's id), then ``run_end`` with the status and the reason.
    """
    run_id = await store.runs.start(session, text, senders_of(batch))
    await store.runs.finish(run_id, status, error=error)
    callbacks = batch[-1].callbacks
    await callbacks.emit(RunEvent("run_start", session, {"run_id": run_id, "text": text}))
    await callbacks.emit(RunEvent("run_end", session, {"status": status, "error": error}))
    return RunResult("", status, session, run_id=run_id, error=error)
