"""`MCPToolManager` against real servers: stdio, streamable HTTP, SSE and mcp-server-time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _waits import until
from mcp_servers.support import (
    DEMO_TOOLS,
    settings,
    stdio_entry,
    time_entry,
)

from ania_nb import __version__
from ania_nb.errors import ToolError
from ania_nb.mcp import MCPServerConfig, MCPServerError, MCPToolManager

pytest_plugins = ["mcp_servers.fixtures"]  # the demo HTTP/SSE server fixtures


def manager_for(entry: dict, tmp_path: Path, **overrides) -> MCPToolManager:
    return MCPToolManager(
        MCPServerConfig.model_validate(entry), settings(tmp_path / "mcp.json", **overrides)
    )


async def call(manager: MCPToolManager, tool: str, **arguments) -> str:
    return (await manager.call(tool, arguments, generation=manager.generation)).text


@pytest.fixture(params=["stdio", "http", "sse"])
async def demo(request, tmp_path: Path):
    """A connected manager for the demo server over each transport."""
    if request.param == "stdio":
        entry = stdio_entry()
    else:
        url = request.getfixturevalue("http_url" if request.param == "http" else "sse_url")
        kind = "streamable-http" if request.param == "http" else "sse"
        entry = {"name": "demo", "transport": kind, "endpoint": url, "headers": {"X-Probe": "42"}}
    manager = manager_for(entry, tmp_path)
    await manager.connect()
    yield manager
    await manager.aclose()


async def test_tools_calls_results_and_errors(demo: MCPToolManager):
    assert demo.state == "connected" and demo.generation == 1
    assert [t.name for t in demo.tools] == DEMO_TOOLS
    add = next(t for t in demo.tools if t.name == "add")
    assert add.read_only and add.description.startswith("Add two integers.")
    assert add.input_schema["required"] == ["a", "b"]
    assert await call(demo, "add", a=2, b=40) == "42"
    assert await call(demo, "greet", name="Ada", mode="loud") == "HELLO, ADA!"
    assert await call(demo, "client") == f"ania-nb/{__version__}"

    text = await call(demo, "huge", size=20000)
    marker = "\n...(MCP tool result truncated: 20000 characters in total)"
    full = "".join(chr(ord("a") + i % 26) for i in range(8000))
    assert text == full[: 8000 - len(marker)] + marker  # 8000 characters, the note included
    assert await call(demo, "huge", size=8000) == full  # exactly at the limit: untouched

    with pytest.raises(ToolError, match="failed on purpose: no luck"):
        await call(demo, "fail", message="no luck")
    with pytest.raises(ToolError, match="no_such_tool"):
        await call(demo, "no_such_tool")
    # Parallel calls share the one connection.
    results = await asyncio.gather(*(call(demo, "sleep", seconds=0.05 * i) for i in range(1, 4)))
    assert results == ["slept 0.05", "slept 0.1", "slept 0.15000000000000002"]
    assert await call(demo, "add", a=1, b=1) == "2"


async def test_headers_reach_http_servers(
    http_url: str, sse_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PROBE_TOKEN", "t0k3n")
    headers = {"X-Probe": "42", "Authorization": "Bearer ${PROBE_TOKEN}", "X-Def": "${NOPE:-d}"}
    for kind, url in (("streamable-http", http_url), ("sse", sse_url)):
        entry = {"name": "h", "transport": kind, "endpoint": url, "headers": headers}
        manager = manager_for(entry, tmp_path)
        await manager.connect()
        try:
            assert await call(manager, "header", key="X-Probe") == "42"
            assert await call(manager, "header", key="Authorization") == "Bearer t0k3n"
            assert await call(manager, "header", key="X-Def") == "d"
        finally:
            await manager.aclose()
    monkeypatch.delenv("PROBE_TOKEN")
    manager = manager_for({"name": "h", "endpoint": http_url, "headers": headers}, tmp_path)
    with pytest.raises(MCPServerError, match=r"uses \$\{PROBE_TOKEN\}, which is not set"):
        await manager.connect()
    assert manager.state == "failed" and "PROBE_TOKEN" in (manager.error or "")


async def test_results_use_the_configured_limit(tmp_path: Path):
    manager = manager_for(stdio_entry(), tmp_path, max_result_chars=100)
    await manager.connect()
    try:
        text = await call(manager, "huge", size=150)
        assert len(text) == 100 and text.endswith("150 characters in total)")
    finally:
        await manager.aclose()


async def test_stdio_env_is_passed_and_the_rest_is_cleared(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ANIA_LLM__API_KEY", "sk-secret")
    monkeypatch.setenv("NOT_LISTED", "yes")
    manager = manager_for(stdio_entry(env={"GIVEN": "by config"}), tmp_path)
    await manager.connect()
    try:
        assert await call(manager, "get_env", key="GIVEN") == "by config"
        assert await call(manager, "get_env", key="PATH") == os.environ["PATH"]
        assert await call(manager, "get_env", key="NOT_LISTED") == "<unset>"  # security.pass_env
        assert await call(manager, "get_env", key="ANIA_LLM__API_KEY") == "<unset>"
    finally:
        await manager.aclose()


async def test_mcp_server_time(tmp_path: Path):
    manager = manager_for(time_entry(), tmp_path)
    await manager.connect()
    try:
        assert [t.name for t in manager.tools] == ["convert_time", "get_current_time"]
        text = await call(manager, "get_current_time", timezone="Asia/Tokyo")
        assert '"timezone": "Asia/Tokyo"' in text and "+09:00" in text
        with pytest.raises(ToolError, match="Invalid timezone"):
            await call(manager, "get_current_time", timezone="Mars/Olympus")
    finally:
        await manager.aclose()


async def test_filter_from_the_entry(tmp_path: Path):
    entry = stdio_entry(extra=6, filter={"any": [{"names": ["add"]}, {"keywords": ["keywordodd"]}]})
    manager = manager_for(entry, tmp_path)
    await manager.connect()
    try:
        assert [t.name for t in manager.tools] == ["add", "extra_001", "extra_003", "extra_005"]
    finally:
        await manager.aclose()


async def test_killed_server_is_reported_and_reconnects(tmp_path: Path):
    manager = manager_for(stdio_entry(), tmp_path)
    await manager.connect()
    try:
        pid = int(await call(manager, "pid"))
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ToolError) as caught:
            await call(manager, "add", a=1, b=2)
        message = str(caught.value)
        assert "MCP server 'demo' is disconnected" in message
        assert "mcp_reconnect(name='demo')" in message
        assert manager.state == "disconnected"
        with pytest.raises(ToolError, match="is disconnected"):  # and stays so, without hanging
            await call(manager, "add", a=1, b=2)
        old_generation = manager.generation
        await manager.reconnect()
        assert manager.state == "connected" and manager.generation == old_generation + 1
        assert int(await call(manager, "pid")) != pid
        with pytest.raises(ToolError, match=r"reconnected since; load it again with mcp_load_demo"):
            await manager.call("add", {"a": 1, "b": 2}, generation=old_generation)
    finally:
        await manager.aclose()
    assert manager.state == "closed"
    with pytest.raises(ToolError, match="has been removed or shut down"):
        await call(manager, "add", a=1, b=2)
    with pytest.raises(MCPServerError, match="closed"):
        await manager.reconnect()


async def running_sleep(manager: MCPToolManager, marker: Path) -> asyncio.Task[str]:
    """Start a 30 s ``sleep`` call; return its task once the server is running it."""
    task = asyncio.create_task(call(manager, "sleep", seconds=30, started=str(marker)))
    await until(marker.exists, "the server to run the sleep call")
    return task


async def test_close_and_reconnect_during_a_call(tmp_path: Path):
    manager = manager_for(stdio_entry(), tmp_path)
    await manager.connect()
    slow = await running_sleep(manager, tmp_path / "first")
    await manager.reconnect()
    with pytest.raises(ToolError, match="MCP server 'demo'"):
        await slow
    assert await call(manager, "add", a=3, b=4) == "7"
    slow = await running_sleep(manager, tmp_path / "second")
    await manager.aclose()
    with pytest.raises(ToolError, match="has been removed or shut down"):
        await slow


async def test_a_cancelled_call_leaves_the_connection_usable(tmp_path: Path):
    manager = manager_for(stdio_entry(), tmp_path)
    await manager.connect()
    try:
        slow = await running_sleep(manager, tmp_path / "started")
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert await call(manager, "add", a=5, b=5) == "10"
    finally:
        await manager.aclose()


async def test_connect_failures_are_clear(tmp_path: Path):
    crash = {
        "name": "crash",
        "command": sys.executable,
        "args": ["-c", "import sys; sys.stderr.write('boom: missing dependency\\n'); sys.exit(3)"],
    }
    manager = manager_for(crash, tmp_path)
    with pytest.raises(MCPServerError) as caught:
        await manager.connect()
    assert "MCP server 'crash' (stdio " in str(caught.value)
    assert "boom: missing dependency" in str(caught.value)
    assert caught.value.server == "crash" and manager.state == "failed"
    with pytest.raises(ToolError, match="is not connected"):
        await call(manager, "add")

    silent = {
        "name": "silent",
        "command": sys.executable,
        "args": ["-c", "import time; time.sleep(60)"],
    }
    manager = manager_for(silent, tmp_path, connect_timeout=1.0)
    with pytest.raises(MCPServerError, match=r"no answer within 1 s"):
        await manager.connect()

    missing = {"name": "missing", "command": str(tmp_path / "no-such-program")}
    with pytest.raises(MCPServerError, match="missing"):
        await manager_for(missing, tmp_path).connect()

    closed_port = {"name": "web", "endpoint": "http://127.0.0.1:9/mcp"}
    with pytest.raises(MCPServerError, match=r"MCP server 'web' \(streamable-http http://127"):
        await manager_for(closed_port, tmp_path, connect_timeout=5.0).connect()
    sse_closed = {"name": "ev", "transport": "sse", "endpoint": "http://127.0.0.1:9/sse"}
    with pytest.raises(MCPServerError, match="could not be connected"):
        await manager_for(sse_closed, tmp_path, connect_timeout=5.0).connect()


@pytest.mark.parametrize("kind", ["http", "sse"])
async def test_http_tool_calls_may_outlast_the_connect_timeout(kind, request, tmp_path: Path):
    """The connect timeout bounds the handshake only: a read timeout on the HTTP client would
    cut a tool call (or the SSE stream) that stays silent longer."""
    url = request.getfixturevalue(f"{kind}_url")
    transport = "streamable-http" if kind == "http" else "sse"
    manager = manager_for(
        {"name": "demo", "transport": transport, "endpoint": url, "timeout": 2.0}, tmp_path
    )
    await manager.connect()
    try:
        assert await call(manager, "sleep", seconds=4.0) == "slept 4.0"
        assert manager.state == "connected"
    finally:
        await manager.aclose()


SDK_NOISE_SCRIPT = """
import asyncio, logging, os, sys
sys.path.insert(0, {tests!r})
from mcp_servers.support import http_server
from ania_nb.config import MCPSettings
from ania_nb.mcp import MCPServerConfig, MCPToolManager

seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record)

async def main():
    with http_server("sse") as url:
        entry = {{"name": "s", "transport": "sse", "endpoint": url}}
        manager = MCPToolManager(MCPServerConfig.model_validate(entry), MCPSettings())
        await manager.connect()
        if {debug}:  # a user who wants the SDK's own records asks for them
            sdk = logging.getLogger("ania_nb.mcp.sdk")
            sdk.setLevel(logging.DEBUG)
            sdk.addHandler(Keep())
        pid = (await manager.call("pid", {{}}, generation=manager.generation)).text
        os.kill(int(pid), 9)
        try:  # the broken stream ends the call (and makes the SDK log its traceback)
            await manager.call("add", {{"a": 1, "b": 2}}, generation=manager.generation)
        except Exception as exc:
            print("CALL", exc)
        await manager.aclose()
    print("TRACEBACKS", sum(1 for r in seen if r.exc_info))

asyncio.run(main())
"""


@pytest.mark.parametrize("debug", [False, True])
def test_sdk_tracebacks_go_to_the_logger_not_stderr(debug: bool):
    # A fresh interpreter with no logging set up, as in a notebook kernel: Python's last-resort
    # handler would print every SDK error record, with its traceback, on stderr.
    script = SDK_NOISE_SCRIPT.format(tests=str(Path(__file__).parent), debug=debug)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "MCP server 's' disconnected:" in done.stderr  # ania-nb's own one-line warning
    assert "CALL MCP server 's' is disconnected" in done.stdout
    assert "Traceback" not in done.stderr
    count = int(done.stdout.split("TRACEBACKS")[1])
    assert count >= 1 if debug else count == 0  # the SDK's traceback, kept at debug level
