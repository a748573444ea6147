"""The run journal: what one agent run writes, one transaction per step.

A run touches both the chat history and its run record. Doing each write separately costs a
thread hop and a transaction apiece (nine for a two-round run); the journal groups them by the
run's natural steps — begin, each finished tool round, finish — so a typical run makes three.
Each step is atomic: a crash leaves whole rounds, never half of one.

Bookkeeping never fails a run: the history is what the model's work produced and is always
written, while the run record is best effort. Inside a step the record update runs in a
savepoint; if it cannot be written (its row was deleted, say by hand or by an older ania-nb
pruning the log) the row is re-created from what ``begin`` saw, or the record is skipped with a
warning — the step's history rows are committed either way. Malformed bookkeeping values
(non-numeric usage, non-string reply) are stored as far as they are valid, never raised.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ania_nb.errors import UsageError

from .db import transaction
from .history import check_session, encode_messages, insert_rows, load_rows
from .mailbox import Effect, apply_effects, check_effects
from .runlog import (
    FINAL_STATUSES,
    RUNNING,
    USAGE_KEYS,
    Retention,
    ToolCallRecord,
    add_tool_call_row,
    close_running,
    finish_run,
    insert_run,
    prepare_finish,
    prepare_start,
    prepare_tool_call,
)
from .usage import UsageLedger, add_counts, as_calls, counted_total

if TYPE_CHECKING:
    from .db import Conn, Database
    from .usage import Call, Tokens

    Counted = Mapping[str, Tokens] | Sequence[Call]

Message = dict[str, Any]
Outcome = tuple[str, dict[str, int], str | None, str | None]
Counting = tuple[str, list["Call"]]  # (quota day, calls) a step adds to the usage ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Begun:
    """What ``begin`` stored, kept until ``finish`` so a lost record row can be re-created."""

    session: str
    sender: str | None
    text: str
    started_at: float


class RunJournal:
    """Grouped writes of a run to the chat history and the run log."""

    def __init__(self, db: Database, *, max_entries: int, max_per_session: int = 200) -> None:
        """Write into ``db``; the run log keeps records as `Retention` says."""
        self._db = db
        self._retention = Retention(max_entries, max_per_session)
        self._begun: dict[int, _Begun] = {}
        # The quota day a step's calls count on, None while nothing is counted (set by
        # whoever owns the quota settings; see ``usage.py``).
        self.usage_day: Callable[[], str | None] = lambda: None
        self._ledger = UsageLedger(db)

    def _counting(self, counted: Counted | None) -> Counting | None:
        """The day and calls a step adds to the ledger, None when it adds nothing."""
        calls = as_calls(counted) if counted else []
        day = self.usage_day() if calls else None
        return (day, calls) if day else None

    async def begin(
        self,
        session: str,
        input: str,
        *,
        sender: str | None,
        message: Message,
        load_history: bool,
        effects: Sequence[Effect] = (),
    ) -> tuple[int, list[Message] | None]:
        """Start the run record and store the user's message, in one transaction.

        Returns the run id and, when ``load_history``, the history as it was before the message.
        ``effects`` (e.g. the batch's inbox rows now ``running``) are written in the same
        transaction, bound to the new run.
        """
        started = prepare_start(session, input, sender)
        encoded = encode_messages([message])
        checked = check_effects(effects)
        now = time.time()
        run_id, history = await self._db.run(
            _begin, started, encoded, now, self._retention, load_history, checked
        )
        self._begun[run_id] = _Begun(*started, now)
        return run_id, history

    async def start(self, session: str, input: str, *, sender: str | None = None) -> int:
        """Start a run record with no history (one-shot runs); then ``record_round``/``finish``.

        Like ``RunLog.start``, but the later steps are best effort as for ``begin``'s runs.
        """
        started = prepare_start(session, input, sender)
        now = time.time()
        run_id = await self._db.run(_start, started, now, self._retention)
        self._begun[run_id] = _Begun(*started, now)
        return run_id

    async def record_round(
        self,
        session: str,
        run_id: int,
        messages: Sequence[Message],
        tool_calls: Sequence[ToolCallRecord],
        *,
        counted: Counted | None = None,
    ) -> None:
        """Store a finished tool round: its messages (may be none) and its tool-call records.

        ``counted`` (the calls whose results the round holds) goes to the usage ledger of the
        current quota day in the same transaction, and is noted on the record.
        """
        encoded = encode_messages(messages)
        records = [_tool_call_json(r) for r in tool_calls]
        await self._db.run(
            _round,
            check_session(session),
            run_id,
            encoded,
            records,
            self._begun.get(run_id),
            self._retention,
            time.time(),
            self._counting(counted),
        )

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
        counted: Counted | None = None,
        effects: Sequence[Effect] = (),
    ) -> list[int]:
        """Store the last messages (final answer) and (best effort) close the run record.

        ``counted`` (the run's calls not counted by an earlier step: the final answer's, by
        model or call by call) goes to the usage ledger of the current quota day in the same
        transaction, and is noted on the record. ``effects`` (the batch's inbox rows
        ``answered``, the reply's outbox row) are written in it too; returns the ids of the
        outbox rows it wrote.
        """
        encoded = encode_messages(messages)
        checked = check_effects(effects)
        outcome = _outcome(status, usage, reply, error)
        try:
            return await self._db.run(
                _finish,
                check_session(session),
                run_id,
                encoded,
                outcome,
                self._begun.get(run_id),
                self._retention,
                time.time(),
                self._counting(counted),
                checked,
            )
        finally:
            self._begun.pop(run_id, None)

    async def mark_side_effects(self, run_id: int) -> None:
        """Note on the run's record that a tool with side effects is about to start.

        Committed before the tool runs, so recovery never re-runs a turn whose effects may
        have happened (``runner.resume = "rerun"``).
        """
        await self._db.run(_mark_side_effects, run_id)

    async def count(self, session: str, counted: Counted) -> None:
        """Count tokens whose run has no record (it could not be written) on the current day."""
        counting = self._counting(counted)
        if counting:
            await self._ledger.add(counting[0], session, counting[1])


# Lenient preparation: bookkeeping values that fail validation are kept as far as they are valid.


def _outcome(status: str, usage: Mapping[str, Any] | None, reply: object, error: object) -> Outcome:
    """``prepare_finish``'s result; malformed usage/reply/error are repaired, not raised."""
    if status not in FINAL_STATUSES:
        return prepare_finish(status, None, None, None)  # a caller bug: raises UsageError
    try:
        return prepare_finish(status, usage, reply, error)  # type: ignore[arg-type]
    except UsageError as exc:
        log.warning("run record: %s; storing the valid parts", exc)
    counts: dict[str, int] = {}
    if isinstance(usage, Mapping):
        for key in USAGE_KEYS:
            value = _as_count(usage.get(key))
            if value is not None:
                counts[key] = value
    return prepare_finish(status, counts, _as_text(reply), _as_text(error))


def _tool_call_json(record: object) -> str:
    """``prepare_tool_call``'s JSON; a malformed record is stored with its fields as text."""
    try:
        return prepare_tool_call(record)  # type: ignore[arg-type]
    except UsageError as exc:
        log.warning("run record: %s; storing the call with its fields as text", exc)

    def field(name: str) -> Any:
        return getattr(record, name, None)

    repaired = ToolCallRecord(
        name=_as_text(field("name")) or "",
        arguments=_as_text(field("arguments")) or "",
        result=_as_text(field("result")) or "",
        error=_as_text(field("error")),
        duration_ms=_as_count(field("duration_ms")) or 0,
        outcome=_as_text(field("outcome")) or "ok",
    )
    return prepare_tool_call(repaired)


def _as_count(value: object) -> int | None:
    """An int from an int or a whole finite float; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return round(value)
    return None


def _as_text(value: object) -> str | None:
    """Text as is, None as None, anything else as its ``str()``."""
    if value is None or isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:  # a hostile __str__ must not fail the bookkeeping
        return f"<unprintable {type(value).__name__}>"


# Store operations: each receives the connection first (see ``Database.run``).


async def _begin(
    conn: Conn,
    started: tuple[str, str | None, str],
    encoded: list[str],
    now: float,
    retention: Retention,
    load_history: bool,
    effects: list[Effect],
) -> tuple[int, list[Message] | None]:
    session, sender, text = started
    async with transaction(conn):
        history = (
            [json.loads(raw) for raw in await load_rows(conn, session)] if load_history else None
        )
        run_id = await insert_run(conn, session, sender, text, now, retention)
        await insert_rows(conn, session, encoded, now, replace=False)
        await apply_effects(conn, effects, run_id, now)
    return run_id, history


async def _mark_side_effects(conn: Conn, run_id: int) -> None:
    await conn.execute("UPDATE runs SET side_effects_started = 1 WHERE id = ?", (run_id,))


async def _start(
    conn: Conn,
    started: tuple[str, str | None, str],
    now: float,
    retention: Retention,
) -> int:
    async with transaction(conn):
        return await insert_run(conn, *started, now, retention)


async def _round(
    conn: Conn,
    session: str,
    run_id: int,
    encoded: list[str],
    records: list[str],
    begun: _Begun | None,
    retention: Retention,
    now: float,
    counting: Counting | None,
) -> None:
    async with transaction(conn):
        await insert_rows(conn, session, encoded, now, replace=False)
        # Counted whatever becomes of the record: a quota must not depend on bookkeeping.
        added = await _count(conn, session, run_id, counting, now)
        if records or added:

            async def add_calls() -> None:
                for raw in records:
                    await add_tool_call_row(conn, run_id, raw)
                if counting and added:
                    await _note_counted(conn, run_id, counting[0], added)

            await _best_effort(conn, run_id, begun, retention, "its tool calls", add_calls)


async def _finish(
    conn: Conn,
    session: str,
    run_id: int,
    encoded: list[str],
    outcome: Outcome,
    begun: _Begun | None,
    retention: Retention,
    now: float,
    counting: Counting | None,
    effects: list[Effect],
) -> list[int]:
    args = (conn, session, run_id, encoded, outcome, begun, retention, now, counting, effects)
    try:
        return await _finish_step(*args, quick=True)
    except _QuickCloseFailed as exc:
        # Nothing of the step was written (the close is its first statement): again, with the
        # record's write in a savepoint, so that the history is stored whatever it does.
        log.warning("run %d: closing its record failed (%s); trying step by step", run_id, exc)
        return await _finish_step(*args, quick=False)


class _QuickCloseFailed(Exception):
    """The one-statement close of a run's record failed (its transaction is rolled back)."""


async def _finish_step(
    conn: Conn,
    session: str,
    run_id: int,
    encoded: list[str],
    outcome: Outcome,
    begun: _Begun | None,
    retention: Retention,
    now: float,
    counting: Counting | None,
    effects: list[Effect],
    *,
    quick: bool,
) -> list[int]:
    """The finish step; ``quick``: first try to close a still running record in one statement.

    The usual end of a run is one UPDATE (outcome and what the step counts) and no savepoint;
    a record that is missing, finished or marked interrupted takes the careful path.
    """
    async with transaction(conn):
        closed = False
        if quick:
            noted = (counting[0], counted_total(counting[1])) if counting else None
            try:
                closed = await close_running(conn, run_id, outcome, now, noted)
            except conn.errors as exc:
                raise _QuickCloseFailed(exc) from exc
        if encoded:
            await insert_rows(conn, session, encoded, now, replace=False)
        outbox_ids = await apply_effects(conn, effects, run_id, now)
        # Counted whatever becomes of the record: a quota must not depend on bookkeeping.
        added = await _count(conn, session, run_id, counting, now)
        if closed:
            return outbox_ids

        async def close() -> None:
            row = await conn.fetchone("SELECT status FROM runs WHERE id = ?", (run_id,))
            if row is not None and row[0] not in (RUNNING, "interrupted"):
                log.warning(
                    "run %d already finished with status %r; its record keeps that status, not %r",
                    run_id,
                    row[0],
                    outcome[0],
                )
                return
            if row is not None and row[0] == "interrupted":
                log.warning(
                    "run %d was marked interrupted while its process still ran it; "
                    "recording its real outcome %r",
                    run_id,
                    outcome[0],
                )
            await finish_run(conn, run_id, *outcome, now, reopen=True)
            if counting and added:
                await _note_counted(conn, run_id, counting[0], added)

        await _best_effort(conn, run_id, begun, retention, f"its outcome {outcome[0]!r}", close)
    return outbox_ids


async def _count(
    conn: Conn, session: str, run_id: int, counting: Counting | None, now: float
) -> int:
    """Add a step's calls to the usage ledger (inside its transaction); the total added."""
    if counting is None:
        return 0
    return await add_counts(conn, counting[0], session, counting[1], run_id=run_id, now=now)


async def _note_counted(conn: Conn, run_id: int, day: str, added: int) -> None:
    """Note on the record what its steps counted so far, and the day of the latest."""
    await conn.execute(
        "UPDATE runs SET counted_tokens = counted_tokens + ?, usage_day = ? WHERE id = ?",
        (added, day, run_id),
    )


async def _best_effort(
    conn: Conn,
    run_id: int,
    begun: _Begun | None,
    retention: Retention,
    what: str,
    write: Callable[[], Awaitable[None]],
) -> None:
    """Run ``write`` on the run's record in a savepoint; on failure undo only it and warn."""
    await conn.execute("SAVEPOINT run_record")
    try:
        exists = await conn.fetchone("SELECT 1 FROM runs WHERE id = ?", (run_id,))
        if exists is None:
            if begun is None:
                log.warning(
                    "run %d has no record (deleted from the run log?) and was not begun by "
                    "this store; %s was not recorded, the history was",
                    run_id,
                    what,
                )
                await conn.execute("RELEASE run_record")
                return
            log.warning("run %d's record was deleted while it ran; re-creating it", run_id)
            await insert_run(
                conn, begun.session, begun.sender, begun.text, begun.started_at, retention, run_id
            )
        await write()
    except Exception as exc:
        if not isinstance(exc, (UsageError, *conn.errors)):
            raise
        await conn.execute("ROLLBACK TO run_record")
        log.warning("run %d: recording %s failed (%s); the history was stored", run_id, what, exc)
    await conn.execute("RELEASE run_record")
