"""Replicas on one store share what one of them changes: skills, MCP servers, config_set values.

Two Agents on one store stand for two ``ania-nb serve`` replicas (on PostgreSQL: one database;
on SQLite: two processes on one data directory). Each has its own MCP config file; the skills
folder is the shared folder the replicas are pointed at (``skills.dir`` on shared storage).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _waits import until
from mcp_servers.support import DEMO, settings, write_config

from ania_nb import ToolContext, tool
from ania_nb.catalogue import say
from ania_nb.mcp import MCPRegistry, MCPServerConfig, load_config_file
from ania_nb.mcp.shared import MCP_SERVERS_NAMESPACE, SharedServers
from ania_nb.store import Store
from ania_nb.store.kv import REVISIONS_NAMESPACE
from ania_nb.testing import reply, tool_call
from ania_nb.tools import ToolExecutor

pytestmark = pytest.mark.usefixtures("backend")

ADMIN = ToolContext(session="g:1", sender="root")
SKILL = """---
name: shared-notes
description: Notes every replica reads.
---
Write notes in the shared style.
"""


def replica(
    make_agent: Any, tmp_path: Path, name: str, *, tools: Sequence[Any] = (), **overrides: Any
) -> Any:
    """An Agent on the shared store (one data directory) with its own MCP file."""
    return make_agent(
        data_dir=tmp_path / "data",
        tools=tools,
        overrides={
            "store.sync_interval": 0.05,
            "admin.ids": ["root"],
            "mcp.config_file": str(tmp_path / f"{name}-mcp.json"),
            **overrides,
        },
    )


async def call(agent: Any, tool: str, /, **arguments: Any) -> Any:
    """Call a tool as the model would, past the gate (the gate's approvals are tested elsewhere)."""
    return await agent.tools.execute(tool, json.dumps(arguments), ADMIN)


async def test_a_skill_installed_on_one_replica_is_loaded_by_the_other(make_agent, tmp_path):
    shared = {"skills.dir": str(tmp_path / "shared-skills"), "skills.self_manage": True}
    one = await replica(make_agent, tmp_path, "one", **shared).start()
    two = await replica(make_agent, tmp_path, "two", **shared).start()
    assert two.skills is not None and "shared-notes" not in two.skills

    installed = await call(one, "skill_install", content=SKILL)
    assert installed.error is None, installed.error
    await until(lambda: "shared-notes" in two.skills, "the other replica to load the skill")
    assert "shared-notes" in two.system_prompt
    read = await call(two, "skill_read", skill_name="shared-notes")
    assert "Write notes in the shared style." in read.text

    removed = await call(two, "skill_remove", name="shared-notes")
    assert removed.error is None, removed.error
    await until(lambda: "shared-notes" not in one.skills, "the first replica to drop the skill")
    assert "shared-notes" not in one.system_prompt


async def test_a_config_set_value_is_saved_for_every_replica_and_applied_at_its_start(
    make_agent, tmp_path
):
    on = {"config_tool.enable": True}
    one = await replica(make_agent, tmp_path, "one", **on).start()
    two = await replica(make_agent, tmp_path, "two", **on).start()
    saved = await call(one, "config_set", key="agent.max_iterations", value="7")
    assert saved.text.startswith("Saved agent.max_iterations = 7. It takes effect after a restart")
    shown = await call(two, "config_get", key="agent.max_iterations")
    assert "saved by config_set: 7" in shown.text  # the other replica reads the shared value
    assert two.config.agent.max_iterations == 20  # like the replica that saved it: at a restart
    await two.aclose()

    restarted = await replica(make_agent, tmp_path, "two", **on).start()
    assert restarted.config.agent.max_iterations == 7


def demo_server(name: str) -> dict[str, Any]:
    """mcp_add arguments for the demo server over stdio."""
    return {"name": name, "command": sys.executable, "args": [str(DEMO), "stdio", "--name", name]}


async def test_an_mcp_server_added_or_removed_on_one_replica_follows_on_the_others(
    make_agent, tmp_path
):
    manage = {"mcp.self_manage": True}
    one = await replica(make_agent, tmp_path, "one", **manage).start()
    two = await replica(make_agent, tmp_path, "two", **manage).start()

    added = await call(one, "mcp_add", **demo_server("demo"))
    assert added.error is None, added.error
    running = one.mcp.get("demo")

    def connected(agent: Any) -> bool:
        server = agent.mcp.get("demo")
        return server is not None and server.state == "connected"

    await until(lambda: connected(two), "the other replica to start the server", limit=30)
    assert "mcp_load_demo" in two.tools.names()
    assert not (tmp_path / "two-mcp.json").exists()  # its own file is the operator's
    listed = await call(two, "mcp_list")
    assert "added on another replica" in listed.text
    assert one.mcp.get("demo") is running  # the replica that added it keeps its connection

    removed = await call(two, "mcp_remove", name="demo")
    assert removed.error is None, removed.error
    await until(lambda: one.mcp.get("demo") is None, "the first replica to stop the server")
    assert "mcp_load_demo" not in one.tools.names()
    assert load_config_file(tmp_path / "one-mcp.json").names() == ["demo"]
    await one.aclose()

    # A restart reads its own file (which still names the server) and the store's removal.
    again = await replica(make_agent, tmp_path, "one", **manage).start()
    assert again.mcp.get("demo") is None
    assert "mcp_load_demo" not in again.tools.names()


async def test_a_replica_started_later_starts_the_servers_other_replicas_added(
    make_agent, tmp_path
):
    one = await replica(make_agent, tmp_path, "one", **{"mcp.self_manage": True}).start()
    assert (await call(one, "mcp_add", **demo_server("late"))).error is None
    # self-management off and an empty file: the servers the store records still start
    later = await replica(make_agent, tmp_path, "later").start()
    assert later.mcp is not None
    server = later.mcp.get("late")
    assert server is not None and server.state == "connected"


def closed_port() -> int:
    """A loopback port nobody listens on (a server there fails to connect at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_stores_changes_apply_on_top_of_the_file_and_a_bad_record_is_skipped(
    tmp_path, caplog
):
    dead = f"http://127.0.0.1:{closed_port()}/mcp"
    path = write_config(
        tmp_path / "mcp.json",
        [{"name": n, "transport": "streamable-http", "endpoint": dead} for n in ("kept", "gone")],
    )
    store = await Store.open(tmp_path / "data")
    try:
        shared = SharedServers(store.kv(MCP_SERVERS_NAMESPACE), store.kv(REVISIONS_NAMESPACE))
        await shared.remove("gone")
        await shared.put(MCPServerConfig(name="added", transport="sse", endpoint=dead))
        bad = {"entry": {"name": "broken", "transport": "carrier-pigeon"}}
        await store.kv(MCP_SERVERS_NAMESPACE).set("broken", bad)
        async with MCPRegistry(settings(path), ToolExecutor(), shared_servers=shared) as registry:
            assert [(s.name, s.transport) for s in registry.servers()] == [
                ("added", "sse"),
                ("kept", "streamable-http"),
            ]
            assert "ignoring the store's shared MCP server 'broken'" in caplog.text
            assert await store.kv(MCP_SERVERS_NAMESPACE).get("broken") == bad  # kept as it was

            # Another replica removes "kept" and replaces "added": applied at the next sync.
            await shared.remove("kept")
            await shared.put(
                MCPServerConfig(name="added", transport="streamable-http", endpoint=dead)
            )
            await registry.sync_shared()
            assert [(s.name, s.transport) for s in registry.servers()] == [
                ("added", "streamable-http")
            ]
    finally:
        await store.close()


written: list[str] = []


@tool(side_effects=True)
def write_note(text: str) -> str:
    """Write a note (a side effect)."""
    written.append(text)
    return f"wrote {text}"


async def test_plan_mode_switched_on_one_replica_holds_on_the_other(llm, make_agent, tmp_path):
    written.clear()
    one = replica(make_agent, tmp_path, "one", tools=[write_note])
    two = replica(make_agent, tmp_path, "two", tools=[write_note])
    await two.start()  # it has read the session's (unset) state before the switch
    assert (await one.chat("/plan on", session="f:7")).text == say("plan.on", "zh")

    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "x"})]), reply("my plan"))
    planned = await two.chat("do it", session="f:7")
    assert planned.text == "my plan" and written == []
    assert planned.tool_calls[0].result.startswith("[Plan mode] the tool write_note was blocked")
    assert "[Plan mode] The user turned on plan mode" in llm.requests[0].messages[-1]["content"]
    assert two.plan_mode("f:7")

    assert (await two.chat("/plan off", session="f:7")).text == say("plan.off", "zh")
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "y"})]), reply("done"))
    acted = await one.chat("go", session="f:7")
    assert acted.text == "done" and written == ["y"]


async def test_a_todo_list_written_on_one_replica_is_the_list_of_the_other(
    llm, make_agent, tmp_path
):
    builtin = {"agent.builtin_tools": True}
    one = replica(make_agent, tmp_path, "one", **builtin)
    two = replica(make_agent, tmp_path, "two", **builtin)
    assert await two.todos("f:8") == []  # read once before the other replica writes
    todos = {"todos": [{"content": "draft", "status": "in_progress"}]}
    llm.script(reply(tool_calls=[tool_call("todo_write", todos)]), reply("listed"))
    assert (await one.chat("plan it", session="f:8")).text == "listed"
    assert [t["content"] for t in await two.todos("f:8")] == ["draft"]


async def test_plan_mode_switched_on_mid_run_elsewhere_blocks_the_runs_next_call(
    llm, make_agent, tmp_path
):
    written.clear()
    one = replica(make_agent, tmp_path, "one")

    @tool
    async def ask_elsewhere() -> str:
        """Someone turns plan mode on through the other replica while this run goes on."""
        return (await one.chat("/plan on", session="f:9")).text

    two = replica(make_agent, tmp_path, "two", tools=[write_note, ask_elsewhere])
    llm.script(
        reply(tool_calls=[tool_call("ask_elsewhere")]),
        reply(tool_calls=[tool_call("write_note", {"text": "z"})]),
        reply("stopped"),
    )
    result = await two.chat("go", session="f:9")
    assert result.tool_calls[0].result == say("plan.on", "zh")
    assert result.tool_calls[1].result.startswith("[Plan mode] the tool write_note was blocked")
    assert written == []


async def test_skill_reload_on_one_replica_reloads_the_shared_folder_on_the_others(
    make_agent, tmp_path
):
    folder = tmp_path / "shared-skills"
    (folder / "copied").mkdir(parents=True)
    one = await replica(make_agent, tmp_path, "one", **{"skills.dir": str(folder)}).start()
    two = await replica(make_agent, tmp_path, "two", **{"skills.dir": str(folder)}).start()
    (folder / "copied" / "SKILL.md").write_text(SKILL.replace("shared-notes", "copied"))
    reloaded = await call(one, "skill_reload")
    assert "[copied]" in reloaded.text
    await until(lambda: "copied" in two.skills, "the other replica to reload the folder")


async def test_an_mcp_add_that_cannot_be_recorded_for_the_others_changes_nothing(
    make_agent, tmp_path
):
    one = await replica(make_agent, tmp_path, "one", **{"mcp.self_manage": True}).start()
    opened = await one.host.open_store()  # the shared store, as the replicas see it
    # A revision counter another version left unusable: the record cannot be announced.
    await opened.kv(REVISIONS_NAMESPACE).set("mcp", "not a counter")
    failed = await call(one, "mcp_add", **demo_server("nope"))
    assert "recording it in the store for the other replicas failed" in (failed.error or "")
    assert one.mcp.get("nope") is None and "mcp_load_nope" not in one.tools.names()
    assert load_config_file(tmp_path / "one-mcp.json").names() == []  # the file put back
    assert await opened.kv(MCP_SERVERS_NAMESPACE).items() == []  # no record left behind
    assert await opened.kv(REVISIONS_NAMESPACE).get("mcp") == "not a counter"  # kept as it was
