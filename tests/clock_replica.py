"""One replica of the clock for test_clock_replicas.py: an Agent on a shared PostgreSQL store.

``python tests/clock_replica.py <data_dir> <llm base_url> <store url>`` opens an Agent (its clock
starts with it, at the default poll interval) and prints ``ACTIVE <pid>`` / ``STANDBY <pid>``
each time its clock takes or loses the lease, until it is killed.
"""

import asyncio
import os
import sys

from ania_nb import Agent


async def main() -> None:
    """Run the replica until killed, reporting its clock's state changes."""
    data_dir, base_url, store_url = sys.argv[1:4]
    agent = Agent(
        base_url=base_url,
        api_key="test",
        model="scripted",
        data_dir=data_dir,
        overrides={
            "store.url": store_url,
            "llm.stream": False,
            "agent.builtin_tools": False,
            "skills.dir": data_dir + "/no-skills",
            "mcp.config_file": data_dir + "/no-mcp.json",
        },
    )
    await agent.start()
    # One chat first pays the model client's first use, so clock runs take milliseconds and a
    # freeze (SIGSTOP) lands between runs, not inside a slow first one.
    await agent.chat("warm up", session="nb:warm-up")
    print("STARTED", os.getpid(), flush=True)
    was = None
    while True:
        active = agent.clock.active
        if active != was:
            print("ACTIVE" if active else "STANDBY", os.getpid(), flush=True)
            was = active
        await asyncio.sleep(0.02)


asyncio.run(main())
