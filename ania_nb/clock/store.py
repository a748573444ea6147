"""The clock's tables: ``clock_tasks`` (creation order), ``clock_log`` (runs) and ``clock_meta``.

Every statement runs on the store thread (``Database.run``). Task ids are the base-36 form of a
persisted counter; every user edit of a task bumps a revision counter and stamps the row with
it, so the scheduler's poll for other processes' edits reads one integer. Log rows record their
owning process (like the run log) so that only runs of a dead process become ``interrupted``
and a task running in another live process is never started twice.
"""

from __future__ import annotations

import builtins
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..store import ToolCallRecord
from ..store.db import clean_text, transaction
from ..store.owner import Owner, liveness
from ..store.runlog import INTERRUPTED_ERROR as RUN_INTERRUPTED_ERROR
from ..store.runlog import prepare_finish, prepare_tool_call
from ..text import cut
from .model import RUNNING, ClockError, ClockTask, TaskLogEntry

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Database
    from ..store.db import Conn

__all__ = [
    "INTERRUPTED_ERROR",
    "NO_LEADER_ERROR",
    "SKIPPED_ERROR",
    "ClockStore",
    "SlotTaken",
    "base36",
]

MAX_TRIGGER_CHARS = 500
MAX_TOOL_CALLS = 20
INTERRUPTED_ERROR = "the process running it ended before the run finished (restart)"
SKIPPED_ERROR = "the previous run of this task was still running"
NO_LEADER_ERROR = "skipped (no leader): no process held the clock at the planned time"
_SKIP_COUNT = re.compile(r"\((\d+) triggers skipped\)$")
SLOT_EPSILON = 0.001  # planned times are kept to the millisecond (`ania_nb.clock.schedule`)

_TASK_COLUMNS = (
    "id, cron, title, content, target, enabled, run_once, timeout, created_by, creator, "
    "updater, note, created_at, updated_at, last_run_at, next_run_at, last_status"
)
_LOG_COLUMNS = (
    "id, task_id, title, target, trigger, status, started_at, finished_at, duration_ms, manual, "
    "scheduled_at, iterations, prompt_tokens, completion_tokens, total_tokens, cached_tokens, "
    "tool_calls, tool_calls_total, reply, error, missed_from"
)

# Columns `update` may write (the model's UPDATABLE_FIELDS plus who/when/next).
_EDITABLE = frozenset(
    {
        "cron",
        "title",
        "content",
        "target",
        "enabled",
        "run_once",
        "timeout",
        "created_by",
        "note",
        "updater",
        "next_run_at",
    }
)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


class SlotTaken(ClockError):
    """The fire's ``(task, planned time)`` is recorded already (another leader's): do not run."""


def base36(number: int) -> str:
    """``number`` (≥ 0) in base 36, lower case."""
    out = ""
    while True:
        number, digit = divmod(number, 36)
        out = _DIGITS[digit] + out
        if not number:
            return out


