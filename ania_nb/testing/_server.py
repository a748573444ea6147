"""`ScriptedLLM`: an OpenAI-compatible Chat Completions server on 127.0.0.1 that replays a script.

Built on the loopback server of `ania_nb.testing._http` (standard library only, daemon threads),
so it starts instantly and works the same from sync code, async code and a Jupyter kernel.

Several callers can share one server and still follow their own scripts: `llm.route(match, ...)`
queues items only for requests whose system prompt contains `match` (or whose model is `match`,
or for which a callable `match(request)` is true), e.g. a main agent and its subagents.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self, cast

from ania_nb.testing._conversation import conversation_problem
from ania_nb.testing._embeddings import DEFAULT_DIM, EmbeddingsEndpoint
from ania_nb.testing._http import LoopbackHandler, LoopbackServer
from ania_nb.testing._script import (
    ITEM_TYPES,
    CutStream,
    Delay,
    ErrorItem,
    Garbage,
    Raw,
    Reply,
    ScriptItem,
    completion_body,
    stream_chunks,
    wait_for_requests,
)

Responder = Callable[["RecordedRequest"], ScriptItem]
RouteMatch = str | Callable[["RecordedRequest"], bool]
"""What `ScriptedLLM.route` matches: a system-prompt substring or model name, or a predicate."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request received on /v1/chat/completions (or /v1/embeddings), as the server saw it."""

    index: int
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    raw: bytes

    @property
    def model(self) -> str | None:
        """The requested model name."""
        return (self.body or {}).get("model")

    @property
    def inputs(self) -> list[str]:
        """The texts of an embeddings request (empty if absent or malformed)."""
        texts = self.body.get("input") if isinstance(self.body, dict) else None
        texts = [texts] if isinstance(texts, str) else texts
        return list(texts) if isinstance(texts, list) else []

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's messages (empty if the body was unparsable)."""
        return (self.body or {}).get("messages") or []

    @property
    def system(self) -> str:
        """The text of the system (and developer) messages, joined by blank lines; "" if none."""
        parts: list[str] = []
        for message in self.messages:
            if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
                continue
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # content parts: keep the text ones
                parts += [
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                ]
        return "\n\n".join(parts)

    @property
    def tool_names(self) -> list[str]:
        """The names of the offered function tools, in order (empty when none)."""
        names = []
        for tool in self.tools or []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                names.append(function["name"])
        return names

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The request's tools array, or None when absent."""
        return (self.body or {}).get("tools")

    @property
    def stream(self) -> bool:
        """Whether the client asked for a streamed response."""
        return (self.body or {}).get("stream") is True

    @property
    def tools_bytes(self) -> bytes:
        """The tools array re-serialised compactly (UTF-8), for comparing tools across requests."""
        return json.dumps(self.tools, separators=(",", ":"), ensure_ascii=False).encode()


# -- HTTP -------------------------------------------------------------------------------


