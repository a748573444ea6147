"""What the clock's poll costs (issue 31: edits reach the leader within a second).

Every process runs one poll per `ania_nb.clock.POLL_SECONDS` (0.5 s): the lease heartbeat or
try, the edit counter, and the other processes' new task-log entries. This opens an Agent with
its clock (100 tasks), runs the poll's body N times back to back and prints the wall and CPU
time per poll — and what that is per second at the default interval.

    python bench/clock_poll.py [--pg-url postgresql://user@host/db] [--polls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from ania_nb import Agent
from ania_nb.clock import POLL_SECONDS


async def measure(pg_url: str, polls: int) -> None:
    """Time ``polls`` polls of a leader and of a standby on one store."""
    with tempfile.TemporaryDirectory() as data_dir:
        overrides = {"agent.builtin_tools": False, "skills.dir": data_dir + "/none"}
        if pg_url:
            overrides["store.url"] = pg_url
        agents = [
            Agent(
                base_url="http://127.0.0.1:9/v1",
                api_key="x",
                model="m",
                data_dir=data_dir,
                overrides=overrides,
            )
            for _ in range(2)
        ]
        for agent in agents:
            await agent.start()
        leader, standby = agents
        for n in range(100):
            await leader.clock.create(cron="@every 1h", title=f"t{n}", content="c", target="nb:x")
        for agent, role in ((leader, "leader"), (standby, "standby")):
            clock = agent.clock
            lease = clock._lease
            assert lease is not None
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(polls):
                if clock.active:
                    await lease.check()
                else:
                    await clock._take_over()
                await clock._sync()
                await clock._sync_runs()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            per, cpu_per = wall / polls * 1000, cpu / polls * 1000
            print(
                f"{'postgresql' if pg_url else 'sqlite'} {role}: {per:.3f} ms wall, "
                f"{cpu_per:.3f} ms CPU per poll; at one poll per {POLL_SECONDS:g} s: "
                f"{cpu_per / POLL_SECONDS / 10:.3f} % of one core"
            )
        for agent in agents:
            await agent.aclose()


def main() -> None:
    """Parse the options and measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default="", help="a PostgreSQL database to use (else SQLite)")
    parser.add_argument("--polls", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(measure(args.pg_url, args.polls))


if __name__ == "__main__":
    main()
