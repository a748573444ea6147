"""engine.concurrency.gather_all: no child outlives the caller; a failure beats a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from ania_nb.engine.concurrency import gather_all


async def test_results_come_in_order() -> None:
    async def value(v: int) -> int:
        await asyncio.sleep(0)
        return v

    assert await gather_all(value(1), value(2), value(3)) == [1, 2, 3]


async def test_a_failing_child_is_raised_only_once_its_siblings_have_ended() -> None:
    sibling_ended = asyncio.Event()
    release = asyncio.Event()

    async def fails() -> None:
        raise ValueError("boom")

    async def slow() -> None:
        await release.wait()
        sibling_ended.set()

    async def release_soon() -> None:
        await asyncio.sleep(0.01)
        release.set()

    releaser = asyncio.ensure_future(release_soon())
    with pytest.raises(ValueError, match="boom"):
        await gather_all(fails(), slow())
    assert sibling_ended.is_set()  # plain asyncio.gather would have returned first
    await releaser


async def test_cancelling_the_caller_waits_for_every_childs_clean_up() -> None:
    started = asyncio.Event()
    cleaned: list[str] = []

    async def child(name: str) -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # clean-up that takes a moment (a store write)
            cleaned.append(name)
            raise

    caller = asyncio.ensure_future(gather_all(child("a"), child("b")))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert sorted(cleaned) == ["a", "b"]


async def test_a_failure_wins_over_a_siblings_cancellation() -> None:
    victim: asyncio.Task[None] | None = None

    async def sleeper() -> None:
        nonlocal victim
        victim = asyncio.current_task()
        await asyncio.Event().wait()

    async def stopper() -> None:
        await asyncio.sleep(0)
        assert victim is not None
        victim.cancel()  # like a hook's continue: false cancelling the run's other calls
        raise RuntimeError("stopped by a hook")

    with pytest.raises(RuntimeError, match="stopped by a hook"):
        await gather_all(sleeper(), stopper())
