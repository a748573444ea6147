"""Many writers at once: real processes hammering one store, on both backends (issue #30).

Each test starts several processes (tests/_race_worker.py) on one database — a fresh
PostgreSQL database, or one SQLite data directory — releases them all at once, and checks
the invariant the store promises: a clock task never runs twice at once, a scope never holds
more teams than the limit, counters equal the sum of what was added, and the run log and op
log hold exactly their retention limit while writers race. On PostgreSQL each of these holds
only thanks to a lock or an atomic statement (READ COMMITTED lets two check-then-write
transactions interleave); SQLite's exclusive writers make them hold there by construction.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import ania_nb
from ania_nb.agents.team_store import MAX_TEAMS_PER_SCOPE, TeamStore
from ania_nb.clock.store import ClockStore
from ania_nb.store import OpLog, Store
from ania_nb.store.db import Conn

WORKER = Path(__file__).with_name("_race_worker.py")
PACKAGE = str(Path(ania_nb.__file__).parent)
LINE_TIMEOUT_S = 300  # a loaded 2-core machine starting fifty interpreters


async def _url(backend: Any, data_dir: Path) -> str:
    """The store URL the workers use: the data directory's PostgreSQL database, or none."""
    return "" if backend == "sqlite" else str(await backend.url_for(data_dir))


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), LINE_TIMEOUT_S)
    if not raw:
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode(errors="replace")
        raise AssertionError(f"worker {proc.pid} ended early ({await proc.wait()}): {err[-3000:]}")
    return raw.decode().strip()


