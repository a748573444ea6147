"""Bounded load: hundreds of concurrent runs against a tiny run log, every run succeeds."""

from __future__ import annotations

import asyncio
from typing import Any

from ania_nb import tool
from ania_nb.testing import RecordedRequest, reply, tool_call

SESSIONS = 300
MAX_ENTRIES = 50


def _one_tool_round(request: RecordedRequest) -> Any:
    """First call of a run asks for its tool (named in the user text); the second answers."""
    last = request.messages[-1]
    if last["role"] == "tool":
        return reply(f"done: {last['content']}")
    name = "wait_long" if "long" in str(last["content"]) else "hold"
    return reply(tool_calls=[tool_call(name, {"n": 1})])


async def test_300_concurrent_sessions_against_a_run_log_of_50_all_succeed(llm, make_agent):
    in_tools = 0
    all_in = asyncio.Event()
    long_started, long_gate = asyncio.Event(), asyncio.Event()

    @tool
    async def hold(n: int) -> str:
        """Wait until every run is inside its tool round."""
        nonlocal in_tools
        in_tools += 1
        if in_tools == SESSIONS:
            all_in.set()
        await all_in.wait()
        return f"held {n}"

    @tool
    async def wait_long(n: int) -> str:
        """The long run's tool: waits until all the others have finished."""
        long_started.set()
        await long_gate.wait()
        return f"long {n}"

    llm.responder = _one_tool_round
    agent = make_agent(
        tools=[hold, wait_long],
        # All 300 at once: no global run limit (runner.max_concurrent_runs queues the rest).
        overrides={"store.run_log_max_entries": MAX_ENTRIES, "runner.max_concurrent_runs": 0},
    )
    long = asyncio.create_task(agent.chat("the long one", session="long"))
    await asyncio.wait_for(long_started.wait(), 60)
    # 300 runs in flight at once (each waits in its tool until all have arrived), six times
    # the run log's size, while the long run is older than all of them.
    results = await asyncio.wait_for(
        asyncio.gather(*(agent.chat(f"hello {i}", session=f"s{i}") for i in range(SESSIONS))),
        240,
    )
    assert [r.status for r in results] == ["success"] * SESSIONS, {
        r.error for r in results if not r.ok
    }
    assert all(r.text == "done: held 1" for r in results)
    long_gate.set()
    outcome = await asyncio.wait_for(long, 60)
    assert (outcome.status, outcome.text) == ("success", "done: long 1")

    record = (await agent.runs(session="long"))[0]
    assert record.id == outcome.run_id
    assert (record.status, record.tool_calls_total) == ("success", 1)
    assert [m["role"] for m in await agent.history("long")] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    for i in (0, SESSIONS // 2, SESSIONS - 1):  # every history is whole, record or not
        assert len(await agent.history(f"s{i}")) == 4
    records = await agent.runs(limit=1000)
    assert len(records) == SESSIONS + 1  # all were in flight at once, so all were kept ...
    assert {r.status for r in records} == {"success"}
    await agent.chat("hello again", session="s0")
    assert len(await agent.runs(limit=1000)) == MAX_ENTRIES  # ... and pruned once done
