"""clock_* tools called by the model (scripted server, real Agent and store): texts, ownership,
errors that change nothing, updates that change only the fields given."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ania_nb.clock.model import DuplicateTaskError
from ania_nb.clock.tools import OWNERSHIP_ERROR
from ania_nb.testing import reply, tool_call

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

DAILY = "0 9 * * *"  # never fires during a test run of a few seconds (unless at 09:00 sharp)


def short(ts: float | None) -> str:
    assert ts is not None
    return time.strftime("%m-%d %H:%M", time.localtime(ts))


async def call(agent: Any, llm: Any, session: str, name: str, args: dict | None = None) -> str:
    """The model calls one tool in ``session``; returns the tool message the model got back."""
    llm.script(reply(tool_calls=[tool_call(name, args or {})]), reply("ok"))
    await agent.chat(f"please use {name}", session=session)
    message = llm.requests[-1].messages[-1]
    assert message["role"] == "tool"
    return message["content"]


@pytest.fixture
async def agent(make_agent: Any) -> Any:
    agent = make_agent(overrides={"agent.builtin_tools": True})  # clock_* are built-in tools
    await agent.start()
    return agent


async def test_create_list_get_delete_through_the_model(agent, llm):
    text = await call(
        agent,
        llm,
        "nb:a",
        "clock_create",
        {"cron": DAILY, "title": "morning news", "content": "summarise the news", "note": "short"},
    )
    [task] = await agent.clock.list()
    assert text == (
        f"created task ID={task.id}, mode=repeat, cron={DAILY}, target=nb:a, "
        f"next run {short(task.next_run_at)}"
    )
    assert (task.target, task.creator, task.enabled, task.run_once, task.note) == (
        "nb:a",
        "ai",
        True,
        False,
        "short",
    )

    once = await call(
        agent,
        llm,
        "nb:a",
        "clock_create",
        {
            "cron": "@every 1h",
            "title": "a very long title indeed",
            "content": "x",
            "target": "nb:a",
            "run_once": True,
            "timeout_sec": 30,
        },
    )
    second = (await agent.clock.list())[1]
    assert once.startswith(f"created task ID={second.id}, mode=once, cron=@every 1h, target=nb:a")
    assert second.timeout == 30

    listed = await call(agent, llm, "nb:a", "clock_list")
    assert listed == (
        "Clock tasks of nb:a (2):\n"
        f"✅ [{task.id}] morning news | repeat | {DAILY} → nb:a\n"
        f"✅ [{second.id}] a very long… | once | @every 1h → nb:a"  # 12 characters and "…"
    )

    detail = await call(agent, llm, "nb:a", "clock_get", {"id": task.id})
    lines = detail.splitlines()
    assert lines[:8] == [
        f"ID: {task.id}",
        "State: enabled",
        "Mode: repeat",
        f"Schedule: {DAILY}",
        "Title: morning news",
        "Content: summarise the news",
        "Target: nb:a",
        "Timeout: default (120s)",
    ]
    assert "Note: short" in lines and "Creator: AI" in lines
    assert f"Next run: {time.strftime('%Y-%m-%d %H:%M', time.localtime(task.next_run_at))}" in lines
    assert "Last run: -" in lines

    gone = await call(agent, llm, "nb:a", "clock_delete", {"id": second.id})
    assert gone == f"deleted task ID={second.id} (a very long title indeed)"
    assert [t.id for t in await agent.clock.list()] == [task.id]


async def test_descriptions_are_the_same_in_every_session_and_parameters_are_typed(agent, llm):
    await call(agent, llm, "g:qq:42", "clock_list")
    tools = {t["function"]["name"]: t["function"] for t in llm.requests[0].tools}
    assert {n for n in tools if n.startswith("clock_")} == {
        "clock_create",
        "clock_list",
        "clock_get",
        "clock_update",
        "clock_delete",
        "clock_log",
    }
    for name in ("clock_create", "clock_list", "clock_get", "clock_update", "clock_delete"):
        assert "Scope: the tasks of the current chat only." in tools[name]["description"]
        assert "qq:42" not in tools[name]["description"]  # the scope is known at call time
    create = tools["clock_create"]["parameters"]
    assert sorted(create["required"]) == ["content", "title"]  # cron, or after for once
    assert create["properties"]["run_once"]["type"] == "boolean"
    assert create["properties"]["timeout_sec"]["type"] == "number"
    assert tools["clock_update"]["parameters"]["required"] == ["id"]
    assert tools["clock_log"]["parameters"]["properties"]["limit"]["type"] == "integer"
    listed = await call(agent, llm, "f:tg:7", "clock_list")
    assert listed == "No clock tasks for f:tg:7 yet."  # the result names the scope
    assert llm.requests[-1].tools == llm.requests[0].tools  # byte for byte: prompt caching


async def test_tasks_of_another_session_are_out_of_reach(agent, llm):
    theirs = await agent.clock.create(cron=DAILY, title="theirs", content="c", target="nb:b")
    mine = await agent.clock.create(cron=DAILY, title="mine", content="c", target="nb:a")
    attempts = [
        ("clock_get", {"id": theirs.id}),
        ("clock_update", {"id": theirs.id, "title": "hijacked"}),
        ("clock_update", {"id": mine.id, "target": "nb:b"}),
        ("clock_delete", {"id": theirs.id}),
        ("clock_log", {"task_id": theirs.id}),
        ("clock_list", {"target": "nb:b"}),
        ("clock_create", {"cron": DAILY, "title": "t", "content": "c", "target": "nb:b"}),
    ]
    for name, args in attempts:
        text = await call(agent, llm, "nb:a", name, args)
        assert text.startswith("Error executing tool: "), (name, text)
        assert OWNERSHIP_ERROR in text, (name, text)
    assert [(t.id, t.title, t.target) for t in await agent.clock.list()] == [
        (theirs.id, "theirs", "nb:b"),
        (mine.id, "mine", "nb:a"),
    ]
    listed = await call(agent, llm, "nb:a", "clock_list")
    assert "mine" in listed and "theirs" not in listed
    assert await call(agent, llm, "nb:c", "clock_list") == "No clock tasks for nb:c yet."


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            {"cron": "0 9 * *", "title": "t", "content": "c"},
            "has 4 field(s); a cron schedule has 5",
        ),
        ({"cron": "@every soon", "title": "t", "content": "c"}, "is not a duration"),
        ({"cron": "61 * * * *", "title": "t", "content": "c"}, "invalid cron schedule"),
        ({"cron": DAILY, "title": "t", "content": "  \n"}, "content must not be blank"),
        ({"cron": DAILY, "title": "t", "content": "c", "timeout_sec": -1}, "timeout must be"),
        # Whom a task mentions is the real sender's, never the model's to say.
        (
            {"cron": DAILY, "title": "t", "content": "c", "created_by": "qq:all"},
            "unknown argument 'created_by'",
        ),
        ({"cron": DAILY, "title": "t"}, "field 'content' is required"),
    ],
)
async def test_bad_creations_are_refused_clearly_and_store_nothing(agent, llm, args, error):
    text = await call(agent, llm, "nb:a", "clock_create", args)
    assert text.startswith("Error executing tool: ") and error in text
    assert await agent.clock.list() == []


async def test_updates_change_only_the_fields_given(agent, llm):
    task = await agent.clock.create(
        cron=DAILY,
        title="old",
        content="do it",
        target="nb:a",
        note="n",
        timeout=60,
        created_by="qq:5",
    )
    text = await call(agent, llm, "nb:a", "clock_update", {"id": task.id, "title": "new"})
    now = await agent.clock.get(task.id)
    assert text == (
        f"updated ID={task.id}, state=enabled, mode=repeat, cron={DAILY}, "
        f"next run {short(now.next_run_at)}"
    )
    assert (now.title, now.content, now.note, now.timeout, now.created_by, now.updater) == (
        "new",
        "do it",
        "n",
        60,
        "qq:5",
        "ai",
    )

    args = {"id": task.id, "enabled": False, "timeout_sec": 0, "run_once": True}
    text = await call(agent, llm, "nb:a", "clock_update", args)
    assert text == f"updated ID={task.id}, state=disabled, mode=once, cron={DAILY}"
    now = await agent.clock.get(task.id)
    assert (now.enabled, now.next_run_at, now.created_by, now.timeout, now.title) == (
        False,
        None,
        "qq:5",
        0,
        "new",
    )

    text = await call(
        agent, llm, "nb:a", "clock_update", {"id": task.id, "cron": "@every 2h", "enabled": True}
    )
    now = await agent.clock.get(task.id)
    assert text.startswith(f"updated ID={task.id}, state=enabled, mode=once, cron=@every 2h")
    assert now.next_run_at is not None


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"cron": "every day"}, "has 2 field(s)"),
        ({"content": " "}, "content must not be blank"),
        ({"created_by": "qq:all"}, "unknown argument 'created_by'"),
        ({"timeout_sec": -5}, "timeout must be"),
        ({}, "nothing to change"),
        ({"enabled": "maybe"}, "field 'enabled'"),
    ],
)
async def test_bad_updates_are_refused_and_keep_the_task(agent, llm, args, error):
    task = await agent.clock.create(cron=DAILY, title="t", content="c", target="nb:a")
    text = await call(agent, llm, "nb:a", "clock_update", {"id": task.id, **args})
    assert text.startswith("Error executing tool: ") and error in text
    now = await agent.clock.get(task.id)
    assert (now.cron, now.content, now.enabled, now.timeout, now.updated_at) == (
        DAILY,
        "c",
        True,
        0,
        task.updated_at,
    )


@pytest.mark.parametrize("name", ["clock_get", "clock_update", "clock_delete"])
async def test_unknown_ids_get_a_clear_error(agent, llm, name):
    args = {"id": "zz"} if name != "clock_update" else {"id": "zz", "title": "x"}
    text = await call(agent, llm, "nb:a", name, args)
    assert text == (
        "Error executing tool: no clock task with id 'zz'; clock_list shows this session's tasks"
    )


async def test_log_shows_this_sessions_runs_only(agent, llm):
    mine = await agent.clock.create(cron=DAILY, title="mine", content="c", target="nb:a")
    theirs = await agent.clock.create(cron=DAILY, title="theirs", content="c", target="nb:b")
    assert await call(agent, llm, "nb:a", "clock_log") == "No clock runs of nb:a yet."
    for task in (mine, theirs, mine):
        llm.script(reply("done"))
        assert (await agent.clock.run_now(task.id)).status == "success"

    text = await call(agent, llm, "nb:a", "clock_log")
    lines = text.splitlines()
    assert lines[0] == "Clock runs of nb:a (2, newest first):"
    entries = await agent.clock.logs(target="nb:a")
    for line, entry in zip(lines[1:], entries, strict=True):
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(entry.started_at))
        assert line == (f"- {stamp} [success] {entry.duration_ms}ms mine {entry.total_tokens}tok")

    one = await call(agent, llm, "nb:a", "clock_log", {"task_id": mine.id, "limit": 1})
    assert one.splitlines()[0] == f"Clock runs of task {mine.id} (1, newest first):"
    bad = await call(agent, llm, "nb:a", "clock_log", {"limit": 0})
    assert "field 'limit'" in bad


async def test_plan_mode_blocks_changes_but_not_reading(agent, llm):
    task = await agent.clock.create(cron=DAILY, title="t", content="c", target="nb:a")
    agent.set_plan_mode("nb:a", True)
    for name, args in [
        ("clock_create", {"cron": DAILY, "title": "t", "content": "c"}),
        ("clock_update", {"id": task.id, "enabled": False}),
        ("clock_delete", {"id": task.id}),
    ]:
        text = await call(agent, llm, "nb:a", name, args)
        assert text.startswith(f"[Plan mode] the tool {name} was blocked")
    assert (await call(agent, llm, "nb:a", "clock_get", {"id": task.id})).startswith("ID: ")
    assert [(t.id, t.enabled) for t in await agent.clock.list()] == [(task.id, True)]


async def test_no_clock_tools_when_the_clock_or_the_built_ins_are_off(make_agent, llm):
    on = make_agent(overrides={"agent.builtin_tools": True})
    off = make_agent(overrides={"clock.enable": False, "agent.builtin_tools": True})
    bare = make_agent(overrides={"agent.builtin_tools": False}, data_dir=off.data_dir.parent / "b")
    for agent in (on, off, bare):
        llm.script(reply("hi"))
        await agent.chat("hello", session="nb:a")
    sent = [{t["function"]["name"] for t in r.tools or []} for r in llm.requests]
    assert [sorted(n for n in names if n.startswith("clock_")) != [] for names in sent] == [
        True,
        False,
        False,
    ]
    assert not {n for n in sent[2] if n.startswith(("subagent_", "team_", "todo_"))}


# ------------------------------------------------------------------ one request, one task (#36)

REMIND = {"cron": "@every 1m", "title": "stretch", "content": "remind me to stretch"}


async def test_one_request_calling_clock_create_twenty_times_makes_one_task(agent, llm):
    """A 1.5B model called clock_create 7 times for one reminder; each result named a new id."""
    same = [tool_call("clock_create", REMIND) for _ in range(10)]
    llm.script(
        reply(tool_calls=same),  # ten in one round, run in parallel
        *[reply(tool_calls=[tool_call("clock_create", REMIND)]) for _ in range(10)],
        reply("I will remind you."),
    )
    result = await agent.chat("Remind me in 1 minute to stretch", session="nb:a")
    [task] = await agent.clock.list()
    assert result.ok and len(result.tool_calls) == 20
    texts = [c.result for c in result.tool_calls]
    assert sum(t.startswith(f"created task ID={task.id}") for t in texts) == 1
    assert all(
        t.startswith((f"created task ID={task.id}", f"task ID={task.id} already exists", "Not run"))
        for t in texts
    )  # never a second id


async def test_the_same_task_is_not_created_twice_and_a_different_one_is(agent, llm):
    first = await agent.clock.create(target="nb:a", **REMIND)
    with pytest.raises(DuplicateTaskError) as refused:  # /clock add and the API alike
        await agent.clock.create(target="nb:a", **{**REMIND, "title": " stretch "})
    assert refused.value.task == first and f"task ID={first.id}" in str(refused.value)
    await agent.clock.create(target="nb:b", **REMIND)  # another chat's own task
    await agent.clock.create(target="nb:a", **{**REMIND, "cron": "@every 2m"})
    await agent.clock.create(target="nb:a", **{**REMIND, "content": "drink water"})
    await agent.clock.create(target="nb:a", run_once=True, **REMIND)  # once is another task
    assert len(await agent.clock.list()) == 5
    text = await call(agent, llm, "nb:a", "clock_create", REMIND)
    assert text.startswith(f"task ID={first.id} already exists with this schedule")
    assert text.endswith("not created again")


async def test_in_n_minutes_is_a_run_once_task(agent, llm):
    text = await call(agent, llm, "nb:a", "clock_create", {**REMIND, "cron": "", "after": "1m"})
    [task] = await agent.clock.list()
    assert (task.cron, task.run_once) == ("@every 1m", True)
    assert text.startswith(f"created task ID={task.id}, mode=once, cron=@every 1m")
    both = await call(agent, llm, "nb:a", "clock_create", {**REMIND, "after": "1m"})
    assert "either cron" in both
    neither = await call(agent, llm, "nb:a", "clock_create", {**REMIND, "cron": ""})
    assert "give cron for a repeating task" in neither
    assert len(await agent.clock.list()) == 1


async def test_a_clock_run_cannot_create_clock_tasks(agent, llm):
    """A fired task's run has the clock tools: it must not make the tasks multiply."""
    task = await agent.clock.create(target="nb:a", **REMIND)
    others = [tool_call("clock_create", {**REMIND, "title": f"t{n}"}) for n in range(20)]
    llm.script(reply(tool_calls=others), reply("stretch now!"))
    entry = await agent.clock.run_now(task.id)
    assert entry.status == "success" and entry.reply == "stretch now!"
    assert [t.id for t in await agent.clock.list()] == [task.id]
    refused = [c.result for c in entry.tool_calls]
    assert len(refused) == 20
    assert all("clock.max_tasks_per_run = 0" in r for r in refused), refused[0]