class ClockStore:
    """Tasks and task log of one database."""

    def __init__(self, db: Database, max_log_entries: int = 500) -> None:
        """Use ``db``; the log keeps the newest ``max_log_entries`` finished entries."""
        self.db = db
        self.max_log_entries = max_log_entries

    # ---------------------------------------------------------------- tasks

    async def create(self, fields: Mapping[str, Any]) -> tuple[ClockTask, int]:
        """Insert a task (id assigned here) from checked ``fields``; returns it and its rev."""
        return await self.db.run(_create, dict(fields), time.time())

    async def get(self, task_id: str) -> ClockTask | None:
        """One task, or None."""
        rows = await self.db.run(_select_tasks, "WHERE id = ?", (task_id,))
        return rows[0] if rows else None

    async def list(self, target: str | None = None) -> builtins.list[ClockTask]:
        """Every task (or ``target``'s), in creation order."""
        if target is None:
            return await self.db.run(_select_tasks, "", ())
        return await self.db.run(_select_tasks, "WHERE target = ?", (target,))

    async def update(
        self, task_id: str, changes: Mapping[str, Any]
    ) -> tuple[ClockTask, int] | None:
        """Write checked ``changes`` (an edit: bumps the revision); returns (task, rev) or None."""
        bad = set(changes) - _EDITABLE
        assert not bad, f"not editable: {bad}"
        return await self.db.run(_update, task_id, dict(changes), time.time())

    async def delete(self, task_id: str, *, only_run_once: bool = False) -> ClockTask | None:
        """Delete a task (its log stays); returns it as it was, or None if it was not there."""
        return await self.db.run(_delete, task_id, only_run_once)

    async def set_next_runs(self, planned: Sequence[tuple[str, float | None]]) -> None:
        """Store the next fire times ``(id, epoch or None)`` (not an edit: no revision bump)."""
        if planned:
            await self.db.run(_set_next_runs, list(planned))

    async def revision(self) -> int:
        """The edit counter: it changes whenever any process edits any task."""
        return await self.db.run(_meta, "rev")

    async def revisions(self) -> dict[str, int]:
        """Every task id with the revision of its last edit."""
        return await self.db.run(_revisions)

    async def tasks(self, ids: Sequence[str]) -> builtins.list[ClockTask]:
        """The tasks with these ids (missing ones left out), in creation order."""
        if not ids:
            return []
        return await self.db.run(_tasks_by_id, list(ids))

    # ---------------------------------------------------------------- log

    async def begin_run(
        self,
        task_id: str,
        trigger: Callable[[ClockTask], str],
        *,
        manual: bool,
        scheduled_at: float | None,
        next_run_at: float | None = None,
        started_at: float | None = None,
        missed_from: float | None = None,
        skip: str | None = None,
    ) -> tuple[ClockTask, TaskLogEntry] | None:
        """Log a run of the task as ``running`` — or ``skipped`` when a live process runs it.

        A scheduled run is fenced by its slot: when an entry of the task with the planned time
        ``scheduled_at`` exists already (another leader fired it), nothing is written and
        `SlotTaken` is raised — the caller must not run it. ``missed_from``: the oldest missed
        planned time this fire also stands for (kept after any slot recorded before it);
        ``skip``: log the slot ``skipped`` with this reason instead of running it.

        Reads the task in the same transaction (one trip to the store thread when a task is
        due) and returns it with the entry; None, logging nothing, when the task is gone or a
        scheduled run finds it disabled. ``trigger(task)`` makes the entry's input. A
        ``running`` entry stamps the task's ``last_run_at``/``last_status``; a scheduled run
        stores its ``next_run_at`` too (None for a run-once task, which waits for its run).
        ``started_at`` defaults to now (the clock passes the moment it fired).
        """
        planned = _Planned(scheduled_at, next_run_at, missed_from, skip)
        return await self.db.run(
            _begin_run,
            task_id,
            trigger,
            manual,
            planned,
            started_at or time.time(),
            self.max_log_entries,
        )

    async def add_tool_calls(self, entry_id: int, calls: Sequence[ToolCallRecord]) -> None:
        """Append tool-call records (the first 20 are kept, all are counted)."""
        if calls:
            raws = [prepare_tool_call(c) for c in calls]
            await self.db.run(_add_tool_calls, entry_id, raws)

    async def finish_run(
        self,
        entry_id: int,
        status: str,
        *,
        usage: Mapping[str, int] | None = None,
        reply: str | None = None,
        error: str | None = None,
    ) -> TaskLogEntry | None:
        """Close a running entry (and set its task's ``last_status``); returns it."""
        status, counts, reply, error = prepare_finish(status, usage, reply, error)
        return await self.db.run(
            _finish_run, entry_id, status, counts, reply, error, time.time(), self.max_log_entries
        )

    async def mark_interrupted(self) -> int:
        """Mark ``interrupted`` the running entries whose process is gone; returns how many."""
        return await self.db.run(_mark_interrupted)

    async def logs(
        self, task_id: str | None = None, target: str | None = None, limit: int = 10
    ) -> builtins.list[TaskLogEntry]:
        """Newest entries first, optionally of one task and/or target."""
        clauses, params = [], []
        if task_id is not None:
            clauses.append("task_id = ?")
            params.append(task_id)
        if target is not None:
            clauses.append("target = ?")
            params.append(target)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return await self.db.run(_select_logs, where, tuple(params), limit)

    async def entry(self, entry_id: int) -> TaskLogEntry | None:
        """One log entry, or None."""
        rows = await self.db.run(_select_logs, "WHERE id = ?", (entry_id,), 1)
        return rows[0] if rows else None

    async def newest_entry_id(self) -> int:
        """The id of the newest log entry (0 when the log is empty)."""
        return await self.db.run(_newest_entry_id)

    async def others_runs(
        self, after: int, watching: Sequence[int]
    ) -> tuple[builtins.list[TaskLogEntry], int]:
        """Entries of other processes newer than ``after`` or in ``watching``, oldest first.

        Also returns the newest entry id, for the next look.
        """
        return await self.db.run(_others_runs, after, list(watching))


