"""Running awaitables side by side so that none outlives the caller.

`asyncio.gather` without ``return_exceptions`` finishes as soon as the first child is cancelled
or fails, while the others are still cleaning up: a stopped run would close its record before a
parallel tool call (or a team member) had ended and added its tokens. `gather_all` waits for
every child, whatever happens, then raises what the first failed child raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["gather_all"]


async def gather_all(*awaitables: Awaitable[T]) -> list[T]:
    """Results in order once every awaitable has ended; else the first child's error is raised.

    A child's failure wins over a sibling's cancellation (a failing call may have cancelled its
    siblings on purpose, e.g. a hook's ``continue: false``). Cancelling the caller cancels every
    child and still waits for all of them to end.
    """
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    failures = [e for e in errors if not isinstance(e, asyncio.CancelledError)]
    if failures or errors:
        raise (failures or errors)[0]
    return results  # type: ignore[return-value]
