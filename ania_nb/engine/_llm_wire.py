"""What a provider sends, turned into a well-formed `Completion` or one specific error.

Every response (a plain body here, stream chunks in `_llm_stream`) is parsed as plain JSON,
never through the SDK's typed models, and validated before the engine sees it, so no tool runs
on a malformed answer:

* **Text**: lone surrogates (which JSON, SQLite and HTTP cannot encode) become U+FFFD. Content
  must be a string or null; a list of text parts is joined; anything else is `Malformed`.
* **Tool calls** are always a list of ``{"id", "type": "function", "function": {"name",
  "arguments"}}`` with string fields. A missing, empty, non-string or repeated id is replaced
  by ``call_<n>_<position>`` (n = the index the message will have in the conversation, as the
  history validator does), and that id is what gets stored. A missing or empty name becomes
  ``invalid_tool_call``: the call stays, so the loop answers it ("tool not found") and the
  conversation remains valid; dropping it would leave the model without an answer.
  Arguments sent as an object are serialised, null or blank becomes ``"{}"``, and text that is
  not a JSON object (invalid JSON, NaN, an array...) is stored wrapped as ``{"_raw": text}``
  (`safe_arguments`) while the original goes to ``Completion.raw_arguments`` so the tool
  executor can still tell the model exactly what was wrong.
* **Usage** is bookkeeping and never fails a call, but quotas rest on it, so a count that cannot
  be trusted is not taken as zero: when ``prompt_tokens``, ``completion_tokens`` or
  ``total_tokens`` is there but is not a token count (negative, fractional, not a number —
  ``"12"`` and ``12.0`` are counts —, or above `MAX_CALL_TOKENS`), or the block has neither
  ``total_tokens`` nor both of the others, the call is treated as one without usage (None):
  its tokens are estimated (`Usage.estimated_calls`), with a note. A bad cached-token count is
  dropped with a note (it only lowers a price).
* **No choices** is retryable (a provider glitch); other shape errors are not (the same server
  answers the same way), but the fallback model still gets its call.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .messages import Message

INVALID_TOOL_NAME = "invalid_tool_call"
"""Stands for a missing or empty function name: no tool has it, so the model is told."""

MAX_CALL_TOKENS = 100_000_000
"""More tokens than any context window holds: a larger count in one call is not a count."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_MAIN_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")  # what quotas count
_CACHE_COUNTS = ("prompt_cache_hit_tokens", "prompt_cache_miss_tokens")  # DeepSeek's


class Malformed(Exception):
    """The response is not a usable Chat Completion; the message says what is wrong."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class ProviderError(Exception):
    """The provider reported an error inside a 200 body or a stream (retryable)."""


@dataclass
class Completion:
    """One model answer, normalised: the assistant message is valid to store and to send back.

    ``raw_arguments`` maps a call id to the arguments text exactly as the model sent it, for the
    calls whose stored arguments had to be wrapped (not a JSON object): pass that text to the
    tool executor so it reports the real parse error. ``notes`` say what was repaired.
    ``finish_reason == "length"`` (see ``truncated``) means the reply was cut by the token cap;
    ``"repetition"`` that the client cut a runaway reply itself (`_llm_repeat`, notice appended).
    """

    message: Message
    usage: dict[str, Any] | None
    model: str
    finish_reason: str | None = None
    raw_arguments: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    asked: str = ""  # the configured model that answered (``model`` is the provider's name)

    @property
    def truncated(self) -> bool:
        """Whether the reply was cut by the token cap (``finish_reason == "length"``)."""
        return self.finish_reason == "length"

    def arguments_for(self, call: dict[str, Any]) -> str:
        """The arguments text to execute a stored call with (the model's original if wrapped)."""
        arguments: str = call["function"]["arguments"]
        return self.raw_arguments.get(call["id"], arguments)


# -- text -------------------------------------------------------------------------------


def clean_text(text: str) -> str:
    """Replace lone surrogates with U+FFFD (they cannot be encoded as UTF-8)."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def clean_json(value: Any) -> Any:
    """A copy of parsed JSON with every string passed through `clean_text`."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value


def loads(data: bytes | str) -> Any:
    """Parse JSON; lone surrogates (raw bytes or escaped) come out as U+FFFD."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    value = json.loads(text)
    # Surrogates can only come from \u escapes (bytes were decoded with "replace"): checking
    # for the escape first keeps the walk off the hot path.
    if "\\ud" in text or "\\uD" in text:
        value = clean_json(value)
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def content_text(value: Any, where: str) -> str | None:
    """Content as a string: str and null as is, a list of text parts joined, else `Malformed`."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif (
                isinstance(part, dict)
                and part.get("type", "text") == "text"
                and isinstance(part.get("text"), str)
            ):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else None
                raise Malformed(
                    f"{where} is a list with a part that is not text "
                    f"({repr(kind) if kind else _kind(part)})"
                )
        return "".join(texts)
    raise Malformed(f"{where} is {_kind(value)}, not a string")


