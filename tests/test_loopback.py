"""The loopback HTTP server under `ScriptedLLM` and the test stand-ins (`ania_nb.testing._http`)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ania_nb.testing import ScriptedLLM
from ania_nb.testing._http import Answer, LoopbackServer, RoutedServer, Seen

HANG_GUARD = 30  # seconds: only so a broken close() fails the test instead of hanging it


@contextmanager
def connect(server: LoopbackServer) -> Iterator[http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD)
    try:
        yield conn
    finally:
        conn.close()


def get(server: LoopbackServer, path: str) -> bytes:
    with connect(server) as conn:
        conn.request("GET", path)
        return conn.getresponse().read()


def test_routes_exact_then_longest_prefix_else_404() -> None:
    with RoutedServer() as server:
        server.route("/a/", "short prefix", prefix=True)
        server.route("/a/b/", "long prefix", prefix=True)
        server.route("/a/b/c", {"exact": True})
        answers = []
        with connect(server) as conn:  # one keep-alive connection for all four
            for path in ("/a/b/c", "/a/b/x", "/a/x", "/nowhere"):
                conn.request("GET", path)
                got = conn.getresponse()
                answers.append((got.status, got.getheader("content-type"), got.read()))
    assert answers == [
        (200, "application/json", json.dumps({"exact": True}).encode()),
        (200, "text/plain; charset=utf-8", b"long prefix"),
        (200, "text/plain; charset=utf-8", b"short prefix"),
        (404, "text/plain; charset=utf-8", b"no route for GET /nowhere"),
    ]


def test_a_function_route_sees_the_whole_request_and_every_request_is_recorded() -> None:
    def echo(seen: Seen) -> Answer:
        return Answer(201, seen.body[::-1], headers={"X-Seen": seen.query["q"][0]})

    with RoutedServer() as server:
        url = server.route("/echo", echo)
        with connect(server) as conn:
            conn.request("POST", "/echo?q=1&q=2", body=b"abc", headers={"X-Probe": "yes"})
            got = conn.getresponse()
            assert (got.status, got.read(), got.getheader("x-seen")) == (201, b"cba", "1")
        assert url == server.url("/echo")
        [seen] = server.requests
    assert (seen.method, seen.raw_path, seen.path) == ("POST", "/echo?q=1&q=2", "/echo")
    assert seen.query == {"q": ["1", "2"]} and seen.body == b"abc"
    assert seen.headers["x-probe"] == "yes"
    assert server.requests_to("/echo") == [seen] and server.requests_to("/ech") == []


def test_a_body_without_length_ends_when_the_connection_closes() -> None:
    with RoutedServer() as server:
        server.route("/stream", b"x" * 100_000, length=False)
        with connect(server) as conn:
            conn.request("GET", "/stream")
            got = conn.getresponse()
            assert got.getheader("content-length") is None
            assert got.read() == b"x" * 100_000


@pytest.mark.parametrize("hold", ["stall", "delay"])
def test_close_ends_held_answers_and_idle_connections(hold: str) -> None:
    arrived = threading.Event()

    def held(seen: Seen) -> Answer:
        arrived.set()
        if hold == "stall":  # headers go out, then the body never comes
            return Answer(body=b"never sent", stall=True)
        return Answer(body=b"never sent", delay=3600.0)

    outcome: list[str] = []

    def client() -> None:
        with connect(server) as conn:
            conn.request("GET", "/held")
            try:
                outcome.append(f"body {conn.getresponse().read()!r}")
            except (http.client.HTTPException, OSError) as exc:
                outcome.append(type(exc).__name__)

    before = set(threading.enumerate())
    server = RoutedServer().start()
    server.route("/held", held)
    server.route("/ok", b"ok")
    with connect(server) as idle:  # a keep-alive connection left open, parked in its handler
        idle.request("GET", "/ok")
        assert idle.getresponse().read() == b"ok"
        waiter = threading.Thread(target=client)
        waiter.start()
        assert arrived.wait(HANG_GUARD)
        closer = threading.Thread(target=server.close)
        closer.start()
        closer.join(HANG_GUARD)
        waiter.join(HANG_GUARD)
        # No handler keeps serving a kept-alive connection after close: it was dropped.
        with pytest.raises((http.client.HTTPException, OSError)):
            idle.request("GET", "/ok")
            idle.getresponse().read()
    assert not closer.is_alive() and not waiter.is_alive()
    expected = "IncompleteRead" if hold == "stall" else "RemoteDisconnected"
    assert outcome == [expected]
    assert not server.running
    # The handler that held the answer gave up too (it waits on `closing`), like every other.
    for thread in set(threading.enumerate()) - before:
        thread.join(HANG_GUARD)
        assert not thread.is_alive(), thread.name


def test_a_closed_server_can_start_again_and_scripted_llm_shares_the_lifecycle() -> None:
    server = RoutedServer()
    with server:
        server.route("/x", "one")
        server.route("/later", "two", delay=0.01)  # waits on `closing`, which must be reset
    with pytest.raises(RuntimeError, match="RoutedServer is not running"):
        server.url("/x")
    with server:  # a second start serves again (the closing flag was reset)
        assert get(server, "/x") == b"one"
        assert get(server, "/later") == b"two"
    llm = ScriptedLLM()
    assert isinstance(llm, LoopbackServer)
    with pytest.raises(RuntimeError, match="ScriptedLLM is not running"):
        _ = llm.base_url


def test_another_loopback_address_and_a_reason_phrase() -> None:
    with RoutedServer(host="127.0.0.2") as server:
        server.route("/teapot", "short and stout", status=418, reason="I'm a teapot, really")
        assert server.url("/teapot") == f"http://127.0.0.2:{server.port}/teapot"
        conn = http.client.HTTPConnection("127.0.0.2", server.port, timeout=HANG_GUARD)
        try:
            conn.request("GET", "/teapot")
            got = conn.getresponse()
            assert (got.status, got.reason) == (418, "I'm a teapot, really")
            assert got.read() == b"short and stout"
        finally:
            conn.close()
    for elsewhere in ("0.0.0.0", "::1", "192.168.1.1"):
        with pytest.raises(ValueError, match="IPv4 loopback only"):
            RoutedServer(host=elsewhere)
