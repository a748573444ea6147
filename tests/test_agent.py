"""The `Agent` façade: sessions, persistent history, queueing, stop, timeouts and run records."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from _waits import until

from ania_nb import Agent, SessionBusyError, UsageError, tool
from ania_nb.engine.messages import image_marker
from ania_nb.testing import delay, error, reply, tool_call


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


async def test_history_persists_user_and_assistant_messages_per_session(llm, make_agent):
    llm.script(reply(tool_calls=[tool_call("echo", {"text": "x"})]), reply("one"), reply("two"))
    agent = make_agent(tools=[echo])
    await agent.chat("first", session="a")
    await agent.chat("second", session="b")
    a, b = await agent.history("a"), await agent.history("b")
    assert [m["role"] for m in a] == ["user", "assistant", "tool", "assistant"]
    assert a[0]["content"].endswith("] first")  # timestamped user message is kept
    assert a[-1]["content"] == "one"
    assert [m["role"] for m in b] == ["user", "assistant"]
    # the second request of session "b" did not see session "a"
    assert all("first" not in str(m.get("content")) for m in llm.requests[2].messages)


async def test_history_survives_a_new_agent_on_the_same_data_dir(llm, make_agent, tmp_path):
    llm.script(reply("noted"), reply("you said blue"))
    first = make_agent(data_dir=tmp_path / "d")
    await first.chat("my colour is blue", session="nb:x")
    await first.aclose()
    second = make_agent(data_dir=tmp_path / "d")
    await second.chat("what colour?", session="nb:x")
    sent = llm.requests[1].messages
    assert sent[0]["role"] == "system"
    assert [m["role"] for m in sent[1:]] == ["user", "assistant", "user"]
    assert sent[1]["content"].endswith("my colour is blue")
    assert sent[2]["content"] == "noted"


async def test_images_are_sent_but_stored_as_markers(llm, make_agent):
    image = "data:image/png;base64,AAAA"
    llm.script(reply("a square"))
    agent = make_agent()
    await agent.chat("what is this?", images=[image])
    parts = llm.requests[0].messages[-1]["content"]
    assert parts[-1] == {"type": "image_url", "image_url": {"url": image}}
    stored = (await agent.history())[0]["content"]
    assert isinstance(stored, str)
    assert image_marker(image) in stored and "base64" not in stored


async def test_clear_history(llm, make_agent):
    llm.script(reply("a"), reply("b"))
    agent = make_agent()
    await agent.chat("hello")
    assert await agent.clear_history() == 2
    await agent.chat("again")
    assert [m["role"] for m in llm.requests[1].messages] == ["system", "user"]


async def test_messages_sent_while_busy_are_queued_and_answered_together(llm, make_agent):
    llm.script(delay(0.5, reply("first answer")), reply("batch answer"))
    agent = make_agent()
    first = asyncio.create_task(agent.chat("one", sender="alice"))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    second = asyncio.create_task(agent.chat("two", sender="bob"))
    third = asyncio.create_task(agent.chat("three", sender="bob"))
    r1, r2, r3 = await asyncio.gather(first, second, third)
    assert r1.text == "first answer"
    assert r2 is r3 and r2.text == "batch answer"
    merged = llm.requests[1].messages[-1]["content"]
    assert "2 messages arrived" in merged and "1. two" in merged and "2. three" in merged
    runs = await agent.runs()
    assert [r.sender for r in runs] == ["bob", "alice"]


async def test_a_full_queue_refuses_with_session_busy(llm, make_agent):
    llm.script(delay(0.5, reply("slow")), reply("queued"))
    agent = make_agent(overrides={"agent.queue_size": 1})
    first = asyncio.create_task(agent.chat("one"))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    second = asyncio.create_task(agent.chat("two"))
    await asyncio.sleep(0)
    with pytest.raises(SessionBusyError, match="busy"):
        await agent.chat("three")
    assert (await first).text == "slow"
    assert (await second).text == "queued"


async def test_a_global_run_limit_queues_other_sessions_and_never_drops(llm, make_agent):
    gate = asyncio.Event()

    @tool
    async def wait_for_gate() -> str:
        """Block until released."""
        await gate.wait()
        return "released"

    llm.script(reply(tool_calls=[tool_call("wait_for_gate")]), reply("first done"))
    llm.responder = lambda req: reply("later")
    agent = make_agent(tools=[wait_for_gate], overrides={"runner.max_concurrent_runs": 1})
    first = asyncio.create_task(agent.chat("block", session="s1"))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    waiting = [asyncio.create_task(agent.chat(f"m{i}", session="s2")) for i in range(3)]
    stopped = asyncio.create_task(agent.chat("x", session="s3"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(llm.requests) == 1 and agent._queues.running == 1  # the others wait their turn
    assert agent.stop("s3")  # a session waiting for its turn can be stopped
    assert (await stopped).status == "stopped"
    gate.set()
    assert (await first).text == "first done"
    results = await asyncio.gather(*waiting)
    assert {r.text for r in results} == {"later"} and results[0] is results[2]  # one batch
    assert len(llm.requests) == 3 and agent._queues.running == 0


async def test_other_sessions_are_not_blocked_by_a_busy_one(llm, make_agent):
    gate = asyncio.Event()

    @tool
    async def wait_for_gate() -> str:
        """Block until released."""
        await gate.wait()
        return "released"

    llm.script(reply(tool_calls=[tool_call("wait_for_gate")]))
    llm.responder = lambda req: reply(
        "quick" if req.tools is None or len(req.messages) < 4 else "slow"
    )
    agent = make_agent(tools=[wait_for_gate])
    slow = asyncio.create_task(agent.chat("block", session="s1"))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    quick = await agent.chat("hi", session="s2")
    assert quick.text == "quick"
    assert not slow.done()
    gate.set()
    assert (await slow).text == "slow"


async def test_stop_cancels_the_run_and_keeps_persisted_rounds(llm, make_agent):
    started = asyncio.Event()

    @tool
    async def step() -> str:
        """First step finishes at once."""
        return "step done"

    @tool
    async def hang() -> str:
        """Second round never finishes."""
        started.set()
        await asyncio.sleep(60)
        return "never"

    llm.script(reply(tool_calls=[tool_call("step")]), reply(tool_calls=[tool_call("hang")]))
    agent = make_agent(tools=[step, hang])
    task = asyncio.create_task(agent.chat("work", session="w"))
    queued = None
    await asyncio.wait_for(started.wait(), 5)
    queued = asyncio.create_task(agent.chat("also this", session="w"))
    await asyncio.sleep(0)
    assert agent.stop("w") is True
    result, dropped = await task, await queued
    assert result.status == "stopped" and dropped.status == "stopped"
    assert agent.stop("w") is False
    history = await agent.history("w")
    # user message + the finished first round survive; the interrupted round does not
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    run = (await agent.runs(session="w"))[0]
    assert run.status == "stopped"
    assert [c.name for c in run.tool_calls] == ["step"]


async def test_cancelling_the_caller_stops_the_run(llm, make_agent):
    llm.script(delay(3, reply("late")))
    agent = make_agent()
    task = asyncio.create_task(agent.chat("slow one", session="c"))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def finished() -> bool:
        runs = await agent.runs(session="c")
        return bool(runs) and runs[0].status != "running"

    await until(finished, "the cancelled run's record to be closed")
    assert (await agent.runs(session="c"))[0].status == "stopped"


async def test_run_timeout_gives_timeout_status(llm, make_agent):
    llm.script(delay(2, reply("too late")))
    agent = make_agent(overrides={"agent.run_timeout": 0.3})
    result = await agent.chat("hurry")
    assert result.status == "timeout"
    assert "0.3 s" in result.error
    assert (await agent.runs())[0].status == "timeout"


async def test_llm_failure_gives_error_status_with_the_reason(llm, make_agent):
    llm.script(error(401, "invalid api key"))
    agent = make_agent()
    result = await agent.chat("hello")
    assert result.status == "error"
    assert "HTTP 401" in result.error and "invalid api key" in result.error
    assert "llm.api_key" in result.error
    with pytest.raises(Exception, match="401"):
        result.raise_for_status()
    record = (await agent.runs())[0]
    assert record.status == "error" and "401" in record.error


async def test_run_records_capture_calls_usage_and_reply(llm, make_agent):
    calls = [tool_call("echo", {"text": f"n{i}"}) for i in range(25)]
    llm.script(reply(tool_calls=calls), reply("x" * 1500))
    agent = make_agent(tools=[echo])
    result = await agent.chat("many calls", session="rec", sender="alice")
    record = (await agent.runs(session="rec"))[0]
    assert record.id == result.run_id
    assert record.status == "success" and record.sender == "alice"
    assert record.input == "many calls"
    assert record.tool_calls_total == 25 and len(record.tool_calls) == 20
    assert record.total_tokens == result.usage.total_tokens > 0
    assert record.iterations == 2
    assert len(record.reply) == 1000 and record.reply.endswith("…")
    assert sorted(c.arguments for c in record.tool_calls)[0] == '{"text": "n0"}'


async def test_run_records_filter_by_session_status_and_time(llm, make_agent):
    llm.script(reply("ok"), error(400, "bad"), reply("ok"))
    agent = make_agent()
    t0 = time.time()
    await agent.chat("a", session="s1")
    await agent.chat("b", session="s2")
    t1 = time.time()
    await agent.chat("c", session="s1")
    assert [r.input for r in await agent.runs(session="s1")] == ["c", "a"]
    assert [r.input for r in await agent.runs(status="error")] == ["b"]
    assert [r.input for r in await agent.runs(since=t0, until=t1)] == ["b", "a"]


def test_runs_left_running_by_a_crash_become_interrupted(llm, tmp_path):
    data_dir = tmp_path / "crash"
    llm.script(delay(30, reply("never")))
    script = textwrap.dedent(
        f"""
        import asyncio
        from ania_nb import Agent
        async def main():
            agent = Agent(base_url={llm.base_url!r}, api_key="k", model="m",
                          data_dir={str(data_dir)!r})
            await agent.chat("doomed", session="crashy")
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    try:
        llm.wait_for_requests(1, timeout=20)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    async def check() -> None:
        agent = Agent(base_url=llm.base_url, api_key="k", model="m", data_dir=data_dir)
        async with agent:
            [run] = await agent.runs(session="crashy")
            assert run.status == "interrupted"
            assert run.input == "doomed"
            history = await agent.history("crashy")
            assert history[0]["content"].endswith("doomed")  # the user's message was kept

    asyncio.run(check())


