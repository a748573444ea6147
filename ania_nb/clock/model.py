"""The clock's data: tasks, task-log entries, change events and the clock's error type.

Times are epoch seconds (``time.time()``), like the run log; ``None`` means "never" / "not
scheduled". A task's ``target`` is a session key (``nb:<name>`` in a notebook, ``g:<id>`` /
``f:<id>`` on a chat platform); the task's runs use that session's tools and deliver their final
reply to it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import UsageError
from ..store import ToolCallRecord

log = logging.getLogger(__name__)

# Task-log statuses [orig §7.4], plus ``skipped`` (an overlapping trigger) and ``denied`` (quota).
RUNNING = "running"
LOG_STATUSES = ("running", "success", "timeout", "error", "interrupted", "skipped", "denied")
FINAL_LOG_STATUSES = frozenset(LOG_STATUSES) - {RUNNING}

# Fields a caller may change with `Clock.update` (everything else is kept by the clock).
UPDATABLE_FIELDS = frozenset(
    {"cron", "title", "content", "target", "enabled", "run_once", "timeout", "created_by", "note"}
)

MAX_TIMEOUT = 1800.0  # seconds; no clock run may take longer [orig §4.1]

EventKind = Literal["task_created", "task_updated", "task_deleted", "run_started", "run_finished"]


class ClockError(UsageError):
    """A clock request was refused: bad schedule, unknown task, blank content, bad field."""


class DuplicateTaskError(ClockError):
    """A task with the same schedule (and mode), title, content and target exists: ``task``.

    A small model may ask for one reminder several times in one request; each would fire.
    """

    def __init__(self, task: ClockTask) -> None:
        """Name the existing task."""
        super().__init__(
            f"task ID={task.id} ({task.title}) already has this schedule, title, content and "
            f"target {task.target}; not created again"
        )
        self.task = task


IDENTITY_FIELDS = ("cron", "title", "content", "target")
"""With the mode (run-once or repeating): what makes two tasks the same task (their runs would
do the same thing at the same time)."""


def same_task(task: ClockTask, fields: dict[str, Any]) -> bool:
    """Whether ``task`` has the checked ``fields``' schedule, mode, title, content and target."""
    return task.run_once == bool(fields["run_once"]) and all(
        str(getattr(task, name)).strip() == str(fields[name]).strip() for name in IDENTITY_FIELDS
    )


@dataclass
class ClockTask:
    """One scheduled task [orig §4.2].

    ``id`` is the base-36 form of a persisted counter. ``timeout`` is seconds, 0 = the clock's
    default (``clock.default_timeout``); runs are clamped to 1800 s. ``created_by`` is who a
    chat-platform trigger mentions (empty = nobody); ``creator`` who made the task (``api``,
    ``ai``, ``panel`` or a user id) and ``updater`` who changed it last. ``next_run_at`` is the
    next planned fire time (None when disabled); ``last_status`` the status of the newest log
    entry (for display; None before the first run).
    """

    id: str
    cron: str
    title: str
    content: str
    target: str
    enabled: bool = True
    run_once: bool = False
    timeout: float = 0.0
    created_by: str = ""
    creator: str = "api"
    updater: str = ""
    note: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    last_run_at: float | None = None
    next_run_at: float | None = None
    last_status: str | None = None

    @property
    def mode(self) -> str:
        """``once`` for a run-once task, else ``repeat``."""
        return "once" if self.run_once else "repeat"

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for JSON and display."""
        return dataclasses.asdict(self)


@dataclass
class TaskLogEntry:
    """One run of a task, as kept in the task log [orig §7.4].

    ``status`` is one of `LOG_STATUSES`; ``trigger`` the text the model got (≤500 chars);
    ``manual`` tells a `Clock.run_now` run from a scheduled one, whose planned fire time is
    ``scheduled_at`` (so ``started_at - scheduled_at`` is how late it fired; one scheduled entry
    per task and planned time, ``missed_from`` set when it stands for earlier slots too).
    ``tool_calls`` holds the first 20 calls (arguments ≤500, results ≤1000 chars),
    ``tool_calls_total`` all; ``reply`` is cut to 1000 chars. Title and target are copied from
    the task at run time, so the entry stays readable after the task is deleted.
    """

    id: int
    task_id: str
    title: str
    target: str
    trigger: str
    status: str
    started_at: float
    finished_at: float | None = None
    duration_ms: int | None = None
    manual: bool = False
    scheduled_at: float | None = None  # the planned fire time (None for a manual run)
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    tool_calls_total: int = 0
    reply: str | None = None
    error: str | None = None
    # The oldest planned time this entry also stands for: slots that passed unfired (a stall,
    # or no process holding the clock) and were coalesced into this late fire or this skip.
    missed_from: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (tool calls as dicts) for JSON and display."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ClockEvent:
    """A change a `Clock.subscribe` listener hears about.

    ``task_created``/``task_updated`` carry the task as it is now, ``task_deleted`` the task as
    it was (None when another process deleted it); ``run_started``/``run_finished`` carry the
    log entry and the task as the run began (None for runs of other processes, seen by
    polling: their ``run_started`` may be missed when a run ends within one poll, and a
    ``skipped`` entry comes as ``run_finished`` alone). ``task_id`` is always set.
    """

    kind: EventKind
    task_id: str
    task: ClockTask | None = None
    entry: TaskLogEntry | None = None


def check_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Validated task fields, as stored (a `ClockError` names the first bad one)."""
    from .schedule import parse_schedule  # it imports this module

    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "cron":
            out[name] = parse_schedule(value).text
        elif name in ("enabled", "run_once"):
            if not isinstance(value, bool):
                raise ClockError(f"{name} must be true or false, got {value!r}")
            out[name] = int(value)
        elif name == "timeout":
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value >= 0)
            ):
                raise ClockError(
                    f"timeout must be a number of seconds ≥ 0 (0 = the default), got {value!r}"
                )
            out[name] = float(min(value, MAX_TIMEOUT))
        elif name == "content":
            if not check_text(name, value).strip():
                raise ClockError("content must not be blank: it is what the task asks the agent")
            out[name] = value
        elif name == "target":
            if not check_text(name, value).strip():
                raise ClockError("target must be a session key such as 'nb:default' or 'g:<id>'")
            out[name] = value.strip()
        else:
            out[name] = (
                check_text(name, value).strip() if name == "created_by" else check_text(name, value)
            )
    return out


def check_text(name: str, value: object) -> str:
    """``value`` if it is a string, else a `ClockError` naming the field."""
    if not isinstance(value, str):
        raise ClockError(f"{name} must be a string, got {type(value).__name__}")
    return value
