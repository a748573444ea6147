"""todo_write: validation, full replacement, the deduplicated reminder, live events, persistence."""

from __future__ import annotations

import json

import pytest

from ania_nb import Callbacks, ToolContext
from ania_nb.testing import reply, tool_call

BUILTINS = {"agent.builtin_tools": True}


def item(content: str, status: str = "pending") -> dict:
    return {"content": content, "status": status}


async def write(agent, todos, session: str = "nb:t"):
    executor = agent.session(session).executor
    return await executor.execute(
        "todo_write", json.dumps({"todos": todos}), ToolContext(session=session)
    )


@pytest.mark.parametrize(
    ("todos", "error"),
    [
        ([item(f"t{i}") for i in range(51)], "too many items: 51 (at most 50)"),
        ([item("a"), item("   ")], "item 2: content is empty"),
        (
            [item("a"), item("b"), item("x" * 201)],
            "item 3: content has 201 characters (at most 200)",
        ),
        ([item("a", "done")], "item 1: status 'done' is invalid; use pending, in_progress or"),
        (
            [item("a", "in_progress"), item("b"), item("c", "in_progress")],
            "items 1, 3 are all in_progress; at most one item may be in_progress",
        ),
        ([item("a"), {"content": "b"}], "item 2: status is required"),
        ([{"content": 5, "status": "pending"}], "item 1: content input should be a valid string"),
    ],
)
async def test_each_bad_list_gets_a_specific_error_and_changes_nothing(make_agent, todos, error):
    agent = make_agent(overrides=BUILTINS)
    await agent.start()
    assert (await write(agent, [item("keep me")])).error is None
    outcome = await write(agent, todos)
    assert outcome.error is not None and error in outcome.error
    assert await agent.todos("nb:t") == [
        {"content": "keep me", "status": "pending", "activeForm": ""}
    ]


async def test_full_replacement_limits_and_clearing(make_agent):
    agent = make_agent(overrides=BUILTINS)
    await agent.start()
    fifty = [item(f"{i:03d}" + "x" * 197) for i in range(50)]
    outcome = await write(agent, fifty)
    assert outcome.error is None and outcome.text.startswith("Task list updated: 50 items")
    todos = [
        item("  run tests ", "completed"),
        {"content": "fix bug", "status": "IN_PROGRESS", "activeForm": "Fixing the bug"},
        item("release"),
    ]
    outcome = await write(agent, todos)
    assert outcome.text == (
        "Task list updated: 3 items (1 in progress, 1 pending, 1 completed)\n"
        "1. [completed] run tests\n2. [in progress] fix bug\n3. [pending] release"
    )
    assert [t["content"] for t in await agent.todos("nb:t")] == ["run tests", "fix bug", "release"]
    assert (await agent.todos("nb:t"))[1]["activeForm"] == "Fixing the bug"
    assert (await write(agent, [])).text == "Task list cleared."
    assert await agent.todos("nb:t") == []


def reminder_of(request) -> str | None:
    text = request.messages[-1]["content"]
    if "<todo_reminder>" not in text:
        return None
    return text[text.index("<todo_reminder>") : text.index("</todo_reminder>") + 16]


async def test_reminder_only_when_the_pending_list_changed(llm, make_agent):
    events = []
    agent = make_agent(overrides=BUILTINS)
    callbacks = Callbacks(on_event=events.append)
    first = [item("collect data", "in_progress"), item("plot it")]
    second = [item("collect data", "completed"), item("plot it", "in_progress")]
    llm.script(
        reply(tool_calls=[tool_call("todo_write", {"todos": first})]),  # turn 1
        reply("started"),
        reply("turn 2"),
        reply("turn 3"),
        reply(tool_calls=[tool_call("todo_write", {"todos": second})]),  # turn 4
        reply("progress"),
        reply("turn 5"),
        reply(tool_calls=[tool_call("todo_write", {"todos": []})]),  # turn 6
        reply("all done"),
        reply("turn 7"),
        reply(tool_calls=[tool_call("todo_write", {"todos": second})]),  # turn 8
        reply("again"),
        reply("turn 9"),
    )
    for n in range(1, 10):
        assert (await agent.chat(f"turn {n}", session="nb:t", callbacks=callbacks)).ok
    turn_requests = [r for r in llm.requests if r.messages[-1]["role"] == "user"]
    reminders = [reminder_of(r) for r in turn_requests]
    assert reminders[0] is None
    assert reminders[1] == (
        "<todo_reminder>2 item(s) of the task list are not completed:\n"
        "1. [in progress] collect data\n2. [pending] plot it\n"
        "Update the list with todo_write as soon as an item is done; clear it when everything "
        "is done.</todo_reminder>"
    )
    assert reminders[2] is None and reminders[3] is None  # unchanged: not repeated
    assert "1. [in progress] plot it" in reminders[4] and "collect data" not in reminders[4]
    assert reminders[5] is None and reminders[6] is None  # cleared
    assert reminders[7] is None  # the list was written during turn 8
    assert "1. [in progress] plot it" in reminders[8]  # same list as before, after a reset
    todo_events = [e for e in events if e.kind == "todos"]
    assert [len(e.data["todos"]) for e in todo_events] == [2, 2, 0, 2]
    assert todo_events[0].session == "nb:t" and todo_events[0].data["todos"][0]["content"] == (
        "collect data"
    )


async def test_the_list_survives_a_new_agent_and_is_per_session(llm, make_agent, tmp_path):
    llm.script(
        reply(tool_calls=[tool_call("todo_write", {"todos": [item("ship it", "in_progress")]})]),
        reply("ok"),
    )
    first = make_agent(overrides=BUILTINS, data_dir=tmp_path / "d")
    await first.chat("plan", session="nb:a")
    await first.aclose()
    second = make_agent(overrides=BUILTINS, data_dir=tmp_path / "d")
    assert await second.todos("nb:a") == [
        {"content": "ship it", "status": "in_progress", "activeForm": ""}
    ]
    assert await second.todos("nb:b") == []
    llm.script(reply("resumed"))
    await second.chat("where were we?", session="nb:a")
    assert "1. [in progress] ship it" in reminder_of(llm.requests[-1])


async def test_todo_write_is_a_session_tool_of_main_sessions_only(make_agent):
    agent = make_agent(overrides=BUILTINS)
    assert "todo_write" not in agent.tools  # not shared (subagents build their own executors)
    assert "todo_write" in agent.session("nb:x").executor
    tool = agent.session("nb:x").executor.get("todo_write")
    assert tool.parameters_schema()["required"] == ["todos"]
    off = make_agent(overrides={**BUILTINS, "todo.enable": False})
    assert "todo_write" not in off.session("nb:x").executor
    bare = make_agent()  # agent.builtin_tools off: only the caller's tools
    assert "todo_write" not in bare.session("nb:x").executor
