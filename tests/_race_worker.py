"""One process of a race test (tests/test_store_races.py): hammer one store, report as JSON.

Run as ``python tests/_race_worker.py <ania_nb package dir> <spec JSON>``. The worker opens the
store, prints ``ready``, waits for a line on stdin (the barrier: the test releases every
process at once), runs its scenario, prints one JSON line with what it saw, and then waits for
a second line before it exits — so that a run it holds stays owned by a live process until
every other process is done.

Only the store modules are imported: ``ania_nb``, ``ania_nb.clock`` and ``ania_nb.agents`` are
bare packages here (their ``__init__`` pulls in the engine), so fifty interpreters start fast;
every store class used is the real one.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _bare_packages(package_dir: str) -> None:
    """Make ``ania_nb`` and the two subpackages importable without running their __init__."""
    for name, folder in (("ania_nb", ""), ("ania_nb.clock", "clock"), ("ania_nb.agents", "agents")):
        module = types.ModuleType(name)
        module.__path__ = [str(Path(package_dir) / folder)]
        sys.modules[name] = module


@dataclass(frozen=True)
class Tokens:
    """Token counts as the usage ledger reads them."""

    prompt: int
    completion: int
    cached: int
    total: int


async def _clock(store: Any, spec: dict[str, Any]) -> Any:
    """Begin runs of one task, ``parallel`` at a time; each attempt's status.

    An attempt that starts the run counts the task's running entries (it must be alone) and
    finishes the run at once, so the task is free again and the waiting attempts race anew.
    """
    from ania_nb.clock.store import ClockStore

    clock = ClockStore(store.db)
    seen: list[list[Any]] = []

    async def running_entries(conn: Any) -> int:
        sql = "SELECT count(*) FROM clock_log WHERE task_id = ? AND status = 'running'"
        return int(await conn.fetchval(sql, (spec["task_id"],)))

    async def lane(count: int) -> None:
        for _ in range(count):
            begun = await clock.begin_run(
                spec["task_id"], lambda task: "race", manual=True, scheduled_at=None
            )
            assert begun is not None
            entry = begun[1]
            if entry.status != "running":
                seen.append([entry.status, None])
                continue
            seen.append([entry.status, await store.db.run(running_entries)])
            await clock.finish_run(entry.id, "success")

    await asyncio.gather(*(lane(spec["per_lane"]) for _ in range(spec["parallel"])))
    return seen


async def _teams(store: Any, spec: dict[str, Any]) -> Any:
    """Create teams at once; per creation its name, the member asked for and the outcome."""
    from ania_nb.agents.team_store import TeamError, TeamStore

    teams = TeamStore(store)

    async def create(scope: str, name: str, member: str) -> list[str]:
        try:
            await teams.create(scope, name, [{"name": member, "role": "r"}])
        except TeamError as exc:
            return [scope, name, member, "exists" if "already exists" in str(exc) else "full"]
        return [scope, name, member, "ok"]

    return await asyncio.gather(*(create(*c) for c in spec["creations"]))


async def _usage(store: Any, spec: dict[str, Any]) -> Any:
    """Add the given calls one after another; the total each add reported."""
    added = 0
    for model, counts in spec["adds"]:
        added += await store.usage.add(spec["day"], spec["session"], [(model, Tokens(*counts))])
    return added


async def _kv(store: Any, spec: dict[str, Any]) -> Any:
    """Increment one key, ``parallel`` increments at a time; the values incr returned."""
    kv = store.kv("race")
    seen: list[int] = []

    async def lane(count: int) -> None:
        for _ in range(count):
            seen.append(await kv.incr(spec["key"]))

    await asyncio.gather(*(lane(spec["per_lane"]) for _ in range(spec["parallel"])))
    return seen


async def _runs(store: Any, spec: dict[str, Any]) -> Any:
    """Start and finish runs of one session, ``parallel`` at a time; how many ran."""

    async def lane(count: int) -> None:
        for i in range(count):
            run_id = await store.runs.start(spec["session"], f"race {i}")
            await store.runs.finish(run_id, "success")

    await asyncio.gather(*(lane(spec["per_lane"]) for _ in range(spec["parallel"])))
    return spec["per_lane"] * spec["parallel"]


async def _oplog(store: Any, spec: dict[str, Any]) -> Any:
    """Add op-log entries, ``parallel`` at a time, with the given retention; their ids."""
    from ania_nb.store import OpLog

    oplog = OpLog(store.db, max_entries=spec["max_entries"])
    ids: list[int] = []

    async def lane(count: int) -> None:
        for i in range(count):
            ids.append(await oplog.add("race", "add", detail=f"{spec['worker']}-{i}"))

    await asyncio.gather(*(lane(spec["per_lane"]) for _ in range(spec["parallel"])))
    return ids


SCENARIOS = {
    "clock": _clock,
    "teams": _teams,
    "usage": _usage,
    "kv": _kv,
    "runs": _runs,
    "oplog": _oplog,
}


async def main(spec: dict[str, Any]) -> None:
    """Open, wait at the barrier, run the scenario, report, wait to be let go."""
    from ania_nb.store import Store

    store = await Store.open(
        spec["data_dir"],
        url=spec["url"],
        run_log_max_per_session=spec.get("max_per_session", 200),
    )
    try:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        result = await SCENARIOS[spec["scenario"]](store, spec)
        print(json.dumps(result), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
    finally:
        await store.close()


if __name__ == "__main__":
    _bare_packages(sys.argv[1])
    asyncio.run(main(json.loads(sys.argv[2])))
