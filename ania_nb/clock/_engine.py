"""The clock's machinery behind `Clock`: lease and poll, firing, one run's bookkeeping.

`Clock` (the package's public class) adds the API on top of `ClockEngine`; the state lives
here. Only the lease holder has a running `Scheduler`; every process polls the task table
(`poll_interval`) for other processes' edits and, while standing by, for a free lease.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..orchestration import Delivery
from ..orchestration.subscribers import Subscribers
from .lease import Lease
from .model import ClockError, ClockEvent, ClockTask, EventKind, TaskLogEntry
from .runner import CLOSED_ERROR, STOPPED_ERROR, Outcome, run_task, trigger_text
from .scheduler import Scheduler
from .store import ClockStore

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration import AgentHost
    from ..store import Store

log = logging.getLogger("ania_nb.clock")

POLL_SECONDS = 2.0  # how often edits of other processes are picked up and a free lease is tried
ORPHAN_POLLS = 15  # the holder looks for runs of dead processes every this many polls


class ClockEngine:
    """The clock's state and internals (see `Clock` for the API)."""

    def __init__(self, host: AgentHost) -> None:
        """Bind the clock to its host (the Agent); nothing runs until `start`."""
        self.host = host
        self.poll_interval = POLL_SECONDS
        self._state = "new"  # new → started | disabled → closed
        self._store: ClockStore | None = None
        self._lease: Lease | None = None
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
        await self._store.mark_interrupted()  # the previous holder may have died mid-run
        async with self._edits:  # an edit made meanwhile is either listed here or applied after
            tasks = await self._store.list()
            planned = await self._scheduler.start(t for t in tasks if t.enabled)
            await self._store_planned(tasks, dict(planned))
        log.info("clock active: %d task(s) scheduled", len(planned))

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
                if not self.active:
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

    def _fire(self, task_id: str, planned: float) -> None:
        """APScheduler's callback (on the loop): start the task's run as a tracked task.

        The run's log entry starts now, when the clock fires, not when the task gets going.
        """
        if self._state != "closed":
            fired = time.time()
            self._spawn(self._fired(task_id, planned, fired), f"ania-clock-{task_id}")

    async def _fired(self, task_id: str, planned: float, fired: float) -> None:
        try:
            if await self._run(task_id, scheduled_at=planned, fired_at=fired) is None:
                self._scheduler.remove(task_id)  # deleted or disabled meanwhile (elsewhere)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("clock task %s failed outside its run", task_id)

    async def _run(
        self, task_id: str, *, scheduled_at: float | None, fired_at: float | None = None
    ) -> TaskLogEntry | None:
        """One run of a task: log entry, one-shot run, delivery, run-once bookkeeping.

        None when the task is gone (or, for a scheduled run, disabled).
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
        """Close the entry, deliver the result, then delete or disable a run-once task."""
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
        await self._emit("run_finished", task.id, task=task, entry=final)
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
        if once:
            await self._settle_once(task, outcome.status == "success")
        return final

    async def _settle_once(self, task: ClockTask, succeeded: bool) -> None:
        """After a scheduled run of a run-once task: delete it, or keep it disabled with its log.

        A task made repeating during its run is scheduled again instead.
        """
        assert self._store is not None
        event: tuple[EventKind, ClockTask] | None = None
        async with self._edits:
            self._once_running.discard(task.id)
            current = await self._store.get(task.id)
            if current is None:
                return  # deleted during the run
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
        if event is not None:
            await self._emit(event[0], task.id, task=event[1])

    async def _emit(
        self,
        kind: EventKind,
        task_id: str,
        *,
        task: ClockTask | None = None,
        entry: TaskLogEntry | None = None,
    ) -> None:
        await self._listeners.publish(ClockEvent(kind, task_id, task=task, entry=entry), kind)
