"""MCP sampling: a server's sampling/createMessage answered by our scripted model after a
person approved it, refused when off (the default), denied, or asked in a chat by a non-admin.
"""

from __future__ import annotations

import json

import pytest
from mcp_servers.support import everything_entry, stdio_entry

from ania_nb import Callbacks
from ania_nb.testing import reply, tool_call

SAMPLING_SYSTEM = "You answer in one word."


async def _agent_with(make_agent, tmp_path, *servers, **overrides):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": list(servers)}))
    overrides = {"mcp.config_file": str(config), "mcp.lazy_load": False, **overrides}
    agent = make_agent(overrides=overrides)
    return await agent.start()


def approver(agent, asked: list, allow: bool):
    """Callbacks that record each approval request and answer it at once."""

    def request_approval(request):
        asked.append(request)
        agent.answer_approval(request.id, allow=allow)

    return Callbacks(request_approval=request_approval)


def sampling_requests(llm):
    return [r for r in llm.requests if any(m.get("content") == SAMPLING_SYSTEM for m in r.messages)]


async def test_an_approved_request_is_answered_by_our_model_and_counted(llm, make_agent, tmp_path):
    entry = stdio_entry("demo", sampling=True, ask=True)
    agent = await _agent_with(make_agent, tmp_path, entry, **{"mcp.sampling_max_tokens": 50})
    sampled_usage = {"prompt_tokens": 70000, "completion_tokens": 11}
    llm.route(SAMPLING_SYSTEM, reply("four", usage=sampled_usage))
    llm.script(reply(tool_calls=[tool_call("ask_model", {"question": "2+2?"})]), reply("done"))
    asked: list = []
    result = await agent.chat("ask the server", callbacks=approver(agent, asked, True))
    assert result.ok, result.error
    assert result.tool_calls[0].result == "scripted said: four"
    [request] = asked
    assert request.tool == "mcp_sampling_demo"
    assert "MCP server 'demo' asks scripted for a completion (at most 50 tokens)" in (
        request.details
    )
    assert f"System prompt: {SAMPLING_SYSTEM}" in request.details
    assert "[user] 2+2?" in request.details
    [sampled] = sampling_requests(llm)
    assert sampled.body["max_tokens"] == 50  # the server asked 5000: capped by config
    assert [m["role"] for m in sampled.messages] == ["system", "user"]
    assert sampled.tools in (None, [])  # the server's request gets no tools of ours
    assert result.usage.prompt_tokens > 70000  # the sampling call is in the run's usage
    report = await agent.quota.report(1)
    [session] = [u for u in report.sessions if u.session == "nb:default"]
    assert session.prompt > 70000  # and in the session's quota


async def test_sampling_is_off_by_default_and_a_denial_is_refused(llm, make_agent, tmp_path):
    agent = await _agent_with(
        make_agent,
        tmp_path,
        stdio_entry("off", ask=True),
        stdio_entry("on", sampling=True, ask=True),
    )
    llm.script(
        reply(tool_calls=[tool_call("ask_model", {"question": "hi"})]),
        reply("ok"),
        reply(tool_calls=[tool_call("on__ask_model", {"question": "hi"})]),
        reply("ok"),
    )
    asked: list = []
    off = await agent.chat("ask", callbacks=approver(agent, asked, True))
    assert off.tool_calls[0].result == (
        "refused: sampling is off for MCP server 'off': the operator can allow it with "
        '"sampling": true in its entry of the MCP config file'
    )
    assert asked == []  # nobody was asked
    denied = await agent.chat("ask again", callbacks=approver(agent, asked, False))
    assert denied.tool_calls[0].result.startswith(
        "refused: the sampling request of MCP server 'on' was not approved"
    )
    assert len(asked) == 1 and sampling_requests(llm) == []  # the model was never asked


async def test_in_a_chat_only_an_admin_may_approve(llm, make_agent, tmp_path):
    agent = await _agent_with(
        make_agent,
        tmp_path,
        stdio_entry("demo", sampling=True, ask=True),
        **{"admin.ids": ["boss"]},
    )
    llm.script(reply(tool_calls=[tool_call("ask_model", {"question": "hi"})]), reply("ok"))
    asked: list = []

    def request_approval(request):
        asked.append(request)
        with pytest.raises(Exception, match="admin"):
            agent.answer_approval(request.id, allow=True, approver="alice")  # the requester
        agent.answer_approval(request.id, allow=True, approver="boss")

    result = await agent.chat(
        "ask", session="g:1", sender="alice", callbacks=Callbacks(request_approval=request_approval)
    )
    assert asked[0].admin_only
    assert "said:" in result.tool_calls[0].result


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
async def test_server_everything_sampling(llm, make_agent, tmp_path, transport):
    with everything_entry(transport) as entry:
        agent = await _agent_with(make_agent, tmp_path, {**entry, "sampling": True})
        tools = agent.mcp.get("everything").tools
        assert "trigger-sampling-request" in [t.name for t in tools]
        llm.route("You are a helpful test server.", reply("sampled text"))
        llm.script(
            reply(
                tool_calls=[
                    tool_call("trigger-sampling-request", {"prompt": "Say hi", "maxTokens": 20})
                ]
            ),
            reply("done"),
        )
        asked: list = []
        result = await agent.chat("sample", callbacks=approver(agent, asked, True))
        assert result.ok, result.error
        assert len(asked) == 1 and "MCP server 'everything'" in asked[0].details
        assert "sampled text" in result.tool_calls[0].result
