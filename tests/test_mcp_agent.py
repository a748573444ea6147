"""MCP wired into an Agent: discover → load → call across real rounds, against a real server."""

from __future__ import annotations

import json

from mcp_servers.support import stdio_entry

from ania_nb.testing import reply, tool_call


async def test_lazy_mcp_tools_through_an_agent_run(llm, make_agent, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": [stdio_entry("demo")]}))
    llm.script(
        reply(tool_calls=[tool_call("mcp_discover_demo")]),
        reply(tool_calls=[tool_call("mcp_load_demo", {"tool_names": ["add"]})]),
        reply(tool_calls=[tool_call("add", {"a": 2, "b": 40})]),
        reply("2 + 40 = 42"),
        reply("fresh session"),
    )
    agent = make_agent(overrides={"mcp.config_file": str(config)})
    result = await agent.chat("add 2 and 40 with the MCP server", session="one")
    assert result.ok, result.error
    assert [c.name for c in result.tool_calls] == ["mcp_discover_demo", "mcp_load_demo", "add"]
    assert "add" in result.tool_calls[0].result
    assert result.tool_calls[2].result.strip() == "42"
    names = [[t["function"]["name"] for t in r.tools] for r in llm.requests[:4]]
    assert "add" not in names[0] and "add" not in names[1]  # lazy: not sent until loaded
    assert "add" in names[2] and "add" in names[3]  # loaded into this session from the next round
    await agent.chat("hi", session="two")
    assert "add" not in [t["function"]["name"] for t in llm.requests[4].tools]


async def test_a_malformed_mcp_file_leaves_chat_working_and_says_why(
    llm, make_agent, tmp_path, caplog
):
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"demo": {"command": ')  # cut off mid-edit
    llm.script(reply(tool_calls=[tool_call("mcp_list")]), reply("MCP is off"))
    agent = make_agent(overrides={"mcp.config_file": str(config), "mcp.self_manage": True})
    result = await agent.chat("what MCP servers do you have?")
    assert result.ok and result.text == "MCP is off"  # chat goes on without MCP
    listing = result.tool_calls[0].result
    assert f"MCP config file {str(config)!r} is not valid JSON" in listing
    assert agent.mcp is not None and "MCP servers are off until the file is fixed" in (
        agent.mcp.config_error or ""
    )
    assert agent.mcp.source().startswith(f"{config}: MCP config file")
    assert any("is not valid JSON" in r.getMessage() for r in caplog.records)
