"""Habits of small local models (#20), through `Agent.chat` over real HTTP.

The scripted server here is strict like llama-server (`strict_status=500`): any request whose
conversation it would refuse fails, so every test also proves the history stays valid.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ania_nb import Callbacks, RunEvent, tool
from ania_nb.engine.messages import EMPTY_REPLY_MESSAGE
from ania_nb.engine.repair import repair_history
from ania_nb.engine.repeats import canonical_arguments
from ania_nb.engine.text_calls import find_text_calls
from ania_nb.testing import ScriptedLLM, conversation_problem, reply, tool_call


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """A scripted server that refuses invalid conversations with a 500, as llama-server does."""
    with ScriptedLLM(strict=True, strict_status=500) as server:
        yield server


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def counting_tool() -> tuple[Any, list[str]]:
    """A ``meme`` tool that records each real execution and always answers the same."""
    ran: list[str] = []

    @tool
    def meme(topic: str) -> str:
        """Send a meme about a topic."""
        ran.append(topic)
        return f"sent a meme about {topic}"

    return meme, ran


def assert_valid(history: list[dict[str, Any]]) -> None:
    """What is stored would be accepted by a strict server (after the system prompt)."""
    assert conversation_problem([{"role": "system", "content": "s"}, *history]) is None


# ------------------------------------------------------------------ item 1: malformed arguments


@pytest.mark.parametrize("stream", [False, True])
async def test_non_json_arguments_never_poison_the_history(llm, make_agent, tmp_path, stream):
    llm.script(
        reply(tool_calls=[tool_call("add", '{"a": 1, "b": ')]),
        reply("sorry, retrying differently"),
        reply("still talking"),
    )
    agent = make_agent(tools=[add], overrides={"llm.stream": stream})
    first = await agent.chat("add 1 and 2")
    assert first.ok, first.error
    # The error result stands beside the call; the model hears what was wrong with its text.
    assert first.tool_calls[0].outcome == "error"
    assert "failed to parse arguments for tool 'add'" in first.tool_calls[0].result
    sent = llm.requests[1].messages
    stored_call = sent[-2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(stored_call) == {"_raw": '{"a": 1, "b": '}
    assert sent[-1]["role"] == "tool" and "failed to parse" in sent[-1]["content"]
    assert (await agent.chat("and now?")).ok  # the next turn is not refused
    assert_valid(await agent.history())
    await agent.aclose()

    # A restart on the same data dir re-sends the stored history: still accepted.
    llm.script(reply("after restart"))
    again = make_agent(tools=[add], data_dir=tmp_path / "data")
    assert (await again.chat("hello again")).text == "after restart"
    assert conversation_problem(llm.requests[-1].messages) is None


async def test_a_history_poisoned_by_an_older_version_is_accepted_again(llm, make_agent):
    agent = make_agent(tools=[add])
    await agent.start()
    broken_call = {"id": "c1", "function": {"name": "add", "arguments": '{"a": 1, "b": '}}
    await agent._rt.store.history.append(
        "nb:default",
        [
            {"role": "user", "content": "add"},
            {"role": "assistant", "content": None, "tool_calls": [broken_call]},
            {"role": "tool", "tool_call_id": "c1", "content": "Error executing tool: ..."},
            {"role": "assistant", "content": None},
        ],
    )
    llm.script(reply("back in business"))
    result = await agent.chat("hello?")
    assert result.text == "back in business" and len(llm.requests) == 1  # no refused try
    assert_valid(await agent.history())


def test_repair_adds_the_call_type_and_text_for_contentless_messages():
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "b", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "b", "content": "ok"},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "assistant", "content": None},
        {"role": "assistant"},
    ]
    fixed, problems = repair_history(history)
    assert fixed[1]["tool_calls"][0]["type"] == "function"
    assert fixed[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert fixed[3]["tool_calls"][0]["type"] == "function"  # only the type was missing
    assert fixed[5]["content"] == "" and fixed[6]["content"] == ""
    assert len(problems) == 6
    assert_valid(fixed)
    assert repair_history(fixed) == (fixed, [])


# ------------------------------------------------------------------ item 4: repeats


async def test_identical_calls_past_the_limit_are_not_run_and_the_record_says_so(llm, make_agent):
    meme, ran = counting_tool()
    spellings = ['{"topic": "cats"}', '{ "topic" : "cats" }']  # the same JSON either way
    same = [tool_call("meme", spellings[n % 2]) for n in range(5)]
    llm.script(*[reply(tool_calls=[call]) for call in same], reply("done"))
    events: list[RunEvent] = []
    gated: list[str] = []

    async def gate(call, ctx):
        gated.append(call.id)  # a repeat must not ask a person again either
        return None

    agent = make_agent(tools=[meme])
    agent.tool_gate = gate
    result = await agent.chat("memes!", callbacks=Callbacks(on_event=events.append))
    assert result.ok and result.text == "done"
    assert ran == ["cats"] * 3  # agent.max_repeat_calls defaults to 3
    assert len(gated) == 3
    fourth, fifth = result.tool_calls[3:]
    for repeat in (fourth, fifth):
        assert repeat.outcome == "error" and "repeated call" in (repeat.error or "")
        assert repeat.result.startswith("Not run: you already called meme with these arguments")
        assert "The result was:\nsent a meme about cats" in repeat.result
    assert llm.requests[4].messages[-1]["content"] == fourth.result  # what the model heard
    assert result.warnings == [
        "meme was called 2 more time(s) with the same arguments after 3 identical result(s); "
        "those calls were not run"
    ]
    record = (await agent.runs())[0]
    assert record.status == "success"
    assert record.error == f"warning: {result.warnings[0]}"
    assert "repeated call" in (record.tool_calls[3].error or "")
    end = [e for e in events if e.kind == "run_end"][-1]
    assert end.data["warnings"] == result.warnings
    assert sum(e.kind == "tool_end" for e in events) == 5  # repeats are shown as rows too


async def test_parallel_duplicates_in_one_round_are_counted_too(llm, make_agent):
    meme, ran = counting_tool()
    same = [tool_call("meme", {"topic": "dogs"}) for _ in range(5)]
    llm.script(reply(tool_calls=same), reply("ok"))
    agent = make_agent(tools=[meme], overrides={"agent.max_repeat_calls": 2})
    result = await agent.chat("five at once")
    assert ran == ["dogs", "dogs"]
    assert [c.outcome for c in result.tool_calls] == ["ok", "ok", "error", "error", "error"]
    assert "sent a meme about dogs" in result.tool_calls[4].result  # waited for the earlier run


async def test_a_changing_result_or_other_arguments_is_never_a_repeat(llm, make_agent):
    polls: list[int] = []

    @tool
    def status(job: str) -> str:
        """Poll a job (it makes progress)."""
        polls.append(1)
        return f"{job}: {len(polls) * 20}% done"

    meme, ran = counting_tool()
    poll = tool_call("status", {"job": "build"})
    topics = [tool_call("meme", {"topic": t}) for t in ("a", "b", "c", "d", "e")]
    llm.script(
        *[reply(tool_calls=[poll]) for _ in range(5)],
        reply(tool_calls=topics),
        reply("finished"),
    )
    agent = make_agent(tools=[status, meme], overrides={"agent.max_repeat_calls": 2})
    result = await agent.chat("wait for the build")
    assert len(polls) == 5 and ran == ["a", "b", "c", "d", "e"]
    assert all(c.outcome == "ok" for c in result.tool_calls) and result.warnings == []


async def test_a_tool_with_side_effects_repeats_whatever_its_result(llm, make_agent):
    """Each reminder a model creates has a new id: the results differ, the reminders pile up."""
    made: list[str] = []

    @tool(side_effects=True)
    def remind(text: str) -> str:
        """Create a reminder."""
        made.append(text)
        return f"created reminder #{len(made)}"

    same = tool_call("remind", {"text": "stretch"})
    llm.script(reply(tool_calls=[same] * 5), *[reply(tool_calls=[same]) for _ in range(15)])
    llm.script(reply("reminded"))
    agent = make_agent(tools=[remind])
    result = await agent.chat("remind me in 1 minute to stretch")
    assert result.ok and len(result.tool_calls) == 20
    assert made == ["stretch"] * 3  # agent.max_repeat_calls: 3 ran, 17 were not run
    skipped = result.tool_calls[3]
    assert "repeated call of a tool with side effects" in (skipped.error or "")
    assert skipped.result.startswith("Not run: you already called remind with these arguments")
    assert "created reminder #3" in skipped.result  # the last result, as a reminder
    assert result.warnings == [
        "remind was called 17 more time(s) with the same arguments after 3 run(s); those calls "
        "were not run"
    ]


def test_arguments_compare_as_json_and_odd_text_never_raises():
    assert canonical_arguments('{"b": 1, "a": [1, 2]}') == canonical_arguments('{"a":[1,2],"b":1}')
    assert canonical_arguments(" {bad ") == "{bad"
    deep = "[" * 100_000  # a RecursionError here would take the whole tool round down
    assert canonical_arguments(deep) == deep


async def test_max_repeat_calls_zero_turns_the_guard_off(llm, make_agent):
    meme, ran = counting_tool()
    llm.script(*[reply(tool_calls=[tool_call("meme", {"topic": "x"})]) for _ in range(5)])
    llm.script(reply("done"))
    agent = make_agent(tools=[meme], overrides={"agent.max_repeat_calls": 0})
    assert (await agent.chat("go")).ok
    assert len(ran) == 5


# ------------------------------------------------------------------ item 5: text tool calls

HERMES = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
QWEN_XML = (
    "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n"
    "</parameter>\n</function>\n</tool_call>"
)
FENCED = 'I will add them.\n```json\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n```'
BARE_LIST = '[{"name": "add", "parameters": {"a": 2, "b": 3}}]'


@pytest.mark.parametrize(
    ("written", "stream"),
    [(HERMES, False), (QWEN_XML, False), (FENCED, False), (BARE_LIST, False), (HERMES, True)],
)
async def test_text_tool_calls_run_when_enabled(llm, make_agent, written, stream):
    llm.script(reply(written), reply("2 + 3 = 5"))
    overrides = {"llm.text_tool_calls": True, "llm.stream": stream}
    agent = make_agent(tools=[add], overrides=overrides)
    result = await agent.chat("2+3?")
    assert result.ok and result.text == "2 + 3 = 5" and result.warnings == []
    assert [(c.name, c.result, c.outcome) for c in result.tool_calls] == [("add", "5", "ok")]
    assistant = llm.requests[1].messages[-2]  # re-sent as a real call, accepted by the server
    assert assistant["tool_calls"][0]["function"]["name"] == "add"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert assistant["content"] == ("I will add them." if written == FENCED else None)
    assert_valid(await agent.history())


async def test_a_call_inside_inlined_reasoning_is_not_run(llm, make_agent):
    thinking = f"<think>Maybe {HERMES}? No, I know it.</think>It is 5."
    llm.script(reply(thinking))
    agent = make_agent(tools=[add], overrides={"llm.text_tool_calls": True})
    result = await agent.chat("2+3?")
    assert result.ok and result.text == "It is 5." and not result.tool_calls


async def test_json_naming_no_offered_tool_is_just_an_answer(llm, make_agent):
    answer = '```json\n{"name": "Ada", "arguments": {"born": 1815}}\n```'
    llm.script(reply(answer))
    agent = make_agent(tools=[add], overrides={"llm.text_tool_calls": True})
    result = await agent.chat("a JSON record about Ada, please")
    assert result.ok and result.text == answer and not result.tool_calls
    assert result.warnings == []


@pytest.mark.parametrize(
    ("text", "calls", "rest"),
    [
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}', [("f", {"x": 1})], ""),  # no close
        ('<|python_tag|>{"name": "f", "parameters": {"x": 1}}', [("f", {"x": 1})], ""),
        (
            '[TOOL_CALLS] [{"name": "f", "arguments": {}}, {"name": "g"}]',
            [("f", {}), ("g", {})],
            "",
        ),
        (
            '{"type": "function", "function": {"name": "f", "arguments": "{\\"x\\": 1}"}}',
            [("f", {"x": 1})],
            "",
        ),  # OpenAI's nested shape, arguments double-encoded
        ('<tool_call>{"name": "f", "arguments": "{x"}</tool_call>', [("f", {"_raw": "{x"})], ""),
        (
            "<function=f>\n<parameter=q>\nhello world\n</parameter>\n</function>",
            [("f", {"q": "hello world"})],
            "",
        ),
        (
            'Sure.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\nThen I answer.',
            [("f", {})],
            "Sure.\n\nThen I answer.",
        ),
        ('{"name": "f", "arguments": {}, "extra": 1}', [], None),  # a record, not a call
        ('```python\n{"name": "f", "arguments": {}}\n```', [], None),  # code, not a call
        ('{"name": "nobody", "arguments": {}}', [], None),  # not an offered tool
        ("<tool_call>not json</tool_call>", [], None),
        ("[TOOL_CALLS]" + "[" * 5000, [], None),  # too deep for json: no RecursionError
        ("<function=f>" + "<parameter=a>" * 50, [], None),  # no closing tags: not a call
    ],
)
def test_text_call_forms(text, calls, rest):
    found = find_text_calls(text, {"f", "g"})
    assert [(c.name, json.loads(c.arguments)) for c in found.calls] == calls
    assert found.text == (text if rest is None else rest)
    assert found.whole == (bool(calls) and not rest)


@pytest.mark.parametrize("written", [HERMES, FENCED.split("\n", 1)[1]])
async def test_with_text_calls_off_a_call_only_answer_is_an_error(llm, make_agent, written):
    llm.script(reply(written))
    agent = make_agent(tools=[add], overrides={"llm.text_tool_calls": False})
    result = await agent.chat("2+3?")
    assert result.status == "error" and result.text == written and not result.tool_calls
    assert "only a tool call written as text (add), which was not run" in (result.error or "")
    assert 'set it to "auto"' in (result.error or "")
    record = (await agent.runs())[0]
    assert record.status == "error" and record.error == result.error


async def test_with_text_calls_off_prose_around_a_call_is_a_warning(llm, make_agent):
    llm.script(reply(FENCED))
    agent = make_agent(tools=[add], overrides={"llm.text_tool_calls": False})
    result = await agent.chat("how would you call add?")
    assert result.ok and not result.tool_calls
    assert result.warnings == [
        "the answer contains a tool call written as text (add) that was not run "
        "(llm.text_tool_calls = false)"
    ]


# ------------------------------------------------------------------ #36: auto mode, more forms


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"


async def test_auto_is_the_default_and_runs_a_call_only_answer(llm, make_agent):
    """llama-server --jinja with a 1.5B model: 0 native calls; the JSON came back as an answer."""
    llm.script(reply(BARE_LIST), reply("2 + 3 = 5"))
    agent = make_agent(tools=[add])  # no llm.text_tool_calls override
    assert agent.config.llm.text_tool_calls == "auto"
    result = await agent.chat("2+3?")
    assert result.ok and result.text == "2 + 3 = 5" and result.warnings == []
    assert [(c.name, c.result) for c in result.tool_calls] == [("add", "5")]
    assert_valid(await agent.history())


async def test_auto_runs_a_call_after_the_models_words_not_one_in_the_middle(llm, make_agent):
    announced = (
        'I will check the weather for you.\n{"name": "weather", "arguments": {"city": "Oslo"}}'
    )
    llm.script(reply(announced), reply("It is sunny in Oslo."))
    agent = make_agent(tools=[add, weather])
    first = await agent.chat("weather in Oslo?")
    assert first.ok and [c.result for c in first.tool_calls] == ["Oslo: sunny"]
    assert llm.requests[1].messages[-2]["content"] == "I will check the weather for you."

    example = f"{FENCED}\nThat is how you would call it."
    llm.script(reply(example))
    second = await agent.chat("how would you call add?")
    assert second.ok and not second.tool_calls and second.text == example
    assert second.warnings == [
        "the answer contains a tool call written as text (add) that was not run (more text "
        'follows it; llm.text_tool_calls = "auto" runs only calls that end the answer, true '
        "runs every one)"
    ]


@pytest.mark.parametrize(
    "written",
    [
        '{{"name": "weather", "arguments": {{"city": "Oslo"}}}}',  # template braces, doubled
        '{{"name": "weather", "arguments": {"city": "Oslo"}}}',
        '<tools>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n'
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tools>',
        '```json\n{"name": "weather", "arguments": {"city": "Oslo"}}\n'
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n```',
        '{"name": "weather", "arguments": {"city": "Oslo"}}\n'
        '{"name": "add", "arguments": {"a": 2, "b": 3}}',  # one per line
        '{"name": "weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "add", "arguments": {"a": 2, "b": 3}}',
        '<function name="weather" arguments=\'{"city": "Oslo"}\'/>\n'
        '<function name=add arguments={"a": 2, "b": 3} />',
        'Let me look that up.\n<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}'
        '</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
    ],
)
async def test_each_common_text_form_runs_every_call_in_order(llm, make_agent, written):
    llm.script(reply(written), reply("done"))
    agent = make_agent(tools=[add, weather])
    result = await agent.chat("go")
    calls = [(c.name, json.loads(c.arguments)) for c in result.tool_calls]
    expected = [("weather", {"city": "Oslo"}), ("add", {"a": 2, "b": 3})]
    assert calls == expected[: len(calls)] and len(calls) >= 1
    assert result.ok and result.text == "done" and result.warnings == []
    if "add" in written:
        assert [c.result for c in result.tool_calls] == ["Oslo: sunny", "5"]
    assert_valid(await agent.history())


async def test_an_unknown_name_in_a_tagged_call_is_told_to_the_model(llm, make_agent):
    llm.script(
        reply('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'),
        reply("Sorry, I cannot check the weather."),
    )
    agent = make_agent(tools=[add])
    result = await agent.chat("weather?")
    [call] = result.tool_calls
    assert call.name == "get_weather" and call.outcome == "error"
    assert "tool 'get_weather' not found" in call.result
    assert llm.requests[1].messages[-1]["content"] == call.result  # as for a native call


async def test_call_shaped_text_that_cannot_be_read_is_a_warning(llm, make_agent):
    llm.script(reply("Here: <tool_call>weather(city=Oslo)</tool_call>"))
    agent = make_agent(tools=[weather])
    result = await agent.chat("weather?")
    assert result.ok and not result.tool_calls
    assert result.warnings == [
        "the answer contains text shaped like a tool call that could not be read as one, so "
        "it was not run: <tool_call>weather(city=Oslo)</tool_call>"
    ]


@pytest.mark.parametrize(
    ("text", "calls", "rest"),
    [
        ("<function name='f'/>", [("f", {})], ""),
        ('<function name="f" parameters="{&quot;x&quot;: 1}"></function>', [("f", {"x": 1})], ""),
        ("<function name='f' arguments='{x'/>", [], None),  # broken arguments: unread
        ('Sure.\n{"name": "f", "arguments": {}}\nok', [], None),  # text after it: no tail call
        ('{"name": "f", "arguments": {}};\n{"name": "g"}', [("f", {}), ("g", {})], ""),
        ("<function name='" * 3000, [], None),  # unclosed quotes: linear, nothing found
        ("{\n" * 3000, [], None),  # many line starts: only a few tried
        ("{{" * 3000, [], None),
    ],
)
def test_more_text_call_forms(text, calls, rest):
    found = find_text_calls(text, {"f", "g"})
    assert [(c.name, json.loads(c.arguments)) for c in found.calls] == calls
    assert found.text == (text if rest is None else rest)


# ------------------------------------------------------------------ #36: prompt caching


def tools_bytes(request: Any) -> str:
    """The ``tools`` array exactly as the request's body carried it."""
    raw = request.raw.decode("utf-8")
    start = raw.index("[", raw.index('"tools"'))
    _, end = json.JSONDecoder().raw_decode(raw, start)
    return raw[start:end]


