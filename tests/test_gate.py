"""The tool gate inside real runs: plan mode → PreToolUse hooks → admin approval → approval,
blocked calls as results, siblings not delayed, and who may answer an approval."""

from __future__ import annotations

import asyncio
import json

import pytest

from ania_nb import Callbacks, UsageError, tool
from ania_nb.catalogue import say
from ania_nb.store import Store
from ania_nb.testing import reply, tool_call

written: list[str] = []


@tool(side_effects=True)
def write_note(text: str) -> str:
    """Write a note (a side effect)."""
    written.append(text)
    return f"wrote {text}"


@tool
def read_note() -> str:
    """Read the notes (read-only)."""
    return f"notes: {written}"


@tool(name="kb_add")
def kb_add_tool(text: str) -> str:
    """Not marked side-effecting, but on the original's plan-mode list [orig §9.1]."""
    written.append(f"kb:{text}")
    return "added"


@pytest.fixture(autouse=True)
def _fresh_notes():
    written.clear()


async def oplog_entries(agent, **filters):
    store = await Store.open(agent.data_dir)
    try:
        return await store.oplog.list(**filters)
    finally:
        await store.close()


async def test_plan_mode_blocks_side_effects_and_lets_todo_and_read_only_through(llm, make_agent):
    agent = make_agent(
        tools=[write_note, read_note, kb_add_tool], overrides={"agent.builtin_tools": True}
    )
    on = await agent.chat("/plan on", session="p")
    assert on.ok and on.text.startswith("Plan mode on") and llm.requests == []
    assert agent.plan_mode("p") and not agent.plan_mode("other")
    todos = {"todos": [{"content": "draft", "status": "in_progress"}]}
    calls = [
        tool_call("write_note", {"text": "x"}),
        tool_call("kb_add", {"text": "y"}),
        tool_call("read_note"),
        tool_call("todo_write", todos),
    ]
    llm.script(reply(tool_calls=calls), reply("here is my plan"))
    result = await agent.chat("do it", session="p")
    assert result.text == "here is my plan" and written == []
    assert [c.blocked for c in result.tool_calls] == [True, True, False, False]
    blocked = result.tool_calls[0].result
    assert blocked.startswith("[Plan mode] the tool write_note was blocked")
    assert result.tool_calls[3].result.startswith("Task list updated: 1 items")
    tool_messages = [m for m in llm.requests[1].messages if m["role"] == "tool"]
    assert tool_messages[0]["content"] == blocked  # the model sees the block text as the result
    record = (await agent.runs(session="p"))[0]
    assert [c.error is not None for c in record.tool_calls] == [True, True, False, False]
    assert record.tool_calls[1].result.startswith("[Plan mode] the tool kb_add")

    assert (await agent.chat("/plan status", session="p")).text == "Plan mode is on."
    assert (await agent.chat("/plan on", session="p")).text == "Already in plan mode."
    assert (await agent.chat("/plan off", session="p")).text.startswith("Plan mode off")
    assert (await agent.chat("/plan", session="p")).text == "Plan mode is off."
    assert (await agent.chat("/plan maybe", session="p")).text.startswith("usage: /plan")
    agent.set_plan_mode("p", True)
    assert agent.plan_mode("p")
    assert len(llm.requests) == 2  # none of the commands reached the model


async def test_gate_stages_run_in_order(llm, make_agent, tmp_path, inbox):
    seen = tmp_path / "pre-tool"  # one file per call: the calls of a round run in parallel
    seen.mkdir()
    hooks = {
        "PreToolUse": [
            {"command": f"cat > $(mktemp {seen}/call.XXXXXX)"},
            {"matcher": "^read_note$", "command": "echo 'hook says no' >&2; exit 2"},
        ]
    }
    (tmp_path / "hooks.json").write_text(json.dumps({"hooks": hooks}))
    agent = make_agent(
        tools=[write_note, read_note],
        overrides={
            "hooks.enable": True,
            "hooks.file": str(tmp_path / "hooks.json"),
            "config_tool.enable": True,
            "approval.enable": True,
            "approval.tools": ["write_note", "read_note"],
        },
    )
    callbacks = Callbacks(request_approval=inbox)
    agent.set_plan_mode("s", True)
    setting = {"key": "agent.max_iterations", "value": "7"}
    llm.script(
        reply(
            tool_calls=[tool_call("write_note", {"text": "a"}), tool_call("config_set", setting)]
        ),
        reply("planned"),
    )
    planned = await agent.chat("go", session="s", callbacks=callbacks)
    assert all(c.result.startswith("[Plan mode]") for c in planned.tool_calls)
    assert list(seen.iterdir()) == [] and inbox.requests == []  # plan mode acts before hooks

    agent.set_plan_mode("s", False)
    llm.script(
        reply(
            tool_calls=[
                tool_call("read_note"),
                tool_call("config_set", setting),
                tool_call("write_note", {"text": "b"}),
            ]
        ),
        reply("done"),
    )
    task = asyncio.create_task(agent.chat("go", session="s", callbacks=callbacks))
    first = await inbox.wait_for(1)
    agent.answer_approval(first.id, allow=first.tool == "write_note")
    second = await inbox.wait_for(2)
    agent.answer_approval(second.id, allow=second.tool == "write_note")
    result = await task
    requests = {r.tool: r for r in inbox.requests}
    assert set(requests) == {"config_set", "write_note"}  # read_note never got to approval
    assert requests["config_set"].admin_only and not requests["write_note"].admin_only
    assert "agent.max_iterations" in requests["config_set"].summary
    read, config_set, write = result.tool_calls
    assert read.result == "Tool call blocked by a hook: hook says no" and read.blocked
    assert config_set.blocked
    assert config_set.result.startswith("Tool call not approved by an admin: denied")
    assert write.result == "wrote b" and written == ["b"]
    hook_saw = [json.loads(p.read_text())["tool_name"] for p in seen.iterdir()]
    assert sorted(hook_saw) == ["config_set", "read_note", "write_note"]