# Store operations: each receives the connection first (see ``Database.run``).


async def _meta(conn: Conn, key: str) -> int:
    row = await conn.fetchone("SELECT value FROM clock_meta WHERE key = ?", (key,))
    return int(row[0]) if row else 0


async def _bump(conn: Conn, key: str) -> int:
    """Increment a counter inside the caller's transaction; returns the new value."""
    await conn.execute(
        "INSERT INTO clock_meta (key, value) VALUES (?, 1) "
        "ON CONFLICT (key) DO UPDATE SET value = clock_meta.value + 1",
        (key,),
    )
    return await _meta(conn, key)


async def _create(conn: Conn, fields: dict[str, Any], now: float) -> tuple[ClockTask, int]:
    async with transaction(conn):
        seq = await _bump(conn, "seq")
        rev = await _bump(conn, "rev")
        task_id = base36(seq)
        await conn.execute(
            "INSERT INTO clock_tasks (id, seq, cron, title, content, target, enabled, run_once, "
            "timeout, created_by, creator, updater, note, created_at, updated_at, next_run_at, "
            "rev) VALUES (:id, :seq, :cron, :title, :content, :target, 1, :run_once, :timeout, "
            ":created_by, :creator, '', :note, :now, :now, :next_run_at, :rev)",
            {**fields, "id": task_id, "seq": seq, "now": now, "rev": rev},
        )
        return (await _select_tasks(conn, "WHERE id = ?", (task_id,)))[0], rev


async def _update(
    conn: Conn, task_id: str, changes: dict[str, Any], now: float
) -> tuple[ClockTask, int] | None:
    async with transaction(conn):
        if await conn.fetchone("SELECT 1 FROM clock_tasks WHERE id = ?", (task_id,)) is None:
            return None
        rev = await _bump(conn, "rev")
        sets = "".join(f"{name} = :{name}, " for name in changes)  # names checked by caller
        await conn.execute(
            f"UPDATE clock_tasks SET {sets}updated_at = :now, rev = :rev WHERE id = :id",
            {**changes, "now": now, "rev": rev, "id": task_id},
        )
        return (await _select_tasks(conn, "WHERE id = ?", (task_id,)))[0], rev


async def _delete(conn: Conn, task_id: str, only_run_once: bool) -> ClockTask | None:
    async with transaction(conn):
        rows = await _select_tasks(conn, "WHERE id = ?", (task_id,))
        if not rows or (only_run_once and not rows[0].run_once):
            return None
        await _bump(conn, "rev")
        await conn.execute("DELETE FROM clock_tasks WHERE id = ?", (task_id,))
        return rows[0]


async def _set_next_runs(conn: Conn, planned: list[tuple[str, float | None]]) -> None:
    async with transaction(conn):
        await conn.executemany(
            "UPDATE clock_tasks SET next_run_at = ? WHERE id = ?",
            [(when, task_id) for task_id, when in planned],
        )


async def _revisions(conn: Conn) -> dict[str, int]:
    return {row[0]: int(row[1]) for row in await conn.fetchall("SELECT id, rev FROM clock_tasks")}


async def _tasks_by_id(conn: Conn, ids: list[str]) -> list[ClockTask]:
    found: list[ClockTask] = []
    for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        found.extend(await _select_tasks(conn, f"WHERE id IN ({marks})", tuple(chunk)))
    return found


# The task rows' reader and the task log's statements.