async def test_tool_definitions_are_byte_identical_across_sessions(llm, make_agent):
    """Session names in 13 descriptions made every new chat re-read ~3,600 prompt tokens."""
    overrides = {"agent.builtin_tools": True, "embedding.provider": "none"}
    agent = make_agent(tools=[add], overrides=overrides)
    sessions = ["nb:default", "g:qq:123", "f:qq:42", "nb:other"]
    for session in sessions:
        llm.script(reply("hi"))
        assert (await agent.chat("hello", session=session)).ok
    sent = [tools_bytes(r) for r in llm.requests]
    names = {t["function"]["name"] for t in llm.requests[0].body["tools"]}
    assert {"clock_create", "kb_add", "memory_save"} <= names  # the families that named it
    assert all(tools == sent[0] for tools in sent[1:])
    assert not any(key in sent[0] for key in ("qq:123", "qq:42", "nb:other"))


# ------------------------------------------------------------------ item 6: empty final reply


async def test_an_empty_answer_after_tools_is_asked_for_once(llm, make_agent):
    llm.script(
        reply(tool_calls=[tool_call("add", {"a": 1, "b": 1})]),
        reply("<think>done thinking</think>  "),
        reply("1 + 1 = 2"),
    )
    agent = make_agent(tools=[add])
    result = await agent.chat("1+1?")
    assert result.ok and result.text == "1 + 1 = 2"
    retry = llm.requests[2]
    assert retry.messages[-1] == {"role": "user", "content": EMPTY_REPLY_MESSAGE}
    assert retry.messages[-2]["role"] == "tool" and retry.tools is None
    history = await agent.history()
    assert [m["role"] for m in history[-2:]] == ["user", "assistant"]
    assert_valid(history)


