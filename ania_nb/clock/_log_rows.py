"""The task log's statements, and the task-row reader they share with `ClockStore`.

Functions here run on the store thread (``Database.run``), inside `ClockStore`'s calls.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from ..store import ToolCallRecord
from ..store._db import clean_text, transaction
from ..store._owner import Owner, current_owner, is_alive
from ..text import cut
from .model import RUNNING, ClockTask, TaskLogEntry

MAX_TRIGGER_CHARS = 500
MAX_TOOL_CALLS = 20
INTERRUPTED_ERROR = "the process running it ended before the run finished (restart)"
SKIPPED_ERROR = "the previous run of this task was still running"
_SKIP_COUNT = re.compile(r"\((\d+) triggers skipped\)$")

_TASK_COLUMNS = (
    "id, cron, title, content, target, enabled, run_once, timeout, created_by, creator, "
    "updater, note, created_at, updated_at, last_run_at, next_run_at, last_status"
)
_LOG_COLUMNS = (
    "id, task_id, title, target, trigger, status, started_at, finished_at, duration_ms, manual, "
    "scheduled_at, iterations, prompt_tokens, completion_tokens, total_tokens, cached_tokens, "
    "tool_calls, tool_calls_total, reply, error"
)


def _select_tasks(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> list[ClockTask]:
    rows = conn.execute(f"SELECT {_TASK_COLUMNS} FROM clock_tasks {where} ORDER BY seq", params)
    return [_to_task(row) for row in rows]


def _to_task(row: tuple[Any, ...]) -> ClockTask:
    values = list(row)
    values[5], values[6] = bool(values[5]), bool(values[6])
    return ClockTask(*values)


def _live_runner(conn: sqlite3.Connection, task_id: str) -> bool:
    """Whether a live process (this one included) has a running entry of the task."""
    me = current_owner()
    rows = conn.execute(
        "SELECT owner_host, owner_pid, owner_start FROM clock_log WHERE task_id = ? AND status = ?",
        (task_id, RUNNING),
    ).fetchall()
    # Another host's process cannot be checked: count it as running (WAL needs one host anyway).
    return any(host != me.host or is_alive(Owner(host, pid, start)) for host, pid, start in rows)


def _begin_run(
    conn: sqlite3.Connection,
    task_id: str,
    make_trigger: Callable[[ClockTask], str],
    manual: bool,
    planned: tuple[float | None, float | None],
    now: float,
    max_entries: int,
) -> tuple[ClockTask, TaskLogEntry] | None:
    owner = current_owner()
    scheduled_at, next_run_at = planned
    with transaction(conn):
        rows = _select_tasks(conn, "WHERE id = ?", (task_id,))
        if not rows or (not manual and not rows[0].enabled):
            return None
        task = rows[0]
        trigger = clean_text(cut(make_trigger(task), MAX_TRIGGER_CHARS))
        busy = _live_runner(conn, task.id)
        if scheduled_at is not None:
            task.next_run_at = None if task.run_once and not busy else next_run_at
            conn.execute(
                "UPDATE clock_tasks SET next_run_at = ? WHERE id = ?", (task.next_run_at, task.id)
            )
        if (
            busy
            and scheduled_at is not None
            and (again := _skipped_again(conn, task.id, scheduled_at, now)) is not None
        ):
            return task, again
        status = "skipped" if busy else RUNNING
        cursor = conn.execute(
            "INSERT INTO clock_log (task_id, title, target, trigger, status, started_at, "
            "finished_at, duration_ms, manual, scheduled_at, error, owner_host, owner_pid, "
            "owner_start) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                task.id,
                task.title,
                task.target,
                trigger,
                status,
                now,
                now if busy else None,
                0 if busy else None,
                int(manual),
                scheduled_at,
                SKIPPED_ERROR if busy else None,
                owner.host,
                owner.pid,
                owner.start,
            ),
        )
        if not busy:
            task.last_run_at, task.last_status = now, RUNNING
            conn.execute(
                "UPDATE clock_tasks SET last_run_at = ?, last_status = ? WHERE id = ?",
                (now, RUNNING, task.id),
            )
        _prune(conn, max_entries)
        assert cursor.lastrowid is not None
        return task, _select_logs(conn, "WHERE id = ?", (cursor.lastrowid,), 1)[0]


def _skipped_again(
    conn: sqlite3.Connection, task_id: str, scheduled_at: float, now: float
) -> TaskLogEntry | None:
    """Count one more skipped fire on the task's newest entry if that is one already.

    A run outlasting many beats of a short period would otherwise flood the log with skips and
    evict every other entry; the newest entry can only be a skip while the same run goes on.
    """
    row = conn.execute(
        "SELECT id, status, error, manual FROM clock_log WHERE task_id = ? "
        "ORDER BY id DESC LIMIT 1",
        (task_id,),
    ).fetchone()
    if row is None or row[1] != "skipped" or row[3]:
        return None
    found = _SKIP_COUNT.search(row[2] or "")
    count = (int(found.group(1)) if found else 1) + 1
    conn.execute(
        "UPDATE clock_log SET scheduled_at = ?, finished_at = ?, error = ? WHERE id = ?",
        (scheduled_at, now, f"{SKIPPED_ERROR} ({count} triggers skipped)", row[0]),
    )
    return _select_logs(conn, "WHERE id = ?", (row[0],), 1)[0]


def _prune(conn: sqlite3.Connection, max_entries: int) -> None:
    """Delete the oldest finished entries beyond ``max_entries`` (running ones stay)."""
    conn.execute(
        "DELETE FROM clock_log WHERE id IN (SELECT id FROM clock_log WHERE status != ? "
        "ORDER BY id LIMIT max(0, (SELECT count(*) FROM clock_log) - ?))",
        (RUNNING, max_entries),
    )


def _add_tool_calls(conn: sqlite3.Connection, entry_id: int, raws: list[str]) -> None:
    with transaction(conn):
        for raw in raws:
            conn.execute(
                "UPDATE clock_log SET tool_calls = CASE WHEN json_array_length(tool_calls) < ? "
                "THEN json_insert(tool_calls, '$[#]', json(?)) ELSE tool_calls END, "
                "tool_calls_total = tool_calls_total + 1 WHERE id = ?",
                (MAX_TOOL_CALLS, raw, entry_id),
            )


def _finish_run(
    conn: sqlite3.Connection,
    entry_id: int,
    status: str,
    counts: dict[str, int],
    reply: str | None,
    error: str | None,
    now: float,
    max_entries: int,
) -> TaskLogEntry | None:
    with transaction(conn):
        # An entry a restarted process marked interrupted while this one still ran is reopened:
        # its owner knows the real outcome.
        conn.execute(
            "UPDATE clock_log SET status = :status, finished_at = :now, "
            "duration_ms = MAX(0, CAST(ROUND((:now - started_at) * 1000) AS INTEGER)), "
            "iterations = :iterations, prompt_tokens = :prompt_tokens, "
            "completion_tokens = :completion_tokens, total_tokens = :total_tokens, "
            "cached_tokens = :cached_tokens, reply = :reply, error = :error "
            "WHERE id = :id AND status IN ('running', 'interrupted')",
            {**counts, "status": status, "now": now, "reply": reply, "error": error}
            | {"id": entry_id},
        )
        rows = _select_logs(conn, "WHERE id = ?", (entry_id,), 1)
        if rows:
            conn.execute(
                "UPDATE clock_tasks SET last_status = ? WHERE id = ?", (status, rows[0].task_id)
            )
        _prune(conn, max_entries)
        return rows[0] if rows else None


def _orphans(conn: sqlite3.Connection) -> list[tuple[int, str]]:
    """``(entry id, task id)`` of the running entries whose process is gone."""
    me = current_owner()
    rows = conn.execute(
        "SELECT id, task_id, owner_host, owner_pid, owner_start FROM clock_log WHERE status = ?",
        (RUNNING,),
    ).fetchall()
    alive: dict[Owner, bool] = {}  # many entries share an owner: look at each process once
    gone: list[tuple[int, str]] = []
    for entry_id, task_id, host, pid, start in rows:
        owner = Owner(host, pid, start)
        if host != me.host:
            continue  # another host's process cannot be checked
        if owner not in alive:
            alive[owner] = owner == me or is_alive(owner)
        if not alive[owner]:
            gone.append((entry_id, task_id))
    return gone


def _mark_interrupted(conn: sqlite3.Connection) -> int:
    if not _orphans(conn):  # the usual case: a read, no write lock (it runs periodically)
        return 0
    with transaction(conn):
        gone = _orphans(conn)
        for entry_id, task_id in gone:
            conn.execute(
                "UPDATE clock_log SET status = 'interrupted', error = ? WHERE id = ? "
                "AND status = 'running'",
                (INTERRUPTED_ERROR, entry_id),
            )
            conn.execute(
                "UPDATE clock_tasks SET last_status = 'interrupted' WHERE id = ? "
                "AND last_status = ?",
                (task_id, RUNNING),
            )
    return len(gone)


def _newest_entry_id(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(id), 0) FROM clock_log").fetchone()[0])


def _others_runs(
    conn: sqlite3.Connection, after: int, watching: list[int]
) -> tuple[list[TaskLogEntry], int]:
    me = current_owner()
    newest = _newest_entry_id(conn)
    marks = ",".join("?" * len(watching[:500]))
    which = f"(id > ? OR id IN ({marks}))" if watching else "id > ?"
    rows = _select_logs(
        conn,
        f"WHERE {which} AND NOT (owner_host IS ? AND owner_pid IS ?)",
        (after, *watching[:500], me.host, me.pid),
        1000,
    )
    return rows[::-1], newest


def _select_logs(
    conn: sqlite3.Connection, where: str, params: tuple[Any, ...], limit: int
) -> list[TaskLogEntry]:
    rows = conn.execute(
        f"SELECT {_LOG_COLUMNS} FROM clock_log {where} ORDER BY id DESC LIMIT ?", (*params, limit)
    )
    return [_to_entry(row) for row in rows]


def _to_entry(row: tuple[Any, ...]) -> TaskLogEntry:
    values = list(row)
    values[9] = bool(values[9])
    values[16] = [ToolCallRecord(**item) for item in json.loads(values[16])]
    return TaskLogEntry(*values)