async def test_a_clock_run_may_create_up_to_its_cap(make_agent, llm):
    agent = make_agent(overrides={"agent.builtin_tools": True, "clock.max_tasks_per_run": 2})
    task = await agent.clock.create(target="nb:a", **REMIND)
    others = [tool_call("clock_create", {**REMIND, "title": f"t{n}"}) for n in range(5)]
    llm.script(reply(tool_calls=others), reply("done"))
    entry = await agent.clock.run_now(task.id)
    assert len(await agent.clock.list()) == 3  # the task and two of its run's
    outcomes = [c.result.startswith("created task") for c in entry.tool_calls]
    assert sum(outcomes) == 2


async def test_the_subagents_of_a_clock_run_do_not_see_clock_create(agent, llm):
    task = await agent.clock.create(target="nb:a", **REMIND)
    llm.script(
        reply(tool_calls=[tool_call("subagent_run", {"task": "look around"})]),
        reply("started"),
    )

    def is_child(request: Any) -> bool:  # its task is its first user message
        return "look around" in str(request.messages[1].get("content"))

    llm.route(is_child, reply("child done"))
    llm.script(reply("all done"))
    entry = await agent.clock.run_now(task.id)
    assert entry.status == "success"
    [child] = [r for r in llm.requests if is_child(r)]
    names = {t["function"]["name"] for t in child.tools or []}
    assert "clock_create" not in names
    assert "clock_list" in names  # the rest of the clock tools stay