async def test_an_answer_still_empty_ends_as_an_error_not_a_success(llm, make_agent):
    llm.script(reply(tool_calls=[tool_call("add", {"a": 1, "b": 1})]), reply(""), reply(None))
    agent = make_agent(tools=[add])
    result = await agent.chat("1+1?")
    assert result.status == "error" and result.text == ""
    assert "empty answer, also when asked once more" in (result.error or "")
    assert len(llm.requests) == 3
    record = (await agent.runs())[0]
    assert record.status == "error" and "empty answer" in (record.error or "")
    history = await agent.history()
    assert history[-1] == {"role": "assistant", "content": ""}  # null content is refused
    llm.script(reply("next turn works"))
    assert (await agent.chat("again")).ok
    assert_valid(await agent.history())


async def test_after_the_iteration_limit_an_empty_answer_is_an_error_at_once(llm, make_agent):
    llm.script(reply(tool_calls=[tool_call("add", {"a": 1, "b": 1})]), reply(""))
    agent = make_agent(tools=[add], overrides={"agent.max_iterations": 1})
    result = await agent.chat("1+1?")
    assert result.status == "error" and result.error == (
        "the run reached the iteration limit (agent.max_iterations = 1: that many rounds of "
        "tool calls) and the model's last reply was empty; the tool results are in the record "
        "(raise agent.max_iterations, or ask for less at once)"
    )
    assert "empty answer" not in result.error  # it did not give up: it was stopped
    assert len(llm.requests) == 2  # the limit notice already asked for an answer


