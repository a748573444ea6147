"""Knowledge through the Agent: subagents, team members and clock runs get the target's kb and
memory tools; documents and memories survive an Agent restart; auto-inject reaches the model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ania_nb.testing import RecordedRequest, reply, tool_call

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

OVERRIDES = {"agent.builtin_tools": True, "embedding.provider": "none", "team.enable": True}
CHILD = "You are a subagent"
MEMBER = "member of an agent team"  # in every team role's prompt
KNOWLEDGE_TOOLS = {"kb_search", "kb_add", "kb_list", "kb_delete", "memory_save"}


def tools_of(request: RecordedRequest) -> set[str]:
    return set(request.tool_names)


def last_tool_result(request: RecordedRequest) -> str:
    message = request.messages[-1]
    assert message["role"] == "tool"
    return str(message["content"])


async def test_a_subagent_searches_its_parents_session(make_agent: Any, llm: Any) -> None:
    agent = make_agent(overrides=OVERRIDES)
    await agent.knowledge.kb.add("g:1", "Deploy", "run make deploy from the repository root")
    await agent.knowledge.kb.add("g:2", "Other group", "make deploy is forbidden here")
    llm.route(
        CHILD,
        reply(tool_calls=[tool_call("kb_search", {"query": "make deploy"})]),
        reply("child: run make deploy"),
    )
    llm.script(
        reply(tool_calls=[tool_call("subagent_run", {"task": "find how to deploy"})]),
        reply("parent done"),
    )
    result = await agent.chat("how do we deploy?", session="g:1")
    assert result.text == "parent done"
    child = [r for r in llm.requests if CHILD in r.system]
    assert tools_of(child[0]) >= KNOWLEDGE_TOOLS
    found = last_tool_result(child[1])
    assert '"Deploy" (g:1)' in found and "Other group" not in found


async def test_team_members_get_the_sessions_knowledge_tools(make_agent: Any, llm: Any) -> None:
    agent = make_agent(overrides=OVERRIDES)
    await agent.knowledge.memory.save("g:7", "the release is on Friday")
    llm.route(
        MEMBER,
        reply(tool_calls=[tool_call("memory_search", {"query": "release"})]),
        reply("member: Friday"),
    )
    members = [{"name": "ann", "role": "researcher"}]
    llm.script(
        reply(
            tool_calls=[tool_call("team_run", {"task": "when is the release?", "members": members})]
        ),
        reply("team done"),
    )
    await agent.chat("ask the team", session="g:7")
    member = [r for r in llm.requests if MEMBER in r.system]
    assert len(member) == 2 and tools_of(member[0]) >= KNOWLEDGE_TOOLS
    assert "the release is on Friday" in last_tool_result(member[1])


async def test_clock_runs_get_the_target_sessions_tools(make_agent: Any, llm: Any) -> None:
    agent = make_agent(overrides=OVERRIDES)
    await agent.start()
    await agent.knowledge.kb.add("nb:target", "Standup", "standup is at 9:30 in room 4")
    task = await agent.clock.create(
        cron="@daily", title="remind", content="when is standup?", target="nb:target"
    )
    llm.script(
        reply(tool_calls=[tool_call("kb_search", {"query": "standup"})]),
        reply("standup at 9:30"),
    )
    entry = await agent.clock.run_now(task.id)
    assert entry.status == "success"
    assert tools_of(llm.requests[0]) >= KNOWLEDGE_TOOLS
    assert "room 4" in last_tool_result(llm.requests[1])


async def test_knowledge_survives_an_agent_restart(
    make_agent: Any, llm: Any, tmp_path: Any
) -> None:
    first = make_agent(overrides=OVERRIDES, data_dir=tmp_path / "d")
    llm.script(
        reply(
            tool_calls=[tool_call("kb_add", {"title": "Wifi", "content": "password is hunter2"})]
        ),
        reply(tool_calls=[tool_call("memory_save", {"content": "prefers tea"})]),
        reply("saved"),
    )
    await first.chat("remember these", session="f:1")
    await first.aclose()
    second = make_agent(overrides=OVERRIDES, data_dir=tmp_path / "d")
    llm.script(
        reply(tool_calls=[tool_call("kb_list", {}), tool_call("memory_search", {})]),
        reply("listed"),
    )
    await second.chat("what do you know?", session="f:1")
    tool_messages = [m for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert "Wifi" in tool_messages[0]["content"]
    assert "prefers tea" in tool_messages[1]["content"]


async def test_auto_inject_reaches_the_model_and_the_event_stream(
    make_agent: Any, llm: Any
) -> None:
    from ania_nb.engine.callbacks import Callbacks

    agent = make_agent(overrides=OVERRIDES)
    doc = (
        await agent.knowledge.kb.add("nb:a", "Parking", "visitor parking is on level B2")
    ).document
    events: list[Any] = []
    llm.script(reply("level B2"))
    await agent.chat(
        "where is visitor parking?", session="nb:a", callbacks=Callbacks(on_event=events.append)
    )
    sent = llm.requests[-1].messages[-1]["content"]
    text = sent if isinstance(sent, str) else json.dumps(sent, ensure_ascii=False)
    assert "【知识库】" in text and "visitor parking is on level B2" in text
    kinds = [e.kind for e in events]
    assert kinds.index("knowledge") == kinds.index("run_start") + 1
    knowledge = next(e for e in events if e.kind == "knowledge")
    assert knowledge.data["chunks"][0]["doc_id"] == doc.id
    stored = await agent.history("nb:a")
    assert all("【知识库】" not in json.dumps(m, ensure_ascii=False) for m in stored)
    llm.script(reply("nothing"))
    events.clear()
    await agent.chat(
        "tell me a joke about penguins", session="nb:a", callbacks=Callbacks(on_event=events.append)
    )
    assert "knowledge" not in [e.kind for e in events]
    assert "【知识库】" not in json.dumps(llm.requests[-1].messages[-1], ensure_ascii=False)
