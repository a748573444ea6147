"""The LLM client: Chat Completions through `openai.AsyncOpenAI`, with retries and one fallback.

Retries cover HTTP 429, 5xx and network errors (timeouts included) with a delay of
``base·2ⁿ`` capped at ``max_delay`` plus uniform jitter in ``[0, delay)``. Nothing is retried after
cancellation, and nothing after a stream has passed content to ``on_delta`` (that would duplicate
text the user already saw); a stream that breaks before any content is retried. When the main
model still fails for any reason (a 400 included: the fallback may accept what the main model
rejects), the fallback model gets one call with its own retries and no further fallback. A body
that is not JSON is not retried: it is a misconfigured URL or proxy, not a transient fault.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import LLMError, LLMStreamError
from .messages import Message

if TYPE_CHECKING:  # pragma: no cover
    from openai import AsyncOpenAI

    from ..config import Config

DeltaHandler = Callable[[str], Awaitable[None] | None]

_HINTS = {
    401: "check the API key (llm.api_key / ANIA_LLM__API_KEY)",
    403: "the key is not allowed to use this model",
    404: "check llm.base_url (it usually ends in /v1) and llm.model",
    400: "the provider rejected the request; the message above says which field",
    429: "rate limited: wait, or raise the provider quota / retry.base_delay",
}
_SERVER_HINT = "the provider failed on its side; try again later or configure a fallback model"
_NETWORK_HINT = "check llm.base_url and the network; a slow model may need a larger llm.timeout"


@dataclass
class Completion:
    """One model answer: the assistant message (plain dict), raw usage and finish reason."""

    message: Message
    usage: Any
    model: str
    finish_reason: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a failing call."""

    max_attempts: int = 3
    base_delay: float = 2.0
    max_delay: float = 30.0

    def delay(self, attempt: int) -> float:
        """Backoff before retry number ``attempt`` (0-based), jitter included."""
        base = min(self.base_delay * (2**attempt), self.max_delay)
        # random() is in [0, 1) where uniform(0, base) may return base itself
        return base + random.random() * base


