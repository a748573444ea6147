"""The run log: one row per ``chat`` run (trigger → reply), written incrementally while it runs."""

from __future__ import annotations

import builtins
import heapq
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ania_nb.errors import UsageError
from ania_nb.text import cut

from .db import clean_text, transaction
from .history import check_session
from .owner import Owner, liveness

if TYPE_CHECKING:
    from .db import Conn, Database

MAX_INPUT_CHARS = 500
MAX_TOOL_CALLS = 20
MAX_ARGUMENTS_CHARS = 500
MAX_RESULT_CHARS = 1000
MAX_REPLY_CHARS = 1000
MAX_ERROR_CHARS = 1000

RUNNING = "running"
FINAL_STATUSES = frozenset({"success", "stopped", "timeout", "error", "interrupted", "denied"})
STATUSES = FINAL_STATUSES | {RUNNING}
INTERRUPTED_ERROR = "the process running it ended before the run finished"
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens", "iterations")

_COLUMNS = (
    "id, session, sender, input, status, started_at, finished_at, duration_ms, iterations, "
    "prompt_tokens, completion_tokens, total_tokens, cached_tokens, tool_calls, "
    "tool_calls_total, reply, error, counted_tokens, usage_day"
)


@dataclass
class ToolCallRecord:
    """One tool call of a run, as kept in the log (long text already truncated)."""

    name: str
    arguments: str
    result: str
    error: str | None = None
    duration_ms: int = 0
    outcome: str = "ok"  # ok, error, denied, blocked, timeout, stopped (records before: "ok")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for JSON and display."""
        return {
            "name": self.name,
            "arguments": self.arguments,
            "result": self.result,
            "error": self.error,
            "duration_ms": self.duration_ms,
            "outcome": self.outcome,
        }


