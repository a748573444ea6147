"""The LLM client: Chat Completions through `openai.AsyncOpenAI`, with retries and one fallback.

Requests go through the SDK's low-level ``post`` as plain JSON and responses (bodies and
stream chunks) are parsed as plain JSON too, then validated and normalised by `_llm_wire`
before anything else sees them: every malformed response is an `LLMError` that says what was
wrong, every `Completion.message` is valid to store and to send back. The rules (in
`_llm_wire`): missing, empty or repeated call ids become ``call_<n>_<position>``; a call without
a name is kept as ``invalid_tool_call`` (no tool has it, so the loop answers "not found" and the
conversation stays valid); arguments are always JSON object text (`safe_arguments`; the model's
original text of wrapped ones is in `Completion.raw_arguments`); a usage block with a count
that is not one (negative, not a number) is dropped, so the call is estimated, never free;
lone surrogates become U+FFFD.

Retries cover HTTP 429, 5xx, network errors (timeouts included), a body without choices, an
error the provider reports inside a 200 body or a stream, and a stream cut short (no
``finish_reason`` and no ``[DONE]``: never a stored half reply). The delay is ``base·2ⁿ``
capped at ``max_delay`` plus uniform jitter in ``[0, delay)``; a ``Retry-After`` header
(seconds or HTTP date, or ``retry-after-ms``) replaces it when it is at most ``max_delay``,
and a longer one ends the retries at once (waiting less would only be refused again). Two
exceptions spare a local server: a non-streamed call that timed out is not retried unless
``retry.on_timeout`` (the server may still be generating the first answer; the timed-out
connection is closed, which lets it stop; a fallback on the same base URL is not asked), and a
500/501 whose status and body repeat the previous attempt's is deterministic and ends the retries
(502/503/504 are gateways and overload: retried however alike).
Nothing is retried after cancellation.
A stream whose text already reached ``on_delta`` is not retried (that would duplicate what
the user saw, `LLMStreamError`) unless the caller passed ``on_retry``: it is told before every
retry and may take the partial text back. Without ``on_delta`` nobody saw anything, so a
stream that breaks is always retried.

When the main model still fails for any reason (a 400 included: the fallback may accept what
the main model rejects), the fallback model gets its call with its own retries and no further
fallback. `LLMClient.for_run` gives a view for one run: once the fallback has answered there,
later calls of that run ask the fallback first. A body that is not JSON is not retried: it is a
misconfigured URL or proxy, not a transient fault.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import LLMError, LLMStreamError
from . import _llm_wire as wire
from ._llm_repeat import trim_runaway
from ._llm_retry import (
    SAME_FAILURE,
    RetryHandler,
    RetryNotice,
    RetryPolicy,
    describe,
    hint,
    is_timeout,
    retry_after,
    retry_after_seconds,
    retryable,
    server_failure,
    timeout_note,
)
from ._llm_stream import read_body, read_events
from ._llm_wire import INVALID_TOOL_NAME, Completion, clean_text, safe_arguments
from .messages import Message

if TYPE_CHECKING:  # pragma: no cover
    import httpx2
    from openai import AsyncOpenAI

    from ..config import Config, Endpoint

__all__ = [
    "INVALID_TOOL_NAME",
    "Completion",
    "DeltaHandler",
    "LLMClient",
    "RetryHandler",
    "RetryNotice",
    "RetryPolicy",
    "clean_text",
    "retry_after_seconds",
    "safe_arguments",
]

_log = logging.getLogger(__name__)

DeltaHandler = Callable[[str], Awaitable[None] | None]


@dataclass
class _RunState:
    """Shared by the calls of one run (`LLMClient.for_run`)."""

    prefer_fallback: bool = False


@dataclass
class _CallState:
    """One `complete` call: whether text reached ``on_delta`` since the last retry notice."""

    shown: bool = False

    def take_shown(self) -> bool:
        shown, self.shown = self.shown, False
        return shown


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
        http_client: httpx2.AsyncClient | None = None,
        extra_body: dict[str, Any] | None = None,
        cut_repeats: int = 10,
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
        self.cut_repeats = cut_repeats  # 0: never cut a repeating reply
        self._api_key = api_key or "not-set"
        self._http_client = http_client  # injected: its owner closes it, not us
        self._client: AsyncOpenAI | None = None
        self._shared = False
        self._owner: LLMClient | None = None  # views (for_run) use their owner's connections
        self._run: _RunState | None = None

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        role: str = "main",
        http_client: httpx2.AsyncClient | None = None,
    ) -> LLMClient:
        """Build the main client (with its fallback) or a role's client.

        The roles: compressor, subagent, vision, or ``quota`` (``quota.fallback_model``, which
        answers once a daily quota is used up). A role without its own endpoint or model gets
        the main client's settings; a `ConfigError` names ``llm.base_url`` / ``llm.model`` when
        neither has them.
        """
        from ..config import require_endpoint

        llm = config.llm
        retry = RetryPolicy(**config.retry.model_dump())

        def endpoint(
            name: str,
            fallback: LLMClient | None = None,
            max_tokens: int | None = llm.max_tokens,
            section: Endpoint | None = None,
        ) -> LLMClient:
            section = section if section is not None else getattr(config, name)
            assert section is not None
            resolved = section.resolved(llm)
            require_endpoint(resolved, role=name)
            return cls(
                base_url=resolved.base_url,
                api_key=resolved.api_key,
                model=resolved.model,
                temperature=llm.temperature,
                top_p=llm.top_p,
                max_tokens=max_tokens,
                timeout=llm.timeout,
                retry=retry,
                fallback=fallback,
                http_client=http_client,
                cut_repeats=llm.cut_repeats,
            )

        if role == "vision":
            # A few hundred tokens per image (the original's OCR model: 600); no fallback, since
            # a text model cannot describe an image, and a failed description is reported as such.
            return endpoint("vision", max_tokens=600)
        if role == "quota":
            # No fallback on errors: that model may be the expensive one the quota spares.
            return endpoint("quota", section=config.quota.fallback_endpoint())
        fallback = endpoint("fallback") if config.fallback.model.strip() else None
        if role == "subagent" and config.subagent.own_endpoint:
            return endpoint("subagent", fallback)
        if role == "compressor" and config.compressor.model.strip():
            # Every role gets the fallback, as in the original; it never has one of its own.
            return endpoint("compressor", fallback)
        return endpoint("llm", fallback)

    async def _openai(self) -> AsyncOpenAI:
        if self._owner is not None:
            return await self._owner._openai()
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

    def for_run(self) -> LLMClient:
        """A view of this client for one run: after the fallback answered, it is asked first.

        The view shares this client's connections and fallback; ``aclose()`` on it is a no-op.
        """
        view = copy.copy(self)
        view._owner = self._owner or self
        view._shared = True
        view._run = _RunState()
        return view

    async def complete(
        self,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = False,
        on_delta: DeltaHandler | None = None,
        on_retry: RetryHandler | None = None,
    ) -> Completion:
        """Ask the model once (retries per policy, then the fallback); `LLMError` on failure.

        Passing ``on_retry`` says the caller can take back text given to ``on_delta``: a
        stream that breaks after output is then retried too, and ``on_retry`` is told first.
        """
        clients = [self] if self.fallback is None else [self, self.fallback]
        run = self._run
        if run is not None and run.prefer_fallback and len(clients) == 2:
            clients.reverse()
        state = _CallState()
        errors: list[LLMError] = []
        busy: str | None = None  # a server still working on a timed-out call
        for client in clients:
            if client.base_url == busy:
                continue  # another model there would queue behind the unfinished answer
            if errors and on_retry is not None:
                notice = RetryNotice(client.model, 1, 0.0, str(errors[-1]), state.take_shown())
                await _notify(on_retry, notice)
            try:
                completion = await client._with_retries(
                    messages, tools, stream, on_delta, on_retry, state
                )
            except LLMStreamError:
                raise  # the user saw output: a second model would repeat it
            except LLMError as exc:
                errors.append(exc)
                if isinstance(exc, _ServerBusy):
                    busy = client.base_url
                continue
            if run is not None:
                run.prefer_fallback = client is not self
            completion.asked = client.model
            return completion
        if len(errors) == 1:
            raise errors[0]
        first, last = errors
        other = "the fallback model" if clients[1] is self.fallback else "the main model"
        raise LLMError(
            f"{first}; {other} failed too: {last}", status_code=last.status_code, model=last.model
        ) from last

    async def _with_retries(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        stream: bool,
        on_delta: DeltaHandler | None,
        on_retry: RetryHandler | None,
        state: _CallState,
    ) -> Completion:
        client = await self._openai()
        params = self._params(messages, tools)
        turn = len(messages)  # the index the answer will have: generated call ids use it
        attempts = self.retry.max_attempts
        last_failure: str | None = None  # the previous attempt's 500/501 status and body
        for attempt in range(attempts):
            try:
                if stream:
                    completion = await self._stream(client, params, on_delta, state, turn)
                else:
                    completion = await self._once(client, params, turn)
            except _HandlerFailed as failed:
                raise failed.error from None  # the caller's on_delta bug, not a model failure
            except Exception as exc:  # CancelledError is a BaseException: never caught here
                if state.shown and on_retry is None:
                    raise LLMStreamError(
                        f"the stream from {self.model} broke after output had started "
                        f"({describe(exc)}); not retried to avoid duplicated output",
                        model=self.model,
                    ) from exc
                delay = self._backoff(exc, attempt) if attempt < attempts - 1 else None
                failure, last_failure = last_failure, server_failure(exc)
                if delay is not None and failure is not None and failure == last_failure:
                    raise self._error(exc, attempt + 1, SAME_FAILURE) from exc
                if (
                    delay is not None
                    and not stream
                    and is_timeout(exc)
                    and not self.retry.on_timeout
                ):
                    # The server may still be generating the first answer: asking again would
                    # queue a second one behind it. httpx has already closed the connection.
                    error = self._error(exc, attempt + 1, timeout_note(self.timeout))
                    raise _ServerBusy(str(error), model=self.model) from exc
                if delay is None:
                    raise self._error(exc, attempt + 1) from exc
                if on_retry is not None:
                    notice = RetryNotice(
                        self.model, attempt + 2, delay, describe(exc), state.take_shown()
                    )
                    await _notify(on_retry, notice)
                await asyncio.sleep(delay)
                continue
            if completion.notes:
                _log.info("%s: repaired the answer: %s", self.model, "; ".join(completion.notes))
            return completion
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

    async def _post(self, client: AsyncOpenAI, body: dict[str, Any], stream: bool) -> Any:
        # The body goes to the SDK's low-level `post` as plain JSON: the typed `create()` walks
        # every message and tool definition through its TypedDict transform on each call (about
        # 40 % of the client's CPU in bench/engine_overhead.py), and ours are plain JSON already.
        # The response comes back as the raw httpx response: we parse it ourselves.
        response_type = importlib.import_module("httpx2").Response
        try:
            return await client.post(
                "/chat/completions", cast_to=response_type, body=body, stream=stream
            )
        except UnicodeEncodeError:
            # A lone surrogate somewhere in the conversation (a tool result, pasted text) makes
            # the body unencodable: send it with U+FFFD in its place rather than fail the run.
            return await client.post(
                "/chat/completions",
                cast_to=response_type,
                body=wire.clean_json(body),
                stream=stream,
            )

    async def _once(self, client: AsyncOpenAI, params: dict[str, Any], turn: int) -> Completion:
        response = await self._post(client, params, False)
        return self._trimmed(wire.from_body(wire.loads(response.content), self.model, turn))

    def _trimmed(self, completion: Completion) -> Completion:
        """A whole reply with a runaway repetition cut out (nothing to stop: it is complete)."""
        if self.cut_repeats and trim_runaway(completion, self.cut_repeats):
            _log.warning("%s: cut a reply that kept repeating itself", self.model)
        return completion

    async def _stream(
        self,
        client: AsyncOpenAI,
        params: dict[str, Any],
        on_delta: DeltaHandler | None,
        state: _CallState,
        turn: int,
    ) -> Completion:
        body = {**params, "stream": True, "stream_options": {"include_usage": True}}
        response = await self._post(client, body, True)
        try:
            content_type = response.headers.get("content-type", "")
            if "json" in content_type and "event-stream" not in content_type:
                # The server ignored stream=true and sent one body: take it as the answer.
                raw = await read_body(response, response.aread())
                completion = self._trimmed(wire.from_body(wire.loads(raw), self.model, turn))
                text = completion.message.get("content")
                if text and on_delta is not None:
                    await _deliver(on_delta, text, state)
                return completion
            deliver = (
                None if on_delta is None else functools.partial(_deliver, on_delta, state=state)
            )
            events = read_events(
                response,
                model=self.model,
                turn=turn,
                cut_repeats=self.cut_repeats,
                on_piece=deliver,
            )
            return await read_body(response, events)
        finally:
            await response.aclose()

    def _backoff(self, exc: Exception, attempt: int) -> float | None:
        """Seconds to wait before retrying after ``exc``, or None: do not retry."""
        if not retryable(exc):
            return None
        wait = retry_after(exc)  # the provider's word beats our backoff, within max_delay
        if wait is None:
            return self.retry.delay(attempt)
        return wait if wait <= self.retry.max_delay else None

    def _error(self, exc: Exception, attempts: int, note: str | None = None) -> LLMError:
        if isinstance(exc, LLMError):
            return exc
        status = getattr(exc, "status_code", None)
        detail = describe(exc)
        if note:
            detail += f"; {note}"
        wait = retry_after(exc)
        if wait is not None and wait > self.retry.max_delay and retryable(exc):
            detail += (
                f"; the provider asked to wait {wait:g} s (Retry-After), more than "
                f"retry.max_delay ({self.retry.max_delay:g} s), so it was not retried"
            )
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        fix = hint(exc, status)
        return LLMError(
            f"LLM request to {self.model} at {self.base_url} failed {tries}: {detail}"
            + (f" — {fix}" if fix else ""),
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


class _ServerBusy(LLMError):
    """A non-streamed call timed out: the server may still be generating its answer."""


class _HandlerFailed(Exception):
    """Carries an exception raised by the caller's ``on_delta`` past the retry logic."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def _deliver(on_delta: DeltaHandler, piece: str, state: _CallState) -> None:
    state.shown = True
    try:
        result = on_delta(piece)
        if result is not None:
            await result
    except Exception as exc:
        raise _HandlerFailed(exc) from exc


async def _notify(on_retry: RetryHandler, notice: RetryNotice) -> None:
    result = on_retry(notice)
    if result is not None:
        await result