class _Handler(LoopbackHandler):
    server_version = "ScriptedLLM/1.0"

    @property
    def llm(self) -> ScriptedLLM:
        return cast(ScriptedLLM, self.server.owner)

    def do_GET(self) -> None:
        """Serve `/v1/models`; everything else is 404."""
        self._read_body()
        if self._route() == "/v1/models":
            model = {"id": "scripted", "object": "model", "created": 0, "owned_by": "ania-nb"}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_not_found()

    def do_POST(self) -> None:
        """Serve `/v1/chat/completions` from the script, `/v1/embeddings`; else 404."""
        raw = self._read_body()
        if self._route() == "/v1/embeddings":
            self._serve_embeddings(raw)
            return
        if self._route() != "/v1/chat/completions":
            self._send_not_found()
            return
        llm = self.llm
        request = llm._record(self.path, {k.lower(): v for k, v in self.headers.items()}, raw)
        if not isinstance(request.body, dict):
            message = f"ScriptedLLM: request #{request.index} body is not a JSON object"
            self._send_json(400, ErrorItem(400, message, "invalid_request_error").body())
            return
        problem = conversation_problem(request.messages) if llm.strict else None
        if problem is not None:  # refused before the script is consulted: no item is used
            message = f"ScriptedLLM (strict): invalid conversation: {problem}"
            status = llm.strict_status
            kind = "server_error" if status >= 500 else "invalid_request_error"
            self._send_json(status, ErrorItem(status, message, kind).body())
            return
        item = llm._take(request)
        while isinstance(item, Delay):
            if self.server.closing.wait(item.seconds):
                self.close_connection = True  # the server is closing: drop the request
                return
            item = item.then if item.then is not None else llm._take(request)
        self._answer(item, request)

    def _serve_embeddings(self, raw: bytes) -> None:
        endpoint = self.llm.embeddings
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = _loads(raw)
        request = endpoint.record(lambda i: RecordedRequest(i, self.path, headers, body, raw))
        item = endpoint.take()
        while isinstance(item, Delay):  # a bare delay: then the vectors
            if self.server.closing.wait(item.seconds):
                self.close_connection = True
                return
            item = item.then
        if item is None:
            self._send_json(*endpoint.answer(request))
        else:
            self._answer(item, request)

    def _route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def _answer(self, item: ScriptItem, request: RecordedRequest) -> None:
        if isinstance(item, ErrorItem):
            after = item.retry_after
            headers = {}
            if after is not None:
                headers["Retry-After"] = after if isinstance(after, str) else f"{after:g}"
            self._send_json(item.status, item.body(), headers)
        elif isinstance(item, Garbage):
            if request.stream and item.status == 200:
                self._start_stream(keep_alive=True)
                self._write_chunk(f"data: {item.body}\n\n".encode())
                self._write_chunk(b"")
            else:
                self._send_bytes(item.status, item.body.encode(), "application/json")
        elif isinstance(item, Reply):
            if request.stream:
                self._stream(stream_chunks(item, request, self.llm.chunk_size), done=True)
            else:
                self._send_json(200, completion_body(item, request))
        elif isinstance(item, CutStream) and request.stream:
            chunks = stream_chunks(item.then, request, self.llm.chunk_size)
            self._stream(chunks[: item.after_chunks], done=False, end=item.clean)
        elif isinstance(item, Raw):
            if request.stream and item.sse:  # a str chunk is the event's data verbatim
                events = [
                    c.encode() if isinstance(c, str) else _dumps(c)
                    for c in (item.chunks or [item.body])
                ]
                self._stream(events, done=item.done, end=True)
            else:
                self._send_json(200, item.body)
        else:  # Disconnect, or CutStream on a non-streaming request: no response at all
            self.close_connection = True

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, _dumps(body), "application/json", headers)

    def _send_not_found(self) -> None:
        message = f"ScriptedLLM: no route for {self.command} {self.path}"
        self._send_json(404, ErrorItem(404, message, "invalid_request_error", "unknown_url").body())

    def _start_stream(self, *, keep_alive: bool) -> None:
        # Chunked framing makes a cut stream detectable: the client sees an incomplete body. A
        # stream that ends properly keeps the connection open for the next request, as real
        # servers do (a new connection per streamed call would inflate client CPU figures).
        self.close_connection = not keep_alive
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        if not keep_alive:
            self.send_header("Connection", "close")
        self.end_headers()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _stream(self, chunks: list[Any], *, done: bool, end: bool = True) -> None:
        """Send SSE events (JSON, or bytes as they are), then `[DONE]` if `done`.

        Without `done` or `end` the connection just drops (an incomplete chunked body).
        """
        self._start_stream(keep_alive=done or end)
        for chunk in chunks:
            data = chunk if isinstance(chunk, bytes) else _dumps(chunk)
            self._write_chunk(b"data: %s\n\n" % data)
        if done:
            self._write_chunk(b"data: [DONE]\n\n")
        if done or end:
            self._write_chunk(b"")  # the terminating zero-length chunk


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _dumps(body: Any) -> bytes:
    try:
        return json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # lone surrogates (scripted on purpose): send them \u-escaped
        return json.dumps(body).encode()