async def _release(procs: list[asyncio.subprocess.Process]) -> None:
    """One line to every process, sent before any is flushed: they start together."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
    for proc in procs:
        assert proc.stdin is not None
        await proc.stdin.drain()


async def storm(
    specs: list[dict[str, Any]],
    during: Callable[[], Awaitable[None]] | None = None,
) -> list[Any]:
    """Run one worker per spec, all released at once; their results in order.

    ``during`` runs alongside the storm (a watcher reading the store) and is stopped when
    every worker has reported.
    """
    procs: list[asyncio.subprocess.Process] = []
    watcher: asyncio.Task[None] | None = None
    try:
        for spec in specs:
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(WORKER),
                    PACKAGE,
                    json.dumps(spec),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        for proc in procs:
            assert await _line(proc) == "ready"
        if during is not None:
            watcher = asyncio.create_task(during())
        await _release(procs)
        results = [json.loads(await _line(proc)) for proc in procs]
        if watcher is not None:
            watcher.cancel()
            [outcome] = await asyncio.gather(watcher, return_exceptions=True)
            if isinstance(outcome, Exception):
                raise outcome  # the watcher failed (CancelledError is no Exception)
        await _release(procs)  # every process may end now
        codes = [await asyncio.wait_for(proc.wait(), LINE_TIMEOUT_S) for proc in procs]
        assert codes == [0] * len(procs)
        return results
    finally:
        if watcher is not None and not watcher.done():
            watcher.cancel()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _spec(scenario: str, data_dir: Path, url: str, worker: int, **fields: Any) -> dict[str, Any]:
    return {"scenario": scenario, "data_dir": str(data_dir), "url": url, "worker": worker, **fields}


async def _count(store: Store, sql: str, *params: Any) -> int:
    async def read(conn: Conn) -> int:
        return int(await conn.fetchval(sql, params))

    return await store.db.run(read)


# --------------------------------------------------------------------------- clock begin-run


async def test_200_begin_runs_of_one_task_from_four_processes_never_run_it_twice(
    backend: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    store = await Store.open(data_dir)
    try:
        clock = ClockStore(store.db)
        task, _ = await clock.create(
            {
                "cron": "@daily",
                "title": "race",
                "content": "c",
                "target": "nb:race",
                "run_once": 0,
                "timeout": 0.0,
                "created_by": "",
                "creator": "api",
                "note": "",
                "next_run_at": None,
            }
        )
        url = await _url(backend, data_dir)
        running_counts: list[int] = []

        async def watch() -> None:
            while True:
                sql = "SELECT count(*) FROM clock_log WHERE task_id = ? AND status = 'running'"
                running_counts.append(await _count(store, sql, task.id))
                await asyncio.sleep(0.005)  # a sampling pace, not a wait for anything

        # 4 processes x 10 lanes x 5 attempts; a run that starts ends at once, so the task
        # is free again and up to 40 waiting attempts race for it, many times over.
        specs = [
            _spec("clock", data_dir, url, w, task_id=task.id, parallel=10, per_lane=5)
            for w in range(4)
        ]
        attempts = [row for result in await storm(specs, during=watch) for row in result]

        assert len(attempts) == 200
        started = [alone for status, alone in attempts if status == "running"]
        assert started, "no attempt started the task"
        # Each run that started found itself the task's only running entry, and so did
        # every look from outside; every other attempt was logged as skipped.
        assert set(started) == {1}, started
        assert set(running_counts) <= {0, 1}, sorted(set(running_counts))
        assert sum(status == "skipped" for status, _ in attempts) == 200 - len(started)
        entries = await clock.logs(task.id, limit=1000)
        assert sorted(e.status for e in entries) == sorted(
            ["success"] * len(started) + ["skipped"] * (200 - len(started))
        )
    finally:
        await store.close()


# --------------------------------------------------------------------------- team limit


async def test_20_parallel_team_creations_in_one_scope_hold_the_limit_and_never_overwrite(
    backend: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    store = await Store.open(data_dir)
    try:
        teams = TeamStore(store)
        scope, prefilled = "g:race", 12
        for i in range(prefilled):
            await teams.create(scope, f"old{i}", [{"name": "m", "role": "r"}])
        url = await _url(backend, data_dir)
        # 20 new names in the full scope (8 places left) and, in another scope, one name that
        # every creation asks for with its own member: one wins, nothing is replaced.
        specs = [
            _spec(
                "teams",
                data_dir,
                url,
                w,
                creations=[[scope, f"new{w}x{i}", "m"] for i in range(5)]
                + [["g:same", "shared", f"member{w}x{i}"] for i in range(3)],
            )
            for w in range(4)
        ]
        outcomes = [row for result in await storm(specs) for row in result]

        new = [row for row in outcomes if row[0] == scope]
        assert len(new) == 20
        assert sum(row[3] == "ok" for row in new) == MAX_TEAMS_PER_SCOPE - prefilled
        assert sum(row[3] == "full" for row in new) == 20 - (MAX_TEAMS_PER_SCOPE - prefilled)
        stored = await teams.list(scope)
        assert len(stored) == MAX_TEAMS_PER_SCOPE
        assert {t.name for t in stored} == {f"old{i}" for i in range(prefilled)} | {
            row[1] for row in new if row[3] == "ok"
        }

        shared = [row for row in outcomes if row[0] == "g:same"]
        winners = [row for row in shared if row[3] == "ok"]
        assert len(winners) == 1, shared
        assert all(row[3] == "exists" for row in shared if row not in winners)
        team = await teams.get("g:same", "shared")
        assert team is not None and [m.name for m in team.members] == [winners[0][2]]
    finally:
        await store.close()


# --------------------------------------------------------------------------- usage counters


async def test_50_processes_adding_usage_leave_counters_equal_to_the_sum_and_the_ledger(
    backend: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    store = await Store.open(data_dir)  # creates the schema before fifty processes open it
    try:
        url = await _url(backend, data_dir)
        day, session, processes, adds = "2026-12-01", "g:1", 50, 6
        specs = [
            _spec(
                "usage",
                data_dir,
                url,
                w,
                day=day,
                session=session,
                adds=[[f"model{i % 2}", [w + 1, i + 1, 1, w + i + 2]] for i in range(adds)],
            )
            for w in range(processes)
        ]
        reported = await storm(specs)

        expected = {
            "prompt": sum((w + 1) * adds for w in range(processes)),
            "completion": processes * sum(i + 1 for i in range(adds)),
            "cached": processes * adds,
            "total": sum(w + i + 2 for w in range(processes) for i in range(adds)),
        }
        assert sum(reported) == expected["total"]
        [counter] = [c for c in await store.usage.sessions(day) if c.key == session]
        assert (counter.prompt, counter.completion, counter.cached, counter.total) == tuple(
            expected.values()
        )
        assert await store.usage.used(day, session) == expected["total"]
        [ledger] = [c for c in await store.usage.ledger(day) if c.key == session]
        assert ledger == counter
        daily = await store.usage.daily(day)
        assert sum(d.total for d in daily) == expected["total"]
        assert await _count(store, "SELECT count(*) FROM usage_ledger") == processes * adds
    finally:
        await store.close()


# --------------------------------------------------------------------------- KV incr


async def test_kv_increments_from_five_processes_are_all_counted(
    backend: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    store = await Store.open(data_dir)
    try:
        url = await _url(backend, data_dir)
        processes, parallel, per_lane = 5, 4, 25
        specs = [
            _spec("kv", data_dir, url, w, key="hits", parallel=parallel, per_lane=per_lane)
            for w in range(processes)
        ]
        seen = [value for result in await storm(specs) for value in result]

        increments = processes * parallel * per_lane
        assert await store.kv("race").get("hits") == increments
        # Every increment saw its own value: none was lost or applied twice.
        assert sorted(seen) == list(range(1, increments + 1))
    finally:
        await store.close()


# --------------------------------------------------------------------------- retention


async def test_run_log_pruning_under_four_writing_processes_keeps_the_limit_exactly(
    backend: Any, tmp_path: Path
) -> None:
    data_dir, session, limit = tmp_path / "data", "g:race", 20
    store = await Store.open(data_dir, run_log_max_per_session=limit)
    try:
        for i in range(limit):  # the session starts at its limit: every start evicts one
            await store.runs.finish(await store.runs.start(session, f"old {i}"), "success")
        url = await _url(backend, data_dir)
        counts: list[int] = []

        async def watch() -> None:
            # With one pruner at a time every committed start leaves exactly `limit` rows.
            while True:
                sql = "SELECT count(*) FROM runs WHERE session = ?"
                counts.append(await _count(store, sql, session))
                await asyncio.sleep(0.005)  # a sampling pace, not a wait for anything

        specs = [
            _spec("runs", data_dir, url, w, session=session, parallel=3, per_lane=15)
            | {"max_per_session": limit}
            for w in range(4)
        ]
        assert sum(await storm(specs, during=watch)) == 180

        assert counts, "the watcher never read the run log"
        assert set(counts) == {limit}, sorted(set(counts))
        assert await _count(store, "SELECT count(*) FROM runs WHERE session = ?", session) == limit
        records = await store.runs.list(session=session, limit=1000)
        assert {r.status for r in records} == {"success"}
        newest = await _count(store, "SELECT max(id) FROM runs")
        assert sorted(r.id for r in records)[-1] == newest  # the newest stayed, the oldest went
    finally:
        await store.close()


async def test_op_log_eviction_under_four_writing_processes_keeps_the_limit_exactly(
    backend: Any, tmp_path: Path
) -> None:
    data_dir, limit = tmp_path / "data", 30
    store = await Store.open(data_dir)
    try:
        oplog = OpLog(store.db, max_entries=limit)
        for i in range(limit):  # the log starts full: every add evicts one
            await oplog.add("race", "old", detail=str(i))
        url = await _url(backend, data_dir)
        counts: list[int] = []

        async def watch() -> None:
            while True:
                counts.append(await _count(store, "SELECT count(*) FROM oplog"))
                await asyncio.sleep(0.005)  # a sampling pace, not a wait for anything

        specs = [
            _spec("oplog", data_dir, url, w, max_entries=limit, parallel=3, per_lane=20)
            for w in range(4)
        ]
        ids = sorted(i for result in await storm(specs, during=watch) for i in result)

        assert counts, "the watcher never read the op log"
        assert set(counts) == {limit}, sorted(set(counts))
        kept = sorted(entry.id for entry in await oplog.list(limit=1000))
        assert kept == ids[-limit:]  # exactly the newest `limit` entries: none over, none lost
    finally:
        await store.close()


pytestmark = pytest.mark.usefixtures("backend")
