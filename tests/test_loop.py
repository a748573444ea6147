"""The tool loop through `Agent.chat`, over real HTTP to the scripted server."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

from ania_nb import Callbacks, RunEvent, tool
from ania_nb.engine.loop import LOADED_IMAGES_TEXT, GateDecision
from ania_nb.engine.messages import LIMIT_MESSAGE, image_marker
from ania_nb.testing import reply, tool_call, usage


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_parallel_calls_run_concurrently_and_results_keep_call_order(llm, make_agent):
    both_started = asyncio.Event()
    started: list[str] = []

    @tool
    async def slow(name: str) -> str:
        """Wait until the sibling call has started too (deadlocks if calls ran one by one)."""
        started.append(name)
        if len(started) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), timeout=5)
        return f"done {name}"

    llm.script(
        reply(
            tool_calls=[tool_call("slow", {"name": "first"}), tool_call("slow", {"name": "2nd"})]
        ),
        reply("all done"),
    )
    agent = make_agent(tools=[slow])
    result = await agent.chat("go")

    assert result.ok, result.error
    assert result.text == "all done"
    assert [c.result for c in result.tool_calls] == ["done first", "done 2nd"]
    tool_msgs = [m for m in llm.requests[1].messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["done first", "done 2nd"]
    call_ids = [c["id"] for c in llm.requests[1].messages[-3]["tool_calls"]]
    assert [m["tool_call_id"] for m in tool_msgs] == call_ids


async def test_sync_tools_run_off_the_event_loop_thread(llm, make_agent):
    seen: list[int] = []

    @tool
    def where() -> str:
        """Report the thread."""
        seen.append(threading.get_ident())
        return "ok"

    llm.script(reply(tool_calls=[tool_call("where")]), reply("fine"))
    agent = make_agent(tools=[where])
    assert (await agent.chat("where?")).ok
    assert seen and seen[0] != threading.get_ident()


async def test_tool_definitions_are_sent_sorted_and_identical_each_round(llm, make_agent):
    @tool
    def zeta() -> str:
        """Last by name."""
        return "z"

    llm.script(reply(tool_calls=[tool_call("add", {"a": 1, "b": 2})]), reply("3"))
    agent = make_agent(tools=[zeta, add])
    await agent.chat("sum")
    first, second = llm.requests
    assert [t["function"]["name"] for t in first.tools] == ["add", "zeta"]
    assert first.tools_bytes == second.tools_bytes
    assert first.tools[0]["function"]["parameters"] == {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }


async def test_bad_calls_become_error_results_and_the_loop_goes_on(llm, make_agent):
    @tool
    def boom() -> str:
        """Always fails."""
        raise ValueError("disk on fire")

    llm.script(
        reply(
            tool_calls=[
                tool_call("nope", {}),
                tool_call("add", '{"a": 1, "b": '),
                tool_call("add", {"a": "x", "b": 2}),
                tool_call("boom"),
                tool_call("add", ""),
            ]
        ),
        reply("recovered"),
    )
    agent = make_agent(tools=[add, boom])
    result = await agent.chat("try things")
    assert result.ok and result.text == "recovered"
    texts = [c.result for c in result.tool_calls]
    assert texts[0] == ("Error executing tool: tool 'nope' not found. Available tools: [add, boom]")
    assert texts[1].startswith("Error executing tool: failed to parse arguments for tool 'add'")
    assert "Expected schema:" in texts[1]
    assert "field 'a'" in texts[2] and "'x'" in texts[2]
    assert texts[3] == (
        "Error executing tool: tool 'boom' execution failed: ValueError: disk on fire"
    )
    assert "field 'a' is required" in texts[4]  # "" means {} (not a JSON error)
    assert all(c.error for c in result.tool_calls)


async def test_intermediate_text_goes_to_send_text_and_events_stream(llm, make_agent):
    sent: list[str] = []
    events: list[RunEvent] = []
    llm.script(
        reply("<think>hmm</think>Checking…", tool_calls=[tool_call("add", {"a": 2, "b": 2})]),
        reply("<think>easy</think> It is 4."),
    )
    agent = make_agent(tools=[add], overrides={"llm.stream": True})
    callbacks = Callbacks(send_text=sent.append, on_event=events.append)
    result = await agent.chat("2+2?", callbacks=callbacks)
    assert result.text == "It is 4."
    assert sent == ["Checking…"]
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.index("tool_start") < kinds.index("tool_end")
    deltas = "".join(e.data["text"] for e in events if e.kind == "text_delta")
    assert deltas.endswith("It is 4.")
    end = next(e for e in events if e.kind == "tool_end")
    assert end.data["name"] == "add" and end.data["result"] == "4"


async def test_reasoning_content_is_carried_through_tool_rounds(llm, make_agent):
    llm.script(
        reply(reasoning_content="I should add.", tool_calls=[tool_call("add", {"a": 1, "b": 1})]),
        reply("2"),
    )
    agent = make_agent(tools=[add])
    await agent.chat("1+1")
    assistant = llm.requests[1].messages[-2]
    assert assistant["role"] == "assistant"
    assert assistant["reasoning_content"] == "I should add."


async def test_loaded_images_are_injected_after_the_round(llm, make_agent):
    queue: list[str] = []
    image = "data:image/png;base64,iVBORw0KGgo="

    @tool
    def load_images() -> str:
        """Queue the user's image."""
        queue.append(image)
        return "loaded 1 image; you will see it next round"

    def take() -> list[str]:
        taken = list(queue)
        queue.clear()
        return taken

    llm.script(reply(tool_calls=[tool_call("load_images")]), reply("a tiny png"))
    agent = make_agent(tools=[load_images])
    await agent.chat("what is in my image?", callbacks=Callbacks(take_loaded_images=take))
    injected = llm.requests[1].messages[-1]
    assert injected["role"] == "user"
    parts = injected["content"]
    assert parts[0] == {"type": "text", "text": LOADED_IMAGES_TEXT}
    assert parts[1] == {"type": "text", "text": image_marker(image)}
    assert parts[2]["image_url"]["url"] == image
    stored = await agent.history()
    assert any(image_marker(image) in (m.get("content") or "") for m in stored)
    assert not any("base64" in json.dumps(m) for m in stored)


