"""Injected HTTP clients (`HttpClients`): each part sends through the client it was given.

Every injected client records what it sends (an httpx2 event hook) to real loopback servers, and
is still open afterwards: its owner closes it, not ania-nb.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp_servers.support import settings, write_config

from ania_nb import Config
from ania_nb._http import HttpClients
from ania_nb.engine.callbacks import Callbacks
from ania_nb.mcp import MCPRegistry
from ania_nb.testing import reply, tool_call
from ania_nb.tools import ToolContext, ToolExecutor
from ania_nb.tools.builtin import HttpSource, WebSearchTool, image_viewer

pytest_plugins = ["_http_fixtures", "mcp_servers.fixtures"]

IMG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAIAAAUAAeIh"
    "vDMAAAAASUVORK5CYII="
)


class Recorder:
    """An httpx2 client factory whose clients log every request as ``METHOD /path``."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.made: list[dict[str, Any]] = []  # the arguments of each factory call
        self.clients: list[httpx2.AsyncClient] = []

    async def _hook(self, request: httpx2.Request) -> None:
        self.sent.append(f"{request.method} {request.url.path}")

    def client(self, **kwargs: Any) -> httpx2.AsyncClient:
        made = httpx2.AsyncClient(event_hooks={"request": [self._hook]}, **kwargs)
        self.clients.append(made)
        return made

    def __call__(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        self.made.append({"headers": headers, "timeout": timeout})
        return self.client(headers=headers, timeout=timeout, auth=auth)


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()
    yield rec
    for client in rec.clients:
        await client.aclose()


def test_the_vision_client_defaults_to_the_llm_client() -> None:
    llm, vision = httpx2.AsyncClient(), httpx2.AsyncClient()
    assert HttpClients(llm=llm).vision_client is llm
    assert HttpClients(llm=llm, vision=vision).vision_client is vision
    assert HttpClients().vision_client is None


async def test_web_tools_send_through_the_injected_client(jina: Any, recorder: Recorder) -> None:
    client = recorder.client()
    web = Config(web={"search_url": jina.url("/search")}).web
    source = HttpSource(client)
    text = await WebSearchTool(web, source).invoke({"query": "q"}, ToolContext(session="s"))
    assert text.startswith("1. Result title")
    assert recorder.sent == ["GET /search"]
    await source.aclose()
    assert not client.is_closed


async def test_the_vision_model_is_built_by_the_llm_endpoint_builder(
    llm: Any, recorder: Recorder
) -> None:
    client = recorder.client()
    config = Config(
        llm={"base_url": llm.base_url, "api_key": "sk-main", "model": "main", "max_tokens": 50},
        fallback={"model": "fallback-model"},
        vision={"model": "describer"},  # endpoint and key: the main model's
    )
    describer = image_viewer(config, http_client=client).describer
    assert describer is not None and describer.fallback is None  # a text model cannot describe
    llm.script(reply("a red dot"))
    completion = await describer.complete([{"role": "user", "content": "describe"}])
    assert completion.message["content"] == "a red dot"
    [request] = llm.requests
    assert request.model == "describer" and request.body is not None
    assert request.body["max_tokens"] == 600
    assert request.headers["authorization"] == "Bearer sk-main"
    assert recorder.sent == ["POST /v1/chat/completions"]
    await describer.aclose()
    assert not client.is_closed


async def test_mcp_http_and_sse_connections_use_the_client_factory(
    http_url: str, sse_url: str, tmp_path: Path, recorder: Recorder
) -> None:
    entries = [
        {"name": "h", "transport": "streamable-http", "endpoint": http_url, "headers": {"X": "1"}},
        {"name": "s", "transport": "sse", "endpoint": sse_url, "headers": {"X": "2"}},
    ]
    path = write_config(tmp_path / "mcp.json", entries)
    async with MCPRegistry(settings(path), ToolExecutor(), client_factory=recorder) as registry:
        assert [s.state for s in registry.servers()] == ["connected", "connected"]
    assert sorted(m["headers"]["X"] for m in recorder.made) == ["1", "2"]
    # ania-nb's timeouts: bounded connect, unbounded reads (event streams may stay silent)
    assert all(m["timeout"].connect == 20.0 and m["timeout"].read is None for m in recorder.made)
    assert "POST /mcp" in recorder.sent and "GET /sse" in recorder.sent


async def test_an_agent_sends_everything_through_the_injected_clients(
    make_agent: Any, llm: Any, jina: Any, http_url: str, tmp_path: Path
) -> None:
    model, web, vision, mcp = Recorder(), Recorder(), Recorder(), Recorder()
    clients = HttpClients(llm=model.client(), web=web.client(), vision=vision.client(), mcp=mcp)
    mcp_file = write_config(
        tmp_path / "mcp.json", [{"name": "h", "transport": "streamable-http", "endpoint": http_url}]
    )
    agent = make_agent(
        http=clients,
        overrides={
            "agent.builtin_tools": True,
            "web.search_url": jina.url("/search"),
            "vision.model": "describer",
            "mcp.config_file": str(mcp_file),
        },
    )
    llm.script(
        reply(tool_calls=[tool_call("webSearch", {"query": "q"}), tool_call("load_images")]),
        reply("the picture shows: a dot"),  # the describer's answer
        reply("done"),
    )

    async def load_images() -> list[str]:
        return [IMG]

    try:
        result = await agent.chat("look", callbacks=Callbacks(load_images=load_images))
        assert result.status == "success", result.error
        await agent.mcp.wait_started()  # it connects in the background: the reply did not wait
    finally:
        await agent.aclose()
    assert model.sent.count("POST /v1/chat/completions") == 2
    assert vision.sent == ["POST /v1/chat/completions"]
    assert web.sent == ["GET /search"]
    assert mcp.made and "POST /mcp" in mcp.sent
    for rec in (model, web, vision):
        assert not rec.clients[0].is_closed
        await rec.clients[0].aclose()
