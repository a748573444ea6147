"""Three clock replicas on one PostgreSQL database (issue 31): failover and fencing, for real.

Each replica is a process (tests/clock_replica.py) with a data directory of its own and the
suite's PostgreSQL cluster as its store; a task fires ``@every 1s`` against the scripted model.
The leader is killed (kill -9), then the next one frozen (SIGSTOP, past the lease's idle timeout)
and woken (SIGCONT). Every planned slot from the first fire to the last must then have exactly
one task-log entry standing for it — its own, or a late fire's or skip's ``missed_from`` range —
none twice, and every run that started reached the model once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _waits import until

from ania_nb.clock import POLL_SECONDS
from ania_nb.clock.lease import LEADER_IDLE_TIMEOUT
from ania_nb.clock.store import ClockStore
from ania_nb.store import Store
from ania_nb.testing import ScriptedLLM, reply

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).with_name("clock_replica.py")
PERIOD = 1.0
# The documented bounds (README "Run several replicas"), from the moment of the kill or freeze
# to the next fire: a kill -9 frees the lease at once, a standby takes it at its next poll and
# fires the missed slot late; a frozen leader's session ends LEADER_IDLE_TIMEOUT after its last
# heartbeat (a poll before the freeze at most).
KILL_BOUND = 2 * POLL_SECONDS
FREEZE_BOUND = LEADER_IDLE_TIMEOUT + 2 * POLL_SECONDS
SLACK = 3.0  # a loaded two-core machine: process wake-ups, not the protocol
START_LIMIT = 60.0


@dataclass
class Replica:
    """A replica process and the state changes it printed: (monotonic time, word)."""

    process: asyncio.subprocess.Process
    said: list[tuple[float, str]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def active(self) -> bool:
        """Whether its last word was ACTIVE."""
        words = [w for _, w in self.said if w in ("ACTIVE", "STANDBY")]
        return bool(words) and words[-1] == "ACTIVE"

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            word = raw.decode().split(" ", 1)[0]
            self.said.append((time.monotonic(), word))


@pytest.fixture
async def replicas(pg_url: str, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start replicas on ``pg_url``: ``replica = await start(llm_url)``; all killed after."""
    started: list[Replica] = []

    async def start(llm_url: str) -> Replica:
        data_dir = tmp_path / f"replica{len(started)}"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            str(data_dir),
            llm_url,
            pg_url,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        replica = Replica(process)
        replica.reader = asyncio.create_task(replica.read())
        started.append(replica)
        return replica

    yield start
    for replica in started:
        if replica.process.returncode is None:
            replica.process.send_signal(signal.SIGCONT)
            replica.process.kill()
            await replica.process.wait()
        if replica.reader is not None:
            await replica.reader