@dataclass
class RunRecord:
    """One run as stored: input, outcome, token counts and the first tool calls."""

    id: int
    session: str
    sender: str | None
    input: str
    status: str
    started_at: float
    finished_at: float | None
    duration_ms: int | None
    iterations: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    tool_calls_total: int = 0
    reply: str | None = None
    error: str | None = None
    counted_tokens: int = 0  # what this record added to the usage counters (its own calls)
    usage_day: str | None = None  # the quota day its latest counted step counted on

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (tool calls as dicts) for JSON and display."""
        return asdict(self)


@dataclass(frozen=True)
class Retention:
    """How many finished run records are kept: per session, and in all.

    A session's oldest records go past ``max_per_session``; past ``max_entries`` the records
    go from the sessions holding the most (oldest first among equals), so one busy chat never
    evicts the others' records.
    """

    max_entries: int = 10_000
    max_per_session: int = 200

    def __post_init__(self) -> None:
        """Refuse counts below one with the name of the setting."""
        positive_int("max_entries", self.max_entries)
        positive_int("max_per_session", self.max_per_session)

    @property
    def check_every(self) -> int:
        """Runs between two checks of ``max_entries`` (1 % of it; every run below 200).

        Counting the whole table is a scan: it is done once per that many runs. A check over
        the limit evicts this many rows more, so from the first eviction on the table stays at
        the limit between checks too. Before it (filling up), or after an id lost to a
        rolled-back start, the table passes the limit by fewer than this many rows until the
        next check.
        """
        return max(1, self.max_entries // 100)


class RunLog:
    """Start, update and finish run records, kept as `Retention` says."""

    def __init__(self, db: Database, max_entries: int = 10_000, max_per_session: int = 200) -> None:
        """Log into ``db``, evicting the oldest rows beyond the limits (see `Retention`)."""
        self._db = db
        self.retention = Retention(max_entries, max_per_session)

    @property
    def max_entries(self) -> int:
        """Run records kept in all."""
        return self.retention.max_entries

    @property
    def max_per_session(self) -> int:
        """Run records kept per session."""
        return self.retention.max_per_session

    async def start(self, session: str, input: str, sender: str | None = None) -> int:
        """Record a new running run; return its id."""
        args = prepare_start(session, input, sender)
        return await self._db.run(_start, *args, time.time(), self.retention)

    async def add_tool_call(self, run_id: int, record: ToolCallRecord) -> None:
        """Persist one tool call now; only the first 20 are kept, all are counted."""
        raw = prepare_tool_call(record)
        await self._db.run(add_tool_call_row, _check_int("run_id", run_id), raw)

    async def finish(
        self,
        run_id: int,
        status: str,
        *,
        usage: Mapping[str, int] | None = None,
        reply: str | None = None,
        error: str | None = None,
    ) -> None:
        """Close a running run with a final status, token usage, reply and error."""
        outcome = prepare_finish(status, usage, reply, error)
        await self._db.run(finish_run, _check_int("run_id", run_id), *outcome, time.time())

    async def mark_interrupted(self, *, stale_after: float | None = None) -> int:
        """Mark as interrupted the running runs whose owning process is gone; return how many.

        A run started by a live process on this host (this one included) is never touched.
        Runs started on another host cannot be checked: they are marked only when
        ``stale_after`` is given and they started more than that many seconds ago.
        """
        stale_before = None
        if stale_after is not None:
            if isinstance(stale_after, bool) or not isinstance(stale_after, int | float):
                raise UsageError(f"stale_after must be seconds, got {stale_after!r}")
            stale_before = time.time() - stale_after
        return await self._db.run(_mark_interrupted, stale_before)

    async def get(self, run_id: int) -> RunRecord | None:
        """One run by id, or None."""
        rows = await self._db.run(_select, "WHERE id = ?", (_check_int("run_id", run_id),), 1)
        return rows[0] if rows else None

    async def count(self) -> int:
        """How many runs are stored."""
        return await self._db.run(_count)

    async def list(
        self,
        *,
        session: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
    ) -> builtins.list[RunRecord]:
        """Return runs newest first, by session, status and ``since <= started_at < until``."""
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        if session is not None:
            clauses.append("session = ?")
            params.append(session)
        if status is not None:
            if status not in STATUSES:
                raise UsageError(
                    f"invalid run status {status!r}; expected one of {', '.join(sorted(STATUSES))}"
                )
            clauses.append("status = ?")
            params.append(status)
        for name, value, op in (("since", since, ">="), ("until", until, "<")):
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise UsageError(f"{name} must be epoch seconds, got {value!r}")
                clauses.append(f"started_at {op} ?")
                params.append(float(value))
        positive_int("limit", limit)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return await self._db.run(_select, where, tuple(params), limit)


# Validation and truncation, done on the caller's side before anything touches the database.


def prepare_start(session: str, input: str, sender: str | None) -> tuple[str, str | None, str]:
    """Checked ``(session, sender, input)`` for a new run, the input truncated."""
    check_session(session)
    _check_str("input", input)
    if sender is not None:
        sender = clean_text(_check_str("sender", sender))
    return session, sender, clean_text(cut(input, MAX_INPUT_CHARS))


def prepare_tool_call(record: ToolCallRecord) -> str:
    """The JSON of a tool-call record, checked and truncated to the log's limits."""
    if not isinstance(record, ToolCallRecord):
        raise UsageError(f"record must be a ToolCallRecord, got {type(record).__name__}")
    for name in ("name", "arguments", "result"):
        _check_str(f"tool call {name}", getattr(record, name))
    if record.error is not None:
        _check_str("tool call error", record.error)
    kept = {
        # Truncate first: a tool result can be large, and cleaning keeps the length.
        "name": clean_text(record.name),
        "arguments": clean_text(cut(record.arguments, MAX_ARGUMENTS_CHARS)),
        "result": clean_text(cut(record.result, MAX_RESULT_CHARS)),
        "error": None if record.error is None else clean_text(cut(record.error, MAX_ERROR_CHARS)),
        "duration_ms": _check_int("tool call duration_ms", record.duration_ms),
    }
    if record.outcome != "ok":  # the usual case costs nothing; records before it read as "ok"
        _check_str("tool call outcome", record.outcome)
        kept["outcome"] = clean_text(cut(record.outcome, 20))
    return json.dumps(kept, ensure_ascii=False)


