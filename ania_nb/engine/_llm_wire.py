"""What a provider sends, turned into a well-formed `Completion` or one specific error.

Every response (plain body or stream) is parsed here as plain JSON, never through the SDK's
typed models, and validated before the engine sees it, so no tool runs on a malformed answer:

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
* **Usage** is bookkeeping and never fails a call: counts become ints; a value that is not a
  number (``"12"`` is) counts as 0 and adds a note.
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

_SURROGATE = re.compile("[\ud800-\udfff]")
_USAGE_COUNTS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "prompt_cache_hit_tokens",
    "prompt_cache_miss_tokens",
)


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
    ``finish_reason == "length"`` (see ``truncated``) means the reply was cut by the token cap.
    """

    message: Message
    usage: dict[str, Any] | None
    model: str
    finish_reason: str | None = None
    raw_arguments: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

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


def _count(value: Any, key: str, notes: list[str]) -> int:
    if type(value) is int and value >= 0:
        return value
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if value is None:
        return 0  # null is a provider's way of saying "not counted"
    if number is not None and math.isfinite(number) and number >= 0:
        return int(number)
    notes.append(f"usage.{key} is not a token count ({value!r:.40}); counted as 0")
    return 0


def normalise_usage(raw: Any, notes: list[str]) -> dict[str, Any] | None:
    """The usage block with int counts only (see the module docstring), or None."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        notes.append(f"usage is {_kind(raw)}, not an object; ignored")
        return None
    usage: dict[str, Any] = {}
    for key in _USAGE_COUNTS:
        if key in raw:
            usage[key] = _count(raw[key], key, notes)
    details = raw.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        cached = _count(details["cached_tokens"], "prompt_tokens_details.cached_tokens", notes)
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
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


def _provider_error(error: Any) -> ProviderError:
    message = error.get("message") if isinstance(error, dict) else error
    return ProviderError(str(message or "the provider reported an error without a message"))


def from_body(body: Any, default_model: str, turn: int) -> Completion:
    """A `Completion` from a parsed non-streamed body."""
    if not isinstance(body, dict):
        raise Malformed(f"the body is {_kind(body)}, not a Chat Completions object")
    if body.get("error"):
        raise _provider_error(body["error"])
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


class _Slot:
    """One tool call being assembled from stream deltas."""

    __slots__ = ("arguments", "id", "name", "other_arguments", "other_name")

    def __init__(self) -> None:
        self.id: Any = None
        self.name: list[str] = []
        self.other_name: Any = None
        self.arguments: list[str] = []
        self.other_arguments: Any = None

    def raw(self) -> dict[str, Any]:
        name = "".join(self.name) if self.name else self.other_name
        if self.arguments:
            arguments: Any = "".join(self.arguments)
        else:
            arguments = self.other_arguments
        return {"id": self.id, "function": {"name": name, "arguments": arguments}}


class StreamState:
    """Accumulates ``chat.completion.chunk`` objects; `feed` returns the text to show."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.slots: dict[int, _Slot] = {}
        self.usage: Any = None
        self.finish: Any = None
        self.model: Any = None
        self.chunks = 0
        self.choices = False

    def feed(self, chunk: Any) -> str | None:
        """Take one parsed chunk; returns its content piece (None when it has none)."""
        if not isinstance(chunk, dict):
            raise Malformed(f"a stream event is {_kind(chunk)}, not a JSON object")
        self.chunks += 1
        if chunk.get("error"):
            raise _provider_error(chunk["error"])
        model = chunk.get("model")
        if model:
            self.model = model
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            return None
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise Malformed(f"a stream chunk's choices is {_kind(choices)}, not a list of objects")
        choice = choices[0]
        self.choices = True
        finish = choice.get("finish_reason")
        if finish:
            self.finish = finish
        delta = choice.get("delta")
        if not delta:
            return None
        if not isinstance(delta, dict):
            raise Malformed(f"a stream chunk's delta is {_kind(delta)}, not an object")
        reasoning = delta.get("reasoning_content")
        if reasoning:
            self.reasoning.append(content_text(reasoning, "a reasoning_content delta") or "")
        calls = delta.get("tool_calls")
        if calls:
            self._calls(calls)
        piece = delta.get("content")
        if not piece:
            return None
        if not isinstance(piece, str):
            piece = content_text(piece, "a content delta") or ""
        self.content.append(piece)
        return piece

    def _calls(self, deltas: Any) -> None:
        if not isinstance(deltas, list):
            raise Malformed(f"a tool_calls delta is {_kind(deltas)}, not a list")
        for delta in deltas:
            if not isinstance(delta, dict):
                raise Malformed(f"a tool call delta is {_kind(delta)}, not an object")
            index = delta.get("index")
            call_id = delta.get("id")
            if not isinstance(index, int) or isinstance(index, bool):
                # No index (some servers): a new id opens a call, otherwise the last one goes on.
                known = any(s.id == call_id for s in self.slots.values())
                last = max(self.slots, default=-1)
                index = last + 1 if last < 0 or (call_id and not known) else last
            slot = self.slots.get(index)
            if slot is None:
                slot = self.slots[index] = _Slot()
            if call_id:
                slot.id = call_id
            function = delta.get("function")
            if function is None:
                continue
            if not isinstance(function, dict):
                raise Malformed(f"a tool call delta's function is {_kind(function)}")
            name = function.get("name")
            if isinstance(name, str):
                slot.name.append(name)
            elif name is not None:
                slot.other_name = name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                slot.arguments.append(arguments)
            elif arguments is not None:
                slot.other_arguments = arguments

    def finish_completion(self, *, done: bool, default_model: str, turn: int) -> Completion:
        """The `Completion` once the stream has ended (``done``: ``[DONE]`` arrived)."""
        if not done and not self.finish:
            raise Malformed(
                "the stream ended without a finish_reason or [DONE] (the answer was cut short)",
                retryable=True,
            )
        if not self.choices:
            raise Malformed("no choices in the response (the stream had none)", retryable=True)
        if not self.finish and not self.content and not self.slots:
            raise Malformed("the stream ended before the model produced any output", retryable=True)
        raw_calls = [self.slots[i].raw() for i in sorted(self.slots)]
        return build(
            "".join(self.content) or None,
            "".join(self.reasoning) or None,
            raw_calls,
            self.finish,
            self.usage,
            self.model,
            default_model,
            turn,
        )


