"""`MCPRegistry`: lazy discover/load through real session executors, eager mode, runtime changes."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _waits import until
from mcp_servers.support import (
    DEMO,
    DEMO_TOOLS,
    session_of,
    settings,
    stdio_entry,
    time_entry,
    write_config,
)

from ania_nb.errors import UsageError
from ania_nb.mcp import MCPRegistry, MCPServerConfig, MCPServerError
from ania_nb.tools import ToolExecutor

pytest_plugins = ["mcp_servers.fixtures"]  # the demo HTTP/SSE server fixtures


async def text_of(executor, name: str, args: dict | None = None, ctx=None) -> str:
    outcome = await executor.execute(name, args or {}, ctx)
    return outcome.text


async def test_lazy_discover_load_call_in_one_session_only(tmp_path: Path):
    path = write_config(tmp_path / "mcp.json", [stdio_entry(description="a demo server")])
    shared = ToolExecutor()
    async with MCPRegistry(settings(path), shared) as registry:
        assert registry.mode == "lazy"
        assert shared.names() == ["mcp_discover_demo", "mcp_load_demo"]
        discover = shared.get("mcp_discover_demo")
        assert discover is not None and not discover.side_effects
        assert "MCP server 'a demo server'" in discover.description
        assert discover.parameters_schema() == {
            "type": "object",
            "additionalProperties": False,
            "properties": {},
            "required": [],
        }
        load = shared.get("mcp_load_demo")
        assert load is not None and load.parameters_schema()["required"] == ["tool_names"]
        assert load.parameters_schema()["properties"]["tool_names"]["type"] == "array"
        # The description names every tool, so a model can load without discovering first.
        assert load.description == (
            f"Load tools of MCP server 'a demo server', callable from your next step. "
            f"Its tools: {', '.join(DEMO_TOOLS)}."
        )

        one, _ = session_of(shared)
        two, _ = session_of(shared)
        listing = await text_of(one, "mcp_discover_demo")
        lines = listing.splitlines()
        assert lines[0].startswith("MCP server 'demo' has 10 tools")
        assert [line.split(":")[0] for line in lines[1:]] == DEMO_TOOLS
        assert "add: Add two integers." in lines  # one line of a multi-line description
        assert listing == await text_of(two, "mcp_discover_demo")  # deterministic

        loaded = await text_of(one, "mcp_load_demo", {"tool_names": ["add"]})
        assert loaded == "tool 'add' loaded; call it directly from your next step."
        assert "add" in one.names() and "add" not in two.names()
        assert "add" not in shared.names()
        assert await text_of(one, "add", {"a": 20, "b": 22}) == "42"
        missing = await text_of(two, "add", {"a": 1, "b": 1})
        assert missing.startswith("Error executing tool: tool 'add' not found")

        wrong = await text_of(two, "mcp_load_demo", {"tool_names": ["ad"]})
        assert wrong == (
            "Error executing tool: MCP server 'demo' has no tool 'ad'; nothing was loaded. "
            f"Available tools: [{', '.join(DEMO_TOOLS)}]"
        )
        several = await text_of(two, "mcp_load_demo", {"tool_names": ["whoami", "pid", "ad"]})
        assert "has no tool 'ad'; nothing was loaded" in several and "pid" not in two
        several = await text_of(two, "mcp_load_demo", {"tool_names": ["whoami", "pid"]})
        assert several == "tools 'whoami', 'pid' loaded; call them directly from your next step."
        assert {"whoami", "pid"} <= set(two.names())
        none = await text_of(two, "mcp_load_demo", {"tool_names": []})
        assert none == "Error executing tool: name the tools to load in tool_names"
        assert "fail" not in one  # only what was loaded is callable
        await text_of(one, "mcp_load_demo", {"tool_names": ["fail"]})
        assert await text_of(one, "fail", {"message": "x"}) == (
            "Error executing tool: Error executing tool fail: failed on purpose: x"
        )  # the server's own wording, behind the executor's prefix
        huge = await text_of(one, "mcp_load_demo", {"tool_names": ["huge"]})
        assert "loaded" in huge
        assert len(await text_of(one, "huge", {})) < 8100
        # Loading into the shared executor (no session) is refused, not silently global.
        refused = await text_of(shared, "mcp_load_demo", {"tool_names": ["add"]})
        assert "needs a session" in refused
    assert shared.names() == []


async def test_tools_field_is_byte_identical(tmp_path: Path):
    path = write_config(tmp_path / "mcp.json", [stdio_entry(), time_entry()])
    shared = ToolExecutor()
    async with MCPRegistry(settings(path), shared):
        one, _ = session_of(shared)
        two, _ = session_of(shared)
        loads = [("demo", "greet"), ("time", "get_current_time"), ("demo", "add")]
        for server, tool in loads:
            await text_of(one, f"mcp_load_{server}", {"tool_names": [tool]})
        for server, tool in reversed(loads):
            await text_of(two, f"mcp_load_{server}", {"tool_names": [tool]})
        first = one.definitions_json()
        assert all(one.definitions_json() == first for _ in range(100))
        assert two.definitions_json() == first
        names = [d["function"]["name"] for d in one.definitions()]
        assert names == sorted(names) and "get_current_time" in names
        # Reloading the same tool does not change the bytes either.
        await text_of(one, "mcp_load_demo", {"tool_names": ["greet"]})
        assert one.definitions_json() == first
        greet = next(d for d in one.definitions() if d["function"]["name"] == "greet")
        mode = greet["function"]["parameters"]["properties"]["mode"]
        assert mode["description"].endswith("(allowed values: [plain loud])")


async def test_eager_mode_registers_every_tool_and_never_shadows(tmp_path: Path):
    entries = [
        stdio_entry("alpha", filter={"names": ["add", "whoami", "greet"]}),
        stdio_entry("beta", filter={"prefix": ["who", "pid"]}),
        time_entry(),
    ]
    path = write_config(tmp_path / "mcp.json", entries, form="mcpServers")
    shared = ToolExecutor()
    async with MCPRegistry(settings(path, lazy_load=False), shared) as registry:
        assert registry.mode == "eager"
        assert shared.names() == [
            "add",
            "beta__whoami",  # the name is alpha's (first in the file): prefixed, not dropped
            "convert_time",
            "get_current_time",
            "greet",
            "pid",
            "whoami",
        ]
        session, _ = session_of(shared)
        assert await text_of(session, "whoami") == "alpha"
        assert await text_of(session, "beta__whoami") == "beta"
        assert await text_of(session, "add", {"a": 1, "b": 2}) == "3"
        assert not shared.get("add").side_effects and shared.get("greet").side_effects
        # Removing alpha frees whoami; reconnecting beta claims it.
        await registry.remove("alpha")
        assert "whoami" not in shared.names() and "add" not in shared.names()
        await registry.reconnect("beta")
        assert await text_of(session, "whoami") == "beta"
        assert "beta__whoami" not in shared.names()
    assert shared.names() == []


@pytest.mark.parametrize("lazy", [True, False])
async def test_an_mcp_tool_never_shadows_a_user_tool_and_removal_unloads_it(
    tmp_path: Path, lazy: bool
):
    from ania_nb import tool

    @tool(name="add")
    def add(a: int, b: int) -> str:
        """The user's own add."""
        return f"user says {a + b}"

    path = write_config(tmp_path / "mcp.json", [stdio_entry("demo")])
    shared = ToolExecutor()
    shared.add(add)
    async with MCPRegistry(settings(path, lazy_load=lazy), shared) as registry:
        session, _ = session_of(shared)
        if lazy:
            loaded = await text_of(session, "mcp_load_demo", {"tool_names": ["add", "pid"]})
            assert loaded == (
                "tools 'add' as 'demo__add' (the name is taken), 'pid' loaded; "
                "call them directly from your next step."
            )
        assert await text_of(session, "add", {"a": 1, "b": 2}) == "user says 3"
        assert await text_of(session, "demo__add", {"a": 1, "b": 2}) == "3"
        other, _ = session_of(shared)
        if lazy:
            await text_of(other, "mcp_load_demo", {"tool_names": ["greet"]})
        assert await registry.remove("demo")
        for table in (session, other):  # gone from every session, not only from shared
            assert [n for n in table.names() if n not in ("add",)] == []
        assert await text_of(session, "add", {"a": 1, "b": 2}) == "user says 3"
    assert shared.names() == ["add"]  # the user's tool stays


