"""`Subscribers`: functions (sync or async) handed every item published, each in turn.

The outbox publishes deliveries and the clock its events through one of these; a subscriber
that fails is logged and the others still get the item.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")


class Subscribers(Generic[Item]):
    """The subscribers of one kind of item (``what`` names it in the log)."""

    def __init__(self, what: str) -> None:
        """Start with no subscribers."""
        self.what = what
        self._fns: list[Callable[[Item], Any]] = []

    def subscribe(self, fn: Callable[[Item], Any]) -> Callable[[], None]:
        """Call ``fn`` (sync or async) with every item; returns the function that removes it."""
        self._fns.append(fn)

        def unsubscribe() -> None:
            if fn in self._fns:
                self._fns.remove(fn)

        return unsubscribe

    def __len__(self) -> int:
        return len(self._fns)

    async def publish(self, item: Item, label: str = "") -> int:
        """Hand ``item`` to every subscriber in turn; returns how many took it without failing.

        ``label`` (e.g. the item's kind) goes into the log line of a failure.
        """
        reached = 0
        for fn in list(self._fns):
            try:
                result = fn(item)
                if inspect.isawaitable(result):
                    await result
                reached += 1
            except Exception:
                log.exception("a subscriber failed to take a %s %s", label, self.what)
        return reached