class LLMClient:
    """An OpenAI-compatible chat model with retry policy and an optional fallback client."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        fallback: LLMClient | None = None,
        http_client: Any = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.fallback = fallback
        self.extra_body = extra_body
        self._api_key = api_key or "not-set"
        self._http_client = http_client  # injected: its owner closes it, not us
        self._client: AsyncOpenAI | None = None
        self._shared = False

    @classmethod
    def from_config(
        cls, config: Config, *, role: str = "main", http_client: Any = None
    ) -> LLMClient:
        """Build the main client (with its fallback) or the ``compressor`` client from config."""
        llm = config.llm
        retry = RetryPolicy(**config.retry.model_dump())
        main_key = llm.api_key.get_secret_value() if llm.api_key else None

        def endpoint(section: Any, fallback: LLMClient | None = None) -> LLMClient:
            key = section.api_key.get_secret_value() if section.api_key else main_key
            return cls(
                base_url=section.base_url or llm.base_url,
                api_key=key,
                model=section.model,
                temperature=llm.temperature,
                top_p=llm.top_p,
                max_tokens=llm.max_tokens,
                timeout=llm.timeout,
                retry=retry,
                fallback=fallback,
                http_client=http_client,
            )

        fallback = endpoint(config.fallback) if config.fallback.model else None
        if role == "compressor" and config.compressor.model:
            # Every role gets the fallback, as in the original; it never has one of its own.
            return endpoint(config.compressor, fallback)
        return endpoint(llm, fallback)

    async def _openai(self) -> AsyncOpenAI:
        if self._client is None:
            # Importing openai takes a while: do it off the loop so a kernel stays responsive.
            openai = await asyncio.to_thread(importlib.import_module, "openai")
            if self._client is None:  # concurrent first calls: build one client, not two
                self._client = openai.AsyncOpenAI(
                    base_url=self.base_url,
                    api_key=self._api_key,
                    timeout=self.timeout,
                    max_retries=0,  # retries are ours: one policy, with fallback after it
                    http_client=self._http_client,
                )
        return self._client

    async def with_model(self, model: str) -> LLMClient:
        """A client for another model on the same endpoint, sharing this one's connections."""
        clone = copy.copy(self)
        clone.model = model
        clone._client = await self._openai()
        clone._shared = True  # the connections belong to self: aclose() on the clone is a no-op
        return clone

    async def complete(
        self,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = False,
        on_delta: DeltaHandler | None = None,
    ) -> Completion:
        """Ask the model once (retries per policy, then the fallback); `LLMError` on failure."""
        try:
            return await self._with_retries(messages, tools, stream, on_delta)
        except LLMStreamError:
            raise  # the user saw output: a second model would repeat it
        except LLMError as main_error:
            if self.fallback is None:
                raise
            try:
                return await self.fallback._with_retries(messages, tools, stream, on_delta)
            except LLMStreamError:
                raise
            except LLMError as fb_error:
                raise LLMError(
                    f"{main_error}; the fallback model failed too: {fb_error}",
                    status_code=fb_error.status_code,
                    model=self.fallback.model,
                ) from fb_error

    async def _with_retries(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        stream: bool,
        on_delta: DeltaHandler | None,
    ) -> Completion:
        client = await self._openai()
        params = self._params(messages, tools)
        attempts = self.retry.max_attempts
        for attempt in range(attempts):
            try:
                if stream:
                    return await self._stream(client, params, on_delta)
                return await self._once(client, params)
            except LLMStreamError:
                raise
            except _HandlerFailed as failed:
                raise failed.error from None  # the caller's on_delta bug, not a model failure
            except Exception as exc:  # CancelledError is a BaseException: never caught here
                if not _retryable(exc) or attempt == attempts - 1:
                    raise self._error(exc, attempt + 1) from exc
                await asyncio.sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _params(
        self, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            params["tools"] = tools
        for key in ("temperature", "top_p", "max_tokens"):
            value = getattr(self, key)
            if value is not None:
                params[key] = value
        if self.extra_body:
            params.update(self.extra_body)
        return params

    async def _once(self, client: AsyncOpenAI, params: dict[str, Any]) -> Completion:
        # The body goes to the SDK's low-level `post` as plain JSON: the typed `create()` walks
        # every message and tool definition through its TypedDict transform on each call (about
        # 40 % of the client's CPU in bench/engine_overhead.py), and ours are plain JSON already.
        # Responses are still parsed into the SDK's typed models.
        chat = importlib.import_module("openai.types.chat")
        response = await client.post("/chat/completions", cast_to=chat.ChatCompletion, body=params)
        if not getattr(response, "choices", None):
            raise LLMError(
                f"no choices returned by {self.model} at {self.base_url}", model=self.model
            )
        choice = response.choices[0]
        msg = choice.message
        message: Message = {"role": "assistant", "content": msg.content}
        if msg.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in msg.tool_calls
            ]
        reasoning = (msg.model_extra or {}).get("reasoning_content")
        if reasoning:
            message["reasoning_content"] = reasoning
        return Completion(message, response.usage, response.model, choice.finish_reason)

    async def _stream(
        self, client: AsyncOpenAI, params: dict[str, Any], on_delta: DeltaHandler | None
    ) -> Completion:
        openai = importlib.import_module("openai")
        chat = importlib.import_module("openai.types.chat")
        stream = await client.post(
            "/chat/completions",
            cast_to=chat.ChatCompletion,
            body={**params, "stream": True, "stream_options": {"include_usage": True}},
            stream=True,
            stream_cls=openai.AsyncStream[chat.ChatCompletionChunk],
        )
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: Any = None
        finish: str | None = None
        model = self.model
        started = False
        try:
            async with stream:
                async for chunk in stream:
                    started = True  # a chunk arrived; output starts with the first content
                    model = chunk.model or model
                    if chunk.usage is not None:
                        usage = chunk.usage
                    if not chunk.choices:
                        continue
                    choice = chunk.choices[0]
                    finish = choice.finish_reason or finish
                    delta = choice.delta
                    piece = (delta.model_extra or {}).get("reasoning_content")
                    if piece:
                        reasoning.append(piece)
                    if delta.content:
                        content.append(delta.content)
                        if on_delta is not None:
                            try:
                                result = on_delta(delta.content)
                                if result is not None:
                                    await result
                            except Exception as exc:
                                raise _HandlerFailed(exc) from exc
                    for tc in delta.tool_calls or ():
                        slot = calls.setdefault(
                            tc.index,
                            {
                                "id": "",
                                "type": "function",
                                "function": {"name": "", "arguments": ""},
                            },
                        )
                        if tc.id:
                            slot["id"] = tc.id
                        if tc.function is not None:
                            slot["function"]["name"] += tc.function.name or ""
                            slot["function"]["arguments"] += tc.function.arguments or ""
        except _HandlerFailed:
            raise
        except Exception as exc:
            if content:
                raise LLMStreamError(
                    f"the stream from {self.model} broke after output had started "
                    f"({type(exc).__name__}: {exc}); not retried to avoid duplicated output",
                    model=self.model,
                ) from exc
            raise
        if not started:
            raise LLMError(
                f"no choices returned by {self.model} at {self.base_url} (empty stream)",
                model=self.model,
            )
        if finish is None and not content and not calls:
            # A real cut raises above (chunked framing); a clean end with nothing in it is not
            # an answer, and nothing reached the user yet, so a retry is safe.
            raise _BrokenStream("the stream ended before the model produced any output")
        # Some local servers omit finish_reason on a complete stream: accept what arrived.
        message: Message = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        return Completion(message, usage, model, finish)

    def _error(self, exc: Exception, attempts: int) -> LLMError:
        if isinstance(exc, LLMError):
            return exc
        status = getattr(exc, "status_code", None)
        detail = _describe(exc)
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        hint = _hint(exc, status)
        return LLMError(
            f"LLM request to {self.model} at {self.base_url} failed {tries}: {detail}"
            + (f" — {hint}" if hint else ""),
            status_code=status,
            model=self.model,
        )

    async def aclose(self) -> None:
        """Close the HTTP connections (and the fallback's); an injected http_client stays open."""
        if self._shared:
            return
        if self._client is not None:
            if self._http_client is None:  # openai would close an injected client too
                await self._client.close()
            self._client = None
        if self.fallback is not None:
            await self.fallback.aclose()


class _BrokenStream(Exception):
    """A stream that broke before any output reached the user: safe to retry."""


class _HandlerFailed(Exception):
    """Carries an exception raised by the caller's ``on_delta`` past the retry logic."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, _BrokenStream):
        return True
    openai = importlib.import_module("openai")
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError)


def _hint(exc: Exception, status: int | None) -> str | None:
    if status is not None:
        return _HINTS.get(status) or (_SERVER_HINT if status >= 500 else None)
    if isinstance(exc, json.JSONDecodeError):
        return "check llm.base_url: it should be an OpenAI-compatible API, usually ending in /v1"
    if _retryable(exc):
        return _NETWORK_HINT
    return None


def _describe(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        # openai lets a non-JSON body surface as a bare JSONDecodeError
        return f"the endpoint returned a body that is not Chat Completions JSON ({exc})"
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    message = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else None
    text = message or str(exc) or type(exc).__name__
    if status:
        return f"HTTP {status}: {text}"
    return f"{type(exc).__name__}: {text}"