def prepare_finish(
    status: str, usage: Mapping[str, int] | None, reply: str | None, error: str | None
) -> tuple[str, dict[str, int], str | None, str | None]:
    """Checked ``(status, counts, reply, error)`` for closing a run."""
    if status not in FINAL_STATUSES:
        raise UsageError(
            f"invalid final run status {status!r}; expected one of "
            f"{', '.join(sorted(FINAL_STATUSES))}"
        )
    counts = dict.fromkeys(USAGE_KEYS, 0)
    # Other keys (e.g. Usage.to_dict()'s last_prompt_tokens) are not logged.
    for key in USAGE_KEYS:
        if usage is not None and key in usage:
            counts[key] = _check_int(f"usage[{key!r}]", usage[key])
    if reply is not None:
        reply = clean_text(cut(_check_str("reply", reply), MAX_REPLY_CHARS))
    if error is not None:
        error = clean_text(cut(_check_str("error", error), MAX_ERROR_CHARS))
    return status, counts, reply, error


def _check_str(name: str, value: object) -> str:
    """Reject non-string text fields with a message naming the field."""
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a string, got {type(value).__name__}")
    return value


def _check_int(name: str, value: object) -> int:
    """Reject non-int (and bool) numeric fields with a message naming the field."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an int, got {value!r}")
    return value


def positive_int(name: str, value: object) -> int:
    """``value`` if it is a whole number ≥ 1 (not a bool), else a `UsageError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive int, got {value!r}")
    return value


# Store operations: each receives the connection first (see ``Database.run``).


async def _start(
    conn: Conn,
    session: str,
    sender: str | None,
    text: str,
    now: float,
    retention: Retention,
) -> int:
    """Insert the running row and evict the rows beyond ``retention``, atomically."""
    async with transaction(conn):
        return await insert_run(conn, session, sender, text, now, retention)


async def insert_run(
    conn: Conn,
    session: str,
    sender: str | None,
    text: str,
    now: float,
    retention: Retention,
    run_id: int | None = None,
) -> int:
    """Insert a running row owned by this process, then prune (inside the caller's transaction).

    ``run_id`` re-creates a row under a known id (see ``RunJournal``); None picks a new one.
    """
    owner = conn.owner
    values = (session, sender, text, RUNNING, now, owner.host, owner.pid, owner.start)
    locked = False
    if run_id is None:
        if conn.dialect.name == "postgres":
            # The session's pruner lock (see `prune`) taken by the INSERT itself: one round
            # trip less per run. The prune's DELETE that follows is a new statement, so its
            # snapshot is taken with the lock held, as with a separate lock statement.
            row = await conn.fetchone(
                "INSERT INTO runs (session, sender, input, status, started_at, owner_host, "
                "owner_pid, owner_start) SELECT ?, ?, ?, ?, ?, ?, ?, ? "
                "FROM (SELECT pg_advisory_xact_lock(hashtextextended(?, 0))) AS pruner "
                "RETURNING id",
                (*values, _session_lock(session)),
            )
            locked = True
        else:
            row = await conn.fetchone(
                "INSERT INTO runs (session, sender, input, status, started_at, owner_host, "
                "owner_pid, owner_start) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                values,
            )
        assert row is not None  # an INSERT … RETURNING always returns its row
        run_id = int(row[0])
    else:
        await conn.execute(
            "INSERT INTO runs (id, session, sender, input, status, started_at, owner_host, "
            "owner_pid, owner_start) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, *values),
        )
        if conn.dialect.name == "postgres":
            # An explicit id does not move PostgreSQL's identity sequence (SQLite's rowid
            # follows the largest id by itself): move it past this id, never back.
            await conn.execute(
                "SELECT setval(pg_get_serial_sequence('runs', 'id'), ?) WHERE ? > coalesce("
                "pg_sequence_last_value(pg_get_serial_sequence('runs', 'id')::regclass), 0)",
                (run_id, run_id),
            )
    await prune(conn, session, retention, run_id, locked=locked)
    return run_id


PRUNE_LOCK = "runs-prune"


def _session_lock(session: str) -> str:
    """The lock key of ``session``'s pruner."""
    return f"{PRUNE_LOCK}:{session}"


async def prune(
    conn: Conn, session: str, retention: Retention, run_id: int, *, locked: bool = False
) -> None:
    """Evict *finished* rows beyond ``retention`` (see `Retention`); running rows stay.

    ``session`` (the one that just started run ``run_id``) is cut to its own limit. The global
    limit is checked when ``run_id`` is a multiple of ``retention.check_every``; over it, rows
    go from the sessions holding the most. While more runs are in flight than the limits
    allow, the table holds all of them and shrinks back once they finish. ``locked``: the
    caller holds the pruner's lock already.
    """
    # One pruner per session at a time (and one for the whole table): two processes pruning at
    # once would each count the rows the other is deleting and evict twice as many (no-ops on
    # SQLite, whose writers are exclusive). Not one lock for all: a begin step holds it until
    # its commit, so every run start would wait for the one before, across sessions.
    if not locked:
        await conn.lock(_session_lock(session))
    check_all = run_id % retention.check_every == 0
    if check_all:
        # Before deleting anything: a pruner holding rows locked never waits for this lock,
        # so two pruners cannot deadlock (the session's lock is always taken first).
        await conn.lock(PRUNE_LOCK)
    await conn.defer(
        "DELETE FROM runs WHERE id IN (SELECT id FROM runs WHERE session = ? AND status != ? "
        f"ORDER BY id LIMIT {conn.dialect.greatest}"
        "(0, (SELECT count(*) FROM runs WHERE session = ?) - ?))",
        (session, RUNNING, session, retention.max_per_session),
    )
    if not check_all:
        return
    over = await conn.fetchval("SELECT count(*) FROM runs") - retention.max_entries
    if over > 0:
        await _evict_from_the_biggest(conn, over + retention.check_every - 1)


async def _evict_from_the_biggest(conn: Conn, rows: int) -> None:
    """Delete ``rows`` finished rows, each from the session holding the most finished ones.

    Among sessions holding as many, the one with the oldest row gives first; each gives its
    oldest rows.
    """
    sizes = await conn.fetchall(
        "SELECT session, count(*), min(id) FROM runs WHERE status != ? GROUP BY session",
        (RUNNING,),
    )
    heap = [(-count, oldest, name) for name, count, oldest in sizes]
    heapq.heapify(heap)
    taken: dict[str, int] = {}
    for _ in range(rows):
        if not heap:
            break
        count, oldest, name = heapq.heappop(heap)
        taken[name] = taken.get(name, 0) + 1
        if count + 1 < 0:
            heapq.heappush(heap, (count + 1, oldest, name))
    for name, count in taken.items():
        await conn.execute(
            "DELETE FROM runs WHERE id IN (SELECT id FROM runs WHERE session = ? AND status != ? "
            "ORDER BY id LIMIT ?)",
            (name, RUNNING, count),
        )


async def add_tool_call_row(conn: Conn, run_id: int, raw: str) -> None:
    """Append one record (while fewer than the cap are kept) and count it, in one statement."""
    updated = await conn.execute(
        f"UPDATE runs SET tool_calls = CASE WHEN {conn.dialect.json_length('tool_calls')} < ? "
        f"THEN {conn.dialect.json_append('tool_calls')} ELSE tool_calls END, "
        "tool_calls_total = tool_calls_total + 1 WHERE id = ?",
        (MAX_TOOL_CALLS, raw, run_id),
    )
    if not updated:
        raise UsageError(f"no run with id {run_id} (it may have been evicted from the run log)")


async def finish_run(
    conn: Conn,
    run_id: int,
    status: str,
    counts: dict[str, int],
    reply: str | None,
    error: str | None,
    now: float,
    *,
    reopen: bool = False,
) -> None:
    """Set the outcome of a running row; explain why when the row is missing or finished.

    ``reopen`` also accepts a row already marked ``interrupted``: its owner, still alive,
    knows the real outcome better than whoever marked it.
    """
    updated = await conn.execute(
        f"UPDATE runs SET {_outcome_set(conn)} "
        "WHERE id = :id AND status IN (:running, :interrupted)",
        {
            **counts,
            "status": status,
            "now": now,
            "reply": reply,
            "error": error,
            "id": run_id,
            "running": RUNNING,
            "interrupted": "interrupted" if reopen else RUNNING,
        },
    )
    if updated:
        return
    row = await conn.fetchone("SELECT status FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise UsageError(f"no run with id {run_id} (it may have been evicted from the run log)")
    raise UsageError(f"run {run_id} already finished with status {row[0]!r}")


async def close_running(
    conn: Conn,
    run_id: int,
    outcome: tuple[str, dict[str, int], str | None, str | None],
    now: float,
    counted: tuple[str, int] | None,
) -> bool:
    """Set the outcome of a row still ``running`` and note ``counted`` (day, tokens) on it.

    One statement for a run's usual end; False (nothing written) when the row is missing or
    not running, which the caller handles as `finish_run` does.
    """
    status, counts, reply, error = outcome
    day, added = counted if counted is not None else (None, 0)
    updated = await conn.execute(
        f"UPDATE runs SET {_outcome_set(conn)}, counted_tokens = counted_tokens + :added, "
        "usage_day = coalesce(:day, usage_day) WHERE id = :id AND status = :running",
        {
            **counts,
            "status": status,
            "now": now,
            "reply": reply,
            "error": error,
            "id": run_id,
            "running": RUNNING,
            "added": added,
            "day": day if added else None,
        },
    )
    return bool(updated)


def _outcome_set(conn: Conn) -> str:
    """The SET list of a run's outcome (named parameters: the outcome's and ``now``)."""
    return (
        "status = :status, finished_at = :now, "
        f"duration_ms = {conn.dialect.greatest}"
        "(0, CAST(ROUND((:now - started_at) * 1000) AS BIGINT)), "
        "iterations = :iterations, prompt_tokens = :prompt_tokens, "
        "completion_tokens = :completion_tokens, total_tokens = :total_tokens, "
        "cached_tokens = :cached_tokens, reply = :reply, error = :error"
    )


async def _mark_interrupted(conn: Conn, stale_before: float | None) -> int:
    """Mark the running rows whose owning process is gone (see ``_owner``); return how many."""
    async with transaction(conn):
        rows = await conn.fetchall(
            "SELECT id, owner_host, owner_pid, owner_start, started_at FROM runs WHERE status = ?",
            (RUNNING,),
        )
        owners = {
            run_id: Owner(host, pid, start)
            for run_id, host, pid, start, _ in rows
            if host is not None and pid is not None
        }
        alive = await liveness(conn, owners.values())
        orphaned: list[int] = []
        for run_id, _, _, _, started_at in rows:
            owner = owners.get(run_id)
            if owner is None:
                orphaned.append(run_id)  # written before owners were recorded
            elif alive[owner] is False:
                orphaned.append(run_id)
            elif alive[owner] is None and stale_before is not None and started_at < stale_before:
                orphaned.append(run_id)  # another host's run, past its lease
        for run_id in orphaned:
            await conn.execute(
                "UPDATE runs SET status = ?, error = ? WHERE id = ? AND status = ?",
                ("interrupted", INTERRUPTED_ERROR, run_id, RUNNING),
            )
    return len(orphaned)


async def _count(conn: Conn) -> int:
    """Total rows."""
    return int(await conn.fetchval("SELECT count(*) FROM runs"))


async def _select(conn: Conn, where: str, params: tuple[Any, ...], limit: int) -> list[RunRecord]:
    """Rows matching ``where`` (built from fixed clauses only), newest first."""
    rows = await conn.fetchall(
        f"SELECT {_COLUMNS} FROM runs {where} ORDER BY id DESC LIMIT ?", (*params, limit)
    )
    return [_to_record(row) for row in rows]


def _to_record(row: tuple[Any, ...]) -> RunRecord:
    """Build a RunRecord from a ``_COLUMNS`` row."""
    values = list(row)
    values[13] = [ToolCallRecord(**item) for item in json.loads(values[13])]
    return RunRecord(*values)
