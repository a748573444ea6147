"""The clock: scheduled tasks that start one-shot agent runs on the Agent's own event loop.

``clock = Clock(agent)`` (the Agent does this and calls `Clock.start` / `Clock.aclose`). Tasks
live in the store (tables ``clock_tasks`` and ``clock_log``); one process per data directory
holds the clock's lease and runs the scheduler (APScheduler's ``AsyncIOScheduler`` on the running
loop, so tasks fire while a notebook kernel is idle); the others only edit tasks, and the holder
picks their changes up by polling the table. Each trigger runs the task as a fresh one-shot
``clock`` run against its target session and publishes the final reply on the host's outbox.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .model import ClockError, ClockEvent, ClockTask, TaskLogEntry

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration import AgentHost
    from ..tools import Tool

__all__ = ["Clock", "ClockError", "ClockEvent", "ClockTask", "TaskLogEntry"]


class Clock:
    """Scheduled tasks of one Agent: the engine API behind ``/clock``, clock_* tools and panel.

    Every method may be called before `start` (the store is opened through the host); only the
    lease holder (`active`) fires scheduled tasks, but any process may create, change, delete
    and `run_now` tasks.
    """

    def __init__(self, host: AgentHost) -> None:
        """Bind the clock to its host (the Agent); nothing runs until `start`."""
        self.host = host

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the store, take the lease if free and schedule every enabled task.

        Orphaned ``running`` log entries become ``interrupted`` first; a process that lost the
        lease retries it periodically and takes over when the holder exits.

        Does nothing when ``config.clock.enable`` is false; calling it twice is a no-op.
        """
        raise NotImplementedError

    async def aclose(self) -> None:
        """Stop the scheduler and release the lease; idempotent.

        Running task runs are cancelled (their entries end ``error``); no asyncio task is left
        pending.
        """
        raise NotImplementedError

    @property
    def active(self) -> bool:
        """Whether this process holds the clock's lease (and so runs the scheduler)."""
        raise NotImplementedError

    def status_text(self) -> str:
        """One line on the scheduler: active, waiting for the lease, disabled or not started."""
        raise NotImplementedError

    # ------------------------------------------------------------------ tasks

    async def create(
        self,
        *,
        cron: str,
        title: str,
        content: str,
        target: str,
        run_once: bool = False,
        timeout: float = 0,  # noqa: ASYNC109 - the task's run timeout, not this call's
        created_by: str = "",
        creator: str = "api",
        note: str = "",
    ) -> ClockTask:
        """Create an enabled task and schedule it; returns it with ``next_run_at`` set.

        Raises `ClockError` for an invalid schedule (the message shows a valid example), blank
        content, an empty target or a negative timeout.
        """
        raise NotImplementedError

    async def get(self, id: str) -> ClockTask | None:
        """The task with this id, or None."""
        raise NotImplementedError

    async def list(self, target: str | None = None) -> builtins.list[ClockTask]:
        """Every task (or those of ``target``), in creation order."""
        raise NotImplementedError

    async def update(self, id: str, updater: str = "api", **fields: Any) -> ClockTask:
        """Change the given fields and reschedule; returns the task as it is now.

        Fields: cron, title, content, target, enabled, run_once, timeout, created_by, note.
        Raises `ClockError` for an unknown id or field, or an invalid value (nothing is saved).
        """
        raise NotImplementedError

    async def delete(self, id: str) -> ClockTask:
        """Delete a task (its log stays); returns it as it was. `ClockError` if unknown.

        A run in progress is not cancelled: it finishes and is logged.
        """
        raise NotImplementedError

    async def run_now(self, id: str) -> TaskLogEntry:
        """Run a task now (even when disabled) and await the run; returns its log entry.

        If the task is already running (here or in another process) the entry is ``skipped``.
        A manual run never deletes a run-once task. `ClockError` if the id is unknown.
        """
        raise NotImplementedError

    async def logs(
        self, task_id: str | None = None, target: str | None = None, limit: int = 10
    ) -> builtins.list[TaskLogEntry]:
        """The newest task-log entries first, optionally of one task and/or one target."""
        raise NotImplementedError

    def subscribe(self, fn: Callable[[ClockEvent], Any]) -> Callable[[], None]:
        """Call ``fn`` (sync or async) with every `ClockEvent`; returns the unsubscribe function.

        Changes made by other processes are reported too (as the lease holder polls them).
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ faces

    def session_tools(self, session: str) -> builtins.list[Tool]:
        """The clock_* tools bound to ``session`` (none when the clock is disabled).

        Delegates to ``ania_nb.clock.tools.clock_tools(clock, session)`` (H-clock-face).
        """
        if not self.host.config.clock.enable:
            return []
        from .tools import clock_tools  # type: ignore[import-not-found,unused-ignore]

        return list(clock_tools(self, session))

    async def command(self, session: str, args: str, sender: str | None) -> str:
        """Answer ``/clock <args>`` sent by ``sender`` in ``session`` (plain text).

        Delegates to ``ania_nb.clock.command.clock_command(clock, session, args, sender)``
        (H-clock-face).
        """
        from .command import clock_command  # type: ignore[import-not-found,unused-ignore]

        return str(await clock_command(self, session, args, sender))
