"""APScheduler 3 on the running event loop: one job per enabled task, fired on the loop itself.

The scheduler's own asyncio executor would wrap every fire in an extra task (and run plain
functions on a thread pool); `_LoopExecutor` instead calls the fire callback right where
APScheduler processes due jobs — already on the loop — and the callback only starts the
clock's own tracked task. Overlaps are the clock's business (they are logged as ``skipped``),
so APScheduler's instance limit never trips; late fires still run (no misfire grace limit)
and a backlog after a stall fires once: `_LoopExecutor` coalesces it itself, so the fire knows
the oldest slot it stands for. Planned times are kept to the millisecond, so every process
computes the same key for a slot (`ania_nb.clock.store` fences fires on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from apscheduler.executors.base import BaseExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import BaseScheduler

from .schedule import Schedule, parse_schedule

if TYPE_CHECKING:  # pragma: no cover
    from .model import ClockTask

log = logging.getLogger(__name__)

FireCallback = Callable[[str, float, float], None]  # (task id, planned, oldest due)
START_BATCH = 50  # jobs added between two looks at the loop (each batch holds it ~15-40 ms)


class _LoopExecutor(BaseExecutor):  # type: ignore[misc]
    """Call the job's function synchronously on the loop with the newest and oldest due times.

    APScheduler's own coalescing would keep only the newest; a backlog (the loop stalled, the
    process was frozen) arrives here whole and fires once, standing for all of it.
    """

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        try:
            job.func(*job.args, slot_time(run_times[-1]), slot_time(run_times[0]))
        except BaseException:
            self._run_job_error(job.id, *sys.exc_info()[1:])
        else:
            self._run_job_success(job.id, [])


class _LoopScheduler(AsyncIOScheduler):  # type: ignore[misc]
    """``AsyncIOScheduler`` whose timer processes the due jobs in the timer callback itself.

    The stock timer calls the thread-safe ``wakeup``, which queues the work through the loop's
    self-pipe for one more loop iteration; on a busy loop that hop adds a whole iteration to
    the lateness of every fire. The clock only touches the scheduler from the loop.
    """

    def _start_timer(self, wait_seconds: float | None) -> None:
        self._stop_timer()
        if wait_seconds is not None:
            self._timeout = self._eventloop.call_later(wait_seconds, self._wake_on_loop)

    def _wake_on_loop(self) -> None:
        self._stop_timer()
        self._start_timer(self._process_jobs())


class Scheduler:
    """The jobs of the enabled tasks on an ``AsyncIOScheduler`` bound to the running loop."""

    def __init__(self, fire: FireCallback) -> None:
        """``fire(task_id, planned, oldest)`` is called on the loop when a task is due.

        ``planned`` is the newest due planned time (epoch seconds), ``oldest`` the oldest one
        not fired yet (the same unless the loop fell behind).
        """
        self._fire = fire
        self._aps: _LoopScheduler | None = None

        def due(task_id: str, planned: float = 0.0, oldest: float = 0.0) -> None:
            self._fire(task_id, planned, oldest)  # `_LoopExecutor` passes the times

        # APScheduler checks the function's signature for every job it adds; computed once
        # here, that check stops being a quarter of the start-up time with many tasks.
        due.__signature__ = inspect.signature(due)  # type: ignore[attr-defined]
        self._due = due
        self._signatures: dict[str, str] = {}  # task id → the schedule its job was made from

    @property
    def running(self) -> bool:
        """Whether the scheduler is started."""
        return self._aps is not None

    def __len__(self) -> int:
        """How many tasks have a job."""
        return len(self._signatures)

    async def start(self, tasks: Iterable[ClockTask]) -> list[tuple[str, float | None]]:
        """Start on the running loop with jobs for ``tasks``; returns their next fire times.

        The jobs are added while the scheduler is paused, a batch at a time with the loop free
        in between, so thousands of tasks never hold the loop up for long.
        """
        aps = _LoopScheduler(
            executors={"default": _LoopExecutor()},
            job_defaults={"coalesce": False, "misfire_grace_time": None, "max_instances": 1},
        )
        self._aps = aps
        aps.start(paused=True)
        for n, task in enumerate(tasks, 1):
            if self._aps is not aps:
                return []  # shut down meanwhile
            self.put(task)
            if n % START_BATCH == 0:
                await asyncio.sleep(0)
        if self._aps is not aps:
            return []
        aps.resume()
        return [(task_id, self.next_fire(task_id)) for task_id in self._signatures]

    def shutdown(self) -> None:
        """Stop firing and drop every job (nothing keeps running: fires are synchronous)."""
        aps, self._aps = self._aps, None
        self._signatures.clear()
        if aps is not None and aps.running:
            # AsyncIOScheduler.shutdown would defer the work to a later loop callback; we are on
            # the loop, so shut down now. Without jobs, a wakeup still queued finds nothing to do.
            aps.remove_all_jobs()
            BaseScheduler.shutdown(aps, wait=False)
            aps._stop_timer()

    def put(self, task: ClockTask) -> float | None:
        """(Re)schedule ``task`` — or unschedule it when disabled; returns its next fire time.

        A task whose schedule and enabled state did not change keeps its job (and so its
        ``@every`` rhythm).
        """
        if self._aps is None:
            return None
        if not task.enabled:
            self.remove(task.id)
            return None
        if self._signatures.get(task.id) == task.cron:
            return self.next_fire(task.id) if self._aps.running else None
        try:
            schedule = parse_schedule(task.cron)
        except ValueError as exc:  # stored by hand or an older version: keep it unscheduled
            log.warning("clock task %s has an unusable schedule: %s", task.id, exc)
            self.remove(task.id)
            return None
        trigger = schedule.trigger(_anchor(schedule, task))
        self._aps.add_job(
            self._due,
            trigger,
            args=(task.id,),
            id=task.id,
            name=task.title or task.id,
            replace_existing=True,
        )
        self._signatures[task.id] = task.cron
        # Before `start` the job waits in APScheduler's pending list, where every lookup is a
        # scan: `start` asks for the fire times once the jobs are in the job store.
        return self.next_fire(task.id) if self._aps.running else None

    def remove(self, task_id: str) -> None:
        """Drop the task's job, if it has one."""
        if self._signatures.pop(task_id, None) is not None and self._aps is not None:
            with contextlib.suppress(JobLookupError):
                self._aps.remove_job(task_id)

    def next_fire(self, task_id: str) -> float | None:
        """When the task fires next (epoch seconds), or None when it has no job."""
        if self._aps is None or task_id not in self._signatures:
            return None
        job = self._aps.get_job(task_id)
        when = getattr(job, "next_run_time", None)
        return None if when is None else slot_time(when)

    def scheduled(self) -> set[str]:
        """The ids of the tasks that have a job."""
        return set(self._signatures)


def slot_time(when: datetime) -> float:
    """A planned fire time as the clock keys it: epoch seconds to the millisecond."""
    return round(when.timestamp(), 3)


def _anchor(schedule: Schedule, task: ClockTask) -> float | None:
    """Where an ``@every`` rhythm starts: the stored next fire time.

    So a restart, or another process taking over, keeps the planned times (from a past one the
    rhythm goes on with the next beat after now).
    """
    if schedule.every is None:
        return None
    return task.next_run_at
