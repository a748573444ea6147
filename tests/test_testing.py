"""ania_nb.testing: the scripted LLM server, driven by the real openai clients over loopback."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import ania_nb.testing as testing
from ania_nb.testing import (
    EmbeddingsEndpoint,
    RecordedRequest,
    Reply,
    ScriptedLLM,
    cut_stream,
    delay,
    disconnect,
    embedding_vector,
    error,
    garbage,
    raw,
    reply,
    script_from_json,
    script_to_json,
    tool_call,
    usage,
)

ROOT = Path(__file__).resolve().parents[1]
HI: list[Any] = [{"role": "user", "content": "hi"}]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city — ünïcode kept.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
def client(llm: ScriptedLLM) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as c:
        yield c


@pytest.fixture
async def aclient(llm: ScriptedLLM) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as c:
        yield c


def _http(url: str, data: bytes | None = None) -> tuple[int, dict[str, Any]]:
    """Raw stdlib request, for shapes the openai client does not expose."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


# -- replies ------------------------------------------------------------------------------


def test_text_reply_with_cached_and_deepseek_usage(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(reply("Hello!", usage=usage(120, 7, cached=100, deepseek_cache_hit=96)))
    resp = client.chat.completions.create(model="gpt-test", messages=HI)
    assert resp.id == "chatcmpl-scripted-0"
    assert resp.model == "gpt-test"
    choice = resp.choices[0]
    assert (choice.message.role, choice.message.content) == ("assistant", "Hello!")
    assert choice.finish_reason == "stop"
    assert choice.message.tool_calls is None
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (120, 7)
    assert resp.usage.total_tokens == 127
    assert resp.usage.prompt_tokens_details is not None
    assert resp.usage.prompt_tokens_details.cached_tokens == 100
    assert resp.usage.model_extra == {"prompt_cache_hit_tokens": 96, "prompt_cache_miss_tokens": 24}


def test_default_usage_model_override_and_no_usage(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(reply("estimated"), reply("x", model="other-model", usage=None))
    first = client.chat.completions.create(model="m", messages=HI)
    assert first.usage is not None and first.usage.prompt_tokens > 0
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    second = client.chat.completions.create(model="m", messages=HI)
    assert second.model == "other-model"
    assert second.usage is None


async def test_parallel_tool_calls(llm: ScriptedLLM, aclient: openai.AsyncOpenAI):
    llm.script(
        reply(
            tool_calls=[
                tool_call("get_weather", {"city": "Oslo"}),
                tool_call("get_weather", {"city": "Köln"}),
                tool_call("get_time", id="call_custom"),
            ]
        )
    )
    resp = await aclient.chat.completions.create(model="m", messages=HI, tools=TOOLS)
    message = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    calls: list[Any] = message.tool_calls or []
    assert [c.id for c in calls] == ["call_0_0", "call_0_1", "call_custom"]
    assert [c.function.name for c in calls] == ["get_weather", "get_weather", "get_time"]
    assert [json.loads(c.function.arguments) for c in calls] == [
        {"city": "Oslo"},
        {"city": "Köln"},
        {},
    ]


def test_malformed_arguments_are_sent_verbatim(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(reply(tool_calls=[tool_call("get_weather", '{"city": "Oslo"')]))
    resp = client.chat.completions.create(model="m", messages=HI)
    calls: list[Any] = resp.choices[0].message.tool_calls or []
    assert calls[0].function.arguments == '{"city": "Oslo"'


def test_reasoning_content(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(reply("42", reasoning_content="Six times seven."), reply("plain"))
    message = client.chat.completions.create(model="m", messages=HI).choices[0].message
    assert message.model_extra is not None
    assert message.model_extra["reasoning_content"] == "Six times seven."
    plain = client.chat.completions.create(model="m", messages=HI).choices[0].message
    assert "reasoning_content" not in (plain.model_extra or {})


# -- streaming ----------------------------------------------------------------------------


def _reassemble(chunks: list[Any]) -> dict[str, Any]:
    """Fold stream chunks back into one message, as an engine would."""
    out: dict[str, Any] = {
        "content": "",
        "reasoning": "",
        "calls": {},
        "finish": None,
        "usage": None,
    }
    for chunk in chunks:
        if chunk.usage is not None:
            out["usage"] = chunk.usage.model_dump(exclude_none=True)
        for choice in chunk.choices:
            delta = choice.delta
            out["content"] += delta.content or ""
            out["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                entry = out["calls"].setdefault(
                    call.index, {"id": None, "name": "", "arguments": ""}
                )
                entry["id"] = call.id or entry["id"]
                entry["name"] += (call.function and call.function.name) or ""
                entry["arguments"] += (call.function and call.function.arguments) or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return out


async def test_stream_reassembles_to_the_non_streamed_reply():
    async with (
        ScriptedLLM(chunk_size=5) as llm,
        openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client,
    ):
        scripted = reply(
            "The weather is fine today.",
            reasoning_content="User wants weather; call tools.",
            tool_calls=[
                tool_call("get_weather", {"city": "Oslo"}, id="call_a"),
                tool_call("get_weather", {"city": "Bergen"}, id="call_b"),
            ],
            usage=usage(50, 20, cached=10),
        )
        llm.script(scripted, scripted)
        full = await client.chat.completions.create(model="m", messages=HI)
        stream = await client.chat.completions.create(
            model="m", messages=HI, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]

    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].object == "chat.completion.chunk"
    assert all(len(c.choices[0].delta.content or "") <= 5 for c in chunks if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    got = _reassemble(chunks)
    message = full.choices[0].message
    assert got["content"] == message.content
    assert got["reasoning"] == (message.model_extra or {})["reasoning_content"]
    assert got["finish"] == full.choices[0].finish_reason == "tool_calls"
    expected_calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in message.tool_calls or []
    ]
    assert [got["calls"][i] for i in sorted(got["calls"])] == expected_calls
    assert full.usage is not None
    assert got["usage"] == full.usage.model_dump(exclude_none=True)


async def test_stream_without_include_usage_has_no_usage_chunk(
    llm: ScriptedLLM, aclient: openai.AsyncOpenAI
):
    llm.script(reply("short"))
    stream = await aclient.chat.completions.create(model="m", messages=HI, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None and c.choices for c in chunks)
    assert _reassemble(chunks)["content"] == "short"
    assert llm.requests[0].stream is True


# -- failures -----------------------------------------------------------------------------


def test_errors_surface_as_typed_openai_exceptions(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(error(429, "Slow down, please.", retry_after=2), error(500), reply("recovered"))
    with pytest.raises(openai.RateLimitError, match=r"Slow down, please\.") as rate:
        client.chat.completions.create(model="m", messages=HI)
    assert rate.value.status_code == 429
    assert rate.value.response.headers["retry-after"] == "2"
    assert rate.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.InternalServerError, match="Internal Server Error") as server:
        client.chat.completions.create(model="m", messages=HI)
    assert server.value.type == "server_error"
    assert client.chat.completions.create(model="m", messages=HI).choices[0].message.content == (
        "recovered"
    )


async def test_garbage_body_and_garbage_stream_fail_in_the_client(
    llm: ScriptedLLM, aclient: openai.AsyncOpenAI
):
    llm.script(garbage(), garbage(), reply("fine"))
    with pytest.raises((ValueError, openai.APIError)):
        await aclient.chat.completions.create(model="m", messages=HI)
    stream = await aclient.chat.completions.create(model="m", messages=HI, stream=True)
    with pytest.raises(ValueError):
        async for _ in stream:
            pass
    resp = await aclient.chat.completions.create(model="m", messages=HI)
    assert resp.choices[0].message.content == "fine"


async def test_delay_past_client_timeout_then_server_keeps_serving(llm: ScriptedLLM):
    llm.script(delay(5), reply("too late"), delay(0.01, reply("prompt enough")), reply("next"))
    async with openai.AsyncOpenAI(
        base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=0.5
    ) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=HI)
        # The timed-out request already claimed "too late", so order is kept.
        second = await client.chat.completions.create(model="m", messages=HI)
        third = await client.chat.completions.create(model="m", messages=HI)
    assert second.choices[0].message.content == "prompt enough"
    assert third.choices[0].message.content == "next"


async def test_cut_stream_breaks_the_client_stream(llm: ScriptedLLM, aclient: openai.AsyncOpenAI):
    llm.script(
        cut_stream(reply("abcdefghijklmnopqrstuvwxyz"), after_chunks=2), cut_stream(reply("x"))
    )
    stream = await aclient.chat.completions.create(model="m", messages=HI, stream=True)
    received: list[Any] = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk)
    assert _reassemble(received)["content"] == "abcdefgh"  # role chunk + one 8-char piece
    with pytest.raises(openai.APIConnectionError):  # no stream requested: no response at all
        await aclient.chat.completions.create(model="m", messages=HI)


def _post(llm: ScriptedLLM, *, stream: bool) -> tuple[int, dict[str, str], bytes]:
    """POST a chat request with the stdlib; status, headers and the whole raw body."""
    body = json.dumps({"model": "m", "messages": HI, "stream": stream}).encode()
    url = f"{llm.base_url}/chat/completions"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _events(data: bytes) -> list[Any]:
    """The data payloads of an SSE body: parsed JSON, or the raw text ("[DONE]")."""
    out: list[Any] = []
    for line in data.decode().splitlines():
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


ODD_CALLS = [
    tool_call("f", {"a": 1}, wire={"id": None}),
    tool_call("g", omit=["id"]),
    tool_call("h", wire={"id": "", "name": None}),
    tool_call("k", wire={"arguments": {"city": "Oslo"}}),
    tool_call("m", wire={"arguments": None}, omit=["index"]),
]


def test_odd_tool_call_shapes_non_streamed(llm: ScriptedLLM):
    llm.script(reply(tool_calls=ODD_CALLS))
    status, _, data = _post(llm, stream=False)
    assert status == 200
    calls = json.loads(data)["choices"][0]["message"]["tool_calls"]
    fn = "function"
    assert calls == [
        {"id": None, "type": fn, fn: {"name": "f", "arguments": '{"a": 1}'}},
        {"type": fn, fn: {"name": "g", "arguments": "{}"}},
        {"id": "", "type": fn, fn: {"name": None, "arguments": "{}"}},
        {"id": "call_0_3", "type": fn, fn: {"name": "k", "arguments": {"city": "Oslo"}}},
        {"id": "call_0_4", "type": fn, fn: {"name": "m", "arguments": None}},
    ]


def test_odd_tool_call_shapes_streamed():
    with ScriptedLLM(chunk_size=4) as llm:
        llm.script(reply(tool_calls=ODD_CALLS))
        status, _, data = _post(llm, stream=True)
    assert status == 200
    deltas = [
        call
        for event in _events(data)
        if isinstance(event, dict) and event["choices"]
        for call in event["choices"][0]["delta"].get("tool_calls", [])
    ]
    fn = "function"
    assert deltas == [
        {"index": 0, "id": None, "type": fn, fn: {"name": "f", "arguments": ""}},
        {"index": 0, fn: {"arguments": '{"a"'}},
        {"index": 0, fn: {"arguments": ": 1}"}},
        {"index": 1, "type": fn, fn: {"name": "g", "arguments": ""}},
        {"index": 1, fn: {"arguments": "{}"}},
        {"index": 2, "id": "", "type": fn, fn: {"name": None, "arguments": ""}},
        {"index": 2, fn: {"arguments": "{}"}},
        # arguments that are not a string are sent whole in the opener
        {
            "index": 3,
            "id": "call_0_3",
            "type": fn,
            fn: {"name": "k", "arguments": {"city": "Oslo"}},
        },
        {"id": "call_0_4", "type": fn, fn: {"name": "m", "arguments": None}},
    ]
    assert _events(data)[-1] == "[DONE]"


def test_retry_after_header_seconds_or_verbatim_date(llm: ScriptedLLM):
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    llm.script(error(503, retry_after=0.5), error(429, retry_after=date), error(500))
    assert [_post(llm, stream=False)[1].get("retry-after") for _ in range(3)] == ["0.5", date, None]


def test_complete_streams_keep_the_connection_and_cut_ones_drop_it(llm: ScriptedLLM):
    import http.client

    llm.script(reply("one"), reply("two"), cut_stream(reply("three"), after_chunks=1))
    body = json.dumps({"model": "m", "messages": HI, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", llm.port, timeout=5)
    try:
        sockets, closing = [], []
        for _ in range(2):
            conn.request("POST", "/v1/chat/completions", body)
            sockets.append(conn.sock)
            response = conn.getresponse()
            assert b"data: [DONE]" in response.read()
            closing.append(response.will_close)
        assert sockets[0] is sockets[1] and closing == [False, False]  # one connection, reused
        conn.request("POST", "/v1/chat/completions", body)
        response = conn.getresponse()
        assert response.will_close  # a cut stream says so and drops the connection
        with pytest.raises(http.client.IncompleteRead):
            response.read()
    finally:
        conn.close()


def test_clean_cut_stream_ends_without_finish_reason_or_done():
    with ScriptedLLM(chunk_size=4) as llm:
        calls = [tool_call("f", {"city": "Oslo"})]
        llm.script(cut_stream(reply(tool_calls=calls), after_chunks=3, clean=True))
        status, _, data = _post(llm, stream=True)  # a complete HTTP body: no read error
    events = _events(data)
    assert status == 200 and len(events) == 3  # role, call opener, one arguments piece
    assert "[DONE]" not in events
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    assert events[-1]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == '{"ci'


def test_raw_sends_any_json_verbatim(llm: ScriptedLLM):
    no_choices = {"id": "x", "object": "chat.completion", "model": "m", "choices": []}
    chunks = [{"choices": [{"index": 0, "delta": {"content": 5}}]}, [1, 2], "not json {"]
    llm.script(
        raw(no_choices),
        raw(no_choices),  # to a stream: the body is the only event
        raw(chunks=chunks, done=False),
    )
    status, headers, data = _post(llm, stream=False)
    assert (status, headers["content-type"], json.loads(data)) == (
        200,
        "application/json",
        no_choices,
    )
    assert _events(_post(llm, stream=True)[2]) == [no_choices, "[DONE]"]
    data = _post(llm, stream=True)[2]
    assert data.endswith(b"data: not json {\n\n")  # a str is the event's data verbatim
    assert _events(data[: -len(b"data: not json {\n\n")]) == chunks[:2]


def test_lone_surrogates_are_sent_escaped(llm: ScriptedLLM):
    # Python servers escape them (ensure_ascii): the client must cope, the server must not crash.
    llm.script(reply("a\ud800b"), reply("c\udfffd"))
    assert b'"a\\ud800b"' in _post(llm, stream=False)[2]
    assert b'"c\\udfffd"' in _post(llm, stream=True)[2]


def _assistant(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def _call(id: Any = "c1", name: Any = "f", arguments: Any = "{}") -> dict[str, Any]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _result(id: str = "c1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": id, "content": "ok"}


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([USER, _assistant(_call(id=None)), _result()], "id must be a non-empty string"),
        ([USER, _assistant(_call(id="")), _result("")], "id must be a non-empty string"),
        ([USER, _assistant(_call(), _call()), _result(), _result()], "'c1' is used twice"),
        ([USER, _assistant(_call(name=None)), _result()], "function name must be"),
        ([USER, _assistant(_call(arguments="{bad")), _result()], "arguments are not valid JSON"),
        ([USER, _assistant(_call(arguments="NaN")), _result()], "not valid JSON"),
        ([USER, _assistant(_call(arguments="[" * 100_000)), _result()], "not valid JSON"),
        ([USER, _assistant(_call(arguments="[1]")), _result()], "must be a JSON object"),
        ([USER, _assistant(_call(arguments={"a": 1})), _result()], "must be a string"),
        ([USER, _assistant(_call()), USER], r"\['c1'\] of an earlier message have no result"),
        ([USER, _assistant(_call())], r"\['c1'\] have no result"),
        ([USER, _result()], "'c1' answers no call"),
        ([USER, _assistant(_call()), USER, _result()], "have no result"),
        ([{"role": "user", "content": 5}], "content must be a string"),
        ([], "non-empty array"),
        # llama-server's own refusals (common_chat_msgs_parse_oaicompat)
        ([USER, _assistant({**_call(), "type": None}), _result()], "type must be 'function'"),
        ([USER, _assistant({"id": "c1", "function": _call()["function"]})], "type must be"),
        ([USER, {"role": "assistant"}], "no content and no tool_calls"),
        ([USER, {"role": "assistant", "content": None}], "null content and no tool_calls"),
        ([{"role": "user", "content": [{"text": "hi"}]}], "content part must be an object"),
    ],
)
def test_strict_server_refuses_invalid_conversations(messages: list[Any], problem: str):
    with (
        ScriptedLLM(strict=True) as llm,
        openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client,
    ):
        llm.script(reply("valid at last"))
        with pytest.raises(openai.BadRequestError, match=problem) as info:
            client.chat.completions.create(model="m", messages=messages)
        assert "invalid conversation" in str(info.value)
        assert llm.pending == 1  # a refused request consumes no script item
        valid = [USER, _assistant(_call("a"), _call("b", arguments='{"x": 1}')), _result("b")]
        valid += [_result("a"), {"role": "assistant", "content": "done"}, USER]
        answer = client.chat.completions.create(model="m", messages=valid)
    assert answer.choices[0].message.content == "valid at last"


def test_strict_llama_mode_refuses_with_a_500_every_time():
    """``strict_status=500``: a bad history fails like on llama-server, again on every retry."""
    poisoned = [USER, _assistant(_call(arguments='{"a": 1, "b": ')), _result()]
    with (
        ScriptedLLM(strict=True, strict_status=500) as llm,
        openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client,
    ):
        llm.script(reply("valid at last"))
        for _ in range(2):
            with pytest.raises(openai.InternalServerError, match="arguments are not valid JSON"):
                client.chat.completions.create(model="m", messages=poisoned)
        assert llm.pending == 1 and len(llm.requests) == 2
        fixed = [USER, _assistant(_call(arguments='{"_raw": "{\\"a\\": 1, \\"b\\": "}'))]
        answer = client.chat.completions.create(model="m", messages=[*fixed, _result()])
    assert answer.choices[0].message.content == "valid at last"
    with pytest.raises(ValueError, match="strict_status must be 4xx or 5xx"):
        ScriptedLLM(strict=True, strict_status=200)


def test_disconnect_is_a_connection_error(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(disconnect(), reply("after"))
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=HI)
    assert client.chat.completions.create(model="m", messages=HI).choices[0].message.content == (
        "after"
    )


def test_exhausted_script_is_a_400_naming_the_request(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(reply("only one"))
    client.chat.completions.create(model="m", messages=HI)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="m", messages=HI)
    assert exc.value.status_code == 400
    assert exc.value.code == "script_exhausted"
    assert "ScriptedLLM: script exhausted at request #1; queue replies with .script(...)" in str(
        exc.value
    )


def test_unparsable_request_body_is_a_400_and_still_recorded(llm: ScriptedLLM):
    status, body = _http(f"{llm.base_url}/chat/completions", data=b"{nope")
    assert status == 400
    assert "not a JSON object" in body["error"]["message"]
    assert llm.requests[0].body is None and llm.requests[0].raw == b"{nope"
    assert llm.pending == 0


# -- dynamic replies, loop mode, recording ------------------------------------------------


def test_responder_answers_when_the_queue_is_empty(llm: ScriptedLLM, client: openai.OpenAI):
    llm.responder = lambda req: reply(f"echo: {req.messages[-1]['content']}")
    llm.script(reply("queued first"))
    texts = [
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": t}])
        .choices[0]
        .message.content
        for t in ("a", "b")
    ]
    assert texts == ["queued first", "echo: b"]

    def broken(req: RecordedRequest) -> Reply:
        raise KeyError("boom")

    llm.responder = broken
    with pytest.raises(openai.InternalServerError, match="responder raised KeyError"):
        client.chat.completions.create(model="m", messages=HI)


def test_loop_mode_cycles_the_script():
    with ScriptedLLM(loop=True) as llm:
        llm.script(reply("a"), reply("b"))
        with openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
            texts = [
                client.chat.completions.create(model="m", messages=HI).choices[0].message.content
                for _ in range(5)
            ]
        assert texts == ["a", "b", "a", "b", "a"]
        assert llm.pending == 2


def _ask(client: openai.OpenAI, system: Any, model: str = "m") -> str | None:
    messages = [{"role": "system", "content": system}, *HI] if system is not None else HI
    return client.chat.completions.create(model=model, messages=messages).choices[0].message.content


def test_routes_serve_matching_requests_before_the_common_queue(
    llm: ScriptedLLM, client: openai.OpenAI
):
    llm.script(reply("common 1"), reply("common 2"))
    llm.route("You are a subagent", reply("child 1"), reply("child 2"))
    llm.route("cheap-model", reply("by model"))
    assert llm.pending == 5
    assert _ask(client, "Main agent.") == "common 1"
    assert _ask(client, "Intro. You are a subagent. Work.") == "child 1"
    assert _ask(client, "Main agent.", model="cheap-model") == "by model"
    # an exhausted route falls through to the common queue; appending refills the same route
    assert _ask(client, "Main agent.", model="cheap-model") == "common 2"
    llm.route("You are a subagent", reply("child 3"))
    assert llm.pending_for("You are a subagent") == 2
    assert _ask(client, "You are a subagent") == "child 2"
    assert _ask(client, "You are a subagent") == "child 3"
    assert llm.pending == llm.pending_for("You are a subagent") == llm.pending_for("nope") == 0
    with pytest.raises(openai.BadRequestError, match="script exhausted at request #6"):
        _ask(client, "You are a subagent")


def test_route_by_predicate_with_system_parts_and_delays(llm: ScriptedLLM, client: openai.OpenAI):
    def has_weather_tool(req: RecordedRequest) -> bool:
        return "get_weather" in req.tool_names

    llm.route(has_weather_tool, delay(0.01), reply("weather route"))
    llm.script(reply("plain"))
    parts = [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]
    assert _ask(client, parts) == "plain"  # no tools: the predicate is false
    done = client.chat.completions.create(model="m", messages=HI, tools=TOOLS)
    assert done.choices[0].message.content == "weather route"  # the delay took its follower
    first, second = llm.requests
    assert first.system == "Part one.\n\nPart two."
    assert (first.tool_names, second.tool_names) == ([], ["get_weather"])
    assert second.system == ""

    def broken(req: RecordedRequest) -> bool:
        raise ValueError("bad predicate")

    llm.route(broken, reply("never"))
    with pytest.raises(openai.InternalServerError, match="route match raised ValueError"):
        _ask(client, "x")
    with pytest.raises(TypeError, match="match must be a non-empty string"):
        llm.route("", reply("x"))
    with pytest.raises(TypeError, match="expected reply"):
        llm.route("x", "not an item")  # type: ignore[arg-type]
    llm.reset()
    assert llm.pending == 0


def test_routes_cycle_in_loop_mode():
    with ScriptedLLM(loop=True) as llm:
        llm.script(reply("main"))
        llm.route("child", reply("c1"), reply("c2"))
        with openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
            texts = [_ask(client, s) for s in ("child", "main", "child", "child", "main")]
        assert texts == ["c1", "main", "c2", "c1", "main"]
        assert llm.pending == 3


def test_requests_are_recorded_with_headers_and_tools(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(reply("1"), reply("2"))
    for _ in range(2):
        client.chat.completions.create(model="gpt-x", messages=HI, tools=TOOLS)
    first, second = llm.requests
    assert (first.index, second.index) == (0, 1)
    assert first.path == "/v1/chat/completions"
    assert first.model == "gpt-x"
    assert first.messages == HI
    assert first.tools == TOOLS
    assert first.stream is False
    assert first.headers["authorization"] == "Bearer sk-scripted"
    assert first.headers["content-type"] == "application/json"
    assert first.tools_bytes == second.tools_bytes
    assert json.loads(first.tools_bytes) == TOOLS
    assert "ünïcode".encode() in first.tools_bytes
    assert json.loads(first.raw) == first.body
    llm.requests.clear()  # a copy: the record is untouched
    assert len(llm.requests) == 2


def test_wait_for_requests_and_reset(llm: ScriptedLLM, client: openai.OpenAI):
    llm.script(reply("x"), reply("unused"))
    worker = threading.Thread(target=lambda: client.chat.completions.create(model="m", messages=HI))
    worker.start()
    try:
        assert [r.index for r in llm.wait_for_requests(1)] == [0]
    finally:
        worker.join()
    with pytest.raises(TimeoutError, match="expected 2 request"):
        llm.wait_for_requests(2, timeout=0.05)
    assert llm.pending == 1
    llm.reset()
    assert (llm.pending, llm.requests) == (0, [])


async def test_wait_from_async_code_and_async_context_manager():
    async with ScriptedLLM() as llm:
        llm.script(reply("async"))
        async with openai.AsyncOpenAI(
            base_url=llm.base_url, api_key=llm.api_key, max_retries=0
        ) as client:
            call = asyncio.create_task(client.chat.completions.create(model="m", messages=HI))
            seen = await asyncio.to_thread(llm.wait_for_requests, 1)
            resp = await call
    assert seen[0].messages == HI
    assert resp.choices[0].message.content == "async"


def test_models_endpoint_and_unknown_paths(llm: ScriptedLLM, client: openai.OpenAI):
    assert [m.id for m in client.models.list()] == ["scripted"]
    with pytest.raises(openai.NotFoundError, match="no route for POST /v1/completions"):
        client.completions.create(model="m", prompt="x")
    status, body = _http(f"{llm.base_url}/nope")
    assert status == 404
    assert body["error"]["param"] is None and body["error"]["code"] == "unknown_url"
    assert llm.requests == []  # only chat completions are recorded


# -- lifecycle ----------------------------------------------------------------------------


def test_close_drops_inflight_requests_and_is_idempotent():
    llm = ScriptedLLM().start()
    llm.script(delay(30, reply("never")))
    outcome: list[BaseException] = []

    def call() -> None:
        with openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
            try:
                client.chat.completions.create(model="m", messages=HI)
            except openai.APIError as exc:
                outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    llm.wait_for_requests(1)
    llm.close()
    worker.join()
    llm.close()
    assert [type(e) for e in outcome] == [openai.APIConnectionError]
    with pytest.raises(RuntimeError, match="not running"):
        _ = llm.base_url
    assert "stopped" in repr(llm)


def test_server_restarts_after_close():
    llm = ScriptedLLM()
    for text in ("first life", "second life"):
        with llm, openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0) as client:
            llm.script(reply(text))
            assert (
                client.chat.completions.create(model="m", messages=HI).choices[0].message.content
                == text
            )


# -- script data, CLI, import cost ------------------------------------------------------


def test_builders_validate_their_arguments(llm: ScriptedLLM):
    with pytest.raises(ValueError, match="4xx or 5xx"):
        error(200)
    with pytest.raises(TypeError, match="dict or a str"):
        tool_call("f", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        delay(-1)
    with pytest.raises(TypeError, match="must be a reply"):
        cut_stream(error(500))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected reply"):
        llm.script("hello")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size"):
        ScriptedLLM(chunk_size=0)
    with pytest.raises(ValueError, match=r"unknown wire keys \['ID'\]"):
        tool_call("f", wire={"ID": None})


def test_script_json_round_trip():
    items = [
        reply("hi", usage=usage(3, 4, cached=1), model="m2"),
        reply(
            tool_calls=[tool_call("f", {"a": 1}), tool_call("g", "{bad", id="call_x")],
            reasoning_content="hmm",
            usage=None,
            finish_reason="length",
        ),
        error(429, "slow", retry_after=1.5, code="rate_limit_exceeded"),
        garbage("<html>", status=502),
        delay(0.5, reply("later")),
        delay(0.1),
        cut_stream(reply("partial"), after_chunks=3),
        disconnect(),
        reply(tool_calls=[tool_call("f", wire={"id": None, "arguments": {"a": 1}}, omit=["type"])]),
        error(503, retry_after="Wed, 21 Oct 2015 07:28:00 GMT"),
        cut_stream(reply("quiet"), after_chunks=1, clean=True),
        raw({"choices": []}, chunks=[{"choices": []}], done=False),
    ]
    text = script_to_json(items)
    assert [entry["kind"] for entry in json.loads(text)] == [
        "reply", "reply", "error", "garbage", "delay", "delay", "cut_stream", "disconnect",
        "reply", "error", "cut_stream", "raw",
    ]  # fmt: skip
    assert script_from_json(text) == items
    with pytest.raises(ValueError, match=r"script item #0: unknown kind 'nope'"):
        script_from_json('[{"kind": "nope"}]')
    with pytest.raises(ValueError, match=r"script item #0 \(reply\)"):
        script_from_json('[{"kind": "reply", "contnet": "typo"}]')


def test_cli_serves_a_script_until_sigterm(tmp_path: Path):
    script = tmp_path / "script.json"
    script.write_text(script_to_json([reply("from the CLI")]), encoding="utf-8")
    cmd = [sys.executable, "-m", "ania_nb.testing", "serve", "--script", str(script)]
    with subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line.startswith("base_url=http://127.0.0.1:")
            base_url = line.removeprefix("base_url=")
            with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0) as client:
                resp = client.chat.completions.create(model="m", messages=HI)
            assert resp.choices[0].message.content == "from the CLI"
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert (proc.returncode, out, err) == (0, "", "")


def test_cli_strict_status_refuses_a_bad_history_like_llama_server(tmp_path: Path):
    script = tmp_path / "script.json"
    script.write_text(script_to_json([reply("valid")]), encoding="utf-8")
    cmd = [sys.executable, "-m", "ania_nb.testing", "serve", "--script", str(script)]
    poisoned = [USER, _assistant(_call(arguments="{bad")), _result()]
    with subprocess.Popen(
        [*cmd, "--strict-status", "500"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            base_url = proc.stdout.readline().strip().removeprefix("base_url=")
            with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0) as client:
                with pytest.raises(openai.InternalServerError, match="not valid JSON"):
                    client.chat.completions.create(model="m", messages=poisoned)
                resp = client.chat.completions.create(model="m", messages=HI)
            assert resp.choices[0].message.content == "valid"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=10)
    refused = subprocess.run(
        [*cmd, "--strict-status", "200"], cwd=ROOT, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "strict_status must be 4xx or 5xx" in refused.stderr


def test_cli_help_and_bad_script(tmp_path: Path):
    run = [sys.executable, "-m", "ania_nb.testing"]
    shown = subprocess.run([*run, "serve", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0 and "--chunk-size" in shown.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "reply"}', encoding="utf-8")
    failed = subprocess.run(
        [*run, "serve", "--script", str(bad)], cwd=ROOT, capture_output=True, text=True
    )
    assert failed.returncode == 2 and "must be a list" in failed.stderr


def test_import_pulls_in_no_openai():
    code = "import ania_nb.testing, sys; assert 'openai' not in sys.modules, 'openai imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_all_is_sorted_and_matches_the_public_names():
    assert testing.__all__ == sorted(testing.__all__)
    public = {
        name
        for name, value in vars(testing).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)  # submodules
    } - {"annotations"}
    assert set(testing.__all__) == public


# -- /v1/embeddings -----------------------------------------------------------------------


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_embeddings_are_deterministic_unit_vectors_of_character_bigrams(
    llm: ScriptedLLM, client: openai.OpenAI
):
    texts = ["How to deploy the service", "how to deploy a service?", "薄荷巧克力冰淇淋"]
    resp = client.embeddings.create(model="embed-m", input=texts, encoding_format="float")
    assert [d.index for d in resp.data] == [0, 1, 2] and resp.model == "embed-m"
    vectors = [d.embedding for d in resp.data]
    assert all(len(v) == 64 and abs(_cosine(v, v) - 1) < 1e-9 for v in vectors)
    assert vectors[0] == embedding_vector(texts[0]) == llm.embeddings.vector(texts[0])
    similar, unrelated = _cosine(vectors[0], vectors[1]), _cosine(vectors[0], vectors[2])
    assert similar > 0.6 and abs(unrelated) < 0.3
    assert resp.usage.prompt_tokens > 0
    again = client.embeddings.create(model="embed-m", input=texts[0], encoding_format="float")
    assert again.data[0].embedding == vectors[0]  # a single string works too
    # Recorded apart from chat completions, whose request indices stay undisturbed.
    assert llm.requests == []
    seen = llm.embedding_requests
    assert [r.index for r in seen] == [0, 1] and seen[0].inputs == texts
    assert seen[1].inputs == [texts[0]] and seen[0].model == "embed-m"
    assert seen[0].headers["authorization"] == f"Bearer {llm.api_key}"


def test_embeddings_base64_encoding_and_dimensions(client: openai.OpenAI):
    # The openai client asks for base64 by default and decodes it itself.
    resp = client.embeddings.create(model="m", input=["base64 please"])
    assert resp.data[0].embedding == pytest.approx(embedding_vector("base64 please"), abs=1e-6)
    small = client.embeddings.create(
        model="m", input=["x y"], dimensions=8, encoding_format="float"
    )
    assert small.data[0].embedding == embedding_vector("x y", 8)
    with ScriptedLLM(embedding_dim=16) as other:
        status, body = _http(
            f"{other.base_url}/embeddings", json.dumps({"model": "m", "input": "hi"}).encode()
        )
    assert status == 200 and len(body["data"][0]["embedding"]) == 16


def test_embeddings_refuse_bad_requests_as_openai_does(llm: ScriptedLLM, client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError, match=r"'input'\[1\] is an empty string"):
        client.embeddings.create(model="m", input=["ok", ""])
    with pytest.raises(openai.BadRequestError, match="token arrays"):
        client.embeddings.create(model="m", input=[[1, 2, 3]])
    status, body = _http(f"{llm.base_url}/embeddings", b'{"input": "no model"}')
    assert status == 400 and "'model' is required" in body["error"]["message"]
    status, body = _http(f"{llm.base_url}/embeddings", b"not json")
    assert status == 400 and "not a JSON object" in body["error"]["message"]
    assert len(llm.embedding_requests) == 4  # refused requests are recorded too


def test_fail_embeddings_until_healed_and_scripted_answers(llm: ScriptedLLM, client: openai.OpenAI):
    llm.fail_embeddings(503, "embedder down")
    assert llm.embeddings.failing
    for _ in range(2):
        with pytest.raises(openai.InternalServerError, match="embedder down"):
            client.embeddings.create(model="m", input="x")
    llm.fail_embeddings(None)
    assert client.embeddings.create(model="m", input="x", encoding_format="float").data
    # Scripted answers come first, one per request, then vectors again.
    llm.embeddings.script(error(429, "slow down"), garbage(), raw({"data": []}), delay(0.01))
    assert llm.embeddings.pending == 4
    with pytest.raises(openai.RateLimitError, match="slow down"):
        client.embeddings.create(model="m", input="x")
    with pytest.raises((ValueError, openai.APIError)):  # not JSON
        client.embeddings.create(model="m", input="x")
    assert client.embeddings.create(model="m", input="x", encoding_format="float").data == []
    delayed = client.embeddings.create(model="m", input="x", encoding_format="float")
    assert delayed.data[0].embedding == embedding_vector("x")
    llm.embeddings.script(disconnect())
    with pytest.raises(openai.APIConnectionError):
        client.embeddings.create(model="m", input="x")
    assert len(llm.embeddings.wait_for_requests(8)) == 8
    with pytest.raises(TypeError, match=r"embeddings\.script"):
        llm.embeddings.script(reply("not an embedding"))  # type: ignore[arg-type]
    llm.fail_embeddings(500)
    llm.reset()
    assert llm.embedding_requests == [] and not llm.embeddings.failing
    assert llm.embeddings.pending == 0 and isinstance(llm.embeddings, EmbeddingsEndpoint)


def test_embedding_vector_of_blank_text_is_a_unit_vector():
    assert embedding_vector("   ") == [1.0] + [0.0] * 63
    assert embedding_vector("Deploy API") == embedding_vector("deploy api")  # case-blind
    with pytest.raises(ValueError, match="dim must be >= 1"):
        embedding_vector("x", 0)
