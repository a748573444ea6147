"""Whole runs against a misbehaving model: every run ends with a status, a closed record and a
``run_end`` event, and no answer can poison the session (a strict server refuses any
conversation a real provider would reject, so the next turn proves the history is valid)."""

from __future__ import annotations

from typing import Any

import pytest

from ania_nb import Callbacks, RunEvent, tool
from ania_nb.testing import ScriptedLLM, cut_stream, error, raw, reply, tool_call, usage


@pytest.fixture
def strict_llm():
    with ScriptedLLM(strict=True) as server:
        yield server


@pytest.fixture(params=[False, True], ids=["plain", "stream"])
def stream(request) -> bool:
    return request.param


@pytest.fixture
async def run_agent(strict_llm, stream, tmp_path):
    """An agent on the strict server with one tool, `weather(city)`."""

    @tool
    def weather(city: str) -> str:
        """Weather of a city."""
        return f"sunny in {city}"

    def build(**overrides: Any):
        from ania_nb import Agent

        agent = Agent(
            base_url=strict_llm.base_url,
            api_key=strict_llm.api_key,
            model="scripted",
            data_dir=tmp_path / "data",
            tools=[weather],
            overrides={
                "retry.base_delay": 0.01,
                "retry.max_delay": 0.05,
                "llm.stream": stream,
                "agent.builtin_tools": False,
                "skills.dir": str(tmp_path / "none"),
                "mcp.config_file": str(tmp_path / "none.json"),
                **overrides,
            },
        )
        made.append(agent)
        return agent

    made: list[Any] = []
    yield build
    for agent in made:
        await agent.aclose()


def assert_valid_history(history: list[dict]) -> None:
    """Every tool message follows the assistant message that asked for it; every call answered."""
    open_ids: list[str] = []
    for message in history:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids, message
            open_ids.remove(message["tool_call_id"])
            continue
        assert open_ids == [], f"unanswered calls {open_ids}"
        for call in message.get("tool_calls") or ():
            assert isinstance(call["id"], str) and call["id"]
            assert isinstance(call["function"]["name"], str) and call["function"]["name"]
            assert isinstance(call["function"]["arguments"], str)
            open_ids.append(call["id"])
    assert open_ids == []


ODD_CALLS = {
    "null id": tool_call("weather", {"city": "Oslo"}, wire={"id": None}),
    "empty id": tool_call("weather", {"city": "Oslo"}, wire={"id": ""}),
    "numeric id": tool_call("weather", {"city": "Oslo"}, wire={"id": 7}),
    "object arguments": tool_call("weather", wire={"arguments": {"city": "Oslo"}}),
    "null arguments": tool_call("weather", wire={"arguments": None}),
    "broken JSON arguments": tool_call("weather", '{"city": "Os'),
    "null name": tool_call("weather", {"city": "Oslo"}, wire={"name": None}),
    "empty name": tool_call("weather", {"city": "Oslo"}, wire={"name": ""}),
}


@pytest.mark.parametrize("shape", sorted(ODD_CALLS))
async def test_odd_tool_call_shapes_never_poison_the_session(run_agent, strict_llm, shape):
    agent = run_agent()
    events: list[RunEvent] = []
    strict_llm.script(reply(tool_calls=[ODD_CALLS[shape]]), reply("answered"))
    result = await agent.chat("weather?", callbacks=Callbacks(on_event=events.append))
    assert result.status == "success" and result.text == "answered"
    assert events[-1].kind == "run_end" and events[-1].data["status"] == "success"
    [call] = result.tool_calls
    if "name" in shape:
        assert call.outcome == "error" and "not found" in call.result
    elif "broken" in shape:
        assert call.outcome == "error" and "failed to parse arguments" in call.result
    elif "null arguments" in shape:  # no arguments at all: the required city is missing
        assert call.outcome == "error" and "city" in call.result
    else:
        assert call.outcome == "ok" and call.result == "sunny in Oslo"
    history = await agent.history()
    assert_valid_history(history)
    # The next turn is accepted by the strict server: the stored conversation is valid.
    strict_llm.script(reply("still fine"))
    assert (await agent.chat("and now?")).text == "still fine"
    [record, _] = await agent.runs()
    assert record.status == "success"


async def test_a_truncated_answer_is_not_a_success(run_agent, strict_llm):
    agent = run_agent()
    strict_llm.script(reply("The answer is forty-", finish_reason="length"))
    result = await agent.chat("long question")
    assert result.status == "error" and result.text == "The answer is forty-"
    assert 'finish_reason "length"' in (result.error or "")
    [record] = await agent.runs()
    assert record.status == "error" and "token limit" in (record.error or "")