async def test_after_the_iteration_limit_a_call_only_answer_says_so(llm, make_agent):
    llm.script(reply(tool_calls=[tool_call("add", {"a": 1, "b": 1})]), reply(HERMES))
    agent = make_agent(tools=[add], overrides={"agent.max_iterations": 1})
    result = await agent.chat("1+1?")
    assert result.status == "error" and len(result.tool_calls) == 1  # the text call did not run
    assert "reached the iteration limit (agent.max_iterations = 1" in (result.error or "")
    assert "last reply was only a tool call, written as text, which was not run" in result.error


async def test_an_empty_answer_without_tool_rounds_is_left_alone(llm, make_agent):
    llm.script(reply(""))
    agent = make_agent(tools=[add])
    result = await agent.chat("say nothing")
    assert result.ok and result.text == "" and len(llm.requests) == 1


# ------------------------------------------------------------------ item 3: the run path's part


async def test_a_large_fixed_part_does_not_compact_every_turn(llm, make_agent):
    """The run measures the system prompt and tools, so only the conversation is budgeted."""
    overrides = {
        "agent.max_context_tokens": 1000,  # threshold 800; the prompt alone is about 1,000
        "agent.system_prompt": "You are a careful assistant. " * 140,
    }
    agent = make_agent(tools=[add], overrides=overrides)
    for n in range(3):
        llm.script(reply(f"answer {n}"))
        assert (await agent.chat(f"question {n}")).ok
    assert len(llm.requests) == 3  # no summariser call on any turn
    window = agent._rt.window
    assert window.fixed_too_large and "agent.max_context_tokens" in window.fixed_warning


