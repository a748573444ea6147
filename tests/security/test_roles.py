"""Group roles and per-tool permissions; changing shared skills and MCP servers needs an admin.

Issue 27 items 7 and 3, played through the real path: an `Agent` whose model is the scripted
server (what a run was offered is read from the request body the server received), and
``ania-nb serve`` as a subprocess against the OneBot test implementation.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from _waits import until
from mcp_servers.support import stdio_entry
from mcp_servers.support import write_config as write_mcp_config
from test_runner_serve import ADMIN, TOKEN, Serve, to_group, write_config

from ania_nb import Callbacks, UsageError, tool
from ania_nb.agents.subagent import TASK_PREFIX
from ania_nb.catalogue import say
from ania_nb.config import Config, RolesSettings
from ania_nb.errors import ConfigError
from ania_nb.governance.roles import Roles, highest
from ania_nb.testing import ScriptedLLM, reply, tool_call
from ania_nb.testing.onebot import OneBotImpl

ADMIN_TOOLS = {"config_get", "config_set", "config_file_get", "config_file_set"}
SKILL_TOOLS = {"skill_install", "skill_list", "skill_reload", "skill_remove"}
MCP_TOOLS = {"mcp_add", "mcp_list", "mcp_reconnect", "mcp_remove"}
GOOD_MD = "---\nname: {name}\ndescription: {desc}\n---\n# {name}\nSteps.\n"

notes: list[str] = []


@tool(side_effects=True)
def write_note(text: str) -> str:
    """Write a note (the test's trusted tool)."""
    notes.append(text)
    return f"wrote {text}"


@pytest.fixture(autouse=True)
def _fresh_notes():
    notes.clear()


# --- role resolution and tool patterns ---------------------------------------------------------


def test_roles_of_users_and_the_role_each_tool_needs():
    settings = RolesSettings(
        trusted={"g:1": ["qq:7"], "*": ["qq:8"]}, trusted_tools=["kb_*", "write_note"]
    )
    roles = Roles(settings, admins=["qq:1"])
    assert roles.role_of("g:1", None) == "admin"  # the local user (a notebook)
    assert roles.role_of("g:1", "qq:1") == roles.role_of("f:5", "qq:1") == "admin"
    assert roles.role_of("g:1", "qq:7") == "trusted"
    assert roles.role_of("g:2", "qq:7") == "member"  # trusted in g:1 only
    assert roles.role_of("g:2", "qq:8") == roles.role_of("f:9", "qq:8") == "trusted"  # "*"
    assert roles.role_of("g:1", "7") == "member"  # ids are the sender form of admin.ids

    for name in ADMIN_TOOLS | SKILL_TOOLS | MCP_TOOLS:
        assert roles.required(name) == "admin", name
    for name in ("kb_add", "kb_search", "write_note"):
        assert roles.required(name) == "trusted", name
    # Using skills and MCP servers stays open; the lazy loaders are not mcp_add & co.
    for name in ("skill_read", "mcp_discover_demo", "mcp_load_demo", "clock_create", "time"):
        assert roles.required(name) == "member", name
    assert roles.required("Config_set") == "member"  # case-sensitive, like tool names

    assert roles.refusal("member", "kb_add") == (
        "Tool call refused: kb_add needs the trusted role in this chat and this request has "
        "the member role; ask an admin."
    )
    assert roles.refusal("trusted", "kb_add") is None and roles.refusal("admin", "mcp_add") is None
    assert roles.tool_filter("admin") is None
    member = roles.tool_filter("member")
    assert member is not None and member("time") and not member("kb_add")
    assert highest([]) == "member" and highest(["member", "admin", "trusted"]) == "admin"


def test_bad_roles_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="a tool pattern is empty"):
        Config().with_overrides({"roles.admin_tools": ["config_*", " "]})
    with pytest.raises(ConfigError, match="a chat key is empty"):
        Config().with_overrides({"roles.trusted": {" ": ["qq:1"]}})
    with pytest.raises(ConfigError, match="an empty user id in the trusted users of 'g:1'"):
        Config().with_overrides({"roles.trusted": {"g:1": ["qq:1", ""]}})
    assert Config().roles.admin_tools[0] == "config_*" and Config().roles.trusted_tools == []


