"""`Deliverer`: sends a front end's outbox rows, one at a time per chat, concurrently across chats.

Send at most once, answer at least once: a row is claimed (``pending`` →
``sending``, committed) *before* the front end writes it, then marked by what the front end
says happened (`SendOutcome`):

- ``sent``: done;
- ``unsent``: provably never written (not connected). The row goes back to ``pending`` and the
  chat waits for ``ready()`` (the reconnect) before trying again — unless somebody awaits the
  row (an image a tool sends, an approval card): then it is ``failed`` at once, so the tool
  sees its error instead of hanging;
- ``uncertain``: written, never confirmed (the connection dropped, a timeout). Logged at
  WARNING, never sent again;
- ``failed``: the platform refused it (or rendering it failed). Logged, not retried.

A row found ``sending`` at start is ``uncertain`` (`OutboxLog.recover`, in `Deliverer.start`).

**The cheap path** (what most replies take). A step that writes a row for a chat whose worker
is idle while the front end is connected may write it already claimed (`reserve`, then
`OutboxRow.claimed`: ``sending`` in the step's own transaction, e.g. a run's finish) and hand
the row over after the commit (`handoff`): it is written at once, with no claim of its own.
A crash between that commit and the write leaves the row ``sending`` → ``uncertain``: not sent
again, exactly like a crash between a claim and its write (the window is the same: one hop of
the event loop). Rows confirmed ``sent`` are marked without a transaction of their own when
an event is accepted within `MARK_DELAY` (`OutboxLog.confirm`: the accept's transaction marks
them), else in one batch (`OutboxLog.mark_sent`); one confirmed but not marked yet when the
process dies is ``uncertain`` after the restart: it was written, and is not written again.
Every step that adds a row must `wake` its chat (or hand the row over): a worker looks for
more rows only when woken.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from ..store import OutboxEntry, OutboxLog

log = logging.getLogger(__name__)

SendOutcome = Literal["sent", "unsent", "uncertain", "failed"]
CLOSE_WAIT = 5.0  # seconds `Deliverer.aclose` lets workers write the rows they hold
MARK_DELAY = 0.05  # seconds a sent row waits to be marked with an accepted event's transaction
Send = Callable[[OutboxEntry], Awaitable[tuple[SendOutcome, "str | None"]]]


@dataclass(frozen=True)
class Posted:
    """What became of a posted row: its state (``pending`` when nobody waited) and error."""

    state: str
    error: str | None = None

    @property
    def sent(self) -> bool:
        """Whether the platform confirmed it."""
        return self.state == "sent"


class Deliverer:
    """The sending side of a durable outbox for the sessions ``serves`` accepts."""

    def __init__(
        self,
        log_: OutboxLog,
        send: Send,
        *,
        serves: Callable[[str], bool],
        ready: Callable[[], Awaitable[None]],
        connected: Callable[[], bool] = lambda: True,
    ) -> None:
        """Send ``log_``'s rows of the sessions ``serves`` accepts with ``send``.

        ``ready`` waits until sending can work again (the front end is reconnected);
        ``connected`` says whether it works now (rows are claimed by their step only then).
        """
        self.log = log_
        self.serves = serves
        self._send = send
        self._ready = ready
        self._connected = connected
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._handed: dict[str, asyncio.Future[OutboxEntry | None]] = {}  # reserved chats
        self._marking: asyncio.Task[None] | None = None
        self._dirty: set[str] = set()  # sessions with rows added since their worker last looked
        self._waiters: dict[int, asyncio.Future[Posted]] = {}  # row id -> its final state
        self._stalled: set[str] = set()  # sessions waiting for the reconnect
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    async def start(self) -> list[OutboxEntry]:
        """Mark rows left ``sending`` by a dead process ``uncertain``, then send every pending row.

        Returns the rows found uncertain.
        """
        uncertain = await self.log.recover()
        for entry in uncertain:
            log.warning(
                "outbox row %d to %s (%s) may or may not have been sent before the restart; "
                "it is not sent again",
                entry.id,
                entry.session,
                entry.kind,
            )
        for session in await self.log.sessions_pending():
            if self.serves(session):
                self.wake(session)
        return uncertain

    def wake(self, session: str) -> None:
        """Rows were added for ``session``: make sure its worker sends them (until closed)."""
        if self._closed:
            return  # stored: the next start sends them
        self._dirty.add(session)
        worker = self._workers.get(session)
        if worker is None or worker.done():
            self._idle.clear()
            self._workers[session] = asyncio.create_task(
                self._work(session), name=f"ania-outbox-{session}"
            )

    def reserve(self, session: str) -> bool:
        """Whether the step about to write ``session``'s next row may write it claimed.

        True when the chat's worker is idle and the front end connected: a worker is started
        at once and waits for that row (`handoff`, which the step must call, committed or not).
        """
        if self._closed or session in self._workers or not self._connected():
            return False
        if not self.serves(session):
            return False
        handed = self._handed[session] = asyncio.get_running_loop().create_future()
        self._idle.clear()
        self._workers[session] = asyncio.create_task(
            self._work(session, handed), name=f"ania-outbox-{session}"
        )
        return True

    def handoff(self, session: str, entry: OutboxEntry | None) -> None:
        """The reserved step is over: ``entry`` is its claimed row, None if it wrote none."""
        handed = self._handed.pop(session, None)
        if handed is not None and not handed.done():
            handed.set_result(entry)

    def expect(self, row_id: int) -> asyncio.Future[Posted]:
        """A future of row ``row_id``'s final state (``sent``, ``failed`` or ``uncertain``).

        A row somebody awaits is failed, not kept, when it cannot be written now.
        """
        future = self._waiters.get(row_id)
        if future is None:
            future = self._waiters[row_id] = asyncio.get_running_loop().create_future()
        return future

    @property
    def busy(self) -> bool:
        """Whether any chat's worker is sending (not counting chats waiting for a reconnect)."""
        return not self._idle.is_set()

    async def wait_idle(self) -> None:
        """Return once no chat has rows being sent (pending rows of a disconnected chat wait)."""
        await self._idle.wait()

    def _confirm(self, row_id: int) -> None:
        """Row ``row_id`` was sent: marked by the next accept, else by a batch of its own."""
        self.log.confirm(row_id)
        if self._marking is None:
            self._idle.clear()
            self._marking = asyncio.create_task(self._mark_confirmed(), name="ania-outbox-sent")

    async def _mark_confirmed(self) -> None:
        """Mark what no accept marked within `MARK_DELAY`, one transaction per batch."""
        try:
            while True:
                if not self._closed:
                    await asyncio.sleep(MARK_DELAY)
                batch = self.log.take_confirmed()
                if not batch:
                    break
                try:
                    await self.log.mark_sent(batch)
                except Exception:  # they stay "sending": uncertain after a restart, never resent
                    log.exception("could not mark %d sent outbox row(s) as sent", len(batch))
        finally:
            self._marking = None
            self._check_idle()

    def _check_idle(self) -> None:
        live = [s for s, w in self._workers.items() if not w.done() and s not in self._stalled]
        if live or self._marking is not None:
            self._idle.clear()
        else:
            self._idle.set()

    async def aclose(self) -> None:
        """Stop every worker; a row being sent stays ``sending`` (``uncertain`` at next start).

        Workers holding a claimed row (a handed-over reply too) write it first, for up to
        `CLOSE_WAIT` seconds, and claim nothing more: cancelled between a claim's commit and
        the write, a row that was never written would be lost as ``uncertain``.
        """
        self._closed = True
        holding = [w for s, w in self._workers.items() if s not in self._stalled]
        if holding:
            await asyncio.wait(holding, timeout=CLOSE_WAIT)
        workers = list(self._workers.values())
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if self._marking is not None:  # what was confirmed is marked before the store closes
            await asyncio.gather(self._marking, return_exceptions=True)
        for future in self._waiters.values():
            if not future.done():
                future.set_result(Posted("pending", "the outbox closed"))
        self._idle.set()

    async def _work(
        self, session: str, handed: asyncio.Future[OutboxEntry | None] | None = None
    ) -> None:
        try:
            if handed is not None:
                entry = await handed
                if entry is None:
                    self._dirty.add(session)  # the step wrote no claimed row: look in the store
                else:  # the chat had nothing else to send: more only if woken meanwhile
                    await self._send_from(entry, claim_more=False)
            while session in self._dirty and not self._closed:
                self._dirty.discard(session)
                entry = await self.log.claim(session)
                if entry is not None:
                    await self._send_from(entry, claim_more=True)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store failed: the rows stay, the next wake tries again
            log.exception("the outbox worker of %s failed", session)
        finally:
            if self._workers.get(session) is asyncio.current_task():
                del self._workers[session]
                self._handed.pop(session, None)
            self._stalled.discard(session)
            self._check_idle()

    async def _send_from(self, entry: OutboxEntry | None, *, claim_more: bool) -> None:
        """Send ``entry`` and then the chat's next rows, in order.

        After a row sent, the next one is claimed only with ``claim_more`` (else the worker
        looks again only if woken); after any other outcome its mark claims it.
        """
        while entry is not None:
            session = entry.session
            entry, sent = await self._deliver(entry)
            if sent and claim_more and not self._closed:
                entry = await self.log.claim(session)

    async def _deliver(self, entry: OutboxEntry) -> tuple[OutboxEntry | None, bool]:
        """Send one row and mark it; the next row if its mark claimed one, and if it was sent."""
        while True:
            try:
                outcome, error = await self._send(entry)
            except Exception as exc:  # a front-end bug: the row is not retried blindly
                log.exception("sending outbox row %d to %s failed", entry.id, entry.session)
                outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            if outcome == "unsent" and entry.id not in self._waiters:
                await self.log.mark(entry.id, "pending", error)
                log.info("%s: not connected; outbox row %d waits", entry.session, entry.id)
                self._stalled.add(entry.session)
                self._check_idle()
                try:
                    await self._ready()
                finally:
                    self._stalled.discard(entry.session)
                    self._check_idle()
                if self._closed:
                    return None, False
                again = await self.log.claim(entry.session)
                if again is None:
                    return None, False
                entry = again
                continue
            final = "failed" if outcome == "unsent" else outcome
            if final == "sent":  # the usual case: marked with the next batch, no round trip
                self._confirm(entry.id)
                following = None
            else:
                more = entry.session if not self._closed else None
                following = await self.log.mark(entry.id, final, error, claim_next=more)
            if final == "uncertain":
                log.warning(
                    "outbox row %d to %s (%s) was written but never confirmed (%s); "
                    "it is not sent again",
                    entry.id,
                    entry.session,
                    entry.kind,
                    error,
                )
            elif final == "failed":
                log.warning("outbox row %d to %s failed: %s", entry.id, entry.session, error)
            future = self._waiters.pop(entry.id, None)
            if future is not None and not future.done():
                future.set_result(Posted(final, error))
            return following, final == "sent"