# ------------------------------------------------------------------ all habits at once


class SloppyModel:
    """A seeded stand-in for a 1.5B model: broken JSON, text calls, repeats, empty replies."""

    def __init__(self, seed: int) -> None:
        import random

        self.rng = random.Random(seed)
        self.tally: dict[str, int] = {}

    def __call__(self, request: Any) -> Any:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"] == EMPTY_REPLY_MESSAGE:
            return self._pick({"answer": 3, "empty": 1})
        weights = {"answer": 2, "empty": 2, "broken": 2, "text": 2, "meme": 3}
        if last["role"] == "tool" and str(last["content"]).startswith("sent a meme"):
            weights["meme"] = 8  # once it starts, a small model loops on the same call
        if last["role"] == "tool" and "Not run" in str(last["content"]):
            weights["meme"] = 1  # a model that was told usually stops
        return self._pick(weights)

    def _pick(self, weights: dict[str, int]) -> Any:
        kind = self.rng.choices(list(weights), list(weights.values()))[0]
        self.tally[kind] = self.tally.get(kind, 0) + 1
        if kind == "answer":
            return reply("Here is what I found.")
        if kind == "empty":
            return reply(self.rng.choice(["", None, "<think>hm</think>"]))
        if kind == "broken":
            broken = self.rng.choice(['{"a": 1, "b": ', "NaN", "[1, 2]"])
            return reply(tool_calls=[tool_call("add", broken)])
        if kind == "text":
            return reply(HERMES)
        return reply(tool_calls=[tool_call("meme", {"topic": "cats"})])