async def _select_tasks(conn: Conn, where: str, params: tuple[Any, ...]) -> list[ClockTask]:
    rows = await conn.fetchall(
        f"SELECT {_TASK_COLUMNS} FROM clock_tasks {where} ORDER BY seq", params
    )
    return [_to_task(row) for row in rows]


def _to_task(row: tuple[Any, ...]) -> ClockTask:
    values = list(row)
    values[5], values[6] = bool(values[5]), bool(values[6])
    return ClockTask(*values)


async def _live_runner(conn: Conn, task_id: str) -> bool:
    """Whether a live process (this one included) has a running entry of the task."""
    rows = await conn.fetchall(
        "SELECT owner_host, owner_pid, owner_start FROM clock_log WHERE task_id = ? AND status = ?",
        (task_id, RUNNING),
    )
    # Another host's plain process cannot be checked (None): count it as running.
    alive = await liveness(conn, [Owner(host, pid, start) for host, pid, start in rows])
    return any(found is not False for found in alive.values())


@dataclass(frozen=True)
class _Planned:
    """What `_begin_run` knows of a scheduled fire (all None for a manual run)."""

    scheduled_at: float | None
    next_run_at: float | None
    missed_from: float | None
    skip: str | None


async def _begin_run(
    conn: Conn,
    task_id: str,
    make_trigger: Callable[[ClockTask], str],
    manual: bool,
    planned: _Planned,
    now: float,
    max_entries: int,
) -> tuple[ClockTask, TaskLogEntry] | None:
    owner = conn.owner
    scheduled_at, next_run_at = planned.scheduled_at, planned.next_run_at
    missed_from = planned.missed_from
    async with transaction(conn):
        # The check for a live run and the insert of ours are one step for every process:
        # on PostgreSQL two processes would otherwise both see "not busy" and both run.
        await conn.lock(f"clock-run:{task_id}")
        rows = await _select_tasks(conn, "WHERE id = ?", (task_id,))
        if not rows or (not manual and not rows[0].enabled):
            return None
        task = rows[0]
        if scheduled_at is not None:
            # The fence: one entry per (task, planned time), checked under the task's lock
            # (the unique index clock_log_slot backs it up); the loser writes nothing.
            if await _slot_recorded(conn, task.id, scheduled_at):
                raise SlotTaken(f"clock task {task.id}: planned time {scheduled_at} is taken")
            missed_from = await _missed_since(conn, task.id, scheduled_at, missed_from)
        trigger = clean_text(cut(make_trigger(task), MAX_TRIGGER_CHARS))
        busy = planned.skip is None and await _live_runner(conn, task.id)
        skipped = busy or planned.skip is not None
        if scheduled_at is not None:
            task.next_run_at = None if task.run_once and not busy else next_run_at
            await conn.execute(
                "UPDATE clock_tasks SET next_run_at = ? WHERE id = ?", (task.next_run_at, task.id)
            )
        if (
            busy
            and scheduled_at is not None
            and (again := await _skipped_again(conn, task.id, scheduled_at, now)) is not None
        ):
            return task, again
        status = "skipped" if skipped else RUNNING
        inserted = await conn.fetchone(
            "INSERT INTO clock_log (task_id, title, target, trigger, status, started_at, "
            "finished_at, duration_ms, manual, scheduled_at, error, owner_host, owner_pid, "
            "owner_start, missed_from) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "RETURNING id",
            (
                task.id,
                task.title,
                task.target,
                trigger,
                status,
                now,
                now if skipped else None,
                0 if skipped else None,
                int(manual),
                scheduled_at,
                (SKIPPED_ERROR if busy else planned.skip) if skipped else None,
                owner.host,
                owner.pid,
                owner.start,
                missed_from,
            ),
        )
        if not skipped:
            task.last_run_at, task.last_status = now, RUNNING
            await conn.execute(
                "UPDATE clock_tasks SET last_run_at = ?, last_status = ? WHERE id = ?",
                (now, RUNNING, task.id),
            )
        await _prune(conn, max_entries)
        assert inserted is not None  # an INSERT … RETURNING always returns its row
        return task, (await _select_logs(conn, "WHERE id = ?", (inserted[0],), 1))[0]


