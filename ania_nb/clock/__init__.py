"""The clock: scheduled tasks that start one-shot agent runs on the Agent's own event loop.

``clock = Clock(agent.host)`` (the Agent does this and calls `Clock.start` / `Clock.aclose`).
Tasks live in the store (tables ``clock_tasks`` and ``clock_log``); one process holds the clock's
lease and runs the scheduler (APScheduler's ``AsyncIOScheduler`` on the running loop, so tasks
fire while a notebook kernel is idle): one per data directory on SQLite, one per database on
PostgreSQL, where replicas share the store (`ania_nb.clock.lease`). The others only edit tasks.
Every process polls the store every `POLL_SECONDS` for other processes' edits (so an edit made
anywhere reaches the leader within that) and, standing by, for a free lease; the leader's poll
is also its lease's heartbeat, and a leader that finds its lease lost stops firing at once.

Each fire is recorded under its ``(task, planned time)`` key before it runs (a second leader's
fire of the same slot loses and does not run). Planned times that passed while no process held
the lease — everything stopped, or a leader replaced — are found at take-over from the task's
stored next fire time and handled by ``clock.misfire``: one late run standing for all of them
(``run_once_late``), or one ``skipped (no leader)`` entry (``skip``). The leader also marks the
runs of dead processes ``interrupted`` every `ORPHAN_POLLS` polls (task log and run record).

Each trigger runs the task as a fresh one-shot ``clock`` run against its target session and
publishes the final reply on the host's outbox.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..orchestration import Delivery
from ..orchestration.subscribers import Subscribers
from .lease import ClockLease, PostgresLease, open_lease
from .model import (
    UPDATABLE_FIELDS,
    ClockError,
    ClockEvent,
    ClockTask,
    DuplicateTaskError,
    EventKind,
    TaskLogEntry,
    check_fields,
    check_text,
    same_task,
)
from .runner import CLOSED_ERROR, STOPPED_ERROR, Outcome, run_task, trigger_text
from .schedule import CRON_RESOLUTION, Schedule, describe_period, parse_schedule, shortest_gap
from .scheduler import Scheduler
from .store import NO_LEADER_ERROR, ClockStore, SlotTaken

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration import AgentHost
    from ..store import Store
    from ..tools import Tool

__all__ = [
    "POLL_SECONDS",
    "Clock",
    "ClockError",
    "ClockEvent",
    "ClockTask",
    "DuplicateTaskError",
    "TaskLogEntry",
]

log = logging.getLogger("ania_nb.clock")

# How often edits of other processes are picked up, a free lease is tried and the leader's lease
# heartbeat goes (well under `lease.LEADER_IDLE_TIMEOUT`). One poll costs three small reads.
POLL_SECONDS = 0.5
ORPHAN_POLLS = 20  # the leader looks for runs of dead processes every this many polls (10 s)


class Clock:
    """Scheduled tasks of one Agent: the engine API behind ``/clock``, clock_* tools and panel.

    Every method may be called before `start` (the store is opened through the host); only the
    lease holder (`active`) fires scheduled tasks, but any process may create, change, delete
    and `run_now` tasks.
    """

    def __init__(self, host: AgentHost) -> None:
        """Bind the clock to its Agent's host (``agent.host``); nothing runs until `start`."""
        self.host = host
        self.poll_interval = POLL_SECONDS
        self._state = "new"  # new → started | disabled → closed
        self._store: ClockStore | None = None
        self._lease: ClockLease | None = None
        self._scheduler = Scheduler(self._fire)
        self._listeners: Subscribers[ClockEvent] = Subscribers("clock event")
        self._spawned: set[asyncio.Task[Any]] = set()  # scheduled runs and the watcher
        self._running: set[str] = set()  # ids of tasks running in this process
        self._once_running: set[str] = set()  # run-once tasks whose job waits for their run
        self._rev = -1  # the store's edit counter as last seen
        self._revs: dict[str, int] = {}  # task id → revision of its last edit, as last seen
        self._holder: dict[str, Any] | None = None
        self._log_seen = 0  # the newest log entry id looked at (other processes' runs)
        self._others_running: set[int] = set()  # their entries still running, as last seen
        self._lock = asyncio.Lock()  # one start at a time
        # Local edits and the poll of other processes' edits take turns, so neither mistakes
        # the other's change for a foreign one (events are sent after it is released).
        self._edits = asyncio.Lock()
        self._targets: dict[asyncio.Task[Any], str] = {}  # scheduled runs here → their target
        self._stopped: set[asyncio.Task[Any]] = set()  # runs cancelled by a stop of their target

    @property
    def active(self) -> bool:
        """Whether this process holds the clock's lease (and so runs the scheduler)."""
        return self._state == "started" and self._lease is not None and self._lease.held

    async def _open(self, store: Store | None = None) -> ClockStore:
        if self._state == "closed":
            raise ClockError("this clock was closed; create a new Agent")
        if self._store is None:
            db = (store or await self.host.open_store()).db
            self._store = ClockStore(db, self.host.config.clock.max_log_entries)
        return self._store

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

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
            self._lease = open_lease(store or await self.host.open_store())
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
        scope = "this database" if isinstance(self._lease, PostgresLease) else "this data directory"
        return (
            f"clock: standby: {who} holds the clock of {scope}, so this process "
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
        content, an empty target or a negative timeout, and `DuplicateTaskError` (naming the
        task) when the target has a task with the same schedule, title and content.
        ``limited``: the creator is no admin, so the chat limits apply: ``clock.min_interval``
        between runs (unless run-once), and at most ``clock.max_tasks_per_chat`` tasks in the
        target.
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
            for existing in await store.list(fields["target"]):
                if same_task(existing, fields):
                    raise DuplicateTaskError(existing)
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

    # ------------------------------------------------------------------ lease, poll, firing

    async def _take_over(self) -> None:
        """Take the lease if free; the new holder schedules every enabled task."""
        assert self._lease is not None and self._store is not None
        if not await self._lease.acquire():
            holder = await self._lease.holder()
            if holder != self._holder:
                log.info("the clock is held by another process (%s): standing by", holder)
            self._holder = holder
            return
        self._holder = None
        if self._state == "closed":  # closed while the lock was being taken
            await self._lease.release()
            return
        self._scheduler.shutdown()  # a leadership lost earlier left nothing scheduled
        await self._store.mark_interrupted()  # the previous holder may have died mid-run
        async with self._edits:  # an edit made meanwhile is either listed here or applied after
            tasks = await self._store.list()
            now = time.time()
            missed = await asyncio.to_thread(_missed_slots, tasks, self._once_running, now)
            planned = await self._scheduler.start(t for t in tasks if t.enabled)
            await self._store_planned(tasks, dict(planned))
        log.info("clock active: %d task(s) scheduled", len(planned))
        skip = self.host.config.clock.misfire == "skip"
        for task_id, (oldest, newest) in missed.items():
            # Fenced like every fire: a slot the previous leader did record is not run again.
            self._spawn(
                self._fired(task_id, newest, now, oldest, skip=NO_LEADER_ERROR if skip else None),
                f"ania-clock-{task_id}-missed",
            )
        if missed:
            log.warning(
                "clock: %d task(s) had planned fire times pass while no process held the clock; "
                "%s (clock.misfire = %s)",
                len(missed),
                "logged as skipped" if skip else "each runs once now",
                self.host.config.clock.misfire,
            )

    def _step_down(self) -> None:
        """The lease was lost (this process froze, or lost the database): stop firing at once."""
        self._scheduler.shutdown()
        log.warning(
            "clock: lost the lease (this process was frozen or cut off from the store longer "
            "than the lease allows): standing by; fires already recorded still finish"
        )

    async def _store_planned(
        self, tasks: builtins.list[ClockTask], planned: dict[str, Any]
    ) -> None:
        """Write the next fire times that differ from what the rows say."""
        assert self._store is not None
        stale = [
            (t.id, planned.get(t.id))
            for t in tasks
            if t.id not in self._once_running and planned.get(t.id) != t.next_run_at
        ]
        await self._store.set_next_runs(stale)

    async def _watch(self) -> None:
        """Every poll interval: try the lease (standing by) and pick up other processes' edits."""
        polls = 0
        while True:
            await asyncio.sleep(self.poll_interval)
            polls += 1
            try:
                assert self._lease is not None
                lost = self._scheduler.running and not await self._lease.check()
                if lost:
                    # Stand by for a poll: a standby that saw the lease free takes it first,
                    # rather than the process that just found itself cut off or woken.
                    self._step_down()
                elif not self.active:
                    await self._take_over()
                elif polls % ORPHAN_POLLS == 0 and self._store is not None:
                    # A process that died mid-run while another held the clock.
                    await self._store.mark_interrupted()
                await self._sync()
                await self._sync_runs()
            except Exception:
                log.exception("the clock's poll failed; trying again in %g s", self.poll_interval)

    async def _sync(self) -> None:
        """Apply the edits other processes made since the last look."""
        assert self._store is not None
        events: builtins.list[tuple[EventKind, str, ClockTask | None]] = []
        async with self._edits:
            rev = await self._store.revision()
            if rev == self._rev:
                return
            revs = await self._store.revisions()
            self._rev = rev
            changed = [i for i, r in revs.items() if self._revs.get(i) != r]
            gone = [i for i in self._revs if i not in revs]
            known = set(self._revs)
            self._revs = revs
            for task_id in gone:
                self._scheduler.remove(task_id)
                events.append(("task_deleted", task_id, None))
            for task in await self._store.tasks(changed):
                await self._apply(task)
                kind: EventKind = "task_updated" if task.id in known else "task_created"
                events.append((kind, task.id, task))
        for kind, task_id, changed_task in events:
            await self._emit(kind, task_id, task=changed_task)

    async def _sync_runs(self) -> None:
        """Announce the runs other processes started and finished since the last look.

        So a panel in a process standing by shows the results of the runs the holder made.
        """
        assert self._store is not None
        entries, self._log_seen = await self._store.others_runs(
            self._log_seen, sorted(self._others_running)
        )
        for entry in entries:
            if entry.status == "running":
                if entry.id not in self._others_running:
                    self._others_running.add(entry.id)
                    await self._emit("run_started", entry.task_id, entry=entry)
            else:
                self._others_running.discard(entry.id)
                await self._emit("run_finished", entry.task_id, entry=entry)

    async def _apply(self, task: ClockTask) -> None:
        """Schedule (or unschedule) an edited task here, when this process holds the clock."""
        if not self._scheduler.running or task.id in self._once_running:
            return
        planned = self._scheduler.put(task)
        if planned != task.next_run_at:
            assert self._store is not None
            await self._store.set_next_runs([(task.id, planned)])
            task.next_run_at = planned

    def _fire(self, task_id: str, planned: float, oldest: float) -> None:
        """APScheduler's callback (on the loop): start the task's run as a tracked task.

        The run's log entry starts now, when the clock fires, not when the task gets going.
        ``oldest`` < ``planned``: the loop fell behind and this one fire stands for the backlog.
        """
        if self._state != "closed":
            fired = time.time()
            self._spawn(self._fired(task_id, planned, fired, oldest), f"ania-clock-{task_id}")

    async def _fired(
        self, task_id: str, planned: float, fired: float, oldest: float, skip: str | None = None
    ) -> None:
        try:
            entry = await self._run(
                task_id,
                scheduled_at=planned,
                fired_at=fired,
                missed_from=oldest if oldest < planned else None,
                skip=skip,
            )
            if entry is None:
                self._scheduler.remove(task_id)  # deleted or disabled meanwhile (elsewhere)
        except SlotTaken:
            log.debug("clock task %s: the slot %s was fired by another process", task_id, planned)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("clock task %s failed outside its run", task_id)

    async def _run(
        self,
        task_id: str,
        *,
        scheduled_at: float | None,
        fired_at: float | None = None,
        missed_from: float | None = None,
        skip: str | None = None,
    ) -> TaskLogEntry | None:
        """One run of a task: log entry, one-shot run, delivery, run-once bookkeeping.

        None when the task is gone (or, for a scheduled run, disabled); `SlotTaken` when the
        scheduled slot was recorded by another process (nothing ran). ``skip``: only log the
        slot as skipped, with this reason.
        """
        store = await self._open()
        manual = scheduled_at is None
        begun = await store.begin_run(
            task_id,
            trigger_text,
            manual=manual,
            scheduled_at=scheduled_at,
            next_run_at=None if manual else self._scheduler.next_fire(task_id),
            started_at=fired_at,
            missed_from=missed_from,
            skip=skip,
        )
        if begun is None:
            return None
        task, entry = begun
        if entry.status != "running":  # skipped: the task is running already
            await self._emit("run_finished", task.id, task=task, entry=entry)
            return entry
        once = task.run_once and not manual
        if once:
            self._once_running.add(task.id)
            self._scheduler.remove(task.id)  # no second fire until this run decides its fate
        self._running.add(task.id)
        me = asyncio.current_task()
        if not manual and me is not None:
            self._targets[me] = task.target
        await self._emit("run_started", task.id, task=task, entry=entry)
        try:
            outcome = await run_task(self.host, store, task, entry.id)
        except asyncio.CancelledError:
            why = STOPPED_ERROR if me in self._stopped else CLOSED_ERROR
            outcome = Outcome("interrupted", error=why)
            await asyncio.shield(self._finish(task, entry, outcome, once))
            raise
        except Exception as exc:  # a bug must still close the entry
            log.exception("clock task %s failed", task.id)
            outcome = Outcome("error", error=f"internal error: {type(exc).__name__}: {exc}")
        finally:
            if me is not None:
                self._targets.pop(me, None)
                self._stopped.discard(me)
        return await self._finish(task, entry, outcome, once)

    def _on_stop(self, session: str) -> bool:
        """A stop of ``session`` (``/stop``) cancels the scheduled runs that target it."""
        runs = [t for t, target in self._targets.items() if target == session and not t.done()]
        for run in runs:
            self._stopped.add(run)
            run.cancel()
        return bool(runs)

    async def _finish(
        self, task: ClockTask, entry: TaskLogEntry, outcome: Outcome, once: bool
    ) -> TaskLogEntry:
        """Close the entry, delete or disable a run-once task, then deliver the result."""
        assert self._store is not None
        self._running.discard(task.id)
        final = await self._store.finish_run(
            entry.id,
            outcome.status,
            usage=outcome.usage.to_dict(),
            reply=outcome.reply,
            error=outcome.error,
        )
        final = final or entry
        # A run-once task is settled before anyone hears of the result: what they look up then
        # is final (its events still follow run_finished).
        settled = await self._settle_once(task, outcome.status == "success") if once else None
        await self._emit("run_finished", task.id, task=task, entry=final)
        if settled is not None:
            await self._emit(settled[0], task.id, task=settled[1])
        if outcome.delivery and outcome.status != "interrupted":
            await self.host.outbox.publish(
                Delivery(
                    session=task.target,
                    text=outcome.delivery,
                    source="clock",
                    title=task.title,
                    status=outcome.status,
                    # created_by: whom a chat platform mentions with the text (may be empty)
                    meta={"task_id": task.id, "entry_id": entry.id, "created_by": task.created_by},
                )
            )
        return final

    async def _settle_once(
        self, task: ClockTask, succeeded: bool
    ) -> tuple[EventKind, ClockTask] | None:
        """After a scheduled run of a run-once task: delete it, or keep it disabled with its log.

        A task made repeating during its run is scheduled again instead. Returns the event to
        send (the caller sends it after ``run_finished``).
        """
        assert self._store is not None
        event: tuple[EventKind, ClockTask] | None = None
        async with self._edits:
            self._once_running.discard(task.id)
            current = await self._store.get(task.id)
            if current is None:
                return None  # deleted during the run
            if not current.run_once:  # made repeating meanwhile: it goes on
                await self._apply(current)
                event = ("task_updated", current)
            elif succeeded:
                gone = await self._store.delete(task.id, only_run_once=True)
                if gone is not None:
                    self._revs.pop(task.id, None)
                    event = ("task_deleted", gone)
            else:
                done = await self._store.update(
                    task.id, {"enabled": False, "next_run_at": None, "updater": "clock"}
                )
                if done is not None:
                    current, self._revs[task.id] = done
                    await self._apply(current)
                    event = ("task_updated", current)
        return event

    async def _emit(
        self,
        kind: EventKind,
        task_id: str,
        *,
        task: ClockTask | None = None,
        entry: TaskLogEntry | None = None,
    ) -> None:
        await self._listeners.publish(ClockEvent(kind, task_id, task=task, entry=entry), kind)


def _missed_slots(
    tasks: builtins.list[ClockTask], waiting: set[str], now: float
) -> dict[str, tuple[float, float]]:
    """Task id → (oldest, newest) planned times that passed unfired, from the stored next ones.

    Off the loop: a cron schedule's fire times take a moment to list. Run-once tasks waiting
    for their run here, disabled tasks and unusable schedules have none.
    """
    missed: dict[str, tuple[float, float]] = {}
    for task in tasks:
        if not task.enabled or task.next_run_at is None or task.id in waiting:
            continue
        try:
            slots = parse_schedule(task.cron).missed(task.next_run_at, now)
        except ValueError:
            continue
        if slots is not None:
            missed[task.id] = slots
    return missed