# --- what a run is offered, and a forced call --------------------------------------------------


def roles_agent(make_agent, tmp_path: Path, **overrides: Any) -> Any:
    return make_agent(
        tools=[write_note],
        overrides={
            "config_tool.enable": True,
            "skills.dir": str(tmp_path / "skills"),
            "skills.self_manage": True,
            "mcp.self_manage": True,
            "mcp.config_file": str(tmp_path / "mcp.json"),
            "admin.ids": ["root"],
            "roles.trusted": {"g:1": ["tina"]},
            "roles.trusted_tools": ["write_note"],
            **overrides,
        },
    )


async def test_a_members_run_is_not_offered_admin_tools_and_a_forced_call_is_refused(
    llm, make_agent, tmp_path, inbox
):
    agent = roles_agent(make_agent, tmp_path)
    callbacks = Callbacks(request_approval=inbox)
    setting = {"key": "agent.max_iterations", "value": "3"}
    llm.script(
        reply(
            tool_calls=[
                tool_call("config_set", setting),
                tool_call("write_note", {"text": "x"}),
                tool_call("skill_remove", {"name": "keeper"}),
            ]
        ),
        reply("done"),
    )
    result = await agent.chat("change it", session="g:1", sender="mallory", callbacks=callbacks)
    offered = set(llm.requests[-1].tool_names)
    assert offered and not offered & (ADMIN_TOOLS | SKILL_TOOLS | MCP_TOOLS | {"write_note"})
    assert "skill_read" in offered
    config_set, note, remove = result.tool_calls
    assert config_set.result == (
        "Tool call refused: config_set needs the admin role in this chat and this request has "
        "the member role; ask an admin."
    )
    assert (config_set.outcome, config_set.stage) == ("blocked", "role")
    assert note.result.startswith("Tool call refused: write_note needs the trusted role")
    assert remove.blocked and remove.stage == "role"
    assert inbox.requests == [] and notes == []  # nobody was asked, nothing ran
    assert agent.config.agent.max_iterations != 3
    [record] = await agent.runs(session="g:1")  # audited like every gate block
    assert [(c.name, c.error) for c in record.tool_calls] == [
        (c.name, c.result) for c in result.tool_calls
    ]

    # The same member in another request: the tools are byte-identical (prompt caching).
    llm.script(reply("hi"))
    await agent.chat("again", session="g:1", sender="mallory")
    assert llm.requests[-1].tools_bytes == llm.requests[0].tools_bytes
    assert llm.requests[-1].tool_names == sorted(llm.requests[-1].tool_names)


async def test_trusted_users_get_trusted_tools_and_admins_get_everything(llm, make_agent, tmp_path):
    agent = roles_agent(make_agent, tmp_path)
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "from tina"})]), reply("ok"))
    result = await agent.chat("note it", session="g:1", sender="tina")
    offered = set(llm.requests[-1].tool_names)
    assert "write_note" in offered and not offered & (ADMIN_TOOLS | SKILL_TOOLS | MCP_TOOLS)
    assert result.tool_calls[0].result == "wrote from tina"

    # tina is trusted in g:1 only.
    llm.script(reply("ok"))
    await agent.chat("hi", session="g:2", sender="tina")
    assert "write_note" not in llm.requests[-1].tool_names

    for session, sender in (("g:1", "root"), ("nb:default", None)):  # an admin; the notebook
        llm.script(reply("ok"))
        await agent.chat("hi", session=session, sender=sender)
        offered = set(llm.requests[-1].tool_names)
        assert ADMIN_TOOLS | SKILL_TOOLS | MCP_TOOLS | {"write_note"} <= offered, sender

    # A batch answers the highest role among its senders: queued between a member's
    # messages, the admin's lifts the run that answers them together.
    held = asyncio.Event()

    @tool
    async def hold() -> str:
        """Wait until the test lets go."""
        await held.wait()
        return "held"

    agent.add_tool(hold)
    llm.script(reply(tool_calls=[tool_call("hold")]), reply("first"), reply("batch"))
    first = asyncio.create_task(agent.chat("one", session="g:3", sender="mallory"))
    await asyncio.to_thread(llm.wait_for_requests, len(llm.requests) + 1, 10)
    own = llm.requests[-1]
    queued = [
        asyncio.create_task(agent.chat(text, session="g:3", sender=who))
        for text, who in (("two", "mallory"), ("three", "root"), ("four", "mallory"))
    ]
    await until(lambda: len(agent.sessions.get("g:3").queue) == 3, "three queued messages")
    held.set()
    await asyncio.gather(first, *queued)
    batch = llm.requests[-1]
    assert "four" in str(batch.messages[-1]["content"])
    assert "config_set" not in own.tool_names  # mallory's own run
    assert "config_set" in batch.tool_names  # the batch with root's message