async def test_a_stream_cut_without_finish_is_retried_never_stored_half(
    run_agent, strict_llm, stream
):
    agent = run_agent()
    strict_llm.script(
        cut_stream(reply("a complete answer"), clean=True), reply("a complete answer")
    )
    result = await agent.chat("hi")
    assert result.status == "success" and result.text == "a complete answer"
    assert len(strict_llm.requests) == 2  # a cut body is retried in both modes
    assert [m["content"] for m in await agent.history() if m["role"] == "assistant"] == [
        "a complete answer"
    ]


async def test_a_reset_after_shown_text_is_retried_and_the_view_takes_it_back(
    run_agent, strict_llm, stream
):
    if not stream:
        pytest.skip("streaming only")
    agent = run_agent()
    events: list[RunEvent] = []
    strict_llm.script(cut_stream(reply("partial then more text")), reply("whole answer"))
    result = await agent.chat("hi", callbacks=Callbacks(on_event=events.append))
    assert result.text == "whole answer"
    kinds = [e.kind for e in events]
    assert "retry" in kinds
    retry = events[kinds.index("retry")]
    assert retry.data["discard"] is True
    assert kinds.index("text_delta") < kinds.index("retry")


@pytest.mark.parametrize(
    "body",
    [
        {"id": "x", "object": "chat.completion", "choices": []},
        {"id": "x", "object": "chat.completion"},
    ],
    ids=["empty choices", "no choices"],
)
async def test_an_answer_without_choices_is_retried(run_agent, strict_llm, stream, body):
    agent = run_agent()
    if stream:
        strict_llm.script(raw(chunks=[body]), reply("ok"))
    else:
        strict_llm.script(raw(body), reply("ok"))
    result = await agent.chat("hi")
    assert result.status == "success" and result.text == "ok"
    assert len(strict_llm.requests) == 2


async def test_non_numeric_usage_never_fails_a_run(run_agent, strict_llm):
    agent = run_agent()
    strict_llm.script(reply("fine", usage={"prompt_tokens": "many", "completion_tokens": None}))
    result = await agent.chat("hi")
    assert result.status == "success"
    assert result.usage.estimated_calls == 1 and result.usage.prompt_tokens > 0  # never free


async def test_failures_end_with_a_record_and_a_run_end_event(run_agent, strict_llm):
    agent = run_agent(**{"retry.max_attempts": 2})
    events: list[RunEvent] = []
    strict_llm.script(error(500), error(500))
    result = await agent.chat("hi", callbacks=Callbacks(on_event=events.append))
    assert result.status == "error" and "HTTP 500" in (result.error or "")
    assert [e.kind for e in events][-1] == "run_end"
    [record] = await agent.runs()
    assert record.status == "error"
    strict_llm.script(reply("recovered"))
    assert (await agent.chat("again")).text == "recovered"
    assert_valid_history(await agent.history())


async def test_lone_surrogates_in_user_text_and_tool_results(run_agent, strict_llm):
    agent = run_agent()

    @tool
    def odd() -> str:
        """Returns text with a lone surrogate."""
        return "bad \ud800 char"

    agent.add_tool(odd)
    strict_llm.script(reply(tool_calls=[tool_call("odd")]), reply("done"))
    result = await agent.chat("hi \udc00 there")
    assert result.status == "success"
    history = await agent.history()
    assert "\ufffd" in history[0]["content"] and "\ufffd" in history[2]["content"]


async def test_retry_after_is_honoured_through_a_run(run_agent, strict_llm):
    agent = run_agent(**{"retry.max_delay": 0.2})
    strict_llm.script(error(429, retry_after=0.1), reply("ok", usage=usage(1, 1)))
    result = await agent.chat("hi")
    assert result.status == "success" and len(strict_llm.requests) == 2


async def test_once_the_fallback_answered_the_rest_of_the_run_asks_it_first(run_agent, strict_llm):
    agent = run_agent(**{"retry.max_attempts": 2, "fallback.model": "backup"})
    strict_llm.script(
        error(500),
        error(500),  # main model: both attempts fail
        reply(tool_calls=[tool_call("weather", {"city": "Oslo"})]),  # fallback answers
        reply("from the fallback"),  # the run's next call goes to the fallback directly
    )
    result = await agent.chat("weather?")
    assert result.text == "from the fallback"
    assert [r.model for r in strict_llm.requests] == [
        "scripted",
        "scripted",
        "backup",
        "backup",
    ]
    strict_llm.script(reply("main again"))
    await agent.chat("a new run")
    assert strict_llm.requests[-1].model == "scripted"  # sticky for one run only