async def test_all_transports_in_one_registry(tmp_path: Path, http_url: str, sse_url: str):
    entries = [
        stdio_entry("local"),
        {"name": "web", "transport": "streamable-http", "endpoint": http_url},
        {"name": "events", "transport": "sse", "endpoint": sse_url},
    ]
    path = write_config(tmp_path / "mcp.json", entries)
    shared = ToolExecutor()
    async with MCPRegistry(settings(path), shared) as registry:
        assert [(s.name, s.state, s.tools) for s in registry.servers()] == [
            ("events", "connected", 10),
            ("local", "connected", 10),
            ("web", "connected", 10),
        ]
        session, _ = session_of(shared)
        for server in ("local", "web", "events"):
            await text_of(session, f"mcp_load_{server}", {"tool_names": ["add"]})
            assert await text_of(session, "add", {"a": 2, "b": 3}) == "5"


async def test_a_server_failing_at_start_does_not_stop_the_others(tmp_path: Path, caplog):
    later = tmp_path / "later.py"  # does not exist yet: the server fails at start
    entries = [
        {"name": "broken", "command": sys.executable, "args": [str(later), "stdio"]},
        {"name": "offline", "endpoint": "http://127.0.0.1:9/mcp"},
        stdio_entry("ok"),
        {"name": "off", "command": "never-started", "disabled": True},
    ]
    path = write_config(tmp_path / "mcp.json", entries)
    shared = ToolExecutor()
    async with MCPRegistry(settings(path, connect_timeout=10.0), shared) as registry:
        states = {s.name: (s.state, s.tools) for s in registry.servers()}
        assert states == {
            "broken": ("failed", 0),
            "offline": ("failed", 0),
            "ok": ("connected", 10),
        }
        broken = next(s for s in registry.servers() if s.name == "broken")
        assert "later.py" in (broken.error or "")  # python's own stderr explains it
        assert "MCP server 'broken'" in caplog.text
        assert shared.names() == ["mcp_discover_ok", "mcp_load_ok"]
        from ania_nb.mcp.admin import admin_tools

        [listing] = [t for t in admin_tools(registry) if t.name == "mcp_list"]
        shown = await listing.invoke({}, None)  # type: ignore[arg-type]
        assert "- broken (stdio " in shown and "server stderr (last lines):" in shown
        assert "later.py" in shown  # python's own complaint, not only the first error line

        shutil.copy(DEMO, later)  # now the server can start: reconnect revives it
        status = await registry.reconnect("broken")
        assert (status.state, status.tools) == ("connected", 10)
        assert "mcp_load_broken" in shared.names()
        with pytest.raises(MCPServerError, match="offline"):
            await registry.reconnect("offline")
        with pytest.raises(UsageError, match=r"no MCP server named 'nope'; known servers"):
            await registry.reconnect("nope")


