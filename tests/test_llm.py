"""LLMClient over loopback HTTP to ScriptedLLM: replies, streaming, retries, fallback, usage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx2
import pytest

from ania_nb import Config
from ania_nb.engine._llm_repeat import REPETITION, notice
from ania_nb.engine._llm_stream import SSEParser
from ania_nb.engine.llm import Completion, LLMClient, RetryPolicy
from ania_nb.engine.usage import Usage
from ania_nb.errors import LLMError, LLMStreamError
from ania_nb.testing import (
    ScriptedLLM,
    cut_stream,
    delay,
    disconnect,
    error,
    garbage,
    raw,
    reply,
    tool_call,
    usage,
)

FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
USER: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
LONG = "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun."

MakeClient = Callable[..., LLMClient]


@pytest.fixture
def fb_llm() -> Iterator[ScriptedLLM]:
    """A second scripted server standing in for the fallback endpoint."""
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
async def make_client(llm: ScriptedLLM) -> AsyncIterator[MakeClient]:
    """Build LLMClients against a scripted server (default: `llm`), closed after the test."""
    clients: list[LLMClient] = []

    def factory(server: ScriptedLLM | None = None, **kwargs: Any) -> LLMClient:
        server = server or llm
        kwargs.setdefault("model", "main-model")
        kwargs.setdefault("retry", FAST)
        client = LLMClient(base_url=server.base_url, api_key=server.api_key, **kwargs)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.aclose()


def _fallback(fb_llm: ScriptedLLM, **kwargs: Any) -> LLMClient:
    """A fallback client on the second server; the owner closes it via the main client."""
    return LLMClient(
        base_url=fb_llm.base_url, api_key=fb_llm.api_key, model="fb-model", retry=FAST, **kwargs
    )


# -- plain replies ------------------------------------------------------------------------


async def test_plain_reply(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(reply("Hello there", usage=usage(10, 3)))
    completion = await make_client().complete(USER)

    assert isinstance(completion, Completion)
    assert completion.message == {"role": "assistant", "content": "Hello there"}
    assert completion.finish_reason == "stop"
    assert completion.model == "main-model"
    assert completion.usage["prompt_tokens"] == 10
    assert completion.usage["completion_tokens"] == 3
    (request,) = llm.requests
    assert request.model == "main-model"
    assert request.messages == USER
    assert not request.stream


@pytest.mark.parametrize("stream", [False, True])
async def test_parallel_tool_calls_are_parsed(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(
        reply(
            tool_calls=[
                tool_call("get_weather", {"city": "Oslo", "unit": "celsius"}, id="call_a"),
                tool_call("get_time", '{"tz": "Europe/Oslo"}'),
            ]
        )
    )
    completion = await make_client().complete(USER, tools=TOOLS, stream=stream)

    assert completion.message["content"] is None
    assert completion.message["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {
                "name": "get_weather",
                "arguments": '{"city": "Oslo", "unit": "celsius"}',
            },
        },
        {
            "id": "call_0_1",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"tz": "Europe/Oslo"}'},
        },
    ]
    assert completion.finish_reason == "tool_calls"
    assert llm.requests[0].tools == TOOLS
    assert llm.requests[0].stream is stream


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_content_is_carried(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(reply("42", reasoning_content="Six times seven, carefully counted."))
    completion = await make_client().complete(USER, stream=stream)

    assert completion.message == {
        "role": "assistant",
        "content": "42",
        "reasoning_content": "Six times seven, carefully counted.",
    }


async def test_sampling_params_sent_as_configured(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(reply("a"), reply("b"))
    await make_client(temperature=0.3, top_p=0.8, max_tokens=50).complete(USER)
    await make_client().complete(USER)

    configured, defaults = (r.body or {} for r in llm.requests)
    assert configured["temperature"] == 0.3
    assert configured["top_p"] == 0.8
    assert configured["max_tokens"] == 50
    for key in ("temperature", "top_p", "max_tokens"):
        assert key not in defaults


@pytest.mark.parametrize("tools", [None, []])
async def test_tools_omitted_when_empty(
    llm: ScriptedLLM, make_client: MakeClient, tools: list[dict[str, Any]] | None
) -> None:
    llm.script(reply("no tools"))
    await make_client().complete(USER, tools=tools)

    assert "tools" not in (llm.requests[0].body or {})


# -- streaming ----------------------------------------------------------------------------


async def test_stream_deltas_reach_sync_handler_in_order(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(reply(LONG, usage=usage(12, 7, cached=4)))
    pieces: list[str] = []
    completion = await make_client().complete(USER, stream=True, on_delta=pieces.append)

    size = llm.chunk_size
    assert pieces == [LONG[i : i + size] for i in range(0, len(LONG), size)]
    assert "".join(pieces) == completion.message["content"] == LONG
    assert completion.finish_reason == "stop"
    # usage comes from the include_usage chunk the client asked for
    body = llm.requests[0].body or {}
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert completion.usage["prompt_tokens"] == 12
    assert completion.usage["completion_tokens"] == 7
    assert completion.usage["prompt_tokens_details"]["cached_tokens"] == 4


async def test_stream_deltas_reach_async_handler_in_order(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(reply(LONG))
    pieces: list[str] = []

    async def on_delta(text: str) -> None:
        await asyncio.sleep(0)  # a real await point: the handler is awaited, not just called
        pieces.append(text)

    completion = await make_client().complete(USER, stream=True, on_delta=on_delta)

    assert len(pieces) > 1
    assert "".join(pieces) == completion.message["content"] == LONG


async def test_stream_handler_error_propagates_unchanged(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # A bug in the caller's handler is neither a model failure nor a reason to retry.
    llm.script(reply(LONG), reply(LONG))

    def on_delta(text: str) -> None:
        raise KeyError("display widget gone")

    with pytest.raises(KeyError, match="display widget gone"):
        await make_client().complete(USER, stream=True, on_delta=on_delta)
    assert len(llm.requests) == 1


# -- retries ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_429_then_500_then_success(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(error(429, "slow down"), error(500), reply("finally"))
    completion = await make_client().complete(USER, stream=stream)

    assert completion.message["content"] == "finally"
    assert len(llm.requests) == 3
    assert llm.pending == 0


async def test_400_is_not_retried(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(error(400, "messages[0].content is required"), reply("never sent"))
    with pytest.raises(LLMError) as info:
        await make_client().complete(USER)

    err = info.value
    assert err.status_code == 400
    assert err.model == "main-model"
    text = str(err)
    assert "messages[0].content is required" in text
    assert "HTTP 400" in text
    assert llm.base_url in text
    assert "after 1 attempt" in text
    assert "rejected the request" in text  # the hint
    assert len(llm.requests) == 1


async def test_401_hint_names_the_api_key(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(error(401, "invalid key"))
    with pytest.raises(LLMError, match="api_key") as info:
        await make_client().complete(USER)
    assert info.value.status_code == 401
    assert len(llm.requests) == 1


async def test_retries_exhausted(llm: ScriptedLLM, make_client: MakeClient) -> None:
    # Three different bodies: the same 5xx body twice would end the retries early.
    llm.script(error(503, "overloaded"), error(503), error(503, "still overloaded"), reply("late"))
    with pytest.raises(LLMError) as info:
        await make_client().complete(USER)

    err = info.value
    assert err.status_code == 503
    assert err.model == "main-model"
    text = str(err)
    assert "after 3 attempts" in text
    assert "main-model" in text
    assert llm.base_url in text
    assert "HTTP 503" in text
    assert "still overloaded" in text
    assert "fallback" in text  # the 5xx hint suggests one
    assert len(llm.requests) == 3
    assert llm.pending == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_timeout_is_retried(llm: ScriptedLLM, make_client: MakeClient, stream: bool) -> None:
    # A streamed call is always retried after a timeout; a non-streamed one with on_timeout.
    llm.script(delay(2, reply("late")), reply("on time"))
    retry = RetryPolicy(3, 0.01, 0.02, on_timeout=not stream)
    completion = await make_client(timeout=0.3, retry=retry).complete(USER, stream=stream)

    assert completion.message["content"] == "on time"
    assert len(llm.requests) == 2


async def test_timeouts_exhausted(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(delay(2, reply("late")), delay(2, reply("late")))
    client = make_client(timeout=0.3, retry=RetryPolicy(2, 0.01, 0.02, on_timeout=True))
    with pytest.raises(LLMError) as info:
        await client.complete(USER)

    assert info.value.status_code is None
    assert "after 2 attempts" in str(info.value)
    assert "llm.timeout" in str(info.value)  # the network hint
    assert len(llm.requests) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_garbage_body_is_a_clear_error(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    # Not retried by design: a 200 with a non-JSON body is a wrong URL or a proxy, not a blip.
    llm.script(garbage("<html>login page</html>"), reply("never sent"))
    with pytest.raises(LLMError) as info:
        await make_client().complete(USER, stream=stream)

    assert not isinstance(info.value, LLMStreamError)
    text = str(info.value)
    assert "not Chat Completions JSON" in text
    assert "/v1" in text  # the hint
    assert "main-model" in text
    assert len(llm.requests) == 1


async def test_garbage_with_5xx_status_is_retried(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(garbage("Bad Gateway", status=502), reply("recovered"))
    completion = await make_client().complete(USER)

    assert completion.message["content"] == "recovered"
    assert len(llm.requests) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_is_retried(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(disconnect(), reply("reconnected"))
    completion = await make_client().complete(USER, stream=stream)

    assert completion.message["content"] == "reconnected"
    assert len(llm.requests) == 2


# -- fallback -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_fallback_answers_when_main_fails(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(error(500, "one"), error(500, "two"), error(500, "three"))
    fb_llm.script(reply("from the fallback"))
    client = make_client(fallback=_fallback(fb_llm))
    completion = await client.complete(USER, stream=stream)

    assert completion.message["content"] == "from the fallback"
    assert completion.model == "fb-model"
    assert [r.model for r in llm.requests] == ["main-model"] * 3
    assert [r.model for r in fb_llm.requests] == ["fb-model"]
    assert fb_llm.requests[0].messages == USER


async def test_both_models_fail(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(error(500, "main down"), error(500, "main broken"), error(500, "main broke"))
    fb_llm.script(error(502), error(503), error(502, "fallback broke"))
    client = make_client(fallback=_fallback(fb_llm))
    with pytest.raises(LLMError) as info:
        await client.complete(USER)

    err = info.value
    text = str(err)
    assert "main-model" in text and "main broke" in text
    assert "fb-model" in text and "fallback broke" in text
    assert llm.base_url in text and fb_llm.base_url in text
    assert err.status_code == 502
    assert err.model == "fb-model"
    assert len(llm.requests) == 3
    assert len(fb_llm.requests) == 3


async def test_400_on_main_goes_to_fallback(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # Deliberate: a 400 is not retried, but another provider may accept what this one rejects
    # (a field it does not support, a context it cannot fit), so the fallback gets its call.
    llm.script(error(400, "unsupported parameter"))
    fb_llm.script(reply("fallback accepted it"))
    completion = await make_client(fallback=_fallback(fb_llm)).complete(USER)

    assert completion.message["content"] == "fallback accepted it"
    assert len(llm.requests) == 1
    assert len(fb_llm.requests) == 1


async def test_fallback_has_no_nested_fallback(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    nested = LLMClient(base_url=llm.base_url, api_key=llm.api_key, model="nested", retry=FAST)
    llm.script(error(400), reply("must not be used"))
    fb_llm.script(error(400))
    client = make_client(fallback=_fallback(fb_llm, fallback=nested))
    with pytest.raises(LLMError):
        await client.complete(USER)

    assert [r.model for r in llm.requests] == ["main-model"]
    assert len(fb_llm.requests) == 1


# -- streams that break -------------------------------------------------------------------


async def test_stream_cut_after_content_is_not_retried(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(cut_stream(reply(LONG), after_chunks=3), reply(LONG))
    fb_llm.script(reply(LONG))
    pieces: list[str] = []
    client = make_client(fallback=_fallback(fb_llm))
    with pytest.raises(LLMStreamError) as info:
        await client.complete(USER, stream=True, on_delta=pieces.append)

    # the role chunk, then two content chunks reached the handler before the cut
    assert pieces == [LONG[:8], LONG[8:16]]
    assert info.value.model == "main-model"
    assert "after output had started" in str(info.value)
    assert len(llm.requests) == 1
    assert fb_llm.requests == []


async def test_stream_cut_before_content_is_retried(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(cut_stream(reply(LONG), after_chunks=1), reply(LONG))
    pieces: list[str] = []
    completion = await make_client().complete(USER, stream=True, on_delta=pieces.append)

    assert completion.message["content"] == LONG
    assert "".join(pieces) == LONG  # nothing duplicated
    assert len(llm.requests) == 2


async def test_stream_cut_during_tool_call_is_retried(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # Tool-call and reasoning deltas never reach on_delta, so the user saw nothing: retry.
    calls = [tool_call("get_weather", {"city": "Reykjavik, Iceland"})]
    llm.script(
        cut_stream(reply(tool_calls=calls, reasoning_content="need weather"), after_chunks=4),
        reply(tool_calls=calls),
    )
    completion = await make_client().complete(USER, stream=True, on_delta=lambda _: None)

    assert completion.message["tool_calls"][0]["function"]["arguments"] == (
        '{"city": "Reykjavik, Iceland"}'
    )
    assert "reasoning_content" not in completion.message  # the retry's answer only
    assert len(llm.requests) == 2


async def test_stream_ending_without_finish_reason(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # Some servers omit finish_reason on a complete stream: what arrived is the answer. A stream
    # that ends cleanly with nothing in it is retried (nothing reached the user yet).
    calls = [tool_call("get_weather", {"city": "Oslo"})]
    llm.script(
        reply(tool_calls=calls, finish_reason=""),
        reply(LONG, finish_reason=""),
        reply(None, finish_reason=""),
        reply("second try"),
    )
    client = make_client()
    completion = await client.complete(USER, stream=True)
    assert completion.finish_reason is None
    assert completion.message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert len(llm.requests) == 1

    completion = await client.complete(USER, stream=True)
    assert completion.message["content"] == LONG
    assert len(llm.requests) == 2

    completion = await client.complete(USER, stream=True)
    assert completion.message["content"] == "second try"
    assert len(llm.requests) == 4


# -- cancellation -------------------------------------------------------------------------


async def test_cancel_during_request_is_not_retried(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(delay(5, reply("late")), reply("the next call"))
    fb_llm.script(reply("fallback must not happen"))
    client = make_client(fallback=_fallback(fb_llm))
    task = asyncio.create_task(client.complete(USER))
    await asyncio.to_thread(llm.wait_for_requests, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    # The cancelled call has ended without asking again: the client's next call is the
    # server's second request and gets the second answer, and the fallback was never asked.
    assert (await client.complete(USER)).message["content"] == "the next call"
    assert len(llm.requests) == 2
    assert fb_llm.requests == []


async def test_cancel_during_backoff_is_not_retried(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(error(500), reply("the next call"))
    client = make_client(retry=RetryPolicy(max_attempts=3, base_delay=5.0, max_delay=5.0))
    backing_off = asyncio.Event()
    task = asyncio.create_task(client.complete(USER, on_retry=lambda _: backing_off.set()))
    await asyncio.wait_for(backing_off.wait(), 10)  # the 500 arrived: now its 5-10 s backoff
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert len(llm.requests) == 1 and llm.pending == 1  # the retry was not sent
    assert (await client.complete(USER)).message["content"] == "the next call"
    assert len(llm.requests) == 2


# -- backoff ------------------------------------------------------------------------------


async def test_non_streamed_timeout_is_a_clear_error_not_a_retry(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # A local server still generating the first answer would queue a second one behind it.
    llm.script(delay(2, reply("late")), reply("never asked"))
    with pytest.raises(LLMError) as info:
        await make_client(timeout=0.3).complete(USER)

    text = str(info.value)
    assert "after 1 attempt" in text
    assert "not retried" in text and "retry.on_timeout" in text and "llm.stream" in text
    assert len(llm.requests) == 1
    assert llm.pending == 1


async def test_after_a_non_streamed_timeout_only_a_fallback_elsewhere_is_asked(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    same_server = LLMClient(
        base_url=llm.base_url, api_key=llm.api_key, model="fb-model", retry=FAST, timeout=0.3
    )
    llm.script(delay(2, reply("late")), reply("never asked"))
    with pytest.raises(LLMError, match="not retried"):
        await make_client(timeout=0.3, fallback=same_server).complete(USER)
    assert [r.model for r in llm.requests] == ["main-model"]

    llm.reset()
    llm.script(delay(2, reply("late")))
    fb_llm.script(reply("from elsewhere"))
    client = make_client(timeout=0.3, fallback=_fallback(fb_llm))
    assert (await client.complete(USER)).message["content"] == "from elsewhere"


async def test_timed_out_call_closes_its_connection() -> None:
    # A raw TCP server that never answers: it sees end-of-file once the client gives up, which
    # is what lets llama-server cancel the generation.
    received, closed = asyncio.Event(), asyncio.Event()
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        received.set()
        while await reader.read(65536):  # the body, then EOF when the client closes
            pass
        closed.set()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        url = f"http://127.0.0.1:{port}/v1"
        client = LLMClient(base_url=url, api_key="k", model="m", retry=FAST, timeout=0.3)
        with pytest.raises(LLMError, match="not retried"):
            await client.complete(USER)
        await client.aclose()
        await asyncio.wait_for(received.wait(), 10)
        await asyncio.wait_for(closed.wait(), 10)
        assert connections == 1
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_same_5xx_body_twice_is_not_tried_a_third_time(
    llm: ScriptedLLM, fb_llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    broken = "Failed to parse tool call arguments as JSON"  # llama-server on a bad history
    llm.script(error(500, broken), error(500, broken), reply("never asked"))
    with pytest.raises(LLMError) as info:
        await make_client().complete(USER, stream=stream)

    text = str(info.value)
    assert broken in text and "same error came twice" in text and "after 2 attempts" in text
    assert len(llm.requests) == 2
    assert llm.pending == 1
    # The fallback still gets its call: another server may accept the request.
    llm.reset()
    llm.script(error(500, broken), error(500, broken))
    fb_llm.script(reply("the fallback could"))
    completion = await make_client(fallback=_fallback(fb_llm)).complete(USER, stream=stream)
    assert completion.message["content"] == "the fallback could"
    assert len(llm.requests) == 2


def test_retry_delay_is_capped_exponential_with_jitter() -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=30.0)
    for attempt, expected in enumerate([1, 2, 4, 8, 16, 30, 30]):
        samples = [policy.delay(attempt) for _ in range(300)]
        assert all(expected <= s < 2 * expected for s in samples), (attempt, samples)
        # jitter really spreads over [0, delay): both halves of the range are hit
        assert min(samples) < 1.5 * expected < max(samples)


def test_retry_policy_defaults() -> None:
    assert RetryPolicy() == RetryPolicy(max_attempts=3, base_delay=2.0, max_delay=30.0)


# -- from_config --------------------------------------------------------------------------


async def test_from_config_main_with_inherited_fallback(llm: ScriptedLLM) -> None:
    config = Config().with_overrides(
        {
            "llm.base_url": llm.base_url,
            "llm.api_key": "sk-main",
            "llm.model": "main-model",
            "llm.temperature": 0.5,
            "llm.top_p": None,
            "llm.max_tokens": 77,
            "fallback.model": "fb-model",
            "retry.max_attempts": 2,
            "retry.base_delay": 0.01,
            "retry.max_delay": 0.02,
        }
    )
    client = LLMClient.from_config(config)
    try:
        assert client.retry == RetryPolicy(2, 0.01, 0.02)
        assert client.fallback is not None
        assert client.fallback.base_url == llm.base_url  # empty fallback fields inherit main's
        assert client.fallback.fallback is None
        llm.script(error(500), error(500), reply("fallback via the same endpoint"))
        completion = await client.complete(USER)
    finally:
        await client.aclose()

    assert completion.message["content"] == "fallback via the same endpoint"
    requests = llm.requests
    assert [r.model for r in requests] == ["main-model", "main-model", "fb-model"]
    assert {r.headers["authorization"] for r in requests} == {"Bearer sk-main"}
    for request in requests:
        body = request.body or {}
        assert body["temperature"] == 0.5
        assert body["max_tokens"] == 77
        assert "top_p" not in body


async def test_from_config_separate_fallback_and_compressor(
    llm: ScriptedLLM, fb_llm: ScriptedLLM
) -> None:
    with ScriptedLLM() as small_llm:
        config = Config(
            llm={"base_url": llm.base_url, "api_key": "sk-main", "model": "main-model"},
            fallback={"base_url": fb_llm.base_url, "api_key": "sk-fb", "model": "fb-model"},
            compressor={"base_url": small_llm.base_url, "api_key": "sk-small", "model": "small"},
            retry={"max_attempts": 1, "base_delay": 0.01, "max_delay": 0.02},
        )
        main = LLMClient.from_config(config)
        compressor = LLMClient.from_config(config, role="compressor")
        try:
            llm.script(error(500))
            fb_llm.script(reply("fb answer"), reply("fb answer for the compressor"))
            small_llm.script(reply("summary"), error(503))
            assert (await main.complete(USER)).message["content"] == "fb answer"
            assert (await compressor.complete(USER)).message["content"] == "summary"
            # the compressor has the fallback too, as every role did in the original
            second = await compressor.complete(USER)
            assert second.message["content"] == "fb answer for the compressor"
        finally:
            await main.aclose()
            await compressor.aclose()

        assert [r.headers["authorization"] for r in llm.requests] == ["Bearer sk-main"]
        assert [r.headers["authorization"] for r in fb_llm.requests] == ["Bearer sk-fb"] * 2
        assert [r.model for r in small_llm.requests] == ["small", "small"]
        assert small_llm.requests[0].headers["authorization"] == "Bearer sk-small"


async def test_from_config_compressor_role_without_model_is_the_main_model(
    llm: ScriptedLLM,
) -> None:
    config = Config(llm={"base_url": llm.base_url, "api_key": "sk-main", "model": "main-model"})
    client = LLMClient.from_config(config, role="compressor")
    try:
        assert client.fallback is None
        llm.script(reply("compressed"))
        await client.complete(USER)
    finally:
        await client.aclose()
    assert llm.requests[0].model == "main-model"


async def test_injected_http_client_is_used_and_left_open(llm: ScriptedLLM) -> None:
    config = Config(llm={"base_url": llm.base_url, "api_key": "sk-main", "model": "main-model"})
    seen: list[str] = []

    async def record(request: httpx2.Request) -> None:
        seen.append(str(request.url))

    async with httpx2.AsyncClient(event_hooks={"request": [record]}) as http:
        client = LLMClient.from_config(config, http_client=http)
        llm.script(reply("via the injected client"))
        await client.complete(USER)
        await client.aclose()
        assert not http.is_closed  # its owner closes it, not the LLMClient
    assert seen == [f"{llm.base_url}/chat/completions"]


# -- usage --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_add_call_over_real_responses(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(
        reply("openai-style cache", usage=usage(100, 20, cached=60)),
        reply("deepseek-style cache", usage=usage(150, 30, deepseek_cache_hit=90)),
        reply("both fields, one cache", usage=usage(200, 10, cached=40, deepseek_cache_hit=40)),
        reply("no usage block", usage=None),
        reply("compression call", usage=usage(50, 5)),
    )
    client = make_client()
    total = Usage()
    for _ in range(4):
        completion = await client.complete(USER, stream=stream)
        total.add_call(completion.usage)
    # compression adds tokens but is not a loop iteration
    total.add_call((await client.complete(USER, stream=stream)).usage, count_iteration=False)

    assert total.prompt_tokens == 100 + 150 + 200 + 50
    assert total.completion_tokens == 20 + 30 + 10 + 5
    assert total.total_tokens == 120 + 180 + 210 + 55
    assert total.cached_tokens == 60 + 90 + 40
    assert total.last_prompt_tokens == 50
    assert total.iterations == 4


async def test_usage_add_call_accepts_dicts(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(reply("x", usage=usage(30, 4, deepseek_cache_hit=12)))
    completion = await make_client().complete(USER)
    total = Usage()
    assert isinstance(completion.usage, dict)  # plain JSON, never the SDK's typed model
    total.add_call(completion.usage)

    assert total.to_dict() == {
        "prompt_tokens": 30,
        "completion_tokens": 4,
        "total_tokens": 34,
        "cached_tokens": 12,
        "last_prompt_tokens": 30,
        "iterations": 1,
    }


# -- stream framing -------------------------------------------------------------------------


def test_sse_parser_framing() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n\n') == [b'{"a": 1}']  # one event per network chunk
    assert parser.feed(b'data: {"b"') == []  # an event split across network reads
    assert parser.feed(b': 2}\n\ndata: {"c": 3}\n\n') == [b'{"b": 2}', b'{"c": 3}']
    assert parser.feed(b": keep-alive comment\nevent: message\nid: 7\n\n") == []
    assert parser.feed(b'data: {"d": 4}\r\n\r\ndata:{"e": 5}\n') == [b'{"d": 4}', b'{"e": 5}']
    assert parser.feed(b'data: {"f": 6}\ndata: [DONE]\n') == [b'{"f": 6}', b"[DONE]"]  # no blanks
    # a multi-line event: its data lines joined with a newline
    assert parser.feed(b'data: {"g":\ndata: 7}\n\n') == [b'{"g":\n7}']
    assert parser.feed(b"data: not json") == []
    assert parser.close() == [b"not json"]  # the stream ended without a final newline
    assert parser.close() == []


async def test_stream_tool_calls_without_index(llm: ScriptedLLM, make_client: MakeClient) -> None:
    # Some servers send no index: a delta with a new id opens a call, others continue the last.
    llm.script(
        reply(
            tool_calls=[
                tool_call("get_weather", {"city": "Oslo"}, id="a", omit=["index"]),
                tool_call("get_weather", {"city": "Bergen"}, id="b", omit=["index"]),
            ]
        )
    )
    completion = await make_client().complete(USER, stream=True)
    assert [(c["id"], c["function"]["arguments"]) for c in completion.message["tool_calls"]] == [
        ("a", '{"city": "Oslo"}'),
        ("b", '{"city": "Bergen"}'),
    ]


async def test_server_ignoring_stream_true_is_answered_from_its_body(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "main-model",
        "choices": [{"index": 0, "message": {"content": LONG}, "finish_reason": "stop"}],
    }
    llm.script(raw(body, sse=False))
    pieces: list[str] = []
    completion = await make_client().complete(USER, stream=True, on_delta=pieces.append)
    assert completion.message == {"role": "assistant", "content": LONG}
    assert pieces == [LONG]  # shown in one piece
    assert llm.requests[0].stream


# -- runaway replies --------------------------------------------------------------------

RUNAWAY_LINE = "Error executing tool: the call failed, I will try again."


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_repeating_one_line_is_cut_with_a_notice(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    full = "Here is what I found:\n" + f"{RUNAWAY_LINE}\n" * 300
    llm.script(reply(full))
    shown: list[str] = []
    completion = await make_client().complete(USER, stream=stream, on_delta=shown.append)

    text = completion.message["content"]
    assert text == f"Here is what I found:\n{RUNAWAY_LINE}" + notice(10)
    assert completion.finish_reason == REPETITION and not completion.truncated
    if stream:  # reading stopped at the tenth copy, and the notice was shown last
        assert "".join(shown[:-1]).count(RUNAWAY_LINE) == 10
        assert shown[-1] == notice(10)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_sentence_repeating_without_newlines_is_cut(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    llm.script(reply("Well. " + "I am sorry, I cannot do that. " * 400))
    shown: list[str] = []
    completion = await make_client().complete(USER, stream=stream, on_delta=shown.append)

    assert completion.message["content"] == "Well. I am sorry, I cannot do that" + notice(10)
    assert completion.finish_reason == REPETITION
    if stream:  # stopped within a few hundred characters of the tenth copy
        assert len("".join(shown)) < 30 * 10 + 600


async def test_a_repeated_paragraph_is_cut_after_its_first_copy(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    paragraph = "I checked the file.\nIt has three rows.\n\nShall I go on?\n\n"
    llm.script(reply("Sure.\n\n" + paragraph * 40))
    completion = await make_client().complete(USER, stream=True, on_delta=lambda _: None)

    assert completion.message["content"] == "Sure.\n\n" + paragraph.rstrip() + notice(10)


async def test_streamed_runaway_tool_call_in_progress_is_dropped(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    # A cut reply's unfinished tool call must never run.
    llm.script(
        raw(
            chunks=[
                {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1"}]}}]},
                {"choices": [{"index": 0, "delta": {"content": "go\n" + f"{LONG}\n" * 12}}]},
            ]
        )
    )
    completion = await make_client().complete(USER, stream=True)
    assert "tool_calls" not in completion.message
    assert completion.message["content"] == f"go\n{LONG}" + notice(10)


@pytest.mark.parametrize("stream", [False, True])
async def test_repetition_that_is_not_a_runaway_is_kept(
    llm: ScriptedLLM, make_client: MakeClient, stream: bool
) -> None:
    code = "def f():\n    x = [\n" + "        0,\n" * 40 + "    ]\n" + "}\n" * 20
    nine = f"{RUNAWAY_LINE}\n" * 9  # one short of the limit
    table = "".join(f"| row {i} | same value here |\n" for i in range(30))
    one_line = "=" * 3000 + " [" + "0, " * 600 + "] " + "abc " * 20
    for text in (code, nine, table, one_line):
        llm.script(reply(text))
        completion = await make_client().complete(USER, stream=stream, on_delta=lambda _: None)
        assert completion.message["content"] == text
        assert completion.finish_reason == "stop"


async def test_cut_repeats_zero_never_cuts(llm: ScriptedLLM, make_client: MakeClient) -> None:
    full = f"{RUNAWAY_LINE}\n" * 50
    llm.script(reply(full), reply(full))
    for stream in (False, True):
        completion = await make_client(cut_repeats=0).complete(USER, stream=stream)
        assert completion.message["content"] == full


async def test_a_runaway_reply_ends_the_run_with_the_cut_text(llm: ScriptedLLM, make_agent) -> None:
    llm.script(reply("The sum is 4.\n" + f"{RUNAWAY_LINE}\n" * 100))
    agent = make_agent(overrides={"llm.stream": True, "llm.cut_repeats": 5})
    result = await agent.chat("2+2?")

    assert result.text == f"The sum is 4.\n{RUNAWAY_LINE}" + notice(5)
    stored = await agent.history()
    assert stored[-1]["content"] == result.text


async def test_a_run_whose_non_streamed_call_times_out_ends_once_with_a_clear_error(
    llm: ScriptedLLM, make_agent
) -> None:
    llm.script(delay(2, reply("late")), reply("never asked"))
    agent = make_agent(overrides={"llm.timeout": 0.3, "llm.stream": False})
    result = await agent.chat("slow question")

    assert result.status == "error"
    assert "retry.on_timeout" in (result.error or "")
    assert len(llm.requests) == 1
