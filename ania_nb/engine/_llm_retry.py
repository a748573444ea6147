"""Retry policy and error classification of the LLM client.

What is retried, after how long, and how a failure is described to the user (the likely
cause and the fix).
"""

from __future__ import annotations

import contextlib
import email.utils
import importlib
import json
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC

from . import _llm_wire as wire

_HINTS = {
    401: "check the API key (llm.api_key / ANIA_LLM__API_KEY)",
    403: "the key is not allowed to use this model",
    404: "check llm.base_url (it usually ends in /v1) and llm.model",
    400: "the provider rejected the request; the message above says which field",
    429: "rate limited: wait, or raise the provider quota / retry.base_delay",
}
_SERVER_HINT = "the provider failed on its side; try again later or configure a fallback model"
_NETWORK_HINT = "check llm.base_url and the network; a slow model may need a larger llm.timeout"
_SHAPE_HINT = (
    "the server's answer does not follow the Chat Completions format; "
    "try another model or server version, or configure a fallback model"
)


@dataclass(frozen=True)
class RetryNotice:
    """What ``on_retry`` is told before the client asks again.

    ``discard_output``: text given to ``on_delta`` since the last notice is not part of any
    answer; take it back (the next attempt streams from the start).
    """

    model: str
    """The model about to be asked (the fallback's, when switching to it)."""
    attempt: int
    """1-based attempt number on that model."""
    delay: float
    """Seconds the client waits before asking."""
    error: str
    """Why the previous attempt failed."""
    discard_output: bool


RetryHandler = Callable[[RetryNotice], Awaitable[None] | None]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a failing call."""

    max_attempts: int = 3
    base_delay: float = 2.0
    max_delay: float = 30.0
    on_timeout: bool = False
    """Retry a non-streamed call that timed out (off: the server may still be generating)."""

    def delay(self, attempt: int) -> float:
        """Backoff before retry number ``attempt`` (0-based), jitter included."""
        base = min(self.base_delay * (2**attempt), self.max_delay)
        # random() is in [0, 1) where uniform(0, base) may return base itself
        return base + random.random() * base


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks for (delta-seconds or HTTP date); None if unusable."""
    if not value or not value.strip():
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def retry_after(exc: Exception) -> float | None:
    """Seconds an HTTP error response asks to wait (`retry-after-ms` or `Retry-After`)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        with contextlib.suppress(ValueError):
            value = float(millis) / 1000
            if math.isfinite(value):
                return max(0.0, value)
    return retry_after_seconds(headers.get("retry-after"))


def retryable(exc: Exception) -> bool:
    """Whether another attempt can help: 429, 5xx, network, no choices, a cut stream."""
    if isinstance(exc, wire.Malformed):
        return exc.retryable
    if isinstance(exc, wire.ProviderError):
        return True
    openai = importlib.import_module("openai")
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError)


SAME_FAILURE = (
    "the same error came twice in a row, so it was not retried again (the server fails this "
    "request every time, e.g. a conversation it cannot parse)"
)


def is_timeout(exc: Exception) -> bool:
    """Whether the request timed out waiting for the server (`openai.APITimeoutError`)."""
    return isinstance(exc, importlib.import_module("openai").APITimeoutError)


# Errors a server gives for the request itself (llama-server: a conversation it cannot parse).
# 502/503/504 come from gateways and overload and pass with time, however alike their bodies.
REQUEST_FAILURES = frozenset({500, 501})


def server_failure(exc: Exception) -> str | None:
    """A 500/501 error's status and body, to tell a deterministic failure from a transient one."""
    status = getattr(exc, "status_code", None)
    if status not in REQUEST_FAILURES:
        return None
    response = getattr(exc, "response", None)
    try:
        body = response.text if response is not None else str(exc)
    except Exception:  # a streamed body that was never read
        body = str(exc)
    return f"{status} {body}"


def timeout_note(timeout: float) -> str:
    """Why a timed-out non-streamed call was not retried, and what to change."""
    return (
        f"no answer within llm.timeout ({timeout:g} s); not retried, since the server may "
        "still be working on it — raise llm.timeout, set llm.stream = true, or set "
        "retry.on_timeout = true"
    )


def hint(exc: Exception, status: int | None) -> str | None:
    """The likely fix for a failure, or None."""
    if status is not None:
        return _HINTS.get(status) or (_SERVER_HINT if status >= 500 else None)
    if isinstance(exc, json.JSONDecodeError):
        return "check llm.base_url: it should be an OpenAI-compatible API, usually ending in /v1"
    if isinstance(exc, wire.Malformed):
        return _SERVER_HINT if exc.retryable else _SHAPE_HINT
    if isinstance(exc, wire.ProviderError):
        return _SERVER_HINT
    if retryable(exc):
        return _NETWORK_HINT
    return None


def describe(exc: Exception) -> str:
    """What went wrong, for the error message."""
    if isinstance(exc, json.JSONDecodeError):
        # a non-JSON body (a login page, a proxy error) surfaces as a bare JSONDecodeError
        return f"the endpoint returned a body that is not Chat Completions JSON ({exc})"
    if isinstance(exc, wire.Malformed):
        return f"malformed response: {exc}"
    if isinstance(exc, wire.ProviderError):
        return f"the provider reported an error: {exc}"
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