async def _slot_recorded(conn: Conn, task_id: str, scheduled_at: float) -> bool:
    """Whether the task has a scheduled entry for the planned time ``scheduled_at``."""
    row = await conn.fetchone(
        "SELECT 1 FROM clock_log WHERE task_id = ? AND scheduled_at = ? AND manual = 0",
        (task_id, scheduled_at),
    )
    return row is not None


async def _missed_since(
    conn: Conn, task_id: str, scheduled_at: float, missed_from: float | None
) -> float | None:
    """``missed_from``, moved after any earlier slot the task has an entry for (None if none left).

    So the slots an entry stands for never overlap another entry's: a leader that woke from a
    freeze claims only the slots nobody recorded meanwhile.
    """
    if missed_from is None or missed_from >= scheduled_at:
        return None
    newest = await conn.fetchval(
        "SELECT max(scheduled_at) FROM clock_log WHERE task_id = ? AND manual = 0 "
        "AND scheduled_at < ?",
        (task_id, scheduled_at),
    )
    if newest is not None and newest >= missed_from:
        missed_from = float(newest) + SLOT_EPSILON
    return missed_from if missed_from < scheduled_at else None


async def _skipped_again(
    conn: Conn, task_id: str, scheduled_at: float, now: float
) -> TaskLogEntry | None:
    """Count one more skipped fire on the task's newest entry if that is one already.

    A run outlasting many beats of a short period would otherwise flood the log with skips and
    evict every other entry; the newest entry can only be a skip while the same run goes on.
    The entry moves to the new planned time and stands for the earlier ones (``missed_from``).
    """
    row = await conn.fetchone(
        "SELECT id, status, error, manual FROM clock_log WHERE task_id = ? "
        "ORDER BY id DESC LIMIT 1",
        (task_id,),
    )
    if row is None or row[1] != "skipped" or row[3] or not (row[2] or "").startswith(SKIPPED_ERROR):
        return None
    found = _SKIP_COUNT.search(row[2] or "")
    count = (int(found.group(1)) if found else 1) + 1
    await conn.execute(
        "UPDATE clock_log SET missed_from = coalesce(missed_from, scheduled_at), "
        "scheduled_at = ?, finished_at = ?, error = ? WHERE id = ?",
        (scheduled_at, now, f"{SKIPPED_ERROR} ({count} triggers skipped)", row[0]),
    )
    return (await _select_logs(conn, "WHERE id = ?", (row[0],), 1))[0]


async def _prune(conn: Conn, max_entries: int) -> None:
    """Delete the oldest finished entries beyond ``max_entries`` (running ones stay)."""
    await conn.execute(
        "DELETE FROM clock_log WHERE id IN (SELECT id FROM clock_log WHERE status != ? "
        f"ORDER BY id LIMIT {conn.dialect.greatest}(0, (SELECT count(*) FROM clock_log) - ?))",
        (RUNNING, max_entries),
    )


async def _add_tool_calls(conn: Conn, entry_id: int, raws: list[str]) -> None:
    async with transaction(conn):
        for raw in raws:
            await conn.execute(
                "UPDATE clock_log SET tool_calls = CASE WHEN "
                f"{conn.dialect.json_length('tool_calls')} < ? "
                f"THEN {conn.dialect.json_append('tool_calls')} ELSE tool_calls END, "
                "tool_calls_total = tool_calls_total + 1 WHERE id = ?",
                (MAX_TOOL_CALLS, raw, entry_id),
            )


