"""Texts of the clock shared by the clock_* tools, ``/clock`` and the panel's plain fallback.

Deterministic for a given task or log entry: times are local (``YYYY-MM-DD HH:MM`` in details,
``MM-DD HH:MM`` in short messages, ``MM-DD HH:MM:SS`` in log lines); the structure follows the
original [orig §4.5]: list line, detail, log line, created/updated messages.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ..text import flatten
from .model import ClockTask, TaskLogEntry

__all__ = [
    "created_text",
    "deleted_text",
    "detail_text",
    "list_line",
    "local_time",
    "log_line",
    "logs_text",
    "state",
    "tasks_text",
    "updated_text",
]

# List lines show 12 characters of a title and log lines 30 of an error, then "…", as the
# original [orig §4.5]; the limits count the "…" (`ania_nb.text.cut`).
TITLE_CHARS = 12 + 1
ERROR_CHARS = 30 + 1
WHO = {"ai": "AI", "panel": "panel", "api": "API", "clock": "clock", "user": "local user"}


def local_time(ts: float | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """``ts`` (epoch seconds) in local time, or ``-`` for never."""
    return "-" if ts is None else time.strftime(fmt, time.localtime(ts))


def state(task: ClockTask) -> str:
    """``enabled`` or ``disabled``."""
    return "enabled" if task.enabled else "disabled"


def _who(who: str) -> str:
    return WHO.get(who, who) or "-"


def list_line(task: ClockTask) -> str:
    """``✅|⏸️ [id] <title ≤12…> | repeat|once | <cron> → <target>``."""
    mark = "✅" if task.enabled else "⏸️"
    title = flatten(task.title, TITLE_CHARS) or "(untitled)"
    return f"{mark} [{task.id}] {title} | {task.mode} | {task.cron} → {task.target}"


def tasks_text(tasks: Iterable[ClockTask], heading: str, empty: str) -> str:
    """A heading with the count, then one `list_line` per task; ``empty`` when there are none."""
    lines = [list_line(t) for t in tasks]
    if not lines:
        return empty
    return f"{heading} ({len(lines)}):\n" + "\n".join(lines)


def detail_text(task: ClockTask, default_timeout: float) -> str:
    """Every field of a task, one per line (times local, ``YYYY-MM-DD HH:MM``)."""
    timeout = f"{task.timeout:g}s" if task.timeout > 0 else f"default ({default_timeout:g}s)"
    lines = [
        f"ID: {task.id}",
        f"State: {state(task)}",
        f"Mode: {task.mode}",
        f"Schedule: {task.cron}",
        f"Title: {task.title or '(untitled)'}",
        f"Content: {task.content}",
        f"Target: {task.target}",
        f"Timeout: {timeout}",
    ]
    if task.note.strip():
        lines.append(f"Note: {task.note}")
    if task.created_by:
        lines.append(f"Mentions: {task.created_by}")
    lines.append(f"Creator: {_who(task.creator)}")
    if task.updater:
        lines.append(f"Updater: {_who(task.updater)}")
    lines += [
        f"Created: {local_time(task.created_at)}",
        f"Updated: {local_time(task.updated_at)}",
        f"Next run: {local_time(task.next_run_at)}",
        f"Last run: {local_time(task.last_run_at)}"
        + (f" ({task.last_status})" if task.last_status else ""),
    ]
    return "\n".join(lines)


def log_line(entry: TaskLogEntry) -> str:
    """``- MM-DD HH:MM:SS [status] <ms>ms <title>[ <n>tok][ <error ≤30…>]``."""
    took = "…" if entry.duration_ms is None else f"{entry.duration_ms}ms"
    title = entry.title or f"(task {entry.task_id})"
    line = f"- {local_time(entry.started_at, '%m-%d %H:%M:%S')} [{entry.status}] {took} {title}"
    if entry.total_tokens:
        line += f" {entry.total_tokens}tok"
    if entry.error:
        line += f" {flatten(entry.error, ERROR_CHARS)}"
    return line


def logs_text(entries: Iterable[TaskLogEntry], heading: str, empty: str) -> str:
    """A heading with the count, then one `log_line` per entry (newest first)."""
    lines = [log_line(e) for e in entries]
    if not lines:
        return empty
    return f"{heading} ({len(lines)}, newest first):\n" + "\n".join(lines)


def created_text(task: ClockTask) -> str:
    """``created task ID=x, mode=…, cron=…, target=…[, next run MM-DD HH:MM]``."""
    return f"created task ID={task.id}, {_plan(task)}"


def existing_text(task: ClockTask) -> str:
    """What clock_create answers when the same task exists: that one, not a second task."""
    return (
        f"task ID={task.id} already exists with this schedule, title, content and target "
        f"({_plan(task)}); not created again"
    )


def _plan(task: ClockTask) -> str:
    text = f"mode={task.mode}, cron={task.cron}, target={task.target}"
    if task.next_run_at is not None:
        text += f", next run {local_time(task.next_run_at, '%m-%d %H:%M')}"
    return text


def updated_text(task: ClockTask) -> str:
    """``updated ID=x, state=…, mode=…, cron=…[, next run MM-DD HH:MM]``."""
    text = f"updated ID={task.id}, state={state(task)}, mode={task.mode}, cron={task.cron}"
    if task.next_run_at is not None:
        text += f", next run {local_time(task.next_run_at, '%m-%d %H:%M')}"
    return text


def deleted_text(task: ClockTask) -> str:
    """``deleted task ID=x (<title>)``."""
    return f"deleted task ID={task.id} ({task.title or 'untitled'})"
