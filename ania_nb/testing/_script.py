"""Script items for `ScriptedLLM`: replies and failures, their builders, JSON and wire form.

Each item answers exactly one request. Builders (`reply`, `tool_call`, `error`, ...) are
plain functions returning frozen dataclasses, so a script is just data: it can be written
to JSON with `script_to_json` and served from another process by the CLI. A `Reply` is
rendered to the Chat Completions wire format by `completion_body` / `stream_chunks`.

Misbehaving providers are scripted too: `tool_call(..., wire={...}, omit=[...])` sends odd
tool-call shapes (null or missing ids, null names, arguments as an object),
`error(..., retry_after=)` adds a `Retry-After` header (seconds or an HTTP date),
`cut_stream(..., clean=True)` ends a stream properly but without `finish_reason` or `[DONE]`,
and `raw(...)` sends any JSON verbatim (no choices, non-string content, an error in a 200).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

if TYPE_CHECKING:
    from ania_nb.testing._server import RecordedRequest

#: Usage marker meaning "estimate the token counts from the request and reply sizes".
AUTO_USAGE: Literal["auto"] = "auto"

_OMIT = "<omit>"  # a `ToolCallSpec.wire` value: leave the key out (`tool_call(omit=...)`)

_WIRE_KEYS = frozenset({"id", "type", "name", "arguments", "index"})

UsageSpec: TypeAlias = dict[str, Any] | Literal["auto"] | None


@dataclass(frozen=True)
class ToolCallSpec:
    """One function call the scripted assistant makes; `arguments` is sent verbatim.

    `wire` replaces fields on the wire with any JSON value (or leaves them out): "id", "type",
    "name", "arguments", and in a stream "index". Arguments that are not a string are sent
    whole in the call's first stream delta.
    """

    name: str
    arguments: str = "{}"
    id: str | None = None
    wire: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reply:
    """A successful assistant message (text, reasoning and/or tool calls)."""

    kind: ClassVar[str] = "reply"
    content: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    reasoning_content: str | None = None
    usage: UsageSpec = AUTO_USAGE
    finish_reason: str | None = None
    model: str | None = None

    @property
    def resolved_finish_reason(self) -> str:
        """The finish reason to send: explicit, else "tool_calls" or "stop"."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass(frozen=True)
class ErrorItem:
    """An HTTP error with an OpenAI-shaped body."""

    kind: ClassVar[str] = "error"
    status: int
    message: str | None = None
    type: str | None = None
    code: str | None = None
    retry_after: float | str | None = None
    """`Retry-After` header: seconds, or a string sent verbatim (e.g. an HTTP date)."""

    def body(self) -> dict[str, Any]:
        """Return the `{"error": {...}}` body, with defaults derived from the status."""
        message = self.message or _status_phrase(self.status)
        return {
            "error": {
                "message": message,
                "type": self.type or _default_error_type(self.status),
                "param": None,
                "code": self.code if self.code is not None else _DEFAULT_CODES.get(self.status),
            }
        }


@dataclass(frozen=True)
class Garbage:
    """A body that is not valid JSON (or, for a stream, a garbage SSE event)."""

    kind: ClassVar[str] = "garbage"
    body: str = "this is not json{"
    status: int = 200


@dataclass(frozen=True)
class Delay:
    """Wait `seconds`, then answer with `then` (None: the item queued after this one)."""

    kind: ClassVar[str] = "delay"
    seconds: float
    then: ScriptItem | None = None


@dataclass(frozen=True)
class CutStream:
    """Send the first `after_chunks` SSE chunks of `then`, then drop the connection.

    With `clean`, the response ends properly instead (no `finish_reason`, no `[DONE]`): only
    the missing end tells the client the answer was cut.
    """

    kind: ClassVar[str] = "cut_stream"
    then: Reply
    after_chunks: int = 2
    clean: bool = False


@dataclass(frozen=True)
class Raw:
    """Any JSON sent verbatim: `body` as a 200 response, or `chunks` as SSE events."""

    kind: ClassVar[str] = "raw"
    body: Any = None
    chunks: tuple[Any, ...] | None = None
    """Stream events (a str is sent as the event's data verbatim); None: `body` is the only one."""
    done: bool = True
    """End a stream with `[DONE]`."""
    sse: bool = True
    """False: answer a stream request with the plain `body` too (servers ignoring `stream`)."""


