"""Real loopback HTTP servers for the built-in tool tests, and a helper to run one tool call.

`LocalHTTP` is a stdlib `ThreadingHTTPServer` on 127.0.0.1 in a daemon thread. Routes answer
with a fixed status/body (optionally after a delay) or from a function; every request is
recorded (method, path, parsed query, headers) so tests can check what a tool really sent.

Test modules load the fixtures with ``pytest_plugins = ["_http_fixtures"]``:

- ``local_http``: an empty server;
- ``jina``: ``/search`` and ``/read/…`` standing in for Jina's search and reader APIs;
- ``giphy``: ``/v1/stickers/search`` answering in GIPHY's shape, whose results are images
  served by the same server under ``/img/`` (``server.body(path)`` gives their bytes);
- ``run_tool``: runs one tool call through a real `Agent` and the scripted LLM (``llm``).

Only fixtures are shared (importing this module from a test module would defeat pytest's
assertion rewriting), so helpers are reached through them.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import pytest


@dataclass(frozen=True)
class Seen:
    """One request the server received."""

    method: str
    raw_path: str  # exactly as sent: path and query string
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased


@dataclass(frozen=True)
class Answer:
    """What a route sends back."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    delay: float = 0.0


Handler = Callable[[Seen], Answer]


def as_answer(
    body: bytes | str | dict[str, Any] | list[Any] = b"",
    *,
    status: int = 200,
    content_type: str | None = None,
    delay: float = 0.0,
) -> Answer:
    """An `Answer` from text, bytes or JSON-able data (content type chosen to match)."""
    if isinstance(body, dict | list):
        data = json.dumps(body).encode()
        kind = "application/json"
    elif isinstance(body, str):
        data = body.encode()
        kind = "text/plain; charset=utf-8"
    else:
        data = body
        kind = "application/octet-stream"
    return Answer(status, data, content_type or kind, delay)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: LocalHTTP

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (a timeout test) is expected; anything else is reported."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pytest owns stderr."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        parts = urlsplit(self.path)
        seen = Seen(
            method=self.command,
            raw_path=self.path,
            path=parts.path,
            query=parse_qs(parts.query, keep_blank_values=True),
            headers={k.lower(): v for k, v in self.headers.items()},
        )
        owner = self.server.owner
        answer = owner._answer(seen)
        if answer.delay and owner._closing.wait(answer.delay):
            self.close_connection = True  # server closing: drop the request
            return
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)


@dataclass
class LocalHTTP:
    """A recording HTTP server on 127.0.0.1 with exact and prefix routes."""

    _routes: dict[str, Handler] = field(default_factory=dict)
    _prefixes: dict[str, Handler] = field(default_factory=dict)
    _fixed: dict[str, bytes] = field(default_factory=dict)
    _seen: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _server: _Server | None = None
    _thread: threading.Thread | None = None

    def start(self) -> Self:
        """Bind a free port and serve from a daemon thread."""
        server = _Server(("127.0.0.1", 0), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="LocalHTTP", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; delayed answers are abandoned at once."""
        if self._server is None or self._thread is None:
            return
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def url(self, path: str = "/") -> str:
        """Absolute URL of ``path`` on this server."""
        assert self._server is not None, "LocalHTTP is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def route(
        self,
        path: str,
        body: bytes | str | dict[str, Any] | list[Any] | Handler = b"",
        *,
        status: int = 200,
        content_type: str | None = None,
        delay: float = 0.0,
        prefix: bool = False,
    ) -> None:
        """Answer ``path`` (or every path starting with it) with a fixed answer or a handler."""
        if callable(body):
            handler: Handler = body
        else:
            fixed = as_answer(body, status=status, content_type=content_type, delay=delay)

            def handler(seen: Seen) -> Answer:
                return fixed

        with self._lock:
            (self._prefixes if prefix else self._routes)[path] = handler
            if not callable(body):
                self._fixed[path] = fixed.body

    def body(self, path: str) -> bytes:
        """The fixed body a route answers with."""
        with self._lock:
            return self._fixed[path]

    @property
    def requests(self) -> list[Seen]:
        """Every request received so far, in order."""
        with self._lock:
            return list(self._seen)

    def requests_to(self, path: str) -> list[Seen]:
        """Requests whose path is ``path`` or starts with ``path`` when it ends with '/'."""
        return [
            s
            for s in self.requests
            if s.path == path or (path.endswith("/") and s.path.startswith(path))
        ]

    def _answer(self, seen: Seen) -> Answer:
        with self._lock:
            self._seen.append(seen)
            handler = self._routes.get(seen.path)
            if handler is None:
                matches = [p for p in self._prefixes if seen.path.startswith(p)]
                handler = self._prefixes[max(matches, key=len)] if matches else None
        if handler is None:
            return as_answer(f"no route for {seen.path}", status=404)
        return handler(seen)


# --------------------------------------------------------------------------- fixtures

# Minimal valid images, so "the image that was downloaded" can be compared byte for byte.
PNG_1x1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)
GIF_1x1 = bytes.fromhex(
    "47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b"
)


@pytest.fixture
def local_http() -> Iterator[LocalHTTP]:
    """An empty recording HTTP server on 127.0.0.1."""
    with LocalHTTP() as server:
        yield server


@pytest.fixture
def jina(local_http: LocalHTTP) -> LocalHTTP:
    """Jina stand-in: ``/search`` (search API) and ``/read/<url>`` (reader API)."""
    local_http.route("/search", "1. Result title\nhttps://example.com/result\nsnippet")
    local_http.route("/read/", "# Page title\n\nPage text.", prefix=True)
    return local_http


def giphy_payload(urls: list[str]) -> dict[str, Any]:
    """A GIPHY sticker search answer listing ``urls`` as ``images.fixed_width.url``."""
    return {
        "data": [
            {
                "type": "sticker",
                "id": f"s{i}",
                "images": {"fixed_width": {"url": u, "width": "200"}},
            }
            for i, u in enumerate(urls)
        ],
        "meta": {"status": 200, "msg": "OK"},
        "pagination": {"count": len(urls), "offset": 0},
    }


GIPHY_IMAGES = {
    "/img/a.gif": GIF_1x1,
    "/img/b.png": PNG_1x1,
    "/img/c.bin": b"\x00\x01third-image\xff",
}


@pytest.fixture
def giphy(local_http: LocalHTTP) -> LocalHTTP:
    """GIPHY stand-in: a sticker search listing three images, served under ``/img/``."""
    for path, data in GIPHY_IMAGES.items():
        local_http.route(path, data, content_type="image/gif")
    urls = [local_http.url(path) for path in GIPHY_IMAGES]
    local_http.route("/v1/stickers/search", giphy_payload(urls))
    return local_http


@pytest.fixture
def run_tool(llm: Any) -> Callable[..., Awaitable[Any]]:
    """``await run_tool(agent, name, args, callbacks=...)``: one tool call through a real run.

    Scripts the LLM to call the tool once and then answer; returns the call's `ToolCallResult`.
    """
    from ania_nb.testing import reply, tool_call

    async def run(
        agent: Any,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        callbacks: Any = None,
        session: str = "nb:tools",
    ) -> Any:
        llm.script(reply(tool_calls=[tool_call(name, arguments or {})]), reply("done"))
        result = await agent.chat(f"please use {name}", session=session, callbacks=callbacks)
        assert result.status == "success", result.error
        assert [c.name for c in result.tool_calls] == [name]
        return result.tool_calls[0]

    return run
