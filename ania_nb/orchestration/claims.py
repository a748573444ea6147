"""`SessionClaims`: how one replica shares the answering of chat sessions with the others.

With several replicas on one PostgreSQL store (`ania_nb.store.replicas`), every replica stores
every event and exactly one insert wins; the rules below make sure exactly one replica answers
each session at a time, and that nothing stored is left unanswered when a replica dies:

- a stored row is dispatched (queued for a run, or a command answered) only by the replica that
  holds its session's claim. The replica that stored it claims the session when it is free
  (`take`: claim, dispatch every pending row of the session in order, release when nothing of it
  runs); when another replica holds it, the holder is notified and dispatches the row itself
  (`notified`) — in its next batch, or as the verdict its run waits for;
- a session worker holds a reference for as long as it runs (`worker_started`, `worker_idle`);
  when the worker runs dry it releases the claim, then looks again for rows stored meanwhile
  (a row stored just before the release is never stranded);
- `sweep` (every `SWEEP_SECONDS`): sessions with rows nobody touched for `SWEEP_AGE` seconds
  and no live holder are taken over — a dead replica's cut-off runs are re-run or announced
  under the claim, so exactly once — and outbox rows nobody sends are woken; runs and
  subagents of dead replicas end ``interrupted``.

A replica's cached conversation of a session is dropped whenever it (re)claims the session:
another replica may have answered it meanwhile. On SQLite (`Replica.shared` False) there is one
replica and none of this is needed; only the periodic sweep of dead processes' runs remains.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .spec import Conversation

if TYPE_CHECKING:  # pragma: no cover
    from ..store import InboxEntry, Store
    from ..store.replicas import Replica
    from .sessions import Session, SessionTable

log = logging.getLogger("ania_nb.replicas")

SWEEP_SECONDS = 1.0  # between sweeps of a shared store
LOCAL_SWEEP_SECONDS = 30.0  # between sweeps of dead processes' runs on SQLite
SWEEP_AGE = 1.0  # an inbox row untouched this long with no live holder is taken over
OUTBOX_AGE = 2.0  # an outbox row pending this long is sent by whoever sees it
DEAD_EVERY = 3  # sweeps between looks for dead claimers of outbox rows and subagents
MAX_REMEMBERED = 10_000  # dispatched row ids remembered per session while it stays claimed
MAX_PULLS = 5  # rounds of "release, look again, claim" before a worker leaves it to the sweep


class SessionClaims:
    """One replica's claims on sessions (see the module docstring)."""

    def __init__(
        self,
        replica: Replica,
        store: Store,
        sessions: SessionTable,
        *,
        dispatch: Callable[[InboxEntry], Awaitable[None]],
        route_ignored: Callable[[InboxEntry], Awaitable[bool]],
        recover_session: Callable[[str], Awaitable[None]],
        settled: Callable[[], Awaitable[None]],
        dead_work: Callable[[], Awaitable[None]],
        wake_outbox: Callable[[str], None],
    ) -> None:
        """Bind the replica to the Agent's sessions; ``dispatch`` queues or answers one row."""
        self.replica = replica
        self._store = store
        self._sessions = sessions
        self._dispatch = dispatch
        self._route_ignored = route_ignored
        self._recover_session = recover_session
        self._settled = settled
        self._dead_work = dead_work
        self._wake_outbox = wake_outbox
        # Rows dispatched here since the session was last claimed afresh: a row is dispatched
        # once per claim, even when a notification read it as pending just before its run
        # answered it (a stale read must not answer it twice).
        self._dispatched: dict[str, dict[int, None]] = {}
        self._chores: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.taken_over = 0  # sessions whose dead replica's rows this one answered

    @property
    def shared(self) -> bool:
        """Whether other replicas answer sessions of this store too."""
        return self.replica.shared

    # ------------------------------------------------------------------ taking a session

    async def take(self, session: str, *, recover: bool = False) -> bool:
        """Claim ``session`` and dispatch its pending rows; False when another replica holds it.

        ``recover``: first resolve rows whose run a dead replica left (re-run or announce).
        The claim stays with the session's worker if one started; else it is released.
        """
        fresh = not self.replica.held(session)
        if not await self.replica.claim(session):
            return False
        try:
            if fresh:
                self._claimed_afresh(session)
            if recover:
                await self._recover_session(session)
            await self._pull(session)
        finally:
            await self.replica.release(session)
        return True

    def _claimed_afresh(self, session: str) -> None:
        """The session was not held here: forget what was dispatched, drop the cached history."""
        self._dispatched.pop(session, None)
        state = self._sessions.get(session)
        if state is not None and not state.busy:
            state.conversation = Conversation()  # another replica may have answered since

    def dispatching(self, session: str, inbox_id: int) -> bool:
        """Note that row ``inbox_id`` is dispatched now; False when it was already (skip it)."""
        seen = self._dispatched.setdefault(session, {})
        state = self._sessions.get(session)
        if inbox_id in seen or (state is not None and inbox_id in _inbox_ids(state)):
            return False
        seen[inbox_id] = None
        if len(seen) > MAX_REMEMBERED:
            del seen[next(iter(seen))]
        return True

    async def _pull(self, session: str) -> int:
        """Dispatch the session's pending rows that are not queued here yet, oldest first."""
        dispatched = 0
        for entry in await self._store.inbox.list(states=["pending"], session=session):
            if self.dispatching(session, entry.id):
                await self._dispatch(entry)
                dispatched += 1
        return dispatched

    # ------------------------------------------------------------------ session workers

    def worker_started(self, state: Session) -> None:
        """A worker starts for ``state``: it holds a reference on the claim while it runs."""
        state.claimed = self.replica.hold(state.name)
        if not state.claimed and any(p.inbox_id is not None for p in state.queue):
            log.warning("%s: a stored message was queued without the session's claim", state.name)

    async def worker_idle(self, state: Session) -> bool:
        """The worker ran dry: release the claim; True when there is more to answer here."""
        for _ in range(MAX_PULLS):
            if not state.claimed:
                return False
            state.claimed = False
            await self._settled()  # the batch's rows are answered before another may look
            await self.replica.release(state.name)
            waiting = any(p.inbox_id is not None for p in state.queue)
            if not waiting:
                waiting = bool(
                    await self._store.inbox.list(states=["pending"], session=state.name, limit=1)
                )
            if not waiting:
                return bool(state.queue)
            fresh = not self.replica.held(state.name)
            if not await self.replica.claim(state.name):
                # Another replica holds the session now: it answers the stored rows.
                state.queue = [p for p in state.queue if p.inbox_id is None]
                return bool(state.queue)
            state.claimed = True
            if fresh:  # released for a moment: another replica may have answered meanwhile
                self._claimed_afresh(state.name)
                state.conversation = Conversation()
            if await self._pull(state.name) or state.queue:
                return True
        return bool(state.queue)  # rows that would not dispatch: the sweep tries again

    # ------------------------------------------------------------------ notifications

    def notified(self, session: str, inbox_id: int) -> None:
        """Another replica stored row ``inbox_id`` for ``session``: answer it if held here."""
        if not self.replica.held(session):
            return  # not ours: its replica took the session, or the sweep will
        task = asyncio.ensure_future(self._on_notified(session, inbox_id))
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _on_notified(self, session: str, inbox_id: int) -> None:
        if not self.replica.hold(session):
            return
        try:
            entry = await self._store.inbox.get(inbox_id)
            if entry is None or entry.state not in ("pending", "ignored"):
                return
            if not self.dispatching(session, entry.id):
                return  # dispatched here already (its run may have answered it meanwhile)
            if entry.state == "ignored":
                await self._route_ignored(entry)  # perhaps the verdict a run here waits for
            else:
                await self._dispatch(entry)
        except Exception:
            log.exception("%s: a message stored by another replica was not taken", session)
        finally:
            await self.replica.release(session)

    # ------------------------------------------------------------------ sweeping

    def start(self) -> None:
        """Start the periodic sweep."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="ania-replica-sweep")

    async def _sweep_forever(self) -> None:
        every = SWEEP_SECONDS if self.shared else LOCAL_SWEEP_SECONDS
        round_ = 0
        while True:
            await asyncio.sleep(every)
            round_ += 1
            try:
                await self.sweep(dead=round_ % DEAD_EVERY == 0 or not self.shared)
            except Exception:
                log.exception("the sweep for cut-off work failed (tried again shortly)")

    async def sweep(self, *, age: float = SWEEP_AGE, dead: bool = True) -> int:
        """Take over what no live replica answers; returns how many sessions were taken."""
        await self._store.runs.mark_interrupted()  # runs of dead processes (replicas: exact)
        if dead:
            await self._dead_work()
        if not self.shared:
            return 0
        locked = await self.replica.locked_sessions()
        from ..store.owner import lock_key

        taken = 0
        for session in await self._store.inbox.sessions_waiting(age):
            if self.replica.held(session) or lock_key(session) in locked:
                continue
            if await self.take(session, recover=True):
                taken += 1
        for session in await self._store.outbox.sessions_pending(older_than=OUTBOX_AGE):
            self._wake_outbox(session)
        if taken:
            self.taken_over += taken
            log.info("took over %d session(s) no live replica was answering", taken)
        return taken

    async def aclose(self) -> None:
        """Stop sweeping and handling notifications (the replica closes with the store)."""
        self.replica.on_notified(None)
        tasks = [t for t in (self._sweeper, *self._chores) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._sweeper = None


def _inbox_ids(state: Session) -> set[int]:
    """Inbox rows queued or being answered in this process for ``state``."""
    return {p.inbox_id for p in (*state.queue, *state.batch) if p.inbox_id is not None}