# -- arguments and tool calls -----------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # NaN/Infinity: strict parsers refuse them


def safe_arguments(raw: str) -> str:
    """Arguments text that is always a JSON object: ``raw`` when it is one, else wrapped.

    Blank text is ``"{}"``; anything that does not parse to an object (invalid JSON, NaN, an
    array, a number) becomes ``{"_raw": raw}``, so what is stored and re-sent is always valid.
    """
    return _safe_arguments(raw)[0]


def _safe_arguments(raw: str) -> tuple[str, bool]:
    """`safe_arguments` and whether it had to wrap the text."""
    if not raw.strip():
        return "{}", False
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        return json.dumps({"_raw": clean_text(raw)}, ensure_ascii=False), True
    if "\\ud" in raw or "\\uD" in raw:  # escaped lone surrogates inside the arguments
        cleaned = clean_json(value)
        if cleaned != value:
            return json.dumps(cleaned, ensure_ascii=False), False
    return raw, False


def _arguments_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "{}"
    return json.dumps(value, ensure_ascii=False, default=str)


def normalise_calls(
    raw_calls: Any, turn: int, notes: list[str]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Well-formed tool calls and the original text of the arguments that had to be wrapped."""
    if not raw_calls:
        return [], {}
    if not isinstance(raw_calls, list):
        raise Malformed(f"tool_calls is {_kind(raw_calls)}, not a list")
    calls: list[dict[str, Any]] = []
    raw_arguments: dict[str, str] = {}
    seen: set[str] = set()
    for position, call in enumerate(raw_calls):
        if not isinstance(call, dict):
            raise Malformed(f"tool_calls[{position}] is {_kind(call)}, not an object")
        function = call.get("function")
        if function is None:
            function = {}
        elif not isinstance(function, dict):
            raise Malformed(f"tool_calls[{position}].function is {_kind(function)}, not an object")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id.strip() or call_id in seen:
            if isinstance(call_id, str):
                reason = "repeats an earlier id" if call_id in seen else "is empty"
            else:
                reason = f"is {_kind(call_id)}"
            fresh = f"call_{turn}_{position}"
            while fresh in seen:
                fresh += "_"
            notes.append(f"tool call {position}: its id {reason}; stored as {fresh!r}")
            call_id = fresh
        seen.add(call_id)
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            what = "empty" if isinstance(name, str) else _kind(name)
            notes.append(
                f"tool call {call_id}: the function name is {what}; "
                f"stored as {INVALID_TOOL_NAME!r} (no tool has that name, so the model is told)"
            )
            name = INVALID_TOOL_NAME
        text = _arguments_text(function.get("arguments"))
        arguments, wrapped = _safe_arguments(text)
        if wrapped:
            raw_arguments[call_id] = text  # the executor reports the real problem from it
            notes.append(
                f"tool call {call_id}: the arguments are not a JSON object; "
                'stored wrapped as {"_raw": ...}'
            )
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls, raw_arguments


# -- usage ------------------------------------------------------------------------------


def _count(value: Any) -> int | None:
    """A token count (see the module docstring), or None when ``value`` is not one."""
    number: float
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    if not math.isfinite(number) or number < 0 or number > MAX_CALL_TOKENS:
        return None
    if number != int(number):
        return None  # a fraction of a token is not a count
    return int(number)


def normalise_usage(raw: Any, notes: list[str]) -> dict[str, Any] | None:
    """The usage block with int counts only, or None to estimate (see the module docstring)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        notes.append(f"usage is {_kind(raw)}, not an object; the call's tokens are estimated")
        return None
    usage: dict[str, Any] = {}
    for key in _MAIN_COUNTS:
        if raw.get(key) is None:  # null is a provider's way of saying "not counted"
            continue
        count = _count(raw[key])
        if count is None:
            notes.append(
                f"usage.{key} is not a token count ({raw[key]!r:.40}); "
                "the call's tokens are estimated"
            )
            return None
        usage[key] = count
    if "total_tokens" not in usage and not {"prompt_tokens", "completion_tokens"} <= set(usage):
        notes.append("usage has no total_tokens nor prompt and completion tokens; estimated")
        return None
    cached_counts = [(key, raw[key]) for key in _CACHE_COUNTS if raw.get(key) is not None]
    details = raw.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        cached_counts.append(("prompt_tokens_details.cached_tokens", details["cached_tokens"]))
    for key, value in cached_counts:
        count = _count(value)
        if count is None:
            notes.append(f"usage.{key} is not a token count ({value!r:.40}); ignored")
        elif key.startswith("prompt_tokens_details"):
            usage["prompt_tokens_details"] = {"cached_tokens": count}
        else:
            usage[key] = count
    return usage


# -- completions ------------------------------------------------------------------------


def build(
    content: str | None,
    reasoning: str | None,
    raw_calls: Any,
    finish: Any,
    raw_usage: Any,
    model: Any,
    default_model: str,
    turn: int,
) -> Completion:
    """Assemble a normalised `Completion` (the shared end of the body and stream paths)."""
    notes: list[str] = []
    calls, raw_arguments = normalise_calls(raw_calls, turn, notes)
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = reasoning
    if finish is not None and not isinstance(finish, str):
        notes.append(f"finish_reason is {_kind(finish)}; ignored")
        finish = None
    usage = normalise_usage(raw_usage, notes)
    name = model if isinstance(model, str) and model else default_model
    return Completion(message, usage, name, finish or None, raw_arguments, notes)


def provider_error(error: Any) -> ProviderError:
    """The `ProviderError` for an ``error`` member of a body or a stream chunk."""
    message = error.get("message") if isinstance(error, dict) else error
    return ProviderError(str(message or "the provider reported an error without a message"))


def from_body(body: Any, default_model: str, turn: int) -> Completion:
    """A `Completion` from a parsed non-streamed body."""
    if not isinstance(body, dict):
        raise Malformed(f"the body is {_kind(body)}, not a Chat Completions object")
    if body.get("error"):
        raise provider_error(body["error"])
    choices = body.get("choices")
    if not choices:
        raise Malformed("no choices in the response", retryable=True)
    if not isinstance(choices, list):
        raise Malformed(f"choices is {_kind(choices)}, not a list")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise Malformed(f"choices[0] is {_kind(choice)}, not an object")
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise Malformed(f"choices[0].message is {_kind(msg)}, not an object")
    content = content_text(msg.get("content"), "the message content")
    reasoning = content_text(msg.get("reasoning_content"), "reasoning_content")
    return build(
        content,
        reasoning,
        msg.get("tool_calls"),
        choice.get("finish_reason"),
        body.get("usage"),
        body.get("model"),
        default_model,
        turn,
    )
