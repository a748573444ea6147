"""The clock: scheduled tasks that start one-shot agent runs on the Agent's own event loop.

``clock = Clock(agent)`` (the Agent does this and calls `Clock.start` / `Clock.aclose`). Tasks
live in the store (tables ``clock_tasks`` and ``clock_log``); one process per data directory
holds the clock's lease and runs the scheduler (APScheduler's ``AsyncIOScheduler`` on the running
loop, so tasks fire while a notebook kernel is idle); the others only edit tasks, and the holder
picks their changes up by polling the table. Each trigger runs the task as a fresh one-shot
``clock`` run against its target session and publishes the final reply on the host's outbox.
"""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._engine import POLL_SECONDS, ClockEngine
from .lease import Lease
from .model import (
    UPDATABLE_FIELDS,
    ClockError,
    ClockEvent,
    ClockTask,
    TaskLogEntry,
    check_fields,
    check_text,
)
from .schedule import CRON_RESOLUTION, Schedule, describe_period, parse_schedule, shortest_gap

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store
    from ..tools import Tool
    from .store import ClockStore

__all__ = ["POLL_SECONDS", "Clock", "ClockError", "ClockEvent", "ClockTask", "TaskLogEntry"]


class Clock(ClockEngine):
    """Scheduled tasks of one Agent: the engine API behind ``/clock``, clock_* tools and panel.

    Every method may be called before `start` (the store is opened through the host); only the
    lease holder (`active`) fires scheduled tasks, but any process may create, change, delete
    and `run_now` tasks.
    """

    # ------------------------------------------------------------------ lifecycle

    async def start(self, store: Store | None = None) -> None:
        """Open the store, take the lease if free and schedule every enabled task.

        Orphaned ``running`` log entries become ``interrupted`` first; a process that lost the
        lease retries it every `poll_interval` seconds and takes over when the holder exits.
        Pass ``store`` when the host is opening itself (no second open). Does nothing when
        ``config.clock.enable`` is false; calling it twice is a no-op.
        """
        async with self._lock:
            if self._state != "new":
                return
            if not self.host.config.clock.enable:
                self._state = "disabled"
                return
            clock_store = await self._open(store)
            self._lease = Lease(os.path.dirname(clock_store.db.path))
            await clock_store.mark_interrupted()
            self._rev, self._revs = await clock_store.revision(), await clock_store.revisions()
            self._log_seen = await clock_store.newest_entry_id()
            await self._take_over()
            if self._state == "closed":  # closed while starting
                await self._lease.release()
                return
            self._state = "started"
            self.host.on_stop(self._on_stop)
            self._spawn(self._watch(), "ania-clock-watch")

    async def aclose(self) -> None:
        """Stop the scheduler and release the lease; idempotent.

        Scheduled runs in progress are cancelled (their entries end ``interrupted``); no asyncio
        task of the clock is left pending.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        self._scheduler.shutdown()
        tasks = list(self._spawned)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._scheduler.shutdown()  # again: a take-over cut short may have started it
        if self._lease is not None:
            await self._lease.release()

    def status_text(self) -> str:
        """One line on the scheduler: active, waiting for the lease, disabled or not started."""
        if self._state == "new":
            return "clock: not started (it starts when the agent opens)"
        if self._state == "disabled":
            return "clock: disabled (clock.enable is false)"
        if self._state == "closed":
            return "clock: closed"
        if self.active:
            return (
                f"clock: active in this process (pid {os.getpid()}): {len(self._scheduler)} "
                f"task(s) scheduled, {len(self._running)} running"
            )
        holder = self._holder or {}
        who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
        return (
            f"clock: standby: {who} holds the clock of this data directory, so this process "
            f"fires no scheduled tasks; it takes over when that one exits "
            f"(checked every {self.poll_interval:g} s)"
        )

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
        limited: bool = False,
    ) -> ClockTask:
        """Create an enabled task and schedule it; returns it with ``next_run_at`` set.

        Raises `ClockError` for an invalid schedule (the message shows a valid example), blank
        content, an empty target or a negative timeout. ``limited``: the creator is no admin,
        so the chat limits apply: ``clock.min_interval`` between runs (unless run-once), and
        at most ``clock.max_tasks_per_chat`` tasks in the target.
        """
        fields = check_fields(
            {
                "cron": cron,
                "title": title,
                "content": content,
                "target": target,
                "run_once": run_once,
                "timeout": timeout,
                "created_by": created_by,
                "note": note,
            }
        )
        fields["creator"] = check_text("creator", creator)
        schedule = parse_schedule(fields["cron"])
        if limited and not run_once:
            await self._check_interval(schedule)
        fields["next_run_at"] = schedule.next_fire()
        store = await self._open()
        async with self._edits:  # counted and added in one edit: parallel adds cannot overshoot
            if limited:
                await self._check_room(store, fields["target"])
            task, rev = await store.create(fields)
            self._revs[task.id] = rev
            await self._apply(task)
        await self._emit("task_created", task.id, task=task)
        return task

    async def get(self, id: str) -> ClockTask | None:
        """The task with this id, or None."""
        return await (await self._open()).get(check_text("id", id))

    async def list(self, target: str | None = None) -> builtins.list[ClockTask]:
        """Every task (or those of ``target``), in creation order."""
        return await (await self._open()).list(target)

    async def update(
        self, id: str, updater: str = "api", *, limited: bool = False, **fields: Any
    ) -> ClockTask:
        """Change the given fields and reschedule; returns the task as it is now.

        Fields: cron, title, content, target, enabled, run_once, timeout, created_by, note.
        Raises `ClockError` for an unknown id or field, or an invalid value (nothing is saved).
        ``limited`` (the updater is no admin): a repeating task whose schedule changes, that
        stops being run-once or is enabled again must respect ``clock.min_interval``; a task
        moved to another target must fit under that target's ``clock.max_tasks_per_chat``.
        """
        unknown = set(fields) - UPDATABLE_FIELDS
        if unknown:
            raise ClockError(
                f"cannot change {', '.join(sorted(unknown))} of a clock task; the fields are "
                f"{', '.join(sorted(UPDATABLE_FIELDS))}"
            )
        changes = check_fields(fields)
        changes["updater"] = check_text("updater", updater)
        store = await self._open()
        old = await store.get(check_text("id", id))
        if old is None:
            raise ClockError(f"no clock task with id {id!r}")
        enabled = changes.get("enabled", old.enabled)
        if limited:
            await self._check_changes(old, changes)
        if not enabled:
            changes["next_run_at"] = None
        elif "cron" in changes or not old.enabled:
            changes["next_run_at"] = parse_schedule(changes.get("cron", old.cron)).next_fire()
        async with self._edits:
            if limited and changes.get("target", old.target) != old.target:
                await self._check_room(store, changes["target"])
            done = await store.update(id, changes)
            if done is None:
                raise ClockError(f"no clock task with id {id!r} (it was deleted meanwhile)")
            task, self._revs[id] = done
            await self._apply(task)
        await self._emit("task_updated", task.id, task=task)
        return task

    # ------------------------------------------------------------------ limits

    async def _check_interval(self, schedule: Schedule) -> None:
        """`ClockError` if a non-admin's repeating ``schedule`` runs more often than allowed.

        The limit is ``clock.min_interval`` seconds between two runs (0 = none), measured by
        `shortest_gap` (off the loop: a cron schedule's fire times take a moment to list).
        """
        least = self.host.config.clock.min_interval
        if least <= 0 or (schedule.every is None and least <= CRON_RESOLUTION):
            return  # no limit, or one no cron schedule can break (it fires once a minute at most)
        gap = await asyncio.to_thread(shortest_gap, schedule)
        if gap is not None and gap < least:
            raise ClockError(
                f"schedule {schedule.text!r} runs as often as every {describe_period(gap)}; "
                "a task a non-admin repeats may run at most once every "
                f"{describe_period(least)} (clock.min_interval = {least:g}); choose a longer "
                "period or a run-once task, or ask an admin"
            )

    async def _check_changes(self, old: ClockTask, changes: dict[str, Any]) -> None:
        """The interval check of a limited update (see `update`)."""
        run_once = bool(changes.get("run_once", old.run_once))
        enabled = bool(changes.get("enabled", old.enabled))
        rescheduled = (
            changes.get("cron", old.cron) != old.cron
            or run_once != old.run_once
            or (enabled and not old.enabled)
        )
        if enabled and not run_once and rescheduled:
            await self._check_interval(parse_schedule(changes.get("cron", old.cron)))

    async def _check_room(self, store: ClockStore, target: str) -> None:
        """`ClockError` if ``target`` holds ``clock.max_tasks_per_chat`` tasks already."""
        cap = self.host.config.clock.max_tasks_per_chat
        if cap <= 0:
            return
        count = len(await store.list(target))
        if count >= cap:
            raise ClockError(
                f"{target} has {count} clock tasks, the most a non-admin may add to "
                f"(clock.max_tasks_per_chat = {cap}); delete one first, or ask an admin"
            )

    async def delete(self, id: str) -> ClockTask:
        """Delete a task (its log stays); returns it as it was. `ClockError` if unknown.

        A run in progress is not cancelled: it finishes and is logged.
        """
        store = await self._open()
        async with self._edits:
            task = await store.delete(check_text("id", id))
            if task is None:
                raise ClockError(f"no clock task with id {id!r}")
            self._revs.pop(id, None)
            self._scheduler.remove(id)
        await self._emit("task_deleted", id, task=task)
        return task

    async def run_now(self, id: str) -> TaskLogEntry:
        """Run a task now (even when disabled) and await the run; returns its log entry.

        If the task is already running (here or in another process) the entry is ``skipped``.
        A manual run never deletes a run-once task. `ClockError` if the id is unknown.
        """
        entry = await self._run(check_text("id", id), scheduled_at=None)
        if entry is None:
            raise ClockError(f"no clock task with id {id!r}")
        return entry

    async def logs(
        self, task_id: str | None = None, target: str | None = None, limit: int = 10
    ) -> builtins.list[TaskLogEntry]:
        """The newest task-log entries first, optionally of one task and/or one target."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ClockError(f"limit must be a positive whole number, got {limit!r}")
        return await (await self._open()).logs(task_id, target, limit)

    def subscribe(self, fn: Callable[[ClockEvent], Any]) -> Callable[[], None]:
        """Call ``fn`` (sync or async) with every `ClockEvent`; returns the unsubscribe function.

        Task changes and runs of other processes are reported too, within a poll interval.
        """
        return self._listeners.subscribe(fn)

    # ------------------------------------------------------------------ faces

    def session_tools(self, session: str) -> builtins.list[Tool]:
        """The clock_* tools bound to ``session`` (none when the clock is disabled).

        Delegates to ``ania_nb.clock.tools.clock_tools(clock, session)``.
        """
        if not self.host.config.clock.enable:
            return []
        from .tools import clock_tools  # type: ignore[import-not-found,unused-ignore]

        return list(clock_tools(self, session))

    async def command(self, session: str, args: str, sender: str | None) -> str:
        """Answer ``/clock <args>`` sent by ``sender`` in ``session`` (plain text).

        Delegates to ``ania_nb.clock.command.clock_command(clock, session, args, sender)``.
        """
        from .command import clock_command  # type: ignore[import-not-found,unused-ignore]

        return str(await clock_command(self, session, args, sender))