async def test_a_call_waiting_for_approval_does_not_delay_its_sibling(llm, make_agent, inbox):
    sibling_done = asyncio.Event()

    @tool
    async def quick() -> str:
        """Finish at once."""
        sibling_done.set()
        return "quick done"

    agent = make_agent(
        tools=[write_note, quick],
        overrides={"approval.enable": True, "approval.tools": ["write_note"]},
    )
    llm.script(
        reply(tool_calls=[tool_call("write_note", {"text": "slow"}), tool_call("quick")]),
        reply("both done"),
    )
    task = asyncio.create_task(
        agent.chat("go", session="s", callbacks=Callbacks(request_approval=inbox))
    )
    request = await inbox.wait_for(1)
    await asyncio.wait_for(sibling_done.wait(), 10)  # ran while the approval was pending
    assert agent.approvals.pending("s") == [request] and not task.done()
    agent.answer_approval(session="s", allow=True)
    result = await task
    assert [c.result for c in result.tool_calls] == ["wrote slow", "quick done"]


def approval_agent(make_agent, **overrides):
    return make_agent(
        tools=[write_note],
        overrides={
            "approval.enable": True,
            "approval.tools": ["write_note"],
            "admin.ids": ["root"],
            "config_tool.enable": True,
            "roles.admin_tools": [],  # members may ask for config_set: an admin still approves
            **overrides,
        },
    )


async def test_the_requester_or_an_admin_may_answer_a_stranger_may_not(llm, make_agent, inbox):
    agent = approval_agent(make_agent)
    callbacks = Callbacks(request_approval=inbox)
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "hi   there"})]), reply("ok"))
    task = asyncio.create_task(agent.chat("w", session="g:1", sender="alice", callbacks=callbacks))
    request = await inbox.wait_for(1)
    assert (request.tool, request.requester, request.admin_only) == ("write_note", "alice", False)
    assert request.summary == '{"text": "hi there"}'  # whitespace collapsed
    with pytest.raises(UsageError, match="only the requester or an admin"):
        agent.answer_approval(session="g:1", allow=True, approver="mallory")
    assert agent.approvals.pending("g:1") == [request]  # the stranger's answer did nothing
    agent.answer_approval(session="g:1", allow="允许", approver="alice")
    assert (await task).tool_calls[0].result == "wrote hi   there"

    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "again"})]), reply("ok"))
    task = asyncio.create_task(agent.chat("w", session="g:1", sender="alice", callbacks=callbacks))
    await inbox.wait_for(2)
    agent.answer_approval(session="g:1", allow="拒绝", approver="root")
    denied = (await task).tool_calls[0]
    assert denied.result == "Tool call not approved: denied by root" and written == ["hi   there"]

    verdicts = await oplog_entries(agent, action="tool_approval")
    assert [(e.actor, e.session) for e in verdicts] == [("root", "g:1"), ("alice", "g:1")]
    assert "拒绝" in verdicts[0].detail and "write_note" in verdicts[0].detail
    assert "允许" in verdicts[1].detail


async def test_config_tools_need_an_admin_even_if_the_requester_answers(llm, make_agent, inbox):
    agent = approval_agent(make_agent)
    setting = {"key": "agent.max_iterations", "value": "9"}
    llm.script(reply(tool_calls=[tool_call("config_set", setting)]), reply("saved"))
    task = asyncio.create_task(
        agent.chat("set it", sender="alice", callbacks=Callbacks(request_approval=inbox))
    )
    request = await inbox.wait_for(1)
    assert request.admin_only and request.requester == "alice"
    with pytest.raises(UsageError, match="admin"):
        agent.answer_approval(request.id, allow=True, approver="alice")
    agent.answer_approval(request.id, allow="yes", approver="root")
    call = (await task).tool_calls[0]
    assert not call.blocked and call.result.startswith("Saved agent.max_iterations = 9")


async def test_no_answer_times_out_and_stop_cancels_the_wait(llm, make_agent, inbox):
    agent = approval_agent(make_agent)
    agent.approvals.timeout = 0.3
    callbacks = Callbacks(request_approval=inbox)
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "t"})]), reply("ok"))
    result = await agent.chat("w", session="g:2", sender="bob", callbacks=callbacks)
    assert result.tool_calls[0].result == (
        "Tool call not approved: no answer within 0.3 s, denied automatically"
    )
    agent.approvals.timeout = 30
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "t"})]), reply("never"))
    task = asyncio.create_task(agent.chat("w", session="g:2", sender="bob", callbacks=callbacks))
    await inbox.wait_for(2)
    # A chat session's replies are in the runner's language (zh unless ui.language says).
    assert (await agent.chat("/stop", session="g:2")).text == say("command.stopped", "zh")
    stopped = await task
    assert stopped.status == "stopped" and agent.approvals.pending() == [] and written == []
    assert (await agent.chat("/stop", session="g:2")).text == say("command.nothing_running", "zh")
    actions = [e.detail for e in await oplog_entries(agent, action="tool_approval")]
    assert len(actions) == 1 and "timed out" in actions[0]  # a stop is not audited
