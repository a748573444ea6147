"""`Outbox`: where the results of background work (clock runs, background subagents) go.

Nobody awaits a clock run or a background subagent, so their final text is *published*: every
front end that subscribed (a notebook's clock panel, the chat runner) receives each `Delivery`
and shows or sends what concerns it. Front ends also say which callbacks a session's background
runs may use (images, files, approvals) through `Outbox.callbacks_for`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import NO_CALLBACKS, Callbacks
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
        """Hand ``delivery`` to every subscriber; returns how many took it (failures are logged)."""
        reached = await self._subscribers.publish(delivery, delivery.source)
        if not reached:
            log.info("%s result for %s had no subscriber", delivery.source, delivery.session)
        return reached