@pytest.mark.parametrize("text_tool_calls", [False, True])
async def test_a_hundred_sloppy_chats_never_poison_the_session(llm, make_agent, text_tool_calls):
    meme, ran = counting_tool()
    model = SloppyModel(seed=20)
    llm.responder = model
    overrides = {"llm.text_tool_calls": text_tool_calls, "agent.max_iterations": 8}
    agent = make_agent(tools=[add, meme], overrides=overrides)
    statuses: dict[str, int] = {}
    text_runs = flagged = 0
    for n in range(50):
        result = await agent.chat(f"chat {n}")
        statuses[result.status] = statuses.get(result.status, 0) + 1
        text_runs += sum(c.id.startswith("call_text_") for c in result.tool_calls)
        flagged += "written as text" in (result.error or "")
        assert "invalid conversation" not in (result.error or "")  # the server never refused
        if result.tool_calls:  # never a success without an answer after tool rounds
            assert result.text or result.status == "error"
        if result.status == "error":
            error = result.error or ""
            assert "empty answer" in error or "only a tool call written as text" in error
    assert_valid(await agent.history())
    assert len(ran) < model.tally["meme"]  # some repeats were answered, not run
    asked = sum(r.messages[-1].get("content") == EMPTY_REPLY_MESSAGE for r in llm.requests)
    assert asked > 0  # empty answers after tools were asked for again
    assert (text_runs > 0, flagged > 0) == (text_tool_calls, not text_tool_calls)
    print(f"text_tool_calls={text_tool_calls}: {statuses}, model habits {model.tally}, ", end="")
    print(f"memes run {len(ran)}, empty answers asked again {asked}, text calls run {text_runs}")