async def _finish_run(
    conn: Conn,
    entry_id: int,
    status: str,
    counts: dict[str, int],
    reply: str | None,
    error: str | None,
    now: float,
    max_entries: int,
) -> TaskLogEntry | None:
    async with transaction(conn):
        # An entry a restarted process marked interrupted while this one still ran is reopened:
        # its owner knows the real outcome.
        await conn.execute(
            "UPDATE clock_log SET status = :status, finished_at = :now, "
            f"duration_ms = {conn.dialect.greatest}"
            "(0, CAST(ROUND((:now - started_at) * 1000) AS BIGINT)), "
            "iterations = :iterations, prompt_tokens = :prompt_tokens, "
            "completion_tokens = :completion_tokens, total_tokens = :total_tokens, "
            "cached_tokens = :cached_tokens, reply = :reply, error = :error "
            "WHERE id = :id AND status IN ('running', 'interrupted')",
            {**counts, "status": status, "now": now, "reply": reply, "error": error}
            | {"id": entry_id},
        )
        rows = await _select_logs(conn, "WHERE id = ?", (entry_id,), 1)
        if rows:
            await conn.execute(
                "UPDATE clock_tasks SET last_status = ? WHERE id = ?", (status, rows[0].task_id)
            )
        await _prune(conn, max_entries)
        return rows[0] if rows else None


async def _orphans(conn: Conn) -> list[tuple[int, str]]:
    """``(entry id, task id)`` of the running entries whose process is gone."""
    me = conn.owner
    rows = await conn.fetchall(
        "SELECT id, task_id, owner_host, owner_pid, owner_start FROM clock_log WHERE status = ?",
        (RUNNING,),
    )
    owners = {Owner(host, pid, start) for _, _, host, pid, start in rows} - {me}
    alive = await liveness(conn, owners)  # each process looked at once; None: cannot tell
    return [
        (entry_id, task_id)
        for entry_id, task_id, host, pid, start in rows
        if alive.get(Owner(host, pid, start)) is False
    ]


async def _mark_interrupted(conn: Conn) -> int:
    if not await _orphans(conn):  # the usual case: a read, no write lock (it runs periodically)
        return 0
    async with transaction(conn):
        gone = await _orphans(conn)
        for entry_id, task_id in gone:
            owner = await conn.fetchone(
                "SELECT owner_host, owner_pid, owner_start FROM clock_log WHERE id = ?",
                (entry_id,),
            )
            await conn.execute(
                "UPDATE clock_log SET status = 'interrupted', error = ? WHERE id = ? "
                "AND status = 'running'",
                (INTERRUPTED_ERROR, entry_id),
            )
            if owner is not None:
                # The run's record in `runs` (TaskLogRecorder: sender clock:<task id>) belongs
                # to the same dead process: it ends with the entry, not at the next start.
                await conn.execute(
                    "UPDATE runs SET status = 'interrupted', error = ? WHERE status = ? "
                    "AND sender = ? AND owner_host IS NOT DISTINCT FROM ? "
                    "AND owner_pid IS NOT DISTINCT FROM ? AND owner_start IS NOT DISTINCT FROM ?",
                    (RUN_INTERRUPTED_ERROR, RUNNING, f"clock:{task_id}", *owner),
                )
            await conn.execute(
                "UPDATE clock_tasks SET last_status = 'interrupted' WHERE id = ? "
                "AND last_status = ?",
                (task_id, RUNNING),
            )
    return len(gone)


async def _newest_entry_id(conn: Conn) -> int:
    return int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM clock_log"))


async def _others_runs(
    conn: Conn, after: int, watching: list[int]
) -> tuple[list[TaskLogEntry], int]:
    me = conn.owner
    newest = await _newest_entry_id(conn)
    marks = ",".join("?" * len(watching[:500]))
    which = f"(id > ? OR id IN ({marks}))" if watching else "id > ?"
    rows = await _select_logs(
        conn,
        f"WHERE {which} AND NOT (owner_host IS NOT DISTINCT FROM ? "
        "AND owner_pid IS NOT DISTINCT FROM ?)",
        (after, *watching[:500], me.host, me.pid),
        1000,
    )
    return rows[::-1], newest


async def _select_logs(
    conn: Conn, where: str, params: tuple[Any, ...], limit: int
) -> list[TaskLogEntry]:
    rows = await conn.fetchall(
        f"SELECT {_LOG_COLUMNS} FROM clock_log {where} ORDER BY id DESC LIMIT ?", (*params, limit)
    )
    return [_to_entry(row) for row in rows]


def _to_entry(row: tuple[Any, ...]) -> TaskLogEntry:
    values = list(row)
    values[9] = bool(values[9])
    values[16] = [ToolCallRecord(**item) for item in json.loads(values[16])]
    return TaskLogEntry(*values)
