"""Where a run writes what happened: the session's history and/or a run record.

`SessionRecord` (main turns) stores the user's message, every finished tool round and the final
answer in the chat history together with the run record, one transaction per step (the store's
run journal). `RecordOnly` (one-shot runs) keeps no history: only the run record with its tool
calls. The clock's task log is a third implementation of the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..store import ToolCallRecord

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.loop import ToolCallResult
    from ..engine.messages import Message
    from ..store import Store


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
        self, run_id: int | None, messages: Sequence[Message], calls: Sequence[ToolCallResult]
    ) -> None:
        """Store one finished tool round."""
        ...

    async def finish(
        self,
        run_id: int | None,
        status: str,
        *,
        messages: Sequence[Message] = (),
        usage: Mapping[str, int] | None = None,
        reply: str | None = None,
        error: str | None = None,
    ) -> None:
        """Store the final messages and close the record."""
        ...

    async def replace_history(self, messages: Sequence[Message]) -> None:
        """Replace the stored history (after compaction)."""
        ...


def call_records(calls: Sequence[ToolCallResult]) -> list[ToolCallRecord]:
    """The run-log rows of a round's calls."""
    return [ToolCallRecord(c.name, c.arguments, c.result, c.error, c.duration_ms) for c in calls]


class SessionRecord:
    """History + run record of a session, through the store's run journal."""

    def __init__(self, store: Store, session: str) -> None:
        self.store = store
        self.session = session

    async def begin(
        self, text: str, sender: str | None, turn: Message, *, load_history: bool
    ) -> tuple[int | None, list[Message] | None]:
        """Store the user's turn and start the record in one transaction."""
        return await self.store.journal.begin(
            self.session, text, sender=sender, message=turn, load_history=load_history
        )

    async def round(
        self, run_id: int | None, messages: Sequence[Message], calls: Sequence[ToolCallResult]
    ) -> None:
        """Store the round's messages and call records in one transaction."""
        assert run_id is not None
        await self.store.journal.record_round(self.session, run_id, messages, call_records(calls))

    async def finish(
        self,
        run_id: int | None,
        status: str,
        *,
        messages: Sequence[Message] = (),
        usage: Mapping[str, int] | None = None,
        reply: str | None = None,
        error: str | None = None,
    ) -> None:
        """Store the final answer and close the record in one transaction."""
        assert run_id is not None
        await self.store.journal.finish(
            self.session, run_id, status, messages=messages, usage=usage, reply=reply, error=error
        )

    async def replace_history(self, messages: Sequence[Message]) -> None:
        """Replace the session's stored history."""
        await self.store.history.replace(self.session, list(messages))


class RecordOnly:
    """A run record without history (one-shot runs)."""

    def __init__(self, store: Store, session: str) -> None:
        self.store = store
        self.session = session

    async def begin(
        self, text: str, sender: str | None, turn: Message, *, load_history: bool
    ) -> tuple[int | None, list[Message] | None]:
        """Start the run record; there is no history to load."""
        return await self.store.runs.start(self.session, text, sender), None

    async def round(
        self, run_id: int | None, messages: Sequence[Message], calls: Sequence[ToolCallResult]
    ) -> None:
        """Add the round's calls to the record."""
        if run_id is not None:
            for record in call_records(calls):
                await self.store.runs.add_tool_call(run_id, record)

    async def finish(
        self,
        run_id: int | None,
        status: str,
        *,
        messages: Sequence[Message] = (),
        usage: Mapping[str, int] | None = None,
        reply: str | None = None,
        error: str | None = None,
    ) -> None:
        """Close the record."""
        if run_id is not None:
            await self.store.runs.finish(run_id, status, usage=usage, reply=reply, error=error)

    async def replace_history(self, messages: Sequence[Message]) -> None:
        """Nothing is stored for one-shot runs."""