async def test_mcp_tools_a_member_loads_stay_filtered(llm, make_agent, tmp_path):
    write_mcp_config(tmp_path / "mcp.json", [stdio_entry()])
    agent = roles_agent(
        make_agent, tmp_path, **{"mcp.self_manage": False, "roles.trusted_tools": ["add"]}
    )
    await agent.start()
    llm.script(
        reply(tool_calls=[tool_call("mcp_load_demo", {"tool_names": ["add", "greet"]})]),
        reply(tool_calls=[tool_call("add", {"a": 1, "b": 2})]),
        reply("done"),
    )
    result = await agent.chat("load and add", session="g:1", sender="mallory")
    loaded, added = result.tool_calls
    assert "loaded" in loaded.result
    after_load = llm.requests[1].tool_names
    assert "greet" in after_load and "add" not in after_load  # loaded, but not offered
    assert added.stage == "role" and "add needs the trusted role" in added.result

    llm.script(reply(tool_calls=[tool_call("add", {"a": 1, "b": 2})]), reply("3"))
    result = await agent.chat("add", session="g:1", sender="tina")  # the session has it loaded
    assert "add" in llm.requests[-2].tool_names and result.tool_calls[0].result == "3"


# --- one-shot runs carry the role of whoever started them --------------------------------------


def is_child(request: Any) -> bool:
    """A subagent's request (its task is its first user message)."""
    first = request.messages[1] if len(request.messages) > 1 else {}
    return TASK_PREFIX.strip() in str(first.get("content"))


def is_report(request: Any) -> bool:
    """The reply run to a background subagent's injected result."""
    last = request.messages[-1]
    return last.get("role") == "user" and "[Subagent finished]" in str(last.get("content"))


async def test_a_members_subagents_act_with_the_members_role(llm, make_agent, tmp_path):
    agent = roles_agent(make_agent, tmp_path, **{"agent.builtin_tools": True, "team.enable": True})
    llm.route(is_child, reply(tool_calls=[tool_call("config_get", {})]), reply("could not"))
    llm.script(
        reply(tool_calls=[tool_call("subagent_run", {"task": "read the config"})]),
        reply("done"),
    )
    await agent.chat("delegate", session="g:1", sender="mallory")
    first, second = [r for r in llm.requests if is_child(r)]
    assert "config_get" not in first.tool_names and "time" in first.tool_names
    assert "config_get needs the admin role" in second.messages[-1]["content"]

    # Team members too; an admin's members get the admin's tools.
    for sender, admin in (("mallory", False), ("root", True)):
        llm.route(is_child, reply("member says hi"))
        team = {"task": "look", "members": [{"name": "reader", "role": "reads things"}]}
        llm.script(reply(tool_calls=[tool_call("team_run", team)]), reply("done"))
        seen = len(llm.requests)
        await agent.chat("team up", session="g:1", sender=sender)
        member = next(r for r in llm.requests[seen:] if is_child(r))
        assert ("config_set" in member.tool_names) is admin, sender

    # A background child, and the run that answers its result, act for who started it.
    for session, sender, admin in (("g:1", "mallory", False), ("nb:x", None, True)):
        llm.route(is_child, reply("child result"))
        llm.route(is_report, reply("reported"))
        background = {"task": "look around", "background": True}
        llm.script(reply(tool_calls=[tool_call("subagent_run", background)]), reply("started"))
        seen = len(llm.requests)
        await agent.chat("in the background", session=session, sender=sender)
        reports = 2 if admin else 1  # the notebook's comes second
        await until(lambda n=reports: sum(map(is_report, llm.requests)) == n, "a report", 20)
        child = next(r for r in llm.requests[seen:] if is_child(r))
        report = next(r for r in llm.requests[seen:] if is_report(r))
        assert ("config_set" in child.tool_names) is admin, session
        assert ("config_set" in report.tool_names) is admin, session