async def test_three_replicas_fire_every_slot_once_through_a_kill_and_a_freeze(
    pg_url: str, tmp_path: Path, replicas: Callable[..., Any]
) -> None:
    with ScriptedLLM(responder=lambda request: reply("tick")) as llm:
        group = [await replicas(llm.base_url) for _ in range(3)]
        await until(lambda: all(r.said for r in group), "three replicas started", limit=START_LIMIT)
        await until(lambda: sum(r.active for r in group) == 1, "one leader", limit=START_LIMIT)

        store = await Store.open(tmp_path / "test", url=pg_url)
        clock = ClockStore(store.db)
        try:
            task, _ = await clock.create(
                {
                    "cron": "@every 1s",
                    "title": "tick",
                    "content": "say tick",
                    "target": "nb:ticks",
                    "run_once": 0,
                    "timeout": 0.0,
                    "created_by": "",
                    "creator": "api",
                    "note": "",
                    "next_run_at": round(time.time() + PERIOD, 3),
                }
            )

            async def fired_since(moment: float, *, ran: bool = True) -> bool:
                """Whether an entry started after ``moment`` (one that ran, unless not ``ran``)."""
                entries = await clock.logs(task.id, limit=1000)
                return any(
                    e.started_at > moment and (e.status != "skipped" or not ran) for e in entries
                )

            soon = time.time() + 2
            await until(lambda: fired_since(soon), "a few fires", limit=10)

            # kill -9 the leader: another replica takes the lease within the bound and fires.
            [first] = [r for r in group if r.active]
            killed_at, killed_mono = time.time(), time.monotonic()
            first.process.kill()
            await first.process.wait()
            rest = [r for r in group if r is not first]
            await until(
                lambda: sum(r.active for r in rest) == 1, "a new leader", KILL_BOUND + SLACK
            )
            took_over_after_kill = _took_over(rest, killed_mono)
            await until(lambda: fired_since(killed_at), "a fire after the kill", PERIOD + SLACK)

            # SIGSTOP the new leader past the lease's idle timeout — between two runs, so its
            # backlog fire on waking is no overlap skip — then wake it.
            async def settled() -> bool:
                entries = await clock.logs(task.id, limit=1000)
                return all(e.status != "running" for e in entries)

            await until(settled, "the new leader's run ends")
            [second] = [r for r in rest if r.active]
            [third] = [r for r in rest if r is not second]
            frozen_at, frozen_mono = time.time(), time.monotonic()
            second.process.send_signal(signal.SIGSTOP)
            await until(lambda: third.active, "the third replica takes over", FREEZE_BOUND + SLACK)
            took_over_after_freeze = _took_over([third], frozen_mono)
            # It fires — or logs the slot skipped when the leader froze mid-run: that run's
            # process lives, so the task is still running (no overlap, as ever).
            try:
                await until(
                    lambda: fired_since(frozen_at, ran=False),
                    "the third replica's first slot",
                    PERIOD + SLACK,
                )
            except AssertionError:
                for e in sorted(await clock.logs(task.id, limit=1000), key=lambda e: e.id):
                    print(e.id, e.status, e.scheduled_at, e.missed_from, e.started_at, e.error)
                print("frozen at", frozen_at)
                raise
            await until(lambda: time.time() > frozen_at + FREEZE_BOUND + 2, "frozen a while")
            second.process.send_signal(signal.SIGCONT)
            woke_at = time.monotonic()
            await until(
                lambda: any(t > woke_at and w == "STANDBY" for t, w in second.said),
                "the woken leader steps down",
            )
            later = time.time() + 2
            await until(lambda: fired_since(later), "more fires after the wake-up")
            await clock.update(task.id, {"enabled": False, "next_run_at": None, "updater": "t"})

            await until(settled, "the last run ends")
            entries = sorted(await clock.logs(task.id, limit=1000), key=lambda e: e.id)
        finally:
            await store.close()
        requests = sum("## Scheduled task" in r.system for r in llm.requests)  # no warm-ups

    print(
        f"lease taken over {took_over_after_kill:.2f} s after the kill -9, "
        f"{took_over_after_freeze:.2f} s after the SIGSTOP; {len(entries)} entries, "
        f"{requests} model calls"
    )
    for e in entries:
        print(e.id, e.status, e.scheduled_at, e.missed_from, e.started_at, e.finished_at, e.error)
    scheduled = [e for e in entries if not e.manual]
    keys = [round(e.scheduled_at or 0, 3) for e in scheduled]
    assert len(keys) == len(set(keys)), "a slot has two entries"
    # Every planned slot from the first entry's to the last one's is covered exactly once.
    first_slot, last_slot = min(keys), max(keys)
    slots = [round(first_slot + n * PERIOD, 3) for n in range(round(last_slot - first_slot) + 1)]
    for slot in slots:
        covering = [
            e
            for e in scheduled
            if abs((e.scheduled_at or 0) - slot) < 0.01
            or (e.missed_from is not None and e.missed_from - 0.01 <= slot < e.scheduled_at)
        ]
        assert len(covering) == 1, (slot, [(c.id, c.status, c.scheduled_at) for c in covering])
    ran = [e for e in scheduled if e.status != "skipped"]
    assert {e.status for e in ran} <= {"success", "interrupted"}
    # One model call per run that started (the killed leader's run may have died before its).
    assert len(ran) - 1 <= requests <= len(ran)


def _took_over(replicas: list[Replica], moment: float) -> float:
    """Seconds from ``moment`` (monotonic) to the first ACTIVE one of ``replicas`` printed."""
    return min(t for r in replicas for t, w in r.said if w == "ACTIVE" and t > moment) - moment