@dataclass(frozen=True)
class Disconnect:
    """Close the connection without sending any response."""

    kind: ClassVar[str] = "disconnect"


ScriptItem: TypeAlias = Reply | ErrorItem | Garbage | Delay | CutStream | Disconnect | Raw

ITEM_TYPES: tuple[type[ScriptItem], ...] = (
    Reply,
    ErrorItem,
    Garbage,
    Delay,
    CutStream,
    Disconnect,
    Raw,
)
_KINDS: dict[str, type[ScriptItem]] = {cls.kind: cls for cls in ITEM_TYPES}
_DEFAULT_CODES = {429: "rate_limit_exceeded"}


def _status_phrase(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:  # a non-standard code such as 599
        return f"HTTP {status}"


def _default_error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "requests"
    return "server_error" if status >= 500 else "invalid_request_error"


# -- builders ---------------------------------------------------------------------------


def usage(
    prompt: int,
    completion: int,
    *,
    cached: int | None = None,
    deepseek_cache_hit: int | None = None,
) -> dict[str, Any]:
    """Build a usage block; `cached` fills OpenAI's and `deepseek_cache_hit` DeepSeek's field."""
    block: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        block["prompt_tokens_details"] = {"cached_tokens": cached}
    if deepseek_cache_hit is not None:
        block["prompt_cache_hit_tokens"] = deepseek_cache_hit
        block["prompt_cache_miss_tokens"] = prompt - deepseek_cache_hit
    return block


def tool_call(
    name: str,
    arguments: Mapping[str, Any] | str | None = None,
    *,
    id: str | None = None,
    wire: Mapping[str, Any] | None = None,
    omit: Iterable[str] = (),
) -> ToolCallSpec:
    """Build a tool call; a str is sent verbatim (even malformed JSON), a mapping is dumped.

    Odd shapes for fault tests: `wire` sends other values instead of the well-formed fields,
    e.g. ``{"id": None}``, ``{"name": ""}``, ``{"arguments": {"city": "Oslo"}}``; `omit`
    leaves keys out, e.g. ``("id",)`` or ``("index",)`` (stream chunks only).
    """
    wire = {**(wire or {}), **dict.fromkeys(omit, _OMIT)}
    unknown = set(wire) - _WIRE_KEYS
    if unknown:
        raise ValueError(
            f"tool_call({name!r}): unknown wire keys {sorted(unknown)}; "
            f"expected some of {sorted(_WIRE_KEYS)}"
        )
    if arguments is None:
        text = "{}"
    elif isinstance(arguments, str):
        text = arguments
    elif isinstance(arguments, Mapping):
        text = json.dumps(dict(arguments), ensure_ascii=False)
    else:
        raise TypeError(
            f"tool_call({name!r}): arguments must be a dict or a str, "
            f"got {type(arguments).__name__}"
        )
    return ToolCallSpec(name=name, arguments=text, id=id, wire=wire or None)


def reply(
    content: str | None = None,
    *,
    tool_calls: Iterable[ToolCallSpec] = (),
    reasoning_content: str | None = None,
    usage: UsageSpec = AUTO_USAGE,
    finish_reason: str | None = None,
    model: str | None = None,
) -> Reply:
    """Build an assistant reply; several tool calls are parallel calls.

    `usage` defaults to an estimate (about 4 characters per token) and `None` omits the
    usage block; `model` defaults to echoing the request's model.
    """
    calls = tuple(tool_calls)
    for call in calls:
        if not isinstance(call, ToolCallSpec):
            raise TypeError(f"reply(): tool_calls items must come from tool_call(), got {call!r}")
    if isinstance(usage, str) and usage != AUTO_USAGE:
        raise ValueError(f"reply(): usage must be a dict, None or 'auto', got {usage!r}")
    return Reply(content, calls, reasoning_content, usage, finish_reason, model)


def error(
    status: int,
    message: str | None = None,
    *,
    type: str | None = None,
    code: str | None = None,
    retry_after: float | None = None,
) -> ErrorItem:
    """Build an HTTP error reply (OpenAI-shaped body, optional `Retry-After` header)."""
    if not 400 <= status <= 599:
        raise ValueError(f"error(): status must be a 4xx or 5xx code, got {status}")
    return ErrorItem(status, message, type, code, retry_after)


def garbage(body: str = "this is not json{", *, status: int = 200) -> Garbage:
    """Build a reply whose body is not valid JSON."""
    return Garbage(body, status)


def delay(seconds: float, then: ScriptItem | None = None) -> Delay:
    """Build a pause of `seconds` before answering with `then` (default: the next item)."""
    if seconds < 0:
        raise ValueError(f"delay(): seconds must be >= 0, got {seconds}")
    if isinstance(then, Delay):
        raise ValueError("delay(): `then` cannot be another delay; add the seconds instead")
    return Delay(seconds, then)


def cut_stream(then: Reply, after_chunks: int = 2, *, clean: bool = False) -> CutStream:
    """Build a stream that breaks after `after_chunks` chunks of `then` (`clean`: ends quietly)."""
    if not isinstance(then, Reply):
        raise TypeError(f"cut_stream(): `then` must be a reply(...), got {then!r}")
    if after_chunks < 0:
        raise ValueError(f"cut_stream(): after_chunks must be >= 0, got {after_chunks}")
    return CutStream(then, after_chunks, clean)


def raw(
    body: Any = None, *, chunks: Iterable[Any] | None = None, done: bool = True, sse: bool = True
) -> Raw:
    """Build a 200 reply sending `body` (or, to a stream, `chunks`) verbatim, valid or not."""
    return Raw(body, None if chunks is None else tuple(chunks), done, sse)


def disconnect() -> Disconnect:
    """Build a reply that closes the connection without a response."""
    return Disconnect()


# -- JSON -------------------------------------------------------------------------------


def _item_to_dict(item: ScriptItem) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": item.kind}
    for field in dataclasses.fields(item):
        value = getattr(item, field.name)
        if field.name == "tool_calls":
            value = [dataclasses.asdict(call) for call in value]
        elif field.name == "then" and value is not None:
            value = _item_to_dict(value)
        data[field.name] = value
    return data


def _item_from_dict(data: Any, where: str) -> ScriptItem:
    if not isinstance(data, dict) or "kind" not in data:
        raise ValueError(f"{where}: expected an object with a 'kind' field, got {data!r}")
    fields = dict(data)
    kind = fields.pop("kind")
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"{where}: unknown kind {kind!r}; expected one of {sorted(_KINDS)}")
    if "tool_calls" in fields:
        calls = fields["tool_calls"]
        if not isinstance(calls, list):
            raise ValueError(f"{where}: 'tool_calls' must be a list, got {calls!r}")
        try:
            fields["tool_calls"] = tuple(ToolCallSpec(**call) for call in calls)
        except TypeError as exc:
            raise ValueError(f"{where}: bad tool call: {exc}") from None
    if fields.get("then") is not None:
        fields["then"] = _item_from_dict(fields["then"], f"{where}.then")
    if kind == "raw" and isinstance(fields.get("chunks"), list):
        fields["chunks"] = tuple(fields["chunks"])
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"{where} ({kind}): {exc}") from None