async def test_clock_runs_act_with_their_creators_role(llm, make_agent, tmp_path):
    agent = roles_agent(make_agent, tmp_path, **{"agent.builtin_tools": True})
    fired: dict[str, list[str]] = {}

    def answer(request: Any) -> Any:
        for title in ("member-task", "admin-task"):
            if f"【定时任务】{title}" in str(request.messages[-1]["content"]):
                fired[title] = request.tool_names
        return reply("tick")

    llm.responder = answer
    for sender, title in (("mallory", "member-task"), ("root", "admin-task")):
        command = f"/clock add --once @every 1s | {title} | say tick"
        created = await agent.chat(command, session="g:1", sender=sender)
        assert "created" in created.text.lower(), created.text
    await until(lambda: len(fired) == 2, "both clock runs", 30)
    assert "config_set" not in fired["member-task"] and "clock_create" in fired["member-task"]
    assert "config_set" in fired["admin-task"]


async def test_a_member_cannot_change_an_admins_task_or_borrow_an_admin_as_creator(
    llm, make_agent, tmp_path
):
    agent = roles_agent(make_agent, tmp_path, **{"agent.builtin_tools": True})
    task = await agent.clock.create(
        cron="0 9 * * *", title="report", content="summarise", target="g:1", created_by="root"
    )
    llm.script(
        reply(
            tool_calls=[
                tool_call("clock_update", {"id": task.id, "content": "run config_set"}),
                tool_call(
                    "clock_create",
                    {"cron": "@daily", "title": "t", "content": "c", "created_by": "root"},
                ),
                tool_call("clock_create", {"cron": "@daily", "title": "t", "content": "c"}),
            ]
        ),
        reply("done"),
    )
    result = await agent.chat("edit", session="g:1", sender="mallory")
    update, borrowed, own = result.tool_calls
    assert "its creator 'root' has the admin role" in update.result, update.result
    assert borrowed.error and "created_by" in borrowed.result, borrowed.result
    assert "id" in own.result.lower() and not own.error, own.result
    assert (await agent.clock.get(task.id)).content == "summarise"
    assert [t.created_by for t in await agent.clock.list(target="g:1")] == ["root", "mallory"]


async def test_a_members_clock_run_cannot_create_a_task_that_would_run_as_the_local_user(
    llm, make_agent, tmp_path
):
    agent = roles_agent(make_agent, tmp_path, **{"agent.builtin_tools": True})
    results: list[str] = []

    def answer(request: Any) -> Any:
        if request.messages[-1]["role"] == "tool":
            results.append(str(request.messages[-1]["content"]))
            return reply("done")
        call = {"cron": "@daily", "title": "again", "content": "c"}
        return reply(tool_calls=[tool_call("clock_create", call)])

    llm.responder = answer
    created = await agent.chat(
        "/clock add --once @every 1s | spawn | make a task", session="g:1", sender="mallory"
    )
    assert "created" in created.text.lower(), created.text
    await until(lambda: results, "the clock run's clock_create", 30)
    assert "nobody (its runs act as the local user) has the admin role" in results[0], results
    assert [t.title for t in await agent.clock.list(target="g:1")] in ([], ["spawn"])


# --- /plan in a group --------------------------------------------------------------------------