async def test_iteration_limit_adds_the_notice_and_a_final_call_without_tools(llm, make_agent):
    llm.script(
        reply(tool_calls=[tool_call("add", {"a": 1, "b": 1})]),
        reply(tool_calls=[tool_call("add", {"a": 2, "b": 2})]),
        reply("stopping here"),
    )
    agent = make_agent(tools=[add], overrides={"agent.max_iterations": 2})
    result = await agent.chat("loop forever")
    assert result.ok and result.text == "stopping here"
    assert len(llm.requests) == 3
    assert llm.requests[0].tools and llm.requests[1].tools
    last = llm.requests[2]
    assert last.tools is None
    assert last.messages[-1] == {"role": "user", "content": LIMIT_MESSAGE}
    assert result.usage.iterations == 3


async def test_gate_blocks_a_call_without_delaying_its_sibling(llm, make_agent):
    release = asyncio.Event()
    order: list[str] = []

    async def gate(call, ctx):
        if call.name == "risky":
            await release.wait()  # a human thinking it over
            order.append("risky verdict")
            return GateDecision("blocked: the user denied this call", "denied", "human")
        return None

    @tool
    def risky() -> str:
        """Never runs in this test."""
        order.append("risky ran")
        return "ran"

    @tool
    def quick() -> str:
        """Lets the gate go once it has finished."""
        order.append("quick ran")
        release.set()
        return "quick result"

    llm.script(reply(tool_calls=[tool_call("risky"), tool_call("quick")]), reply("ok"))
    agent = make_agent(tools=[risky, quick])
    agent.tool_gate = gate
    result = await agent.chat("do both")
    assert order == ["quick ran", "risky verdict"]
    risky_call, quick_call = result.tool_calls
    assert risky_call.blocked and risky_call.result == "blocked: the user denied this call"
    assert (risky_call.outcome, risky_call.stage) == ("denied", "human")
    assert (quick_call.outcome, quick_call.stage) == ("ok", None)
    assert quick_call.result == "quick result" and not quick_call.blocked
    tool_msgs = [m["content"] for m in llm.requests[1].messages if m["role"] == "tool"]
    assert tool_msgs == ["blocked: the user denied this call", "quick result"]


async def test_a_broken_gate_fails_only_its_call_and_is_logged_with_its_traceback(
    llm, make_agent, caplog
):
    async def gate(call, ctx):
        return {}["verdict"]  # a bug in the gate

    llm.script(reply(tool_calls=[tool_call("add", {"a": 1, "b": 2})]), reply("the gate broke"))
    agent = make_agent(tools=[add])
    agent.tool_gate = gate
    with caplog.at_level(logging.WARNING, logger="ania_nb.engine"):
        result = await agent.chat("add")
    assert result.ok and result.tool_calls[0].result == "Error executing tool: KeyError: 'verdict'"
    [record] = [r for r in caplog.records if r.name == "ania_nb.engine.loop"]
    assert record.getMessage() == "the gate or executor failed on tool 'add'"
    assert 'return {}["verdict"]  # a bug in the gate' in caplog.text  # the traceback


async def test_usage_is_summed_over_calls_with_cached_tokens(llm, make_agent):
    llm.script(
        reply(tool_calls=[tool_call("add", {"a": 1, "b": 2})], usage=usage(100, 10, cached=60)),
        reply("3", usage=usage(150, 5, deepseek_cache_hit=100)),
    )
    agent = make_agent(tools=[add])
    u = (await agent.chat("1+2")).usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (250, 15, 265)
    assert u.cached_tokens == 160
    assert u.last_prompt_tokens == 150
    assert u.iterations == 2


async def test_no_tools_means_a_single_call_without_tools_field(llm, make_agent):
    llm.script(reply("hello"))
    agent = make_agent()
    result = await agent.chat("hi")
    assert result.text == "hello"
    assert llm.requests[0].tools is None
    assert "tool_choice" not in llm.requests[0].body


async def test_huge_tool_results_are_cut_before_the_model_sees_them(llm, make_agent):
    @tool
    def firehose() -> str:
        """Return far too much."""
        return "x" * 50_000

    llm.script(reply(tool_calls=[tool_call("firehose")]), reply("ok"))
    agent = make_agent(tools=[firehose], overrides={"agent.max_tool_result_chars": 1000})
    result = await agent.chat("go")
    sent = llm.requests[1].messages[-1]["content"]
    marker = "\n...(tool result truncated: 50000 characters in total)"
    assert sent == "x" * (1000 - len(marker)) + marker  # at most 1000 characters, the note included
    assert result.tool_calls[0].result == sent
    stored = (await agent.history())[-2]["content"]
    assert len(stored) < 1100
