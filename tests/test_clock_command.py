"""``/clock`` typed by users through ``agent.chat``: every sub-command, ownership and admin rules
(``admin.ids``; sender None = the local notebook user = admin), usage texts, nothing lost."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ania_nb.clock.command import ADD_USAGE, HELP
from ania_nb.testing import reply

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

DAILY = "0 9 * * *"
ADMIN, ALICE, BOB = "boss", "alice", "bob"
G1, G2 = "g:1", "g:2"


@pytest.fixture
async def agent(make_agent: Any) -> Any:
    agent = make_agent(overrides={"admin.ids": [ADMIN]})
    await agent.start()
    return agent


async def clock(agent: Any, args: str, session: str = G1, sender: str | None = ALICE) -> str:
    """What ``/clock <args>`` answers (no model involved)."""
    result = await agent.chat(f"/clock {args}".strip(), session=session, sender=sender)
    assert result.status == "success"
    return result.text


def short(ts: float | None) -> str:
    assert ts is not None
    return time.strftime("%m-%d %H:%M", time.localtime(ts))


async def test_help_and_unknown_sub_commands(agent, llm):
    assert await clock(agent, "help") == HELP
    assert await clock(agent, "?") == HELP
    assert await clock(agent, "dance now") == (
        "unknown sub-command 'dance'; /clock help lists the commands"
    )
    assert llm.requests == []  # answered without the model


async def test_add_and_list_in_a_chat(agent, llm):
    assert await clock(agent, "") == (
        "No clock tasks in this chat. Add one with /clock add <cron> | <title> | <content>"
    )
    text = await clock(agent, f"add {DAILY} | standup | remind us | at 9:30")
    [task] = await agent.clock.list()
    assert text == (
        f"created task ID={task.id}, mode=repeat, cron={DAILY}, target={G1}, "
        f"next run {short(task.next_run_at)}"
    )
    # split on the first two bars only; the sender is creator and the one mentioned
    assert (task.title, task.content, task.creator, task.created_by, task.run_once) == (
        "standup",
        "remind us | at 9:30",
        ALICE,
        ALICE,
        False,
    )
    text = await clock(agent, "add  --once\t@every 10m |  | tea", session=G2, sender=BOB)
    once = (await agent.clock.list(target=G2))[0]
    assert text.startswith(f"created task ID={once.id}, mode=once, cron=@every 10m, target={G2}")
    assert once.title == "" and once.run_once

    listing = f"Clock tasks of {G1} (1):\n✅ [{task.id}] standup | repeat | {DAILY} → {G1}"
    assert await clock(agent, "list") == listing
    assert await clock(agent, "") == listing
    assert await clock(agent, "list all") == "admin only"
    assert await clock(agent, "list all", sender=ADMIN) == (
        "All clock tasks (2):\n"
        f"✅ [{task.id}] standup | repeat | {DAILY} → {G1}\n"
        f"✅ [{once.id}] (untitled) | once | @every 10m → {G2}"
    )
    assert await clock(agent, "list mine") == "usage: /clock list [all]"
    assert llm.requests == []


async def test_the_local_user_is_admin_and_creator_user(agent):
    await clock(agent, f"add {DAILY} | t | c", session=G2, sender=ALICE)
    assert (await clock(agent, "list all", session="nb:default", sender=None)).startswith(
        "All clock tasks (1):"
    )
    await clock(agent, f"add {DAILY} | mine | c", session="nb:default", sender=None)
    task = (await agent.clock.list(target="nb:default"))[0]
    assert (task.creator, task.created_by) == ("user", "")
    assert "Creator: local user" in await clock(agent, f"info {task.id}", "nb:default", None)


@pytest.mark.parametrize(
    "args",
    [
        "add",
        f"add {DAILY}",
        f"add {DAILY} | title only",
        f"add {DAILY} | title |   ",
        "add  | title | content",
        "add --once",
    ],
)
async def test_malformed_add_shows_the_usage_and_stores_nothing(agent, args):
    assert await clock(agent, args) == ADD_USAGE
    assert await agent.clock.list() == []


async def test_invalid_schedule_is_refused_with_the_reason(agent):
    text = await clock(agent, "add 0 9 * * | t | c")
    assert text.startswith("Not created: schedule '0 9 * *' has 4 field(s)")
    assert "examples:" in text
    text = await clock(agent, "add @every 0s | t | c")
    assert text.startswith("Not created: ") and "at least 1s" in text
    assert await agent.clock.list() == []


async def test_on_off_del_need_ownership_or_admin(agent):
    await clock(agent, f"add {DAILY} | t | c", session=G1, sender=ALICE)
    [task] = await agent.clock.list()
    refused = (
        f"task {task.id} is not a task of this chat; only an admin may manage other chats' tasks"
    )
    for sub in ("off", "disable", "on", "enable", "del", "delete", "rm", "info"):
        assert await clock(agent, f"{sub} {task.id}", session=G2, sender=BOB) == refused
    assert await clock(agent, f"timeout {task.id} 30", session=G2, sender=BOB) == refused
    assert (await agent.clock.get(task.id)).enabled

    # anyone in the task's own chat may manage it
    text = await clock(agent, f"off {task.id}", session=G1, sender=BOB)
    assert text == f"updated ID={task.id}, state=disabled, mode=repeat, cron={DAILY}"
    now = await agent.clock.get(task.id)
    assert (now.enabled, now.next_run_at, now.updater) == (False, None, BOB)
    assert (await clock(agent, "list")).endswith(f"⏸️ [{task.id}] t | repeat | {DAILY} → {G1}")
    # an admin may manage it from anywhere
    text = await clock(agent, f"enable {task.id}", session=G2, sender=ADMIN)
    now = await agent.clock.get(task.id)
    assert text == (
        f"updated ID={task.id}, state=enabled, mode=repeat, cron={DAILY}, "
        f"next run {short(now.next_run_at)}"
    )
    assert await clock(agent, f"rm {task.id}", session=G2, sender=ADMIN) == (
        f"deleted task ID={task.id} (t)"
    )
    assert await agent.clock.list() == []


@pytest.mark.parametrize("sub", ["del", "on", "off", "info", "run"])
async def test_id_commands_explain_a_missing_or_unknown_id(agent, sub):
    assert await clock(agent, sub, sender=ADMIN) == f"usage: /clock {sub} <id>"
    assert await clock(agent, f"{sub} a b", sender=ADMIN) == f"usage: /clock {sub} <id>"
    assert await clock(agent, f"{sub} zz", sender=ADMIN) == (
        "no clock task with id 'zz'; /clock list shows this chat's tasks"
    )


async def test_timeout(agent):
    await clock(agent, f"add {DAILY} | t | c")
    [task] = await agent.clock.list()
    assert await clock(agent, f"timeout {task.id} 45") == f"updated ID={task.id}, timeout=45s"
    assert (await agent.clock.get(task.id)).timeout == 45
    assert await clock(agent, f"timeout {task.id} 5000") == f"updated ID={task.id}, timeout=1800s"
    assert await clock(agent, f"timeout {task.id} 0") == (
        f"updated ID={task.id}, timeout=the default (120s)"
    )
    usage = "usage: /clock timeout <id> <seconds> (a whole number ≥ 0; 0 = the default)"
    for bad in (f"timeout {task.id} -5", f"timeout {task.id} 1.5", f"timeout {task.id}", "timeout"):
        assert await clock(agent, bad) == usage
    assert (await agent.clock.get(task.id)).timeout == 0
    assert await clock(agent, "timeout zz 5") == (
        "no clock task with id 'zz'; /clock list shows this chat's tasks"
    )


async def test_run_is_admin_only_and_info_shows_the_last_five_runs(agent, llm):
    await clock(agent, f"add --once {DAILY} | report | write the report")
    [task] = await agent.clock.list()
    assert await clock(agent, f"run {task.id}") == "admin only"
    assert llm.requests == []
    for i in range(6):
        llm.script(reply(f"report {i}"))
        text = await clock(agent, f"run {task.id}", session=G2, sender=ADMIN)
        entry = (await agent.clock.logs(task_id=task.id, limit=1))[0]
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(entry.started_at))
        assert text == (
            f"ran task ID={task.id}:\n"
            f"- {stamp} [success] {entry.duration_ms}ms report {entry.total_tokens}tok"
        )
    assert "【定时任务】report\nwrite the report" in llm.requests[-1].messages[-1]["content"]
    assert (await agent.clock.get(task.id)) is not None  # a manual run keeps a run-once task

    info = await clock(agent, f"info {task.id}")
    detail, runs = info.split("\n\n")
    assert detail.splitlines()[:3] == [f"ID: {task.id}", "State: enabled", "Mode: once"]
    assert "Creator: alice" in detail and "Mentions: alice" in detail
    assert "Last run: " in detail and "(success)" in detail
    lines = runs.splitlines()
    assert lines[0] == "Latest runs (5, newest first)" + ":"
    assert len(lines) == 6 and all("[success]" in line for line in lines[1:])


async def test_log_admin_sees_every_chat_others_their_own(agent, llm):
    assert await clock(agent, "log") == "No clock runs here yet."
    await clock(agent, f"add {DAILY} | one | c", session=G1)
    await clock(agent, f"add {DAILY} | two | c", session=G2, sender=BOB)
    one, two = await agent.clock.list()
    for task in (one, two, one, two):
        llm.script(reply("done"))
        await clock(agent, f"run {task.id}", sender=ADMIN)

    mine = (await clock(agent, "log")).splitlines()
    assert mine[0] == f"Clock runs of {G1} (2, newest first):"
    assert all(line.endswith("tok") and " one " in line for line in mine[1:])
    everything = (await clock(agent, "log", sender=ADMIN)).splitlines()
    assert everything[0] == "Clock runs (4, newest first):"
    assert [" two " in line for line in everything[1:]] == [True, False, True, False]
    assert len((await clock(agent, "log 1", sender=ADMIN)).splitlines()) == 2
    usage = "usage: /clock log [n] (n a whole number from 1 to 100)"
    for bad in ("log 0", "log x", "log 101", "log 1 2"):
        assert await clock(agent, bad) == usage


async def test_clock_not_enabled(make_agent, llm):
    agent = make_agent(overrides={"clock.enable": False})
    for args in ("", "list", "help", f"add {DAILY} | t | c"):
        assert await clock(agent, args, sender=None) == "clock not enabled"
    assert llm.requests == []
