"""Fault suite, LLM client: a scripted server that misbehaves on purpose, stream and non-stream.

Every misbehaviour ends in one of two ways: a well-formed `Completion` whose message a strict
server accepts back in the next request, or an `LLMError` that says what was wrong — after the
retries that can help (counted on the server) and never with a half answer.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from ania_nb import Config
from ania_nb.engine.llm import (
    INVALID_TOOL_NAME,
    Completion,
    LLMClient,
    RetryNotice,
    retry_after_seconds,
    safe_arguments,
)
from ania_nb.engine.usage import Usage
from ania_nb.errors import LLMError, LLMStreamError
from ania_nb.testing import (
    Raw,
    ScriptedLLM,
    conversation_problem,
    cut_stream,
    error,
    raw,
    reply,
    tool_call,
)
from ania_nb.tools import ToolExecutor, tool

USER: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
LONG = "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun."
BOTH = pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])

MakeClient = Callable[..., LLMClient]


@pytest.fixture
def fb_llm() -> AsyncIterator[ScriptedLLM]:
    """A second scripted server for the fallback model."""
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
async def make_client(llm: ScriptedLLM) -> AsyncIterator[MakeClient]:
    """Clients built from config (tiny retry delays) against `llm`, closed after the test."""
    clients: list[LLMClient] = []

    def factory(*, fallback: ScriptedLLM | None = None, **retry: Any) -> LLMClient:
        config = Config(
            llm={
                "base_url": llm.base_url,
                "api_key": llm.api_key,
                "model": "main-model",
                "temperature": None,
                "top_p": None,
                "max_tokens": None,
            },
            retry={"max_attempts": 3, "base_delay": 0.001, "max_delay": 0.01, **retry},
            fallback={"base_url": fallback.base_url, "model": "fb-model"} if fallback else {},
        )
        client = LLMClient.from_config(config)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.aclose()


def as_raw(message: dict[str, Any], finish: str = "stop", **extra: Any) -> Raw:
    """The same assistant message as a body, and as stream chunks (one delta, then the end).

    `extra` keys (e.g. usage) go into the body, and into a last chunk without choices.
    """
    envelope = {"id": "chatcmpl-raw", "model": "main-model"}
    body = {
        **envelope,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        **extra,
    }
    chunks = [
        {**envelope, "choices": [{"index": 0, "delta": message, "finish_reason": None}]},
        {**envelope, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
    ]
    if extra:
        chunks.append({**envelope, "choices": [], **extra})
    return raw(body, chunks=chunks)


async def assert_valid_history(
    llm: ScriptedLLM, client: LLMClient, completion: Completion, stream: bool
) -> None:
    """The answer plus a result per call is a conversation a strict server accepts."""
    history = [*USER, completion.message]
    history += [
        {"role": "tool", "tool_call_id": call["id"], "content": "ok"}
        for call in completion.message.get("tool_calls", [])
    ]
    assert conversation_problem(history) is None
    json.dumps(history, ensure_ascii=False).encode("utf-8")  # storable and sendable
    llm.strict = True
    llm.script(reply("accepted"))
    answer = await client.complete(history, stream=stream)
    assert answer.message["content"] == "accepted"
    assert llm.requests[-1].messages == history


# -- odd tool-call shapes -----------------------------------------------------------------


ODD_CALLS = [
    tool_call("a", {"x": 1}, wire={"id": None}),
    tool_call("b", omit=["id"]),
    tool_call("c", wire={"id": ""}),
    tool_call("d", wire={"id": 7}),
    tool_call("e", id="dup"),
    tool_call("f", id="dup"),
    tool_call("g", wire={"name": None}),
    tool_call("h", wire={"name": ""}),
    tool_call("i", wire={"arguments": {"city": "Oslo"}}),
    tool_call("j", wire={"arguments": None}),
]


def _call(call_id: str, name: str, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@BOTH
async def test_odd_tool_call_shapes_are_normalised_at_the_source(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(reply(tool_calls=ODD_CALLS))
    client = make_client()
    completion = await client.complete(USER, stream=stream)

    # Generated ids are call_<index of the answer in the conversation>_<position>; the server's
    # own ids are call_<request>_<position>. Unnamed calls stay, under a name no tool has.
    assert completion.message["tool_calls"] == [
        _call("call_1_0", "a", '{"x": 1}'),
        _call("call_1_1", "b"),
        _call("call_1_2", "c"),
        _call("call_1_3", "d"),
        _call("dup", "e"),
        _call("call_1_5", "f"),
        _call("call_0_6", INVALID_TOOL_NAME),
        _call("call_0_7", INVALID_TOOL_NAME),
        _call("call_0_8", "i", '{"city": "Oslo"}'),
        _call("call_0_9", "j"),
    ]
    assert completion.raw_arguments == {}  # objects and null are fine as arguments
    notes = "\n".join(completion.notes)
    assert "repeats an earlier id; stored as 'call_1_5'" in notes
    unnamed = f"tool call call_0_6: the function name is null; stored as {INVALID_TOOL_NAME!r}"
    assert unnamed in notes
    assert len(llm.requests) == 1
    await assert_valid_history(llm, client, completion, stream)


@BOTH
async def test_arguments_that_are_not_an_object_are_stored_wrapped_and_kept_raw(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(
        reply(
            tool_calls=[
                tool_call("lookup", '{"key": "Oslo"', id="c_cut"),
                tool_call("lookup", "NaN", id="c_nan"),
                tool_call("lookup", "[1, 2]", id="c_array"),
                tool_call("lookup", '{"key": "fine"}', id="c_ok"),
                tool_call("lookup", "", id="c_blank"),
            ]
        )
    )
    client = make_client()
    completion = await client.complete(USER, stream=stream)

    calls = completion.message["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [
        '{"_raw": "{\\"key\\": \\"Oslo\\""}',
        '{"_raw": "NaN"}',
        '{"_raw": "[1, 2]"}',
        '{"key": "fine"}',
        "{}",
    ]
    assert completion.raw_arguments == {
        "c_cut": '{"key": "Oslo"',
        "c_nan": "NaN",
        "c_array": "[1, 2]",
    }
    assert [completion.arguments_for(c) for c in calls] == [
        '{"key": "Oslo"',
        "NaN",
        "[1, 2]",
        '{"key": "fine"}',
        "{}",
    ]

    # The executor still tells the model exactly what was wrong with what it sent.
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    executor = ToolExecutor()
    executor.add(tool(lookup))
    outcomes = [await executor.execute("lookup", completion.arguments_for(c)) for c in calls]
    assert "failed to parse arguments for tool 'lookup'" in (outcomes[0].error or "")
    assert 'Arguments: {"key": "Oslo"' in (outcomes[0].error or "")
    assert "must be a JSON object, got array" in (outcomes[2].error or "")
    assert outcomes[3].error is None and outcomes[3].text == "fine"
    await assert_valid_history(llm, client, completion, stream)


def test_safe_arguments() -> None:
    assert safe_arguments('{"a": 1}') == '{"a": 1}'  # kept byte for byte
    assert safe_arguments("  ") == "{}"
    assert safe_arguments("{bad") == '{"_raw": "{bad"}'
    assert safe_arguments('{"a": Infinity}') == '{"_raw": "{\\"a\\": Infinity}"}'
    assert safe_arguments("null") == '{"_raw": "null"}'
    assert safe_arguments('{"a": "\\ud800"}') == '{"a": "\ufffd"}'  # an escaped lone surrogate
    for text in ("{bad", "[1]", '"s"', "1e999", "{" * 5000):
        assert isinstance(json.loads(safe_arguments(text)), dict)


# -- malformed bodies ---------------------------------------------------------------------


@BOTH
async def test_untrusted_usage_is_dropped_and_bad_cache_counts_ignored(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    odd = {  # one count that is not one: the whole block is untrusted (the call is estimated)
        "prompt_tokens": "lots",
        "completion_tokens": "12",
        "total_tokens": None,
    }
    cache_junk = {
        "prompt_tokens": "40",
        "completion_tokens": 12.0,
        "total_tokens": None,
        "prompt_tokens_details": {"cached_tokens": {"n": 3}},
        "prompt_cache_hit_tokens": float("nan"),
    }
    llm.script(
        reply("untrusted", usage=odd),
        reply("counted", usage=cache_junk),
        as_raw({"role": "assistant", "content": "no usage"}, usage="many"),
    )
    client = make_client()
    first = await client.complete(USER, stream=stream)
    assert first.message["content"] == "untrusted" and first.usage is None
    assert first.notes == [
        "usage.prompt_tokens is not a token count ('lots'); the call's tokens are estimated"
    ]

    second = await client.complete(USER, stream=stream)
    assert second.usage == {"prompt_tokens": 40, "completion_tokens": 12}
    assert "usage.prompt_cache_hit_tokens is not a token count (nan); ignored" in second.notes
    total = Usage()
    total.add_call(second.usage)
    assert (total.prompt_tokens, total.completion_tokens, total.total_tokens) == (40, 12, 52)

    third = await client.complete(USER, stream=stream)
    assert third.usage is None
    assert third.notes == ["usage is a string, not an object; the call's tokens are estimated"]
    assert len(llm.requests) == 3


@BOTH
@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (5, "a number"),
        ({"text": "hi"}, "an object"),
        (True, "a boolean"),
        ([{"type": "image_url", "image_url": {"url": "x"}}], "not text ('image_url')"),
    ],
)
async def test_non_string_content_is_a_clear_error_not_retried(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool, content: Any, kind: str
) -> None:
    llm.script(as_raw({"role": "assistant", "content": content}), reply("never asked for"))
    with pytest.raises(LLMError) as info:
        await make_client().complete(USER, stream=stream)

    text = str(info.value)
    assert not isinstance(info.value, LLMStreamError)
    assert "malformed response: " in text and kind in text
    assert "content" in text and "after 1 attempt" in text
    assert "Chat Completions format" in text  # the hint
    assert len(llm.requests) == 1  # the same server answers the same way: no retry


@BOTH
async def test_malformed_answer_goes_to_the_fallback(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(as_raw({"role": "assistant", "content": 5}))
    fb_llm.script(reply("from the fallback"))
    completion = await make_client(fallback=fb_llm).complete(USER, stream=stream)

    assert completion.message["content"] == "from the fallback"
    assert (len(llm.requests), len(fb_llm.requests)) == (1, 1)


@BOTH
async def test_content_as_text_parts_is_joined(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    parts = [{"type": "text", "text": "Hel"}, "lo"]
    llm.script(as_raw({"role": "assistant", "content": parts}))
    completion = await make_client().complete(USER, stream=stream)
    assert completion.message == {"role": "assistant", "content": "Hello"}


NO_CHOICES = [{"id": "x", "choices": []}, {"id": "x"}, {"id": "x", "choices": None}]


@BOTH
@pytest.mark.parametrize("body", NO_CHOICES, ids=["empty", "missing", "null"])
async def test_no_choices_is_retried(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool, body: dict[str, Any]
) -> None:
    llm.script(raw(body), raw(body), reply("third time"))
    completion = await make_client().complete(USER, stream=stream)
    assert completion.message["content"] == "third time"
    assert len(llm.requests) == 3


@BOTH
async def test_no_choices_every_time_is_an_error_after_all_attempts(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(*[raw({"id": "x", "choices": []})] * 3, reply("too late"))
    with pytest.raises(LLMError) as info:
        await make_client().complete(USER, stream=stream)
    text = str(info.value)
    assert "malformed response: no choices in the response" in text
    assert "after 3 attempts" in text
    assert len(llm.requests) == 3


@BOTH
async def test_error_inside_a_200_is_retried(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    overloaded = {"error": {"message": "model overloaded", "code": 503}}
    llm.script(raw(overloaded), raw(overloaded), raw(overloaded), reply("never"))
    with pytest.raises(LLMError, match="the provider reported an error: model overloaded"):
        await make_client().complete(USER, stream=stream)
    assert len(llm.requests) == 3

    llm.script(raw(overloaded))  # "never" is still queued after it
    completion = await make_client().complete(USER, stream=stream)
    assert completion.message["content"] == "never"


@BOTH
async def test_lone_surrogates_are_replaced(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool, tmp_path: Path
) -> None:
    llm.script(
        reply(
            "caf\ud800e",
            reasoning_content="think\udfff",
            tool_calls=[
                tool_call("f", '{"q": "x\ud83d"}', id="c\udc00"),  # raw surrogate in the text
                tool_call("g", '{"q": "\\udbff"}'),  # escaped inside the arguments JSON
            ],
        )
    )
    client = make_client()
    completion = await client.complete(USER, stream=stream)

    message = completion.message
    assert message["content"] == "caf\ufffde"
    assert message["reasoning_content"] == "think\ufffd"
    calls = message["tool_calls"]
    assert calls[0]["id"] == "c\ufffd"
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": "x\ufffd"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"q": "\ufffd"}
    with sqlite3.connect(tmp_path / "history.sqlite3") as db:  # what the store does with it
        db.execute("create table history (body text)")
        db.execute("insert into history values (?)", (json.dumps(message, ensure_ascii=False),))
    await assert_valid_history(llm, client, completion, stream)


@BOTH
async def test_lone_surrogate_in_the_conversation_is_sent_replaced(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(reply("fine"))
    messages = [{"role": "user", "content": "pasted \ud800 text"}]
    completion = await make_client().complete(messages, stream=stream)
    assert completion.message["content"] == "fine"
    assert llm.requests[0].messages == [{"role": "user", "content": "pasted \ufffd text"}]
    assert messages[0]["content"] == "pasted \ud800 text"  # the caller's list is not touched


# -- truncated answers ----------------------------------------------------------------------


@BOTH
async def test_finish_reason_length_is_reported(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(reply("The answer was cu", finish_reason="length"), reply("complete"))
    client = make_client()
    cut = await client.complete(USER, stream=stream)
    assert (cut.finish_reason, cut.truncated) == ("length", True)
    assert cut.message["content"] == "The answer was cu"
    whole = await client.complete(USER, stream=stream)
    assert (whole.finish_reason, whole.truncated) == ("stop", False)


@BOTH
@pytest.mark.parametrize("clean", [True, False], ids=["ended", "dropped"])
async def test_cut_stream_is_retried_never_a_half_answer(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool, clean: bool
) -> None:
    # Non-streamed, a cut is a connection dropped before any response: retried the same way.
    llm.script(cut_stream(reply(LONG), after_chunks=4, clean=clean), reply(LONG))
    completion = await make_client().complete(USER, stream=stream)  # nobody was shown text
    assert completion.message["content"] == LONG
    assert len(llm.requests) == 2


async def test_stream_cut_every_time_is_an_error(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(*[cut_stream(reply(LONG), after_chunks=4, clean=True)] * 3)
    with pytest.raises(LLMError) as info:
        await make_client().complete(USER, stream=True)
    text = str(info.value)
    assert "the stream ended without a finish_reason or [DONE]" in text
    assert "after 3 attempts" in text
    assert len(llm.requests) == 3


@pytest.mark.parametrize("clean", [True, False], ids=["ended", "dropped"])
async def test_cut_inside_tool_arguments_never_yields_the_half_call(
    llm: ScriptedLLM, make_client: MakeClient, clean: bool
) -> None:
    calls = [tool_call("get_weather", {"city": "Reykjavik, Iceland"})]
    # role, call opener, two 8-character pieces of the arguments: then the cut
    half = cut_stream(reply(tool_calls=calls), after_chunks=4, clean=clean)
    llm.script(half, half, half, reply(tool_calls=calls))
    client = make_client()
    with pytest.raises(LLMError, match="after 3 attempts"):
        await client.complete(USER, stream=True)
    assert len(llm.requests) == 3

    completion = await client.complete(USER, stream=True)
    (call,) = completion.message["tool_calls"]
    assert call["function"]["arguments"] == '{"city": "Reykjavik, Iceland"}'
    assert len(llm.requests) == 4


async def test_connection_lost_after_finish_reason_keeps_the_answer(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # role, 10 content pieces, the finish chunk: then the connection drops (no usage, no [DONE])
    llm.script(cut_stream(reply(LONG), after_chunks=12), reply("not asked"))
    shown: list[str] = []
    completion = await make_client().complete(USER, stream=True, on_delta=shown.append)
    assert completion.message["content"] == "".join(shown) == LONG
    assert (completion.finish_reason, completion.usage) == ("stop", None)
    assert len(llm.requests) == 1


async def test_stream_with_done_but_no_finish_reason_is_accepted(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # Some local servers never send finish_reason; [DONE] still says the answer is complete.
    llm.script(reply(LONG, finish_reason=""))
    completion = await make_client().complete(USER, stream=True)
    assert (completion.message["content"], completion.finish_reason) == (LONG, None)


async def test_cut_after_shown_text_is_not_retried_without_on_retry(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(cut_stream(reply(LONG), after_chunks=3, clean=True), reply(LONG))
    fb_llm.script(reply(LONG))
    shown: list[str] = []
    with pytest.raises(LLMStreamError) as info:
        await make_client(fallback=fb_llm).complete(USER, stream=True, on_delta=shown.append)
    assert "after output had started" in str(info.value)
    assert "ended without a finish_reason or [DONE]" in str(info.value)
    assert shown == [LONG[:8], LONG[8:16]]
    assert (len(llm.requests), len(fb_llm.requests)) == (1, 0)


async def test_on_retry_takes_back_shown_text_and_the_stream_is_retried(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(
        cut_stream(reply(LONG), after_chunks=3, clean=True),
        cut_stream(reply(LONG), after_chunks=4, clean=False),
        reply(LONG),
    )
    shown: list[str] = []
    notices: list[RetryNotice] = []

    async def on_retry(notice: RetryNotice) -> None:
        notices.append(notice)
        if notice.discard_output:
            shown.clear()  # what a notebook view does: take the partial text back

    completion = await make_client().complete(
        USER, stream=True, on_delta=shown.append, on_retry=on_retry
    )
    assert "".join(shown) == completion.message["content"] == LONG
    assert [(n.model, n.attempt, n.discard_output) for n in notices] == [
        ("main-model", 2, True),
        ("main-model", 3, True),
    ]
    assert "ended without a finish_reason or [DONE]" in notices[0].error
    assert "APIConnectionError" in notices[1].error
    assert len(llm.requests) == 3


async def test_garbage_after_valid_chunks_is_retried(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": "par"}}]}
    llm.script(raw(chunks=[chunk, "not json {"]), reply("whole"))
    completion = await make_client().complete(USER, stream=True)
    assert completion.message["content"] == "whole"
    assert len(llm.requests) == 2


# -- Retry-After --------------------------------------------------------------------------


@BOTH
@pytest.mark.parametrize("status", [429, 503])
async def test_retry_after_replaces_the_backoff(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool, status: int
) -> None:
    past = format_datetime(datetime.now(UTC) - timedelta(hours=1), usegmt=True)
    llm.script(error(status, retry_after=0), error(status, retry_after=past), reply("served"))
    notices: list[RetryNotice] = []
    # The policy alone would wait 60 s and more: only the header makes this finish.
    client = make_client(base_delay=60, max_delay=120)
    completion = await asyncio.wait_for(
        client.complete(USER, stream=stream, on_retry=notices.append), 20
    )
    assert completion.message["content"] == "served"
    assert [n.delay for n in notices] == [0.0, 0.0]
    assert len(llm.requests) == 3


@BOTH
async def test_retry_after_within_max_delay_is_the_delay(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(error(429, retry_after=0.05), reply("served"))
    notices: list[RetryNotice] = []
    await make_client(max_delay=1).complete(USER, stream=stream, on_retry=notices.append)
    assert [(n.attempt, n.delay) for n in notices] == [(2, 0.05)]


@BOTH
async def test_retry_after_beyond_max_delay_ends_the_retries(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(error(429, "slow down", retry_after=120))
    fb_llm.script(reply("fallback instead"))
    with pytest.raises(LLMError) as info:
        await make_client(max_delay=5).complete(USER, stream=stream)
    text = str(info.value)
    assert "HTTP 429: slow down" in text
    assert "asked to wait 120 s (Retry-After), more than retry.max_delay (5 s)" in text
    assert len(llm.requests) == 1

    llm.script(error(429, "slow down", retry_after=120), reply("not asked"))
    completion = await make_client(fallback=fb_llm, max_delay=5).complete(USER, stream=stream)
    assert completion.message["content"] == "fallback instead"


def test_retry_after_seconds() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(" 1.5 ") == 1.5
    assert retry_after_seconds("-4") == 0.0
    assert retry_after_seconds("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30.0
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0
    for bad in (None, "", "soon", "nan", "inf"):
        assert retry_after_seconds(bad, now) is None


# -- fallback within a run ----------------------------------------------------------------


@BOTH
async def test_after_the_fallback_answered_a_run_asks_it_first(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    # Bodies differ: the same 500 twice would end the retries early (deterministic failure).
    llm.script(error(500, "a"), error(500, "b"), error(500, "c"), reply("main is back"))
    fb_llm.script(reply("fb 1"), reply("fb 2"))
    client = make_client(fallback=fb_llm)
    run = client.for_run()

    assert (await run.complete(USER, stream=stream)).message["content"] == "fb 1"
    assert (await run.complete(USER, stream=stream)).message["content"] == "fb 2"
    assert len(llm.requests) == 3  # the second call did not spend the retry budget again
    assert len(fb_llm.requests) == 2

    # A new run starts with the main model again.
    assert (await client.for_run().complete(USER, stream=stream)).message["content"] == (
        "main is back"
    )
    assert len(llm.requests) == 4
    await run.aclose()  # a view owns nothing: the client still works
    llm.script(reply("still open"))
    assert (await client.complete(USER, stream=stream)).message["content"] == "still open"


async def test_run_goes_back_to_main_when_the_fallback_fails(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(error(400, "main refuses"), reply("main answers"), reply("main again"))
    fb_llm.script(reply("fb answers"), error(400, "fb refuses"))
    run = make_client(fallback=fb_llm).for_run()
    notices: list[RetryNotice] = []

    first = await run.complete(USER, on_retry=notices.append)
    second = await run.complete(USER, on_retry=notices.append)  # fallback first: it refuses
    third = await run.complete(USER)  # main answered last: main first
    assert [c.message["content"] for c in (first, second, third)] == [
        "fb answers",
        "main answers",
        "main again",
    ]
    assert [(n.model, n.attempt, n.delay) for n in notices] == [
        ("fb-model", 1, 0.0),
        ("main-model", 1, 0.0),
    ]
    assert "main refuses" in notices[0].error and "fb refuses" in notices[1].error
    assert [r.model for r in llm.requests] == ["main-model"] * 3
    assert [r.model for r in fb_llm.requests] == ["fb-model"] * 2


async def test_both_fail_with_the_fallback_first(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(error(400, "main refuses"), error(400, "main refuses again"))
    fb_llm.script(reply("fb answers"), error(400, "fb refuses"))
    run = make_client(fallback=fb_llm).for_run()
    await run.complete(USER)
    with pytest.raises(LLMError) as info:
        await run.complete(USER)
    text = str(info.value)
    assert text.index("fb refuses") < text.index("the main model failed too")
    assert "main refuses again" in text
    assert info.value.model == "main-model"