DONE = b"[DONE]"


class SSEParser:
    """Splits server-sent event bytes into ``data`` payloads (comments, other fields skipped).

    A ``data:`` line that is complete JSON on its own is a payload at once (some servers send
    no blank line between events); one that is not waits for the event's next ``data:`` lines.
    """

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # bytes after the last newline
        self._lines: list[bytes] = []  # data lines of a multi-line event

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads completed by ``data``."""
        if (
            data[:6] == b"data: "
            and not self._partial
            and not self._lines
            and data.find(b"\n") == len(data) - 2
            and data[-1:] == b"\n"
        ):
            # The common case: one whole event per network chunk ("data: {...}\n\n").
            return [data[6:-2]]
        if b"\n" not in data:
            self._partial.append(data)
            return []
        if self._partial:
            self._partial.append(data)
            data = b"".join(self._partial)
            self._partial = []
        lines = data.split(b"\n")
        tail = lines.pop()
        if tail:
            self._partial.append(tail)
        out: list[bytes] = []
        for line in lines:
            self._line(line[:-1] if line.endswith(b"\r") else line, out)
        return out

    def close(self) -> list[bytes]:
        """Payloads left when the stream ends without a final blank line."""
        out: list[bytes] = []
        if self._partial:
            self._line(b"".join(self._partial), out)
            self._partial = []
        if self._lines:
            out.append(b"\n".join(self._lines))
            self._lines = []
        return out

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self._lines:  # the end of a multi-line event
                out.append(b"\n".join(self._lines))
                self._lines = []
            return
        if not line.startswith(b"data:"):
            return  # ": comment", "event:", "id:", "retry:"
        value = line[6:] if line[5:6] == b" " else line[5:]
        if self._lines:
            self._lines.append(value)
        elif value == DONE or _is_json_object(value):
            out.append(value)
        else:
            self._lines.append(value)


def _is_json_object(value: bytes) -> bool:
    # Cheap completeness test: a single-line event is a JSON object from { to }.
    return value.startswith(b"{") and value.rstrip().endswith(b"}")