async def test_servers_connect_concurrently_at_start(tmp_path: Path):
    """Each server waits at a barrier until all three have started: connecting them one after
    another, the first would wait for the others forever (and fail at its connect timeout)."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    entries = [stdio_entry(name, barrier=(barrier, 3)) for name in ("one", "two", "three")]
    path = write_config(tmp_path / "mcp.json", entries)
    async with MCPRegistry(settings(path, connect_timeout=30.0), ToolExecutor()) as registry:
        states = {s.name: s.state for s in registry.servers()}
    assert states == {"one": "connected", "three": "connected", "two": "connected"}
    assert sorted(os.listdir(barrier)) == ["one", "three", "two"]


async def test_runtime_add_remove_a_dead_server_seen_at_once_and_rebound_tools(tmp_path: Path):
    shared = ToolExecutor()
    no_auto = settings(tmp_path / "absent.json", auto_reconnect=False)
    async with MCPRegistry(no_auto, shared) as registry:
        assert registry.servers() == [] and shared.names() == []
        status = await registry.add(MCPServerConfig.model_validate(stdio_entry()))
        assert (status.name, status.state, status.tools) == ("demo", "connected", 10)
        with pytest.raises(UsageError, match="already exists"):
            await registry.add(MCPServerConfig.model_validate(stdio_entry()))
        with pytest.raises(MCPServerError):
            await registry.add(MCPServerConfig(name="bad", transport="stdio", command="/no/such"))
        assert [s.name for s in registry.servers()] == ["demo"]
        assert "mcp_load_bad" not in shared.names()

        session, _ = session_of(shared)
        await text_of(session, "mcp_load_demo", {"tool_names": ["pid", "add"]})
        os.kill(int(await text_of(session, "pid")), signal.SIGKILL)
        # Seen without any call: the process's end is watched.
        demo = registry.get("demo")
        assert demo is not None
        await until(lambda: demo.state == "disconnected", "the state to change", limit=15.0)
        assert (demo.error or "").startswith("the server process exited")
        assert "disconnected" in registry.servers()[0].state
        crashed = await text_of(session, "pid")
        assert crashed.startswith("Error executing tool: MCP server 'demo' is disconnected")
        assert "mcp_reconnect(name='demo')" in crashed

        await registry.reconnect("demo")
        # Loaded tools whose schema did not change are re-bound to the new connection.
        assert (await text_of(session, "pid")).isdigit()
        add = session.get("add")
        add.remote = dataclasses.replace(add.remote, input_schema={"type": "object"})
        add.generation -= 1  # as if loaded from a connection whose "add" looked different
        stale = await text_of(session, "add", {"a": 1, "b": 2})
        assert "reconnected since; load it again with mcp_load_demo(tool_names=['add'])" in stale

        assert await registry.remove("demo") is True
        assert await registry.remove("demo") is False
        assert shared.names() == []
        assert "pid" not in session.names()  # removal unloads it from the session too
        gone = await text_of(session, "pid")
        assert gone.startswith("Error executing tool: tool 'pid' not found")


async def test_a_lost_server_reconnects_on_its_next_use(tmp_path: Path):
    path = write_config(tmp_path / "mcp.json", [stdio_entry()])
    shared = ToolExecutor()
    async with MCPRegistry(settings(path), shared) as registry:
        session, _ = session_of(shared)
        await text_of(session, "mcp_load_demo", {"tool_names": ["pid"]})
        first = await text_of(session, "pid")
        os.kill(int(first), signal.SIGKILL)
        demo = registry.get("demo")
        assert demo is not None
        await until(lambda: demo.state == "disconnected", "the state to change", limit=15.0)
        again = await text_of(session, "pid")  # reconnects, then calls the re-bound tool
        assert again.isdigit() and again != first and demo.state == "connected"


async def test_an_invalid_config_file_turns_mcp_off_and_says_why(tmp_path: Path):
    path = tmp_path / "mcp.json"
    path.write_text('{"servers": [{"name": "x", "transport": "telepathy", "command": "y"}]}')
    shared = ToolExecutor()
    registry = MCPRegistry(settings(path), shared)
    await registry.start()  # no longer raises: a broken file must not stop every chat
    assert registry.servers() == [] and shared.names() == []
    error = registry.config_error or ""
    assert str(path) in error and "server 'x': field 'transport'" in error
    assert error.endswith("MCP servers are off until the file is fixed")
    await registry.aclose()


def test_first_connections_in_a_fresh_process_import_the_sdk_safely(tmp_path: Path):
    # Five servers connecting at once in a process that has not imported the SDK yet.
    path = write_config(tmp_path / "mcp.json", [stdio_entry(f"s{i}") for i in range(5)])
    code = (
        "import asyncio, sys\n"
        "from ania_nb.config import MCPSettings\n"
        "from ania_nb.mcp import MCPRegistry\n"
        "from ania_nb.tools import ToolExecutor\n"
        "async def main():\n"
        "    assert 'mcp' not in sys.modules\n"
        f"    settings = MCPSettings(config_file={str(path)!r})\n"
        "    async with MCPRegistry(settings, ToolExecutor()) as registry:\n"
        "        print([(s.name, s.state) for s in registry.servers()])\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([(f"s{i}", "connected") for i in range(5)])
