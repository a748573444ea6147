"""Where a run writes what happened: the session's history and/or a run record.

`StoreRecord` writes through the store's run journal, one transaction per step (begin, each
finished tool round, finish). With ``history=True`` (main turns) the user's message, every round
and the final answer go to the chat history with the run record; with ``history=False``
(one-shot runs) only the run record and its tool calls are kept. The clock's task log is
another `RunRecorder` (``clock/runner.py``).

Each step that stores a model call's result also counts the call's tokens: the run path hands
``round`` and ``finish`` the calls not counted yet (``Usage.uncounted``) and marks them counted
once the step returned, so a crash loses at most the call in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..store import Effect, InboxState, OutboxRow, ToolCallRecord

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.loop import ToolCallResult
    from ..engine.messages import Message
    from ..engine.usage import Tokens
    from ..result import RunResult
    from ..store import Store

    Calls = Sequence[tuple[str, Tokens]]  # (model, tokens) of answered calls, in order


class RunRecorder(Protocol):
    """The record sink of a run."""

    async def begin(
        self, text: str, sender: str | None, turn: Message, *, load_history: bool
    ) -> tuple[int | None, list[Message] | None]:
        """Start the record (and store the user's turn).

        Returns the record id and, when ``load_history``, the history before the turn.
        """
        ...

    async def round(
        self,
        run_id: int | None,
        messages: Sequence[Message],
        calls: Sequence[ToolCallResult],
        tokens: Calls = (),
    ) -> None:
        """Store one finished tool round and count ``tokens`` (its model calls) with it."""
        ...

    async def finish(
        self,
        run_id: int | None,
        outcome: RunResult,
        messages: Sequence[Message],
        tokens: Calls = (),
    ) -> None:
        """Store the final messages, count ``tokens`` and close the record with the outcome."""
        ...

    async def replace_history(self, messages: Sequence[Message]) -> None:
        """Replace the stored history (after compaction or a repair)."""
        ...


def call_records(calls: Sequence[ToolCallResult]) -> list[ToolCallRecord]:
    """The run-log rows of a round's calls."""
    return [
        ToolCallRecord(c.name, c.arguments, c.result, c.error, c.duration_ms, c.outcome)
        for c in calls
    ]


class StoreRecord:
    """A run's record in the store's run log, with or without the session's chat history.

    A run answering durable inbox rows (``inbox``) marks them ``running`` in its begin step and
    ``answered`` in its finish step, with its reply's outbox row (``reply(outcome)``) in the
    same transaction: a crash leaves the rows either waiting, running or answered, never lost.
    """

    def __init__(
        self,
        store: Store,
        session: str,
        *,
        history: bool = True,
        inbox: tuple[int, ...] = (),
        reply: Callable[[RunResult], OutboxRow] | None = None,
        finished: Callable[[], None] | None = None,
        written: Callable[[OutboxRow, int | None], None] | None = None,
    ) -> None:
        self.store = store
        self.session = session
        self.history = history
        self.inbox = inbox
        self.reply = reply
        self.finished = finished  # told once the finish step (and its effects) committed
        self.written = written  # told the reply row's id once the finish step is over

    async def begin(
        self, text: str, sender: str | None, turn: Message, *, load_history: bool
    ) -> tuple[int | None, list[Message] | None]:
        """Start the record (storing the user's turn in the history, if kept)."""
        journal = self.store.journal
        if not self.history:
            return await journal.start(self.session, text, sender=sender), None
        effects = [InboxState(self.inbox, "running")] if self.inbox else []
        return await journal.begin(
            self.session,
            text,
            sender=sender,
            message=turn,
            load_history=load_history,
            effects=effects,
        )

    async def round(
        self,
        run_id: int | None,
        messages: Sequence[Message],
        calls: Sequence[ToolCallResult],
        tokens: Calls = (),
    ) -> None:
        """Store the round's call records (and its messages, if history is kept)."""
        assert run_id is not None
        kept = messages if self.history else ()
        await self.store.journal.record_round(
            self.session, run_id, kept, call_records(calls), counted=tokens
        )

    async def finish(
        self,
        run_id: int | None,
        outcome: RunResult,
        messages: Sequence[Message],
        tokens: Calls = (),
    ) -> None:
        """Close the record (storing the final answer in the history, if kept)."""
        assert run_id is not None
        effects: list[Effect] = []
        if self.inbox:
            effects.append(InboxState(self.inbox, "answered"))
        usage = outcome.usage.to_dict()
        reply = self.reply(outcome) if self.reply is not None else None
        if reply is not None:
            effects.append(reply)
        finishing = self.store.journal.finish(
            self.session,
            run_id,
            outcome.status,
            messages=messages if self.history else (),
            usage=usage,
            reply=outcome.text or None,
            error=outcome.error,
            counted=tokens,  # the run's own calls; included work has its records
            effects=effects,
        )
        written = self.written
        if reply is None or written is None:  # nothing to hand over: the plain path
            await finishing
            if self.finished is not None:
                self.finished()
            return

        handed = reply  # for the callback: bound, not None

        def over(done: asyncio.Future[list[int]]) -> None:
            written(handed, _first_id(done))  # retrieves a failure even if nobody awaits it

        # Told when the transaction is over, even if this run is cancelled meanwhile: a
        # claimed reply is sent right after its commit, before the after-run hooks.
        task = asyncio.ensure_future(finishing)
        task.add_done_callback(over)
        await asyncio.shield(task)
        if self.finished is not None:
            self.finished()

    async def replace_history(self, messages: Sequence[Message]) -> None:
        """Replace the session's stored history (nothing is kept without history)."""
        if self.history:
            await self.store.history.replace(self.session, list(messages))


class ResumedRecord(StoreRecord):
    """A resumed run's record: a new run record, no new user turn; rounds go to the history.

    The run continues a turn that is already stored (its rounds up to the pending one).
    """

    async def begin(
        self, text: str, sender: str | None, turn: Message, *, load_history: bool
    ) -> tuple[int | None, list[Message] | None]:
        """Start the record only (the turn it continues is in the history already)."""
        return await self.store.journal.start(self.session, text, sender=sender), None


def _first_id(done: asyncio.Future[list[int]]) -> int | None:
    """The first outbox row id a finished step wrote (None: it failed or wrote none)."""
    if done.cancelled() or done.exception() is not None:
        return None
    ids = done.result()
    return ids[0] if ids else None
