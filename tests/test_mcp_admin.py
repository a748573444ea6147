"""AI self-management tools: mcp_list / mcp_add / mcp_remove / mcp_reconnect, persisted."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from mcp_servers.support import (
    DEMO,
    session_of,
    settings,
    stdio_entry,
    write_config,
)

from ania_nb.mcp import MCPRegistry
from ania_nb.tools import ToolContext, ToolExecutor

ADMIN = ["mcp_add", "mcp_list", "mcp_reconnect", "mcp_remove"]

pytest_plugins = ["mcp_servers.fixtures"]  # the demo HTTP/SSE server fixtures


async def run(executor, tool: str, /, **args) -> str:
    return (await executor.execute(tool, args)).text


def add_args(name: str = "extra") -> dict:
    return {"name": name, "command": sys.executable, "args": [str(DEMO), "stdio", "--name", name]}


async def test_admin_tools_only_with_self_manage(tmp_path: Path):
    shared = ToolExecutor()
    async with MCPRegistry(settings(tmp_path / "mcp.json"), shared):
        assert shared.names() == []
    async with MCPRegistry(settings(tmp_path / "mcp.json", self_manage=True), shared):
        assert shared.names() == ADMIN
        assert [shared.get(n).side_effects for n in ADMIN] == [True, False, True, True]
        add = shared.get("mcp_add").parameters_schema()
        assert add["required"] == ["name"]
        assert add["properties"]["env"]["anyOf"] == [
            {"type": "array", "items": {"type": "string"}},
            {"type": "null"},
        ]
        assert add["properties"]["timeout_sec"]["anyOf"] == [{"type": "number"}, {"type": "null"}]
        empty = await run(shared, "mcp_list")
        assert empty == "No MCP servers are configured; add one with mcp_add."
    assert shared.names() == []


@pytest.mark.parametrize("form", ["servers", "mcpServers", "vscode"])
async def test_add_list_remove_persist_in_the_files_form(tmp_path: Path, form: str):
    path = write_config(tmp_path / "mcp.json", [stdio_entry("first")], form=form)
    shared = ToolExecutor()
    async with MCPRegistry(settings(path, self_manage=True), shared) as registry:
        session, _ = session_of(shared)
        text = await run(
            session, "mcp_add", **add_args(), env=["GREETING=hi=there"], description="more"
        )
        assert text == (
            "MCP server 'extra' added and saved (10 tools); from your next step, list its tools "
            "with mcp_discover_extra, then load one with mcp_load_extra."
        )
        saved = json.loads(path.read_text())
        key = "servers" if form == "vscode" else form
        assert list(saved) == [key]
        if form == "servers":
            assert [e["name"] for e in saved["servers"]] == ["first", "extra"]
            assert saved["servers"][1]["env"] == {"GREETING": "hi=there"}
        else:
            assert list(saved[key]) == ["first", "extra"]
            assert saved[key]["extra"]["env"] == {"GREETING": "hi=there"}
            # VS Code needs the type of every entry; Claude Code infers stdio from a command
            assert saved[key]["extra"].get("type") == ("stdio" if form == "vscode" else None)
        assert "mcp_load_extra" in shared.names()
        await run(session, "mcp_load_extra", tool_names=["get_env"])
        assert await run(session, "get_env", key="GREETING") == "hi=there"

        listing = await run(session, "mcp_list")
        lines = listing.splitlines()
        described = {
            "servers": 'the "servers" list form',
            "mcpServers": 'the Claude Code "mcpServers" form',
            "vscode": 'the VS Code "servers" object form',
        }[form]
        assert lines[0] == f"MCP servers (lazy mode; from {path} ({described})):"
        assert lines[1].startswith("- extra: more (stdio ") and lines[1].endswith(
            "connected, 10 tools)"
        )
        assert lines[2].startswith("- first (stdio ")

        again = await run(session, "mcp_add", **add_args())
        assert "already exists; mcp_remove it first" in again

        removed = await run(session, "mcp_remove", name="extra")
        assert removed == "MCP server 'extra' removed; its tools are gone from your next step."
        assert "mcp_load_extra" not in shared.names()
        assert [s.name for s in registry.servers()] == ["first"]
        reloaded = json.loads(path.read_text())
        names = (
            [e["name"] for e in reloaded["servers"]] if form == "servers" else list(reloaded[key])
        )
        assert names == ["first"]
        unknown = await run(session, "mcp_remove", name="extra")
        assert unknown == "Error executing tool: no MCP server named 'extra'. Configured: [first]"


async def test_add_rolls_back_when_the_file_cannot_be_written(tmp_path: Path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file: nothing can be created under it, even by root")
    path = blocker / "mcp.json"
    shared = ToolExecutor()
    async with MCPRegistry(settings(path, self_manage=True), shared) as registry:
        text = await run(shared, "mcp_add", **add_args())
        assert text.startswith("Error executing tool: MCP server 'extra' connected, but saving")
        assert "it was disconnected again, nothing changed" in text
        assert registry.servers() == []
        assert "mcp_load_extra" not in shared.names() and "mcp_discover_extra" not in shared.names()
        assert blocker.read_text().startswith("a regular file")


async def test_add_validates_before_connecting_and_saves_nothing_on_failure(tmp_path: Path):
    path = tmp_path / "mcp.json"
    shared = ToolExecutor()
    async with MCPRegistry(settings(path, self_manage=True, connect_timeout=5.0), shared):
        cases = {
            "bad name": ("server name 'bad name' is invalid", {"name": "bad name", "command": "x"}),
            "transport": (
                "field 'transport': unknown transport 'pigeon'",
                {"name": "p", "transport": "pigeon", "command": "x"},
            ),
            "endpoint": ("field 'endpoint'", {"name": "w", "transport": "sse"}),
            "env": ("env item 'NOEQUALS' is not KEY=VALUE", {**add_args(), "env": ["NOEQUALS"]}),
            "headers": ("headers item '=v' is not KEY=VALUE", {"name": "h", "headers": ["=v"]}),
            "connect": (
                "could not be connected",
                {"name": "down", "endpoint": "http://127.0.0.1:9/mcp"},
            ),
        }
        for expected, args in cases.values():
            text = await run(shared, "mcp_add", **args)
            assert text.startswith("Error executing tool: ") and expected in text, text
        assert not path.exists()
        assert "nothing was saved" in await run(
            shared, "mcp_add", name="down", endpoint="http://127.0.0.1:9/mcp"
        )


async def test_add_http_server_with_headers(tmp_path: Path, http_url: str):
    path = tmp_path / "mcp.json"
    shared = ToolExecutor()
    settings_ = settings(path, self_manage=True, lazy_load=False)
    async with MCPRegistry(settings_, shared):
        text = await run(
            shared,
            "mcp_add",
            name="web",
            transport="http",
            endpoint=http_url,
            headers=["X-Probe=7"],
            timeout_sec=15,
        )
        assert text == (
            "MCP server 'web' added and saved (10 tools); from your next step, its tools are "
            "registered under their own names."
        )
        assert await run(shared, "header", key="x-probe") == "7"
        entry = json.loads(path.read_text())["servers"][0]
        assert entry == {
            "name": "web",
            "transport": "streamable-http",
            "endpoint": http_url,
            "headers": {"X-Probe": "7"},
            "timeout": 15.0,
        }


async def test_remove_and_reconnect_servers_that_are_not_running(tmp_path: Path):
    later = tmp_path / "later.py"
    entries = [
        {
            "name": "late",
            "command": sys.executable,
            "args": [str(later), "stdio", "--name", "late"],
        },
        stdio_entry("live"),
    ]
    path = write_config(tmp_path / "mcp.json", entries)
    shared = ToolExecutor()
    async with MCPRegistry(settings(path, self_manage=True), shared) as registry:
        listing = (await run(shared, "mcp_list")).splitlines()
        assert listing[1].startswith("- late (stdio ") and "; failed: " in listing[1]
        failed = await run(shared, "mcp_reconnect", name="late")
        assert failed.startswith("Error executing tool: MCP server 'late' (stdio ")
        shutil.copy(DEMO, later)
        revived = await run(shared, "mcp_reconnect", name="late")
        assert revived == (
            "MCP server 'late' reconnected (10 tools); tools loaded before must be loaded again "
            "with mcp_load_late."
        )
        listed = await run(shared, "mcp_discover_late")
        assert listed.startswith("MCP server 'late' has 10 tools")
        unknown = await run(shared, "mcp_reconnect", name="ghost")
        assert unknown == "Error executing tool: no MCP server named 'ghost'. Known: [late, live]"

        await registry.remove("live")  # stopped at runtime, still in the file
        assert (await run(shared, "mcp_list")).splitlines()[2].endswith("; not running)")
        assert await run(shared, "mcp_remove", name="live") == (
            "MCP server 'live' removed; its tools are gone from your next step."
        )
        assert [e["name"] for e in json.loads(path.read_text())["servers"]] == ["late"]
        # A server in the file but not running can be started by mcp_reconnect, once an admin
        # approved exactly that entry (issue 12: the file may have changed since the start).
        await registry.remove("late")
        refused = await run(shared, "mcp_reconnect", name="late")
        assert "needs an admin's approval of exactly that entry" in refused
        tool = shared.get("mcp_reconnect")
        assert tool.needs_admin_approval({"name": "late"})
        assert f"[0] {json.dumps(str(later))}" in tool.approval_summary({"name": "late"})
        approved = ToolContext(session="s")
        approved.approved = True  # what the gate sets once the admin allowed the call
        started = await shared.execute("mcp_reconnect", {"name": "late"}, approved)
        assert "reconnected (10 tools)" in started.text
