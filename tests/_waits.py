"""Waiting in async tests without sleeping and hoping: poll a condition, bounded."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


async def until(
    predicate: Callable[[], Any], what: str, limit: float = 10.0, step: float = 0.01
) -> None:
    """Yield to the loop until ``predicate()`` holds (bounded, so a hang fails the test).

    ``predicate`` may be async (e.g. a store read): its result is awaited.
    """
    for _ in range(int(limit / step)):
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        await asyncio.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")
