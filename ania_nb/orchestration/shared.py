"""`SharedChanges`: notice what another process changed in the shared store, by polling counters.

Replicas of one agent (``ania-nb serve`` processes on one PostgreSQL, or two processes on one
SQLite data directory) each run their own MCP servers and skill registry. A change made through
one of them (``mcp_add``/``mcp_remove``, ``skill_install``/``skill_remove``) bumps a counter in
the store's ``revisions`` namespace; every process reads those counters every
``store.sync_interval`` seconds (one small query) and, for each one that moved, runs its handler
(apply the shared MCP servers, reload the skills folder). A handler that fails is logged and
tried again at the next poll. The process that made the change runs the handler too: the
handlers are idempotent, and skipping "our own" bump could hide another process's bump made
in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..store import KVNamespace

log = logging.getLogger(__name__)

Handler = Callable[[], Awaitable[None]]


class SharedChanges:
    """Polls the store's revision counters and runs the handler of each one that changed."""

    def __init__(self, revisions: KVNamespace, interval: float) -> None:
        """Watch ``revisions`` (the store's ``revisions`` namespace) every ``interval`` seconds."""
        self.revisions = revisions
        self.interval = interval
        self._handlers: dict[str, Handler] = {}
        self._seen: dict[str, object] = {}
        self._task: asyncio.Task[None] | None = None

    def on(self, key: str, handler: Handler) -> None:
        """Run ``handler`` whenever the counter ``key`` changes."""
        self._handlers[key] = handler

    async def start(self) -> None:
        """Take the counters as they are now (what this process loaded) and start polling."""
        if self._task is not None or not self._handlers:
            return
        self._seen = dict(await self.revisions.items())
        self._task = asyncio.create_task(self._poll(), name="ania-shared-changes")

    async def check(self) -> None:
        """Run the handlers of the counters that moved since the last check."""
        now = dict(await self.revisions.items())
        for key, handler in sorted(self._handlers.items()):
            if now.get(key) == self._seen.get(key):
                continue
            try:
                await handler()
            except Exception:
                log.exception("applying the shared %s changes failed; trying again", key)
                continue
            self._seen[key] = now.get(key)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # the store is away: try again next time
                log.warning("checking the store for shared changes failed", exc_info=True)

    async def aclose(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
