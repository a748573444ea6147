"""`Outbox`: where the results of background work (clock runs, background subagents) go.

Nobody awaits a clock run or a background subagent, so their final text is *published*: every
front end that subscribed (a notebook's clock panel) receives each `Delivery` and shows what
concerns it. Front ends also say which callbacks a session's background runs may use (images,
files, approvals) through `Outbox.callbacks_for`.

**Durable delivery.** A front end that sends to a chat platform (the runner) registers a
`Deliverer` for the sessions it serves (`Outbox.serve`). From then on every message for those
sessions is an ``outbox`` row in the store before it is sent: what `post` writes (notices, a
command's answer, what a run's callbacks send), what `publish` is handed (clock and background
results), and the reply rows a run's finish step writes itself (`main_turn`). The deliverer
sends them per chat in id order (see `ania_nb.orchestration.delivery`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import NO_CALLBACKS, Callbacks
from ..store import InboxState, OutboxLog, OutboxRow
from .delivery import Deliverer, Posted
from .subscribers import Subscribers

if TYPE_CHECKING:  # pragma: no cover
    from ..result import RunResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """A finished piece of background work for a session's front end.

    ``source`` is ``clock`` or ``subagent``; ``status`` the run's (success, timeout, error, …);
    ``meta`` carries source-specific details (a task id, a log entry id, a child id).
    """

    session: str
    text: str
    source: str
    title: str = ""
    status: str = "success"
    meta: dict[str, Any] = field(default_factory=dict)


def delivery_payload(delivery: Delivery) -> dict[str, Any]:
    """A delivery as an outbox row's payload (JSON)."""
    return {
        "text": delivery.text,
        "source": delivery.source,
        "title": delivery.title,
        "status": delivery.status,
        "meta": delivery.meta,
    }


def delivery_of(session: str, payload: dict[str, Any]) -> Delivery:
    """The delivery an outbox row's payload holds (the inverse of `delivery_payload`)."""
    return Delivery(
        session,
        str(payload.get("text") or ""),
        str(payload.get("source") or ""),
        title=str(payload.get("title") or ""),
        status=str(payload.get("status") or "success"),
        meta=dict(payload.get("meta") or {}),
    )


def reply_delivery(session: str, source: str, result: RunResult) -> Delivery:
    """The delivery of a reply nobody awaits (to a message injected by ``source``)."""
    return Delivery(
        session,
        result.text if result.ok else str(result),
        source,
        title=f"reply to a {source} message",
        status=result.status,
        meta={"run_id": result.run_id},
    )


def _no_callbacks(session: str) -> Callbacks:
    return NO_CALLBACKS


class Outbox:
    """Publish/subscribe of `Delivery` objects, plus the front end's background callbacks."""

    def __init__(self) -> None:
        self._subscribers: Subscribers[Delivery] = Subscribers("delivery")
        self._publishing: set[asyncio.Task[int]] = set()  # `publish_soon`'s, kept alive
        # The front end's callbacks for a session's background runs; none by default.
        self.callbacks_for: Callable[[str], Callbacks] = _no_callbacks
        self.deliverer: Deliverer | None = None  # the durable sender (see the module)

    def serve(self, deliverer: Deliverer) -> None:
        """Send every message for the sessions ``deliverer.serves`` through it (durably)."""
        self.deliverer = deliverer

    def durable(self, session: str) -> bool:
        """Whether messages for ``session`` go through the durable outbox."""
        return self.deliverer is not None and self.deliverer.serves(session)

    async def post(
        self,
        delivery: Delivery,
        *,
        kind: str,
        answers: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Posted:
        """Store ``delivery`` as an outbox row of ``kind`` and have it sent.

        ``answers`` are inbox rows this message answers: they become ``answered`` in the same
        transaction. With ``wait``, returns once the row is final (``sent``, ``failed``,
        ``uncertain``: a row that cannot be written now fails instead of waiting for a
        reconnect); else at once, ``pending``. Needs a durable session (`durable`).
        """
        deliverer = self.deliverer
        if deliverer is None or not deliverer.serves(delivery.session):
            raise RuntimeError(f"no durable outbox serves {delivery.session!r}")
        row = OutboxRow(delivery.session, kind, delivery_payload(delivery))
        effects = [InboxState(answers, "answered")] if answers else []
        row_id = await deliverer.log.add(row, effects)
        future = deliverer.expect(row_id) if wait else None
        deliverer.wake(delivery.session)
        return await future if future is not None else Posted("pending")

    def reserve(self, session: str) -> bool:
        """Whether the step about to write ``session``'s next row may write it claimed.

        Then the step must call `handoff` once it is over (`Deliverer.reserve`).
        """
        return self.deliverer is not None and self.deliverer.reserve(session)

    def handoff(self, row: OutboxRow, row_id: int | None) -> None:
        """A step wrote ``row`` as ``row_id`` (None: it failed): send it.

        A claimed row goes to the worker waiting for it; another one wakes its chat.
        """
        if self.deliverer is None:
            return
        if row.claimed:
            entry = OutboxLog.entry(row, row_id) if row_id is not None else None
            self.deliverer.handoff(row.session, entry)
            return
        self.deliverer.handoff(row.session, None)  # a reservation not used: look in the store
        if row_id is not None:
            self.woken(row.session)

    def woken(self, session: str) -> None:
        """Rows for ``session`` were written by another step (a run's finish): send them."""
        if self.deliverer is not None and self.deliverer.serves(session):
            self.deliverer.wake(session)

    @property
    def log(self) -> OutboxLog | None:
        """The store's outbox table, once a deliverer serves it."""
        return self.deliverer.log if self.deliverer is not None else None

    def subscribe(self, fn: Callable[[Delivery], Any]) -> Callable[[], None]:
        """Call ``fn`` (sync or async) with every delivery; returns the unsubscribe function."""
        return self._subscribers.subscribe(fn)

    @property
    def subscribers(self) -> int:
        """How many subscribers there are."""
        return len(self._subscribers)

    def publish_soon(self, delivery: Delivery) -> None:
        """Publish from synchronous code (on the loop): `publish` in a task of its own."""
        task = asyncio.ensure_future(self.publish(delivery))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def publish(self, delivery: Delivery) -> int:
        """Hand ``delivery`` to every subscriber; returns how many took it (failures are logged).

        A durable session's delivery is stored and sent by the deliverer too (counted once).
        """
        reached = await self._subscribers.publish(delivery, delivery.source)
        if self.durable(delivery.session):
            try:
                await self.post(delivery, kind=delivery.source or "text")
                reached += 1
            except Exception:
                log.exception(
                    "could not store the %s result for %s", delivery.source, delivery.session
                )
        if not reached:
            log.info("%s result for %s had no subscriber", delivery.source, delivery.session)
        return reached
