"""One-shot runs and the host API the clock, subagents and teams use (orchestration/oneshot,
outbox, AgentHost.run_one_shot / inject / add_derived_usage / on_stop)."""

from __future__ import annotations

import asyncio

from ania_nb import Callbacks, RunEvent, tool
from ania_nb.engine.usage import Usage
from ania_nb.orchestration import Delivery, OneShotJob, Outbox
from ania_nb.testing import delay, reply, tool_call, usage


def _named(*names: str):
    """Session tools with these names, each recording its calls."""
    calls: list[str] = []
    tools = []
    for name in names:

        def make(n: str):
            @tool(name=n)
            def fn() -> str:
                """A session tool."""
                calls.append(n)
                return f"{n} ran"

            return fn

        tools.append(make(name))
    return tools, calls


async def test_a_subagent_job_sees_the_targets_tools_minus_recursion_and_todo(llm, make_agent):
    agent = make_agent(overrides={"todo.enable": True, "agent.builtin_tools": True})
    tools, calls = _named("subagent_run", "team_run", "lookup")
    agent.add_session_tools(lambda session: tools)
    stops: list[dict] = []
    agent.add_hook("SubagentStop", lambda event, payload: stops.append(payload))
    events: list[RunEvent] = []
    texts: list[str] = []
    llm.script(
        reply(
            "aside",
            tool_calls=[tool_call("lookup"), tool_call("subagent_run")],
            usage=usage(1, 1),
        ),
        reply("child answer", usage=usage(7, 3)),
    )
    tally = Usage(total_tokens=100)
    result = await agent.host.run_one_shot(
        OneShotJob(
            kind="subagent",
            session="nb:parent",
            text="【子代理任务】\nfind it",
            system_prompt="you are a worker",
            timeout=30,
            callbacks=Callbacks(send_text=texts.append),
            on_event=events.append,
            usage=tally,
        )
    )
    assert result.status == "success" and result.text == "child answer"
    sent = [t["function"]["name"] for t in llm.requests[0].tools]
    assert "lookup" in sent
    assert not {"subagent_run", "team_run", "todo_write"} & set(sent)
    assert calls == ["lookup"]  # the hidden one answered like an unknown tool
    assert llm.requests[0].messages[0]["content"] == "you are a worker"
    assert texts == []  # intermediate text dropped ...
    kinds = [e.kind for e in events]  # ... but the live events reach on_event
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and "tool_end" in kinds
    assert tally.total_tokens == 112  # the caller's tally got the child's tokens
    assert [p["prompt"] for p in stops] == ["【子代理任务】\nfind it"]
    assert await agent.history("nb:parent") == []
    [record] = await agent.runs(session="nb:parent")
    assert record.status == "success"


async def test_extra_tools_replace_hidden_ones_for_clock_runs(llm, make_agent):
    agent = make_agent()
    session_tools, session_calls = _named("subagent_run")
    agent.add_session_tools(lambda session: session_tools)
    extra, extra_calls = _named("subagent_run")
    llm.script(reply(tool_calls=[tool_call("subagent_run")]), reply("done"))
    result = await agent.host.run_one_shot(
        OneShotJob(
            kind="clock",
            session="nb:x",
            text="tick",
            system_prompt="clock",
            timeout=30,
            extra_tools=extra,
        )
    )
    assert result.ok
    assert extra_calls == ["subagent_run"] and session_calls == []


async def test_one_shot_runs_use_the_subagent_model_and_round_limit(llm, make_agent):
    agent = make_agent(overrides={"subagent.model": "small-model", "subagent.max_iterations": 1})
    tools, _ = _named("lookup")
    agent.add_tool(tools[0])
    llm.script(reply(tool_calls=[tool_call("lookup")]), reply("forced final"))
    result = await agent.host.run_one_shot(
        OneShotJob(kind="subagent", session="s", text="t", system_prompt="p", timeout=30)
    )
    assert result.text == "forced final"
    assert [r.model for r in llm.requests] == ["small-model", "small-model"]
    llm.script(reply("main"))
    await agent.chat("hi", session="s")
    assert llm.requests[-1].model == "scripted"  # main runs keep the main model