@dataclass
class _Route:
    """Items served only to requests that `match`."""

    match: RouteMatch
    queue: deque[ScriptItem]

    def matches(self, request: RecordedRequest) -> bool:
        """Whether `request` is served by this route."""
        if isinstance(self.match, str):
            return self.match in request.system or self.match == request.model
        return bool(self.match(request))


def _check_items(method: str, items: tuple[ScriptItem, ...]) -> None:
    for item in items:
        if not isinstance(item, ITEM_TYPES):
            raise TypeError(
                f"ScriptedLLM.{method}(): expected reply(), error(), delay(), ... got {item!r}"
            )


class ScriptedLLM(LoopbackServer):
    """A scripted OpenAI-compatible Chat Completions server bound to 127.0.0.1.

    Each request to `/v1/chat/completions` consumes the next queued item; when the queue is
    empty the `responder` (if any) answers, else the request fails with a 400 that names the
    request. Items queued with `route(match, ...)` answer only matching requests, and are
    taken before the common queue. With `loop=True` the script is cycled instead of consumed.
    With `strict=True` a request whose conversation real servers would reject (see
    `conversation_problem`: tool calls without ids or names, arguments that are not JSON
    objects, results that answer no call) gets a 400 naming the problem, and consumes no
    script item. ``strict_status=500`` answers it as llama-server does: a 500 ``server_error``,
    the same on every retry and every later request that re-sends the bad message.

    `/v1/embeddings` answers deterministic vectors (`embeddings.vector(text)`, ``embedding_dim``
    long, or the request's ``dimensions``); `fail_embeddings(503)` or `embeddings.script(...)`
    make it fail; its requests are kept apart in `embedding_requests`.
    """

    api_key = "sk-scripted"
    handler = _Handler

    def __init__(
        self,
        *,
        loop: bool = False,
        chunk_size: int = 8,
        port: int = 0,
        responder: Responder | None = None,
        strict: bool = False,
        strict_status: int = 400,
        embedding_dim: int = DEFAULT_DIM,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"ScriptedLLM: chunk_size must be >= 1, got {chunk_size}")
        if not 400 <= strict_status <= 599:
            raise ValueError(f"ScriptedLLM: strict_status must be 4xx or 5xx, got {strict_status}")
        self.loop = loop
        self.chunk_size = chunk_size
        self.responder = responder
        self.strict = strict
        self.strict_status = strict_status
        self.embeddings = EmbeddingsEndpoint(embedding_dim)
        super().__init__(port=port)
        self._queue: deque[ScriptItem] = deque()
        self._routes: list[_Route] = []
        self._requests: list[RecordedRequest] = []
        self._cond = threading.Condition()

    @property
    def base_url(self) -> str:
        """The OpenAI `base_url`, e.g. `http://127.0.0.1:54321/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- script -------------------------------------------------------------------------

    def script(self, *items: ScriptItem) -> Self:
        """Append items to the queue; returns self for chaining."""
        _check_items("script", items)
        with self._cond:
            self._queue.extend(items)
        return self

    def route(self, match: RouteMatch, *items: ScriptItem) -> Self:
        """Queue items that only requests matching `match` take, before the common queue.

        `match` is a substring of the request's system prompt (`RecordedRequest.system`), or
        equal to its model name, or a callable `match(request) -> bool`. Routing the same
        `match` again (same string or same callable) appends to that route. A request takes
        from the first route, in the order they were added, that matches and still has items;
        a request no route serves takes from the common queue (`script`). Returns self.
        """
        if not (isinstance(match, str) and match) and not callable(match):
            raise TypeError(
                "ScriptedLLM.route(): match must be a non-empty string (system-prompt substring "
                f"or model name) or a callable(request) -> bool, got {match!r}"
            )
        _check_items("route", items)
        with self._cond:
            for existing in self._routes:
                if existing.match is match or (isinstance(match, str) and existing.match == match):
                    existing.queue.extend(items)
                    break
            else:
                self._routes.append(_Route(match, deque(items)))
        return self

    @property
    def pending(self) -> int:
        """Number of queued items, routed ones included (in loop mode, the cycle's length)."""
        with self._cond:
            return len(self._queue) + sum(len(route.queue) for route in self._routes)

    def pending_for(self, match: RouteMatch) -> int:
        """Number of items still queued on the route of `match` (0 if there is none)."""
        with self._cond:
            for route in self._routes:
                if route.match is match or (isinstance(match, str) and route.match == match):
                    return len(route.queue)
        return 0

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every chat-completions request received so far, in order."""
        with self._cond:
            return list(self._requests)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until `n` requests arrived, else raise TimeoutError.

        This blocks the calling thread: from async code use
        `await asyncio.to_thread(llm.wait_for_requests, n)`.
        """
        return wait_for_requests(self._cond, self._requests, n, timeout, "request")

    def reset(self) -> None:
        """Clear the queue, the routes and the recorded requests (embeddings' too)."""
        with self._cond:
            self._queue.clear()
            self._routes.clear()
            self._requests.clear()
        self.embeddings.reset()

    def fail_embeddings(self, status: int | None = 503, message: str | None = None) -> None:
        """Answer every `/v1/embeddings` request with HTTP ``status``; None: vectors again."""
        self.embeddings.fail(status, message)

    @property
    def embedding_requests(self) -> list[RecordedRequest]:
        """A copy of every `/v1/embeddings` request received so far, in order."""
        return self.embeddings.requests

    def __repr__(self) -> str:
        where = self.base_url if self.running else "stopped"
        return f"<ScriptedLLM {where} pending={self.pending} requests={len(self._requests)}>"

    # -- used by the handler threads -------------------------------------------------------

    def _record(self, path: str, headers: dict[str, str], raw: bytes) -> RecordedRequest:
        body = _loads(raw)
        with self._cond:
            request = RecordedRequest(len(self._requests), path, headers, body, raw)
            self._requests.append(request)
            self._cond.notify_all()
        return request

    def _take(self, request: RecordedRequest) -> ScriptItem:
        """Next item for `request`; a bare delay claims its follower now, keeping order."""
        item: ScriptItem | None = None
        with self._cond:
            routes = [route for route in self._routes if route.queue]
        for route in routes:  # predicates are user code: call them outside the lock
            try:
                matched = route.matches(request)
            except Exception as exc:
                return ErrorItem(500, f"ScriptedLLM route match raised {type(exc).__name__}: {exc}")
            if matched:
                with self._cond:
                    if route.queue:  # another request may have emptied it meanwhile
                        item = route.queue.popleft()
                        if self.loop:
                            route.queue.append(item)
                        break
        if item is None:
            with self._cond:
                if self._queue:
                    item = self._queue.popleft()
                    if self.loop:
                        self._queue.append(item)
        if item is None:
            item = self._respond(request)
        if isinstance(item, Delay) and item.then is None:
            item = Delay(item.seconds, self._take(request))
        return item

    def _respond(self, request: RecordedRequest) -> ScriptItem:
        responder = self.responder
        if responder is None:
            message = (
                f"ScriptedLLM: script exhausted at request #{request.index}; "
                "queue replies with .script(...)"
            )
            return ErrorItem(400, message, "invalid_request_error", "script_exhausted")
        try:  # the responder is user code: turn its failure into a readable 500
            item = responder(request)
        except Exception as exc:
            return ErrorItem(500, f"ScriptedLLM responder raised {type(exc).__name__}: {exc}")
        if not isinstance(item, ITEM_TYPES):
            return ErrorItem(500, f"ScriptedLLM responder must return reply(...), got {item!r}")
        return item
