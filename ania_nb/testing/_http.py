"""The loopback HTTP server under `ScriptedLLM` and the test suite's stand-ins for web services.

Standard library only: a `ThreadingHTTPServer` on 127.0.0.1 serving from daemon threads, so it
starts instantly and works the same from sync code, async code and a Jupyter kernel.

- `LoopbackServer`: the lifecycle (start, close, sync and async ``with``, port, URLs). Closing
  sets `closing` (handlers waiting on it give up) and drops idle keep-alive connections, so it
  is prompt even with clients still connected.
- `LoopbackHandler`: quiet HTTP/1.1 plumbing for a server's handler class.
- `RoutedServer`: a `LoopbackServer` with exact and prefix routes answering fixed answers
  (or from a function), recording every request as a `Seen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Self, cast
from urllib.parse import parse_qs, urlsplit

__all__ = ["Answer", "LoopbackHandler", "LoopbackServer", "RoutedServer", "Seen", "as_answer"]


class LoopbackHandler(BaseHTTPRequestHandler):
    """Quiet HTTP/1.1 request handling; ``self.server.owner`` is the `LoopbackServer`."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes; with Nagle + delayed ACK the body would wait
    # ~40 ms for every response.
    disable_nagle_algorithm = True
    server: _ThreadingServer

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: the caller's test output or notebook owns stderr."""

    def handle(self) -> None:
        """Serve the connection; a client that went away is normal (timeouts, cancels)."""
        try:
            super().handle()
        except OSError:
            self.close_connection = True

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _send_bytes(
        self, status: int, data: bytes, ctype: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    # Hundreds of clients may connect at once (load tests): the stdlib backlog of 5 would make
    # the kernel drop SYNs and add 1 s retransmits to what is measured.
    request_queue_size = 4096

    def __init__(
        self, address: tuple[str, int], handler: type[LoopbackHandler], owner: LoopbackServer
    ) -> None:
        self.owner = owner
        self.closing = owner.closing
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore clients that vanished; report real bugs as usual."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def drop_connections(self) -> None:
        # Wakes handler threads parked on idle keep-alive connections so close() is prompt.
        with self._connections_lock:
            for conn in self._connections:
                with contextlib.suppress(OSError):  # already closed by its handler
                    conn.shutdown(socket.SHUT_RDWR)


class LoopbackServer:
    """An HTTP server on 127.0.0.1 serving `handler` from daemon threads (subclasses set it).

    ``host`` may be another IPv4 loopback address (127.0.0.2, …), e.g. to stand for a second
    machine; anything else is refused.
    """

    handler: ClassVar[type[LoopbackHandler]]

    def __init__(self, *, port: int = 0, host: str = "127.0.0.1") -> None:
        if not (ipaddress.ip_address(host).is_loopback and "." in host):
            raise ValueError(f"{type(self).__name__} serves IPv4 loopback only, not {host!r}")
        self.host = host
        self._port = port
        self.closing = threading.Event()  # set by close(): handlers waiting on it give up
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Bind a port on 127.0.0.1 and serve from a daemon thread (no-op if running)."""
        if self._server is None:
            self.closing.clear()
            server = _ThreadingServer((self.host, self._port), self.handler, self)
            # close() waits for the serving loop to look at its stop flag, once per interval:
            # short, since a test suite starts and stops a server for nearly every test.
            self._thread = threading.Thread(
                target=server.serve_forever, args=(0.005,), name=type(self).__name__, daemon=True
            )
            self._server = server
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, drop open connections and release the port (no-op if stopped)."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        self.closing.set()
        server.shutdown()
        server.drop_connections()
        server.server_close()
        thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)  # waits for the serve loop; keep the event loop free

    @property
    def running(self) -> bool:
        """Whether the server is serving."""
        return self._server is not None

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        if self._server is None:
            name = type(self).__name__
            raise RuntimeError(f"{name} is not running; call .start() or use `with {name}()`")
        return int(self._server.server_address[1])

    def url(self, path: str = "/") -> str:
        """Absolute URL of ``path`` on this server."""
        return f"http://{self.host}:{self.port}{path}"


# -- routes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request a `RoutedServer` received."""

    method: str
    raw_path: str  # exactly as sent: path and query string
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: bytes = b""


@dataclass(frozen=True)
class Answer:
    """What a route sends back."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    reason: str | None = None  # the status line's reason phrase (None: the standard one)
    delay: float = 0.0  # seconds before answering (abandoned when the server closes)
    headers: dict[str, str] = field(default_factory=dict)
    length: bool = True  # False: no Content-Length, the body ends when the connection closes
    stall: bool = False  # send the headers, then hang until the server closes


Handler = Callable[[Seen], Answer]


def as_answer(
    body: bytes | str | dict[str, Any] | list[Any] = b"",
    *,
    status: int = 200,
    content_type: str | None = None,
    **options: Any,
) -> Answer:
    """An `Answer` from text, bytes or JSON-able data (content type chosen to match)."""
    if isinstance(body, dict | list):
        data, kind = json.dumps(body).encode(), "application/json"
    elif isinstance(body, str):
        data, kind = body.encode(), "text/plain; charset=utf-8"
    else:
        data, kind = body, "application/octet-stream"
    return Answer(status, data, content_type or kind, **options)


class _RoutedHandler(LoopbackHandler):
    server_version = "ania-nb-test/1.0"

    def do_GET(self) -> None:
        """Answer from the routes."""
        self._serve()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

    def _serve(self) -> None:
        body = self._read_body()
        parts = urlsplit(self.path)
        seen = Seen(
            method=self.command,
            raw_path=self.path,
            path=parts.path,
            query=parse_qs(parts.query, keep_blank_values=True),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        answer = cast(RoutedServer, self.server.owner)._answer(seen)
        if answer.delay and self.server.closing.wait(answer.delay):
            self.close_connection = True  # the server is closing: drop the request
            return
        self.send_response(answer.status, answer.reason)
        self.send_header("Content-Type", answer.content_type)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        if answer.length:
            self.send_header("Content-Length", str(len(answer.body)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if answer.stall:
            self.wfile.flush()
            self.server.closing.wait()
            self.close_connection = True
            return
        if self.command != "HEAD":
            self.wfile.write(answer.body)


class RoutedServer(LoopbackServer):
    """A recording HTTP server on 127.0.0.1 with exact and prefix routes; 404 elsewhere."""

    handler = _RoutedHandler

    def __init__(self, *, port: int = 0, host: str = "127.0.0.1") -> None:
        super().__init__(port=port, host=host)
        self._routes: dict[str, Handler] = {}
        self._prefixes: dict[str, Handler] = {}
        self._fixed: dict[str, bytes] = {}
        self._seen: list[Seen] = []
        self._lock = threading.Lock()

    def route(
        self,
        path: str,
        body: bytes | str | dict[str, Any] | list[Any] | Answer | Handler = b"",
        *,
        prefix: bool = False,
        **options: Any,
    ) -> str:
        """Answer ``path`` (or every path starting with it) with a fixed answer or a function.

        ``options`` are `Answer` fields (``status``, ``content_type``, ``delay``, ``headers``,
        ``length``, ``stall``). Returns the route's URL.
        """
        if callable(body):
            handler = body
        else:
            fixed = body if isinstance(body, Answer) else as_answer(body, **options)

            def handler(seen: Seen) -> Answer:
                return fixed

            with self._lock:
                self._fixed[path] = fixed.body
        with self._lock:
            (self._prefixes if prefix else self._routes)[path] = handler
        return self.url(path)

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
        """Requests whose path is ``path``, or starts with it when it ends with '/'."""
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
            return as_answer(f"no route for {seen.method} {seen.path}", status=404)
        return handler(seen)
