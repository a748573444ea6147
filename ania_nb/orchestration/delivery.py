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
    ) -> None:
        """Send ``log_``'s rows of the sessions ``serves`` accepts with ``send``.

        ``ready`` waits until sending can work again (the front end is reconnected).
        """
        self.log = log_
        self.serves = serves
        self._send = send
        self._ready = ready
        self._workers: dict[str, asyncio.Task[None]] = {}
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

    def _check_idle(self) -> None:
        live = [s for s, w in self._workers.items() if not w.done() and s not in self._stalled]
        if live:
            self._idle.clear()
        else:
            self._idle.set()

    async def aclose(self) -> None:
        """Stop every worker; a row being sent stays ``sending`` (``uncertain`` at next start)."""
        self._closed = True
        workers = list(self._workers.values())
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for future in self._waiters.values():
            if not future.done():
                future.set_result(Posted("pending", "the outbox closed"))
        self._idle.set()

    async def _work(self, session: str) -> None:
        try:
            while session in self._dirty:
                self._dirty.discard(session)
                entry = await self.log.claim(session)
                while entry is not None:
                    entry = await self._deliver(entry)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store failed: the rows stay, the next wake tries again
            log.exception("the outbox worker of %s failed", session)
        finally:
            if self._workers.get(session) is asyncio.current_task():
                del self._workers[session]
            self._stalled.discard(session)
            self._check_idle()

    async def _deliver(self, entry: OutboxEntry) -> OutboxEntry | None:
        """Send one row and mark it; returns the session's next row, already claimed."""
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
                again = await self.log.claim(entry.session)
                if again is None:
                    return None
                entry = again
                continue
            final = "failed" if outcome == "unsent" else outcome
            following = await self.log.mark(entry.id, final, error, claim_next=entry.session)
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
            return following
