"""MCP wired into an Agent: discover → load → call across real rounds, against a real server."""

from __future__ import annotations

import json
import sys

from _waits import until
from mcp_servers.support import stdio_entry

from ania_nb import Callbacks
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


# Never answers the MCP handshake; exits (without a word on stdout) once the file exists.
HANG_UNTIL = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.exit("gave up without answering")
"""


async def test_a_server_that_never_answers_does_not_delay_the_first_reply(
    llm, make_agent, tmp_path
):
    # "Not delayed" by order, not by a clock: the slow server cannot finish connecting before
    # the test lets it go, and the first reply comes before that. Its timeout only bounds a
    # broken build that waits for it (the reply would then see it "failed").
    give_up = tmp_path / "give-up"
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "slow": {
                        "command": sys.executable,
                        "args": ["-c", HANG_UNTIL, str(give_up)],
                        "timeout": 60,
                    },
                    "demo": {k: v for k, v in stdio_entry("demo").items() if k != "name"},
                }
            }
        )
    )
    seen: list[str] = []

    def answer(request):
        agent_mcp = agent.mcp
        seen.append(agent_mcp.get("slow").state if agent_mcp else "none")
        return reply("hello without waiting")

    llm.responder = answer
    agent = make_agent(overrides={"mcp.config_file": str(config)})
    result = await agent.chat("hi")
    assert result.ok and seen == ["connecting"]  # answered while the server was still starting
    first_tools = {t["function"]["name"]: t["function"] for t in llm.requests[0].tools}
    assert "still connecting" in first_tools["mcp_load_slow"]["description"]
    assert not give_up.exists() and agent.mcp.get("slow").state == "connecting"

    demo = agent.mcp.get("demo")
    await until(lambda: demo.state == "connected", "the demo server to connect")
    llm.responder = None
    llm.script(reply(tool_calls=[tool_call("mcp_discover_slow")]), reply("it is down"))

    def on_event(event):
        if event.kind == "tool_start":  # the call waits for the attempt: now let it fail
            give_up.touch()

    waited = await agent.chat("what does slow offer?", callbacks=Callbacks(on_event=on_event))
    told = waited.tool_calls[0].result
    assert "MCP server 'slow' is not connected (MCPError: Connection closed)" in told
    assert "still connecting" not in told  # the call waited for the attempt's outcome
    assert "gave up without answering" in (agent.mcp.get("slow").error or "")  # its stderr
    status = {s.name: s.state for s in agent.mcp.servers()}
    assert status == {"demo": "connected", "slow": "failed"}
    names = [t["function"]["name"] for t in llm.requests[-1].tools]
    assert "mcp_load_slow" not in names and "mcp_load_demo" in names  # failed: pair dropped
