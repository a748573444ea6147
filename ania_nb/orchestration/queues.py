"""`SessionQueues`: each session's waiting messages, answered one batch at a time.

A message for an idle session starts the session's worker task; messages that arrive while it
is busy wait (up to ``queue_size``) and are answered together by the next run. Callers may give
up (`withdraw`), users may `stop` a session, and the Agent may `offer` synthetic messages (a
background subagent's result) whose replies nobody awaits: those are handed to ``unawaited``.
At most ``max_running()`` runs of all sessions go at once (0 = no limit); a session whose turn
has not come keeps its worker waiting, so its messages queue as if it were busy, never dropped.
``started``/``idle`` tell the replica's claims (`ania_nb.orchestration.claims`) when a worker
starts and runs dry (``idle`` may find more to answer: the worker goes on).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import SessionBusyError
from ..result import RunResult
from .sessions import Pending, Session, SessionTable

log = logging.getLogger(__name__)

Answer = Callable[[Session, list[Pending]], Coroutine[Any, Any, RunResult]]


class SessionQueues:
    """The message queues of a `SessionTable`'s sessions (see the module docstring)."""

    def __init__(
        self,
        table: SessionTable,
        answer: Answer,
        *,
        queue_size: Callable[[], int],
        cancel_approvals: Callable[[str], object],
        unawaited: Callable[[Session, list[Pending], RunResult], None],
        max_running: Callable[[], int] = lambda: 0,
        finished: Callable[[Session, list[Pending], RunResult], None] | None = None,
        dropped: Callable[[Session, list[Pending]], None] | None = None,
        started: Callable[[Session], None] | None = None,
        idle: Callable[[Session], Coroutine[Any, Any, bool]] | None = None,
    ) -> None:
        self.table = table
        self._answer = answer
        self._queue_size = queue_size
        self._cancel_approvals = cancel_approvals
        self._unawaited = unawaited
        self._max_running = max_running
        # Told of every answered batch and of every message a stop dropped (the durable inbox
        # settles its rows with them).
        self._finished = finished
        self._dropped = dropped
        self.started = started
        self.idle = idle
        self.running = 0  # runs going now, all sessions
        self._waiters: list[asyncio.Future[None]] = []  # workers waiting for a slot, in order

    def submit(self, state: Session, pending: Pending) -> None:
        """Queue a caller's message; `SessionBusyError` when the queue is full."""
        if not self.offer(state, pending):
            raise SessionBusyError(
                f"session {state.name!r} is busy and {len(state.queue)} messages already wait; "
                "try again when the current reply is done (or stop it)",
                session=state.name,
            )

    def offer(self, state: Session, pending: Pending, *, limit: bool = True) -> bool:
        """Queue a message unless the queue is full; start the worker of an idle session.

        ``limit=False`` queues past ``queue_size`` (messages recovered after a restart were
        accepted once already), and so is a resumed run (``pending.resume``): it is no new
        message but work accepted before a restart.
        """
        limit = limit and pending.resume is None
        if limit and state.busy and len(state.queue) >= self._queue_size():
            return False
        state.queue.append(pending)
        if not state.busy:
            if self.started is not None:
                self.started(state)
            state.worker = asyncio.create_task(self._work(state), name=f"ania-session-{state.name}")
        return True

    def withdraw(self, state: Session, pending: Pending) -> None:
        """A caller gave up (cancelled): stop only its own message.

        Queued, it leaves the queue; answered by the running batch, the run is stopped only if
        nobody else still waits for it.
        """
        resolve(pending, RunResult("", "stopped", state.name, error="the caller cancelled"))
        if pending in state.queue:
            state.queue.remove(pending)
        elif pending in state.batch and all(p.future.done() for p in state.batch):
            self._cancel_approvals(state.name)
            if state.current is not None and not state.current.done():
                state.current.cancel()

    def stop(self, session: str) -> bool:
        """Cancel the session's running request and drop its queue; False if nothing ran."""
        state = self.table.get(session)
        if state is None or not state.busy:
            return False
        self._cancel_approvals(session)
        dropped, state.queue = state.queue, []
        for pending in dropped:
            resolve(pending, RunResult("", "stopped", session, error="stopped before it started"))
        if dropped and self._dropped is not None:
            self._dropped(state, dropped)
        if state.current is not None and not state.current.done():
            state.current.cancel()
        return True

    async def aclose(self) -> None:
        """Stop every session and wait for their workers to end."""
        workers = [s.worker for s in self.table if s.worker is not None]
        for state in self.table:
            self.stop(state.name)
        if workers:
            await asyncio.gather(*workers, return_exceptions=True)

    async def _acquire(self) -> None:
        """Wait for a run slot (see ``max_running``) and take it."""
        while (limit := self._max_running()) and self.running >= limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, but leaving: pass the turn on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.running += 1

    def _release(self) -> None:
        """Give a slot back (synchronously: the session is idle as soon as its reply is out)."""
        self.running -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _work(self, state: Session) -> None:
        """Handle the session's queue until it is empty (one run per batch)."""
        while True:
            while state.queue:
                await self._acquire()
                try:
                    await self._answer_next(state)
                finally:
                    self._release()
            if self.idle is not None and await self.idle(state):
                continue
            if not state.queue:  # else a message came while `idle` awaited: answer it too
                return

    async def _answer_next(self, state: Session) -> None:
        """Answer what waits now as one batch (nothing, if a stop emptied the queue meanwhile)."""
        if not state.queue:
            return
        batch, state.queue = _next_batch(state.queue)
        state.batch = batch
        run = asyncio.create_task(self._answer(state, batch), name=f"ania-run-{state.name}")
        state.current = run
        await asyncio.wait([run])
        state.current, state.batch = None, []
        state.last_used = time.monotonic()
        if run.cancelled():
            result = RunResult("", "stopped", state.name, error="stopped by the user")
        elif (exc := run.exception()) is not None:
            log.error("a run of %s failed outside the run path", state.name, exc_info=exc)
            result = RunResult("", "error", state.name, error=f"{type(exc).__name__}: {exc}")
        else:
            result = run.result()
        for pending in batch:
            resolve(pending, result)
        if self._finished is not None:
            self._finished(state, batch, result)
        if all(p.synthetic for p in batch):  # nobody awaits this reply
            self._unawaited(state, batch, result)


def _next_batch(queue: list[Pending]) -> tuple[list[Pending], list[Pending]]:
    """The next batch and what stays queued: a resumed run alone, messages up to the next one."""
    if queue[0].resume is not None:
        return queue[:1], queue[1:]
    cut = next((i for i, p in enumerate(queue) if p.resume is not None), len(queue))
    return queue[:cut], queue[cut:]


def resolve(pending: Pending, result: RunResult) -> None:
    """Give a waiting caller its result (once)."""
    if not pending.future.done():
        pending.future.set_result(result)
