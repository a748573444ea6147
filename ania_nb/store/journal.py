"""The run journal: what one agent run writes, one transaction per step.

A run touches both the chat history and its run record. Doing each write separately costs a
thread hop and a transaction apiece (nine for a two-round run); the journal groups them by the
run's natural steps — begin, each finished tool round, finish — so a typical run makes three.
Each step is atomic: a crash leaves whole rounds, never half of one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._db import transaction
from .history import check_session, encode_messages, insert_rows, load_rows
from .runlog import (
    ToolCallRecord,
    add_tool_call_row,
    finish_run,
    insert_run,
    prepare_finish,
    prepare_start,
    prepare_tool_call,
)

if TYPE_CHECKING:
    import sqlite3

    from ._db import Database

Message = dict[str, Any]


class RunJournal:
    """Grouped writes of a run to the chat history and the run log."""

    def __init__(self, db: Database, *, max_entries: int) -> None:
        """Write into ``db``; the run log keeps ``max_entries`` rows."""
        self._db = db
        self._max_entries = max_entries

    async def begin(
        self,
        session: str,
        input: str,
        *,
        sender: str | None,
        message: Message,
        load_history: bool,
    ) -> tuple[int, list[Message] | None]:
        """Start the run record and store the user's message, in one transaction.

        Returns the run id and, when ``load_history``, the history as it was before the message.
        """
        started = prepare_start(session, input, sender)
        encoded = encode_messages([message])
        return await self._db.run(
            _begin, started, encoded, time.time(), self._max_entries, load_history
        )

    async def record_round(
        self,
        session: str,
        run_id: int,
        messages: Sequence[Message],
        tool_calls: Sequence[ToolCallRecord],
    ) -> None:
        """Store a finished tool round: its messages and its tool-call records."""
        encoded = encode_messages(messages)
        records = [prepare_tool_call(r) for r in tool_calls]
        await self._db.run(_round, check_session(session), run_id, encoded, records, time.time())

    async def finish(
        self,
        session: str,
        run_id: int,
        status: str,
        *,
        messages: Sequence[Message] = (),
        usage: Mapping[str, int] | None = None,
        reply: str | None = None,
        error: str | None = None,
    ) -> None:
        """Store the last messages (final answer) and close the run record."""
        encoded = encode_messages(messages)
        outcome = prepare_finish(status, usage, reply, error)
        await self._db.run(_finish, check_session(session), run_id, encoded, outcome, time.time())


def _begin(
    conn: sqlite3.Connection,
    started: tuple[str, str | None, str],
    encoded: list[str],
    now: float,
    max_entries: int,
    load_history: bool,
) -> tuple[int, list[Message] | None]:
    session, sender, text = started
    with transaction(conn):
        history = [json.loads(raw) for raw in load_rows(conn, session)] if load_history else None
        run_id = insert_run(conn, session, sender, text, now, max_entries)
        insert_rows(conn, session, encoded, now, replace=False)
    return run_id, history


def _round(
    conn: sqlite3.Connection,
    session: str,
    run_id: int,
    encoded: list[str],
    records: list[str],
    now: float,
) -> None:
    with transaction(conn):
        insert_rows(conn, session, encoded, now, replace=False)
        for raw in records:
            add_tool_call_row(conn, run_id, raw)


def _finish(
    conn: sqlite3.Connection,
    session: str,
    run_id: int,
    encoded: list[str],
    outcome: tuple[str, dict[str, int], str | None, str | None],
    now: float,
) -> None:
    with transaction(conn):
        if encoded:
            insert_rows(conn, session, encoded, now, replace=False)
        finish_run(conn, run_id, *outcome, now)