async def test_plan_on_off_in_a_group_is_for_admins_and_trusted_users(make_agent, tmp_path):
    agent = roles_agent(make_agent, tmp_path)
    refused = await agent.chat("/plan on", session="g:1", sender="mallory")
    # Chat sessions answer in the runner's language (zh unless ui.language says).
    assert refused.text == say("command.plan_rank", "zh", action="on")
    assert not agent.plan_mode("g:1")
    assert (await agent.chat("/plan status", session="g:1", sender="mallory")).text == (
        say("plan.is_off", "zh")
    )
    on = say("plan.on", "zh")
    assert (await agent.chat("/plan on", session="g:1", sender="tina")).text == on
    refused = await agent.chat("/plan off", session="g:1", sender="mallory")
    assert refused.text == say("command.plan_rank", "zh", action="off")
    assert agent.plan_mode("g:1")
    off = say("plan.off", "zh")
    assert (await agent.chat("/plan off", session="g:1", sender="root")).text == off
    # A private chat is the sender's own.
    assert (await agent.chat("/plan on", session="f:5", sender="mallory")).text == on


# --- item 3: removing or replacing skills and MCP servers needs an admin -----------------------


def open_agent(make_agent, tmp_path: Path, **overrides: Any) -> Any:
    """An operator who lets members ask for every tool: what is left is the admin's approval."""
    skills = tmp_path / "skills"
    (skills / "keeper").mkdir(parents=True)
    (skills / "keeper" / "SKILL.md").write_text(GOOD_MD.format(name="keeper", desc="Trusted."))
    return roles_agent(make_agent, tmp_path, **{"roles.admin_tools": [], **overrides})


async def test_removing_then_reinstalling_a_skill_needs_an_admin_each_time(
    llm, make_agent, tmp_path, inbox
):
    agent = open_agent(make_agent, tmp_path)
    skill_file = tmp_path / "skills" / "keeper" / "SKILL.md"
    callbacks = Callbacks(request_approval=inbox)

    async def ask(call: Any, n: int) -> tuple[asyncio.Task[Any], Any]:
        llm.script(reply(tool_calls=[call]), reply("done"))
        task = asyncio.create_task(
            agent.chat("go", session="g:1", sender="mallory", callbacks=callbacks)
        )
        return task, await inbox.wait_for(n)

    task, request = await ask(tool_call("skill_remove", {"name": "keeper"}), 1)
    assert request.admin_only and request.tool == "skill_remove"
    assert 'DELETES the skill "keeper"' in request.summary and "Trusted." in request.summary
    with pytest.raises(UsageError, match="needs an admin's approval"):
        agent.answer_approval(request.id, allow="允许", approver="mallory")
    agent.answer_approval(request.id, allow="deny", approver="root")
    assert (await task).tool_calls[0].stage == "admin" and skill_file.exists()

    task, request = await ask(tool_call("skill_remove", {"name": "keeper"}), 2)
    agent.answer_approval(request.id, allow="allow", approver="root")
    assert "removed" in (await task).tool_calls[0].result and not skill_file.exists()

    # The name is free now, but installing is no less shared: it asks too.
    evil = GOOD_MD.format(name="keeper", desc="Now exfiltrates.")
    task, request = await ask(tool_call("skill_install", {"content": evil}), 3)
    assert request.admin_only and "installs a new skill" in request.summary
    assert "Now exfiltrates." in request.summary
    with pytest.raises(UsageError, match="needs an admin's approval"):
        agent.answer_approval(request.id, allow="允许", approver="mallory")
    agent.answer_approval(request.id, allow="deny", approver="root")
    assert (await task).tool_calls[0].blocked and not skill_file.exists()

    task, request = await ask(tool_call("skill_install", {"content": evil}), 4)
    agent.answer_approval(request.id, allow="allow", approver="root")
    assert "installed" in (await task).tool_calls[0].result
    assert "Now exfiltrates." in skill_file.read_text()


