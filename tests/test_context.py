"""The context window: compaction by summary at the budget, truncation when the summariser fails."""

from __future__ import annotations

from ania_nb import tool
from ania_nb.engine.context import SUMMARISER_PROMPT, ContextWindow
from ania_nb.engine.llm import LLMClient
from ania_nb.engine.messages import SUMMARY_PREFIX, drop_oldest_half
from ania_nb.testing import error, reply, tool_call, usage


@tool
def note(text: str) -> str:
    """Store a note."""
    return f"noted {text}"


def _is_summary_request(req) -> bool:
    return req.messages[0]["content"] == SUMMARISER_PROMPT


async def test_history_over_the_budget_is_summarised_into_one_user_message(llm, make_agent):
    seen_by_hook: list[int] = []
    llm.script(
        reply("Paris is the capital.", usage=usage(900, 20)),  # 900 > 0.8 × 1000
        reply("The user asked about France's capital.", usage=usage(300, 30)),  # summary
        reply("As I said, Paris.", usage=usage(120, 10)),
    )
    agent = make_agent(overrides={"agent.max_context_tokens": 1000})

    async def pre_compact(history):
        seen_by_hook.append(len(history))

    agent.before_compact = pre_compact
    await agent.chat("capital of France?")
    result = await agent.chat("remind me?")

    summary_req, main_req = llm.requests[1], llm.requests[2]
    assert _is_summary_request(summary_req)
    transcript = summary_req.messages[1]["content"]
    assert "[User]:" in transcript and "[Assistant]: Paris is the capital." in transcript
    assert [m["role"] for m in main_req.messages] == ["system", "user", "user"]
    assert main_req.messages[1]["content"] == (
        SUMMARY_PREFIX + "The user asked about France's capital."
    )
    stored = await agent.history()
    assert stored[0]["content"].startswith(SUMMARY_PREFIX)
    assert [m["role"] for m in stored] == ["user", "user", "assistant"]
    assert seen_by_hook == [2]
    # compression tokens count in the totals but not as an iteration
    assert result.usage.total_tokens == 330 + 130
    assert result.usage.iterations == 1


async def test_a_dedicated_compressor_model_is_used_when_configured(llm, make_agent):
    llm.script(reply("long answer", usage=usage(950, 5)), reply("summary"), reply("ok"))
    agent = make_agent(
        overrides={"agent.max_context_tokens": 1000, "compressor.model": "tiny-summariser"}
    )
    await agent.chat("a")
    await agent.chat("b")
    assert llm.requests[1].model == "tiny-summariser"
    assert llm.requests[2].model == "scripted"


async def test_summariser_failure_drops_the_oldest_half_without_orphan_tool_messages(
    llm, make_agent
):
    llm.script(
        reply(tool_calls=[tool_call("note", {"text": "a"})], usage=usage(100, 5)),
        reply("first done", usage=usage(200, 5)),
        reply(tool_calls=[tool_call("note", {"text": "b"})], usage=usage(300, 5)),
        reply("second done", usage=usage(900, 5)),
        error(400, "summariser down"),
        reply("carrying on"),
    )
    agent = make_agent(tools=[note], overrides={"agent.max_context_tokens": 1000})
    await agent.chat("one")
    await agent.chat("two")
    before = await agent.history()
    assert len(before) == 8
    result = await agent.chat("three")
    assert result.ok
    after = await agent.history()
    kept = after[:-2]  # minus this turn's user + assistant
    assert kept == before[4:]
    assert kept[0]["role"] == "user"
    sent = llm.requests[5].messages
    assert sent[1]["role"] != "tool"


async def test_an_estimate_triggers_compaction_before_any_usage_is_known(llm, make_agent):
    llm.script(reply("x" * 3000, usage=None), reply("short summary"), reply("done"))
    agent = make_agent(overrides={"agent.max_context_tokens": 1000})
    await agent.chat("write a lot")
    await agent.chat("next")
    assert _is_summary_request(llm.requests[1])


async def test_zero_budget_disables_compaction(llm, make_agent):
    llm.script(reply("big", usage=usage(10**6, 1)), reply("fine"))
    agent = make_agent(overrides={"agent.max_context_tokens": 0})
    await agent.chat("a")
    await agent.chat("b")
    assert len(llm.requests) == 2
    assert not any(_is_summary_request(r) for r in llm.requests)


def test_drop_oldest_half_never_starts_with_a_tool_result():
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "tool_call_id": "1", "content": "r"},
        {"role": "tool", "tool_call_id": "2", "content": "r"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
    ]
    kept = drop_oldest_half(history)
    assert kept == history[4:]
    assert drop_oldest_half([]) == []
    assert drop_oldest_half([{"role": "user", "content": "x"}]) == [
        {"role": "user", "content": "x"}
    ]


# -- the fixed part (system prompt + tool definitions) -----------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city. " * 40,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _window(llm, max_context_tokens: int = 1000) -> ContextWindow:
    compressor = LLMClient(base_url=llm.base_url, api_key=llm.api_key, model="compressor")
    return ContextWindow(max_context_tokens=max_context_tokens, compressor=compressor)


def _turns(n: int) -> list[dict]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)
    ]


async def test_a_fixed_part_too_large_for_the_budget_does_not_compact_every_turn(llm, caplog):
    window = _window(llm)  # threshold 800; the conversation always keeps 200
    fixed = window.fixed_part("You are a helpful assistant. " * 80, [WEATHER_TOOL])
    assert fixed > 700 and window.fixed_too_large
    assert "agent.max_context_tokens" in window.fixed_warning
    # The old rule (whole prompt > 800) compacted here, on every turn: the fixed part alone is.
    assert not window.needs_compaction(_turns(4), fixed + 150)
    assert not window.needs_compaction(_turns(4), fixed + 200)
    assert window.needs_compaction(_turns(4), fixed + 201)
    # Warned once, however often it is measured.
    for _ in range(3):
        window.fixed_part("You are a helpful assistant. " * 80, [WEATHER_TOOL])
    warnings = [r for r in caplog.records if "tool definitions" in r.getMessage()]
    assert len(warnings) == 1
    await window.compressor.aclose()


async def test_a_fixed_part_that_fits_leaves_the_budget_as_it_was(llm):
    window = _window(llm)
    fixed = window.fixed_part("Be brief.", None)
    assert fixed < 10 and not window.fixed_too_large and window.fixed_warning is None
    assert not window.needs_compaction(_turns(4), 800)
    assert window.needs_compaction(_turns(4), 801)  # the whole prompt over ratio × max
    # A smaller prompt later clears the flag (e.g. tools were removed).
    window.fixed_part("x" * 4000, None)
    assert window.fixed_too_large
    window.fixed_part("Be brief.", None)
    assert not window.fixed_too_large
    await window.compressor.aclose()


async def test_a_lone_summary_is_never_summarised_again(llm):
    window = _window(llm)
    llm.script(reply("the user likes tea"))
    compaction = await window.compact(_turns(6))
    assert compaction.method == "summary" and len(compaction.messages) == 1
    assert not window.needs_compaction(compaction.messages, 5000)
    assert not window.needs_compaction(
        [{"role": "system", "content": "s"}, *compaction.messages], 5000
    )
    assert window.needs_compaction([*compaction.messages, *_turns(2)], 5000)
    assert len(llm.requests) == 1
    await window.compressor.aclose()