async def test_inject_into_an_idle_session_runs_at_once_and_publishes_the_reply(llm, make_agent):
    agent = make_agent()
    got: list[Delivery] = []
    arrived = asyncio.Event()

    def take(delivery: Delivery) -> None:
        got.append(delivery)
        arrived.set()

    agent.outbox.subscribe(take)
    await agent.start()
    llm.script(reply("thanks, noted"))
    assert agent.host.inject("nb:s", "【子代理执行完成】\nresult", sender="subagent")
    await asyncio.wait_for(arrived.wait(), 10)
    assert [(d.session, d.text, d.source, d.status) for d in got] == [
        ("nb:s", "thanks, noted", "subagent", "success")
    ]
    [record] = await agent.runs(session="nb:s")
    assert record.sender == "subagent" and record.input.startswith("【子代理执行完成】")


async def test_inject_into_a_busy_session_waits_for_the_current_reply(llm, make_agent):
    agent = make_agent()
    got: list[Delivery] = []
    arrived = asyncio.Event()
    agent.outbox.subscribe(lambda d: (got.append(d), arrived.set()))
    await agent.start()
    llm.script(delay(0.3, reply("first")), reply("second"))
    chat = asyncio.create_task(agent.chat("hello", session="nb:b"))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    assert agent.host.inject("nb:b", "background result")
    assert (await chat).text == "first"  # the caller's reply is not published
    await asyncio.wait_for(arrived.wait(), 10)
    assert [d.text for d in got] == ["second"]
    assert "background result" in llm.requests[1].messages[-1]["content"]


async def test_inject_refuses_when_the_queue_is_full(llm, make_agent):
    agent = make_agent(overrides={"agent.queue_size": 1})
    await agent.start()
    llm.script(delay(0.3, reply("a")), reply("b"))
    chat = asyncio.create_task(agent.chat("hello", session="nb:q"))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    assert agent.host.inject("nb:q", "one")
    assert not agent.host.inject("nb:q", "two")  # dropped, not silently queued beyond the limit
    await chat


async def test_derived_usage_is_merged_into_the_next_run_record(llm, make_agent):
    agent = make_agent()
    await agent.start()
    agent.host.add_derived_usage(
        "nb:u", Usage(prompt_tokens=30, completion_tokens=12, total_tokens=42)
    )
    llm.script(reply("ok", usage=usage(5, 5)))
    result = await agent.chat("hi", session="nb:u")
    assert result.usage.total_tokens == 52
    [record] = await agent.runs(session="nb:u")
    assert record.total_tokens == 52
    llm.script(reply("again", usage=usage(5, 5)))
    assert (await agent.chat("hi", session="nb:u")).usage.total_tokens == 10  # counted once


async def test_stop_listeners_hear_every_stop(make_agent):
    agent = make_agent()
    heard: list[str] = []
    agent.host.on_stop(lambda session: heard.append(session) or True)
    assert agent.stop("nb:idle") is True  # a listener stopped background work
    assert heard == ["nb:idle"]


async def test_the_clock_and_the_agents_get_the_host_not_the_agent(make_agent):
    agent = make_agent()
    assert agent.clock.host is agent.host and agent.agents.host is agent.host
    held = [value for value in vars(agent.host).values() if value is agent]
    assert held == []  # the host holds the Agent's parts, never the Agent
    assert agent.host.outbox is agent.outbox and agent.host.config is agent.config


async def test_a_closing_agent_takes_no_injected_message(llm, make_agent):
    agent = make_agent()
    await agent.start()
    await agent.aclose()
    assert agent.host.inject("nb:late", "a result after the close") is False
    assert llm.requests == []


async def test_a_failing_stop_listener_does_not_stop_the_others(make_agent):
    agent = make_agent()
    heard: list[str] = []

    def broken(session: str) -> bool:
        raise RuntimeError("listener bug")

    agent.host.on_stop(broken)
    agent.host.on_stop(lambda session: heard.append(session) or False)
    assert agent.stop("nb:idle") is False  # nothing ran, nothing was stopped
    assert heard == ["nb:idle"]


async def test_a_failing_subscriber_does_not_stop_the_others():
    box = Outbox()
    got: list[str] = []

    def broken(delivery: Delivery) -> None:
        raise RuntimeError("display gone")

    async def fine(delivery: Delivery) -> None:
        got.append(delivery.text)

    box.subscribe(broken)
    unsubscribe = box.subscribe(fine)
    assert await box.publish(Delivery("s", "hello", "clock")) == 1
    unsubscribe()
    assert await box.publish(Delivery("s", "again", "clock")) == 0
    assert got == ["hello"]