def script_to_json(items: Iterable[ScriptItem]) -> str:
    """Serialise script items to a JSON list (each item has a "kind" field)."""
    return json.dumps([_item_to_dict(item) for item in items], indent=2, ensure_ascii=False)


def script_from_json(text: str) -> list[ScriptItem]:
    """Parse a JSON list written by `script_to_json` back into script items."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"script JSON must be a list of items, got {type(data).__name__}")
    return [_item_from_dict(entry, f"script item #{i}") for i, entry in enumerate(data)]


# -- wire format ------------------------------------------------------------------------


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _usage_block(reply: Reply, request: RecordedRequest) -> dict[str, Any] | None:
    if reply.usage != AUTO_USAGE:
        return reply.usage
    # A rough 4-characters-per-token estimate keeps token counters moving realistically.
    produced = len(reply.content or "") + len(reply.reasoning_content or "")
    produced += sum(len(call.name) + len(call.arguments) for call in reply.tool_calls)
    prompt, completion = max(1, len(request.raw) // 4), max(1, produced // 4)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _envelope(request: RecordedRequest, reply: Reply, obj: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-scripted-{request.index}",
        "object": obj,
        "created": int(time.time()),
        "model": reply.model or request.model or "scripted",
    }


def _call_id(request: RecordedRequest, reply: Reply, position: int) -> str:
    return reply.tool_calls[position].id or f"call_{request.index}_{position}"


def _override(target: dict[str, Any], key: str, value: Any) -> None:
    if value == _OMIT:
        target.pop(key, None)
    else:
        target[key] = value


def _wire_call(request: RecordedRequest, reply: Reply, position: int) -> dict[str, Any]:
    call = reply.tool_calls[position]
    function = {"name": call.name, "arguments": call.arguments}
    out = {"id": _call_id(request, reply, position), "type": "function", "function": function}
    for key, value in (call.wire or {}).items():
        if key != "index":  # a non-streamed call has no index
            _override(function if key in ("name", "arguments") else out, key, value)
    return out


def completion_body(reply: Reply, request: RecordedRequest) -> dict[str, Any]:
    """Render a reply as a non-streamed `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            _wire_call(request, reply, i) for i in range(len(reply.tool_calls))
        ]
    if reply.reasoning_content is not None:
        message["reasoning_content"] = reply.reasoning_content
    body = _envelope(request, reply, "chat.completion")
    body["choices"] = [
        {"index": 0, "message": message, "finish_reason": reply.resolved_finish_reason}
    ]
    block = _usage_block(reply, request)
    if block is not None:
        body["usage"] = block
    return body


def stream_chunks(reply: Reply, request: RecordedRequest, chunk_size: int) -> list[dict[str, Any]]:
    """Render a reply as the `chat.completion.chunk` objects of a stream, in order."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": p} for p in _pieces(reply.reasoning_content or "", chunk_size)]
    deltas += [{"content": p} for p in _pieces(reply.content or "", chunk_size)]
    for i, call in enumerate(reply.tool_calls):
        wire = call.wire or {}
        function: dict[str, Any] = {"name": call.name, "arguments": ""}
        opener = {"index": i, "id": _call_id(request, reply, i), "type": "function"}
        opener["function"] = function
        arguments = wire.get("arguments", call.arguments)
        for key, value in wire.items():
            if key != "arguments":
                _override(function if key == "name" else opener, key, value)
            elif not isinstance(value, str) or value == _OMIT:
                _override(function, key, value)  # sent whole (or not at all)
        deltas.append({"tool_calls": [opener]})
        if isinstance(arguments, str) and arguments != _OMIT:
            piece: dict[str, Any] = {"index": i} if "index" not in wire else {}
            if wire.get("index", _OMIT) != _OMIT:
                piece["index"] = wire["index"]
            deltas += [
                {"tool_calls": [{**piece, "function": {"arguments": p}}]}
                for p in _pieces(arguments, chunk_size)
            ]
    envelope = _envelope(request, reply, "chat.completion.chunk")
    chunks = [
        {**envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in deltas
    ]
    finish = {"index": 0, "delta": {}, "finish_reason": reply.resolved_finish_reason}
    chunks.append({**envelope, "choices": [finish]})
    options = (request.body or {}).get("stream_options") or {}
    block = _usage_block(reply, request)
    if options.get("include_usage") and block is not None:
        chunks.append({**envelope, "choices": [], "usage": block})
    return chunks


def wait_for_requests(
    cond: threading.Condition, requests: list[Any], n: int, timeout: float, what: str
) -> list[Any]:
    """Block until ``requests`` (guarded by ``cond``) holds ``n``; a copy, or TimeoutError."""
    with cond:
        if not cond.wait_for(lambda: len(requests) >= n, timeout):
            raise TimeoutError(
                f"ScriptedLLM: expected {n} {what}(s) within {timeout}s, got {len(requests)}"
            )
        return list(requests)