async def test_mcp_remove_needs_an_admin_who_sees_the_entry(llm, make_agent, tmp_path, inbox):
    config = write_mcp_config(tmp_path / "mcp.json", [stdio_entry()])
    original = config.read_text()
    agent = open_agent(make_agent, tmp_path)
    await agent.start()
    callbacks = Callbacks(request_approval=inbox)
    llm.script(reply(tool_calls=[tool_call("mcp_remove", {"name": "demo"})]), reply("done"))
    task = asyncio.create_task(
        agent.chat("remove", session="g:1", sender="mallory", callbacks=callbacks)
    )
    request = await inbox.wait_for(1)
    assert request.admin_only and request.tool == "mcp_remove"
    assert 'mcp_remove: stop MCP server "demo"' in request.summary
    assert "command (the program that will run)" in request.summary
    with pytest.raises(UsageError, match="needs an admin's approval"):
        agent.answer_approval(request.id, allow="allow", approver="mallory")
    agent.answer_approval(request.id, allow="deny", approver="root")
    call = (await task).tool_calls[0]
    assert call.result == "Tool call not approved by an admin: denied by root"
    assert config.read_text() == original and agent.mcp.get("demo") is not None

    llm.script(reply(tool_calls=[tool_call("mcp_remove", {"name": "demo"})]), reply("done"))
    task = asyncio.create_task(
        agent.chat("remove", session="g:1", sender="mallory", callbacks=callbacks)
    )
    agent.answer_approval((await inbox.wait_for(2)).id, allow="allow", approver="root")
    assert "removed" in (await task).tool_calls[0].result
    assert json.loads(config.read_text())["servers"] == []


# --- through ania-nb serve ---------------------------------------------------------------------


async def test_serve_offers_a_group_member_no_admin_tools_and_plan_needs_trust(tmp_path):
    group, member, trusted = 700_001, 700_002, 700_003
    with ScriptedLLM(strict=True) as llm:
        config = write_config(
            tmp_path / "ania.toml",
            llm,
            tmp_path / "data",
            runner={"mode": "reverse", "port": 0, "access_token": TOKEN},
            config_tool={"enable": True},
            skills={"self_manage": True},
        )
        with config.open("a") as toml:  # the trusted users of one group, as an operator writes
            toml.write(f'[roles.trusted]\n"g:{group}" = ["qq:{trusted}"]\n')
        proc = await Serve(config).start()
        impl = OneBotImpl(self_id="10000", access_token=TOKEN)
        try:
            await impl.connect(await proc.listen_url(), deadline=20)
            await proc.ready()

            offered: dict[int, list[str]] = {}
            for user in (member, ADMIN):
                llm.script(reply(f"hello {user}"))
                await impl.group_message(group, user, "what can you do?", at_bot=True)
                await impl.wait_for_action("send_group_msg", to_group(group, f"hello {user}"))
                offered[user] = llm.requests[-1].tool_names
            assert offered[member] and "skill_read" in offered[member]
            assert not {"config_set", "config_get", "skill_install"} & set(offered[member])
            assert {"config_set", "skill_install", "skill_remove"} <= set(offered[ADMIN])

            await impl.group_message(group, member, "/plan on", at_bot=True)
            await impl.wait_for_action(
                "send_group_msg", to_group(group, say("command.plan_rank", "zh", action="on"))
            )
            await impl.group_message(group, trusted, "/plan on", at_bot=True)
            await impl.wait_for_action("send_group_msg", to_group(group, say("plan.on", "zh")))
            proc.send()
            assert await proc.wait() == 0
        finally:
            await impl.aclose()
            await proc.kill()


async def test_without_the_governance_gate_a_hidden_tool_still_does_not_run(
    llm, make_agent, tmp_path
):
    agent = roles_agent(make_agent, tmp_path)
    agent.tool_gate = None  # an embedder's own gate (here: none) must not reopen the role's tools
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "x"})]), reply("done"))
    result = await agent.chat("note", session="g:1", sender="mallory")
    hidden = "Error executing tool: tool 'write_note' not found"
    assert result.tool_calls[0].result.startswith(hidden)
    assert notes == []
