"""Issue 27, items 2 and 6 through the model: clock_create and clock_update on the scripted server.

Whom a task mentions is the real sender of the run that created it, never a model argument; a
non-admin's tasks are held to ``clock.max_tasks_per_chat`` and ``clock.min_interval`` (admins,
and the notebook's local user, are exempt; a clock run is nobody's and is held to them too).
``/clock`` is played through ``ania-nb serve`` in test_chat_serve.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from ania_nb.clock.schedule import parse_schedule, shortest_gap
from ania_nb.testing import reply, tool_call

ADMIN, MEMBER = "qq:999", "qq:5"
GROUP = "g:77"
HOURLY = "@every 1h"


@pytest.fixture
async def agent(make_agent: Any) -> Any:
    agent = make_agent(
        overrides={
            "agent.builtin_tools": True,
            "admin.ids": [ADMIN],
            "clock.max_tasks_per_chat": 3,
            "clock.min_interval": 120,
        }
    )
    await agent.start()
    return agent


async def call(
    agent: Any, llm: Any, name: str, args: dict[str, Any], sender: str | None = MEMBER
) -> str:
    """``sender`` asks; the model calls ``name``; the tool result the model got back."""
    llm.script(reply(tool_calls=[tool_call(name, args)]), reply("ok"))
    await agent.chat(f"please use {name}", session=GROUP, sender=sender)
    message = llm.requests[-1].messages[-1]
    assert message["role"] == "tool"
    return str(message["content"])


def create(cron: str, **more: Any) -> dict[str, Any]:
    return {"cron": cron, "title": "t", "content": "say hi", **more}


async def test_the_creator_is_the_real_sender_and_no_argument_can_say_otherwise(agent, llm):
    schema = None
    refused = await call(agent, llm, "clock_create", create(HOURLY, created_by="qq:all"))
    for offered in llm.requests[-2].tools:
        if offered["function"]["name"] in ("clock_create", "clock_update"):
            schema = offered["function"]["parameters"]["properties"]
            assert "created_by" not in schema
    assert schema is not None
    assert "unknown argument 'created_by'" in refused and await agent.clock.list() == []
    await call(agent, llm, "clock_create", create(HOURLY))
    [task] = await agent.clock.list()
    assert (task.created_by, task.creator) == (MEMBER, "ai")
    refused = await call(agent, llm, "clock_update", {"id": task.id, "created_by": "qq:all"})
    assert "unknown argument 'created_by'" in refused
    assert (await agent.clock.get(task.id)).created_by == MEMBER


async def test_a_member_is_held_to_the_interval_an_admin_is_not(agent, llm):
    for fast in ("@every 1s", "@every 119s", "*/1 * * * *", "0-59/1 9 * * *"):
        text = await call(agent, llm, "clock_create", create(fast))
        assert text.startswith("Error executing tool: "), fast
        assert "clock.min_interval = 120" in text and "at most once every 2m0s" in text, text
    assert await agent.clock.list() == []
    # Run-once tasks are exempt; so is a slow enough schedule.
    once = await call(agent, llm, "clock_create", create("@every 1s", run_once=True))
    assert "created task" in once
    assert "created task" in await call(agent, llm, "clock_create", create("*/2 * * * *"))
    admin = await call(agent, llm, "clock_create", create("@every 5s"), sender=ADMIN)
    assert "created task" in admin and "@every 5s" in admin
    fast = next(t for t in await agent.clock.list() if t.cron == "@every 5s")
    await agent.clock.delete(fast.id)  # it would fire during the test


async def test_updates_that_speed_a_task_up_are_refused_for_a_member(agent, llm):
    await call(agent, llm, "clock_create", create("@every 1s", run_once=True))
    await call(agent, llm, "clock_create", create(HOURLY))
    once, hourly = await agent.clock.list()
    for task, change in ((hourly, {"cron": "@every 10s"}), (once, {"run_once": False})):
        text = await call(agent, llm, "clock_update", {"id": task.id, **change})
        assert "clock.min_interval = 120" in text, text
    await agent.clock.update(hourly.id, enabled=False)
    await agent.clock.update(hourly.id, cron="@every 10s")  # an admin's (API) change
    text = await call(agent, llm, "clock_update", {"id": hourly.id, "enabled": True})
    assert "clock.min_interval = 120" in text  # re-enabling a fast task is speeding it up
    assert [(t.cron, t.run_once, t.enabled) for t in await agent.clock.list()] == [
        ("@every 1s", True, True),
        ("@every 10s", False, False),
    ]
    assert "updated" in await call(agent, llm, "clock_update", {"id": hourly.id, "title": "x"})


async def test_a_member_is_held_to_the_tasks_per_chat_an_admin_is_not(agent, llm):
    for n in range(3):  # three different tasks (the same one twice is not created again)
        once = await call(agent, llm, "clock_create", create(HOURLY, run_once=True, title=f"{n}"))
        assert "created task" in once
    text = await call(agent, llm, "clock_create", create(HOURLY))
    assert "g:77 has 3 clock tasks" in text and "clock.max_tasks_per_chat = 3" in text, text
    assert len(await agent.clock.list(target=GROUP)) == 3
    assert "created task" in await call(agent, llm, "clock_create", create(HOURLY), sender=ADMIN)
    # Other chats have room of their own.
    await agent.chat("/clock add @every 1h | t | c", session="g:78", sender=MEMBER)
    assert len(await agent.clock.list(target="g:78")) == 1
    assert len(await agent.clock.list(target=GROUP)) == 4


async def test_a_run_answering_a_member_and_an_admin_together_is_limited(agent, llm):
    from ania_nb.clock.tools import limited
    from ania_nb.tools import ToolContext

    clock = agent.clock
    assert not limited(clock, ToolContext(sender=None))  # the notebook's local user
    assert not limited(clock, ToolContext(sender=ADMIN, requesters=(ADMIN,)))
    assert limited(clock, ToolContext(sender=ADMIN, requesters=(MEMBER, ADMIN)))
    assert limited(clock, ToolContext(sender=None, admin_only_approval=True))  # a one-shot run


async def test_a_clock_run_cannot_create_fast_tasks(agent, llm):
    task = await agent.clock.create(
        cron=HOURLY, title="breed", content="create more tasks", target=GROUP, created_by=ADMIN
    )
    # By default a clock run creates no task at all; allowed one, it is held to the limits.
    for allowed, refusal in ((0, "clock.max_tasks_per_run = 0"), (1, "clock.min_interval = 120")):
        agent.config.clock.max_tasks_per_run = allowed
        llm.route(
            "You are running a scheduled task",  # the clock run's system prompt
            reply(tool_calls=[tool_call("clock_create", create("@every 1s"))]),
            reply("tried"),
        )
        entry = await agent.clock.run_now(task.id)
        assert entry.status == "success"
        [made] = entry.tool_calls
        assert refusal in made.result
        assert [t.id for t in await agent.clock.list()] == [task.id]


def test_shortest_gap_of_schedules() -> None:
    assert shortest_gap(parse_schedule("@every 90s")) == 90
    assert shortest_gap(parse_schedule("*/15 * * * *")) == 900
    assert shortest_gap(parse_schedule("0,1 9 * * *")) == 60
    assert shortest_gap(parse_schedule("55 23 * * *")) == 86400
    # 23:59 then 00:00 the next day: the gap across midnight counts.
    assert shortest_gap(parse_schedule("0,59 0,23 * * *")) == 60
    assert shortest_gap(parse_schedule("0 0 31 2 *")) is None  # never fires


async def test_parallel_creations_in_one_round_cannot_overshoot_the_cap(agent, llm):
    calls = [tool_call("clock_create", create(HOURLY, title=f"t{i}")) for i in range(5)]
    llm.script(reply(tool_calls=calls), reply("ok"))
    await agent.chat("five tasks please", session=GROUP, sender=MEMBER)
    results = [m["content"] for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert sum("created task" in r for r in results) == 3, results
    assert sum("clock.max_tasks_per_chat = 3" in r for r in results) == 2
    assert len(await agent.clock.list(target=GROUP)) == 3