async def test_bad_arguments_are_refused_clearly(make_agent):
    agent = make_agent()
    with pytest.raises(UsageError, match="non-empty"):
        await agent.chat("   ")
    with pytest.raises(UsageError, match="session"):
        await agent.chat("hi", session="")
    with pytest.raises(UsageError, match="unknown Agent argument"):
        Agent(modle="x")


async def test_closed_agent_refuses_new_work(make_agent):
    agent = make_agent()
    await agent.aclose()
    await agent.aclose()  # idempotent
    with pytest.raises(UsageError, match="closed"):
        await agent.chat("hi")


async def test_a_full_run_never_blocks_the_event_loop(llm, make_agent, caplog):
    """asyncio debug mode reports any callback that holds the loop; a run must cause none."""
    import time as _time

    @tool
    def slow_sync(seconds: float) -> str:
        """A blocking tool: must run in a thread."""
        _time.sleep(seconds)
        return "slept"

    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.25
    try:
        llm.script(reply(tool_calls=[tool_call("slow_sync", {"seconds": 0.6})]), reply("done"))
        agent = make_agent(tools=[slow_sync])
        with caplog.at_level("WARNING", logger="asyncio"):
            result = await agent.chat("block?")
            await agent.history()
            await agent.runs()
    finally:
        loop.set_debug(False)
    assert result.ok
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert slow == []


async def test_model_can_be_overridden_per_run(llm, make_agent):
    llm.script(reply("from the big one"), reply("default again"))
    agent = make_agent()
    assert (await agent.chat("hi", model="big-model")).text == "from the big one"
    await agent.chat("hi again")
    assert [r.model for r in llm.requests] == ["big-model", "scripted"]
