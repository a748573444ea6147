"""Real loopback HTTP servers for the built-in tool tests, and a helper to run one tool call.

The server is `ania_nb.testing._http.RoutedServer` (`ScriptedLLM`'s loopback base plus routes):
exact and prefix routes answering fixed answers or from a function, every request recorded
(method, path, parsed query, headers, body) so tests can check what a tool really sent.

Test modules load the fixtures with ``pytest_plugins = ["_http_fixtures"]``:

- ``local_http``: an empty server;
- ``jina``: ``/search`` and ``/read/…`` standing in for Jina's search and reader APIs;
- ``giphy``: ``/v1/stickers/search`` answering in GIPHY's shape, whose results are images
  served by the same server under ``/img/`` (``server.body(path)`` gives their bytes);
- ``run_tool``: runs one tool call through a real `Agent` and the scripted LLM (``llm``);
- ``call_tool``: calls one of an Agent's tools directly (no run: no gate, nothing hidden).

Only fixtures are shared (importing this module from a test module would defeat pytest's
assertion rewriting), so helpers are reached through them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from ania_nb.testing._http import Answer, RoutedServer, Seen, as_answer

__all__ = ["Answer", "Seen", "as_answer"]  # re-exported for tests that build answers themselves


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
def local_http() -> Iterator[RoutedServer]:
    """An empty recording HTTP server on 127.0.0.1."""
    with RoutedServer() as server:
        yield server


@pytest.fixture
def jina(local_http: RoutedServer) -> RoutedServer:
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
def giphy(local_http: RoutedServer) -> RoutedServer:
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


@pytest.fixture
def call_tool() -> Callable[..., Awaitable[Any]]:
    """``await call_tool(agent, name, args, callbacks=...)``: the tool's `ToolOutcome`, called
    without a run around it (a run would not even offer a tool its front end cannot serve)."""
    import json

    from ania_nb.engine.callbacks import NO_CALLBACKS
    from ania_nb.tools import ToolContext

    async def call(
        agent: Any, name: str, arguments: dict[str, Any] | None = None, *, callbacks: Any = None
    ) -> Any:
        await agent.start()
        ctx = ToolContext(session="nb:direct", callbacks=callbacks or NO_CALLBACKS)
        return await agent.tools.execute(name, json.dumps(arguments or {}), ctx)

    return call
