"""Agent teams: validation, role resolution, saved teams per scope, parallel members, usage."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ania_nb import Callbacks, RunEvent
from ania_nb.agents.roles import COMMON_NOTE, builtin_role
from ania_nb.agents.subagent import SUBAGENT_PROMPT, TASK_PREFIX
from ania_nb.agents.team_store import (
    GLOBAL_SCOPE,
    MAX_TEAMS_PER_SCOPE,
    TeamError,
    TeamStore,
    check_team_name,
)
from ania_nb.testing import reply, tool_call, usage

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

SESSION = "nb:teams"
MEMBER_MARK = "member of an agent team"  # in every role prompt (COMMON_NOTE)


def team_agent(make_agent: Callable[..., Any], **overrides: Any) -> Any:
    """An Agent with the team tools on (and the subagent tools, which members must not see)."""
    return make_agent(
        overrides={
            "team.enable": True,
            "subagent.enable": True,
            "agent.builtin_tools": True,
            **overrides,
        }
    )


def system_of(request: Any) -> str:
    return request.messages[0]["content"]


def tool_names(request: Any) -> set[str]:
    return {t["function"]["name"] for t in request.tools or []}


class Scripted:
    """A responder: the parent calls ``call`` first and then answers "done"; members answer.

    ``member(request)`` returns a member's reply. Every request is kept for the assertions.
    """

    def __init__(
        self, call: tuple[str, dict[str, Any]], member: Callable[[Any], Any] | None = None
    ) -> None:
        self.call = call
        self.member = member or (lambda request: reply("member result", usage=usage(10, 5)))
        self.parent_requests: list[Any] = []
        self.member_requests: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, request: Any) -> Any:
        if MEMBER_MARK in system_of(request) or "team_run" not in tool_names(request):
            with self.lock:
                self.member_requests.append(request)
            return self.member(request)
        with self.lock:
            self.parent_requests.append(request)
        if request.messages[-1]["role"] == "tool":
            return reply("done", usage=usage(100, 10))
        name, args = self.call
        return reply(tool_calls=[tool_call(name, args)], usage=usage(50, 5))

    def tool_result(self) -> str:
        """The text the parent got back from its tool call."""
        return self.parent_requests[-1].messages[-1]["content"]


def run_team(task: str, *members: dict[str, Any], **extra: Any) -> tuple[str, dict[str, Any]]:
    return "team_run", {"task": task, "members": list(members), **extra}


# ------------------------------------------------------------------ names and the store


@pytest.mark.parametrize("name", ["research", "研究小组", "team_1", "a-b", "Ωmega", "x" * 20])
def test_team_names_accept_letters_and_digits_of_any_script(name):
    assert check_team_name(f"  {name} ") == name


@pytest.mark.parametrize("name", ["", "   ", "a b", "a:b", "x" * 21, "team!", "a/b", "e\u0301"])
def test_team_names_refuse_everything_else(name):
    with pytest.raises(TeamError):
        check_team_name(name)


async def test_saved_teams_are_checked_trimmed_and_never_replaced(make_agent):
    agent = make_agent()
    teams = TeamStore(await agent.host.open_store())
    team = await teams.create(
        SESSION, " 写作组 ", [{"name": " 作者 ", "role": " writes " + "x" * 600}], description="d"
    )
    assert team.name == "写作组" and team.members[0].name == "作者"
    assert len(team.members[0].role) == 500 and team.members[0].role.startswith("writes")
    with pytest.raises(TeamError, match=r"already exists.*delete it first"):
        await teams.create(SESSION, "写作组", [{"name": "other", "role": "r"}])
    assert (await teams.get(SESSION, "写作组")).members == team.members  # unchanged
    bad_members = [
        [],
        [{"name": "  ", "role": "r"}],
        [{"name": "a", "role": "r"}, {"name": " a ", "role": "s"}],
        [{"name": f"m{i}", "role": "r"} for i in range(11)],
    ]
    for members in bad_members:
        with pytest.raises(TeamError):
            await teams.create(SESSION, "other", members)
    assert [t.name for t in await teams.list(SESSION)] == ["写作组"]


async def test_each_scope_holds_at_most_twenty_teams(make_agent):
    agent = make_agent()
    teams = TeamStore(await agent.host.open_store())
    for i in range(MAX_TEAMS_PER_SCOPE):
        await teams.create(SESSION, f"t{i}", [{"name": "m", "role": "r"}])
    with pytest.raises(TeamError, match="20 teams"):
        await teams.create(SESSION, "one-more", [{"name": "m", "role": "r"}])
    # Another scope, even one whose key starts like this one, has its own limit.
    await teams.create(f"{SESSION}:sub", "one-more", [{"name": "m", "role": "r"}])
    await teams.create(GLOBAL_SCOPE, "one-more", [{"name": "m", "role": "r"}])
    assert len(await teams.list(SESSION)) == MAX_TEAMS_PER_SCOPE
    assert [t.name for t in await teams.list(f"{SESSION}:sub")] == ["one-more"]


async def test_concurrent_creations_cannot_pass_the_limit_or_overwrite(make_agent):
    import asyncio

    agent = make_agent()
    teams = TeamStore(await agent.host.open_store())
    attempts = [
        teams.create(SESSION, f"t{i % 25}", [{"name": f"m{i}", "role": "r"}]) for i in range(30)
    ]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    saved = [r for r in results if not isinstance(r, BaseException)]
    assert len(saved) == MAX_TEAMS_PER_SCOPE
    assert all(isinstance(r, TeamError) for r in results if isinstance(r, BaseException))
    stored = {t.name: t.members for t in await teams.list(SESSION)}
    assert stored == {t.name: t.members for t in saved}


async def test_the_ai_saves_lists_and_deletes_teams_of_its_own_session(llm, make_agent):
    agent = team_agent(make_agent)
    members = [{"name": "Ann", "role": "checks facts", "task": "ignored"}, {"name": "Bo"}]
    llm.script(
        reply(
            tool_calls=[tool_call("team_create", {"name": "crew", "desc": "d", "members": members})]
        ),
        reply("saved"),
        reply(tool_calls=[tool_call("team_create", {"name": "crew", "members": members})]),
        reply("exists"),
        reply(tool_calls=[tool_call("team_list")]),
        reply("listed"),
        reply(
            tool_calls=[
                tool_call("team_delete", {"name": "crew"}),
                tool_call("team_delete", {"name": "nope"}),
            ]
        ),
        reply("deleted"),
    )
    await TeamStore(await agent.host.open_store()).create(
        GLOBAL_SCOPE, "shared", [{"name": "G", "role": "g"}]
    )
    await agent.chat("save", session=SESSION)
    assert "saved team crew (2 members: Ann / Bo)" in llm.requests[1].messages[-1]["content"]
    await agent.chat("again", session=SESSION)
    again = llm.requests[3].messages[-1]["content"]
    assert again.startswith("Error executing tool:") and "already exists" in again
    await agent.chat("list", session=SESSION)
    listing = llm.requests[5].messages[-1]["content"]
    assert (
        "saved teams (1):\n1. crew (2 members)\n   description: d\n   members: Ann / Bo" in listing
    )
    assert "global teams (1):\n1. shared (1 members)" in listing
    assert "other" not in listing
    await agent.chat("delete", session=SESSION)
    results = [m["content"] for m in llm.requests[7].messages[-2:]]
    assert results[0] == "deleted team crew"
    assert "no team named 'nope'" in results[1] and not results[1].startswith("Error")
    teams = TeamStore(await agent.host.open_store())
    assert await teams.list(SESSION) == []
    assert [t.name for t in await teams.list(GLOBAL_SCOPE)] == ["shared"]  # not the AI's to touch


async def test_saved_teams_survive_an_agent_restart(llm, make_agent, tmp_path):
    first = team_agent(make_agent, **{"store.data_dir": str(tmp_path / "kept")})
    members = [{"name": "Ann", "role": "counts sheep"}]
    llm.script(
        reply(tool_calls=[tool_call("team_create", {"name": "crew", "members": members})]),
        reply("saved"),
    )
    await first.chat("save", session=SESSION)
    await first.aclose()
    second = team_agent(make_agent, **{"store.data_dir": str(tmp_path / "kept")})
    llm.script(reply(tool_calls=[tool_call("team_list")]), reply("listed"))
    await second.chat("list", session=SESSION)
    assert "1. crew (1 members)\n   members: Ann" in llm.requests[-1].messages[-1]["content"]


# ------------------------------------------------------------------ team_run validation


def test_a_team_has_at_most_ten_members_whatever_max_members_says():
    from ania_nb.agents.team import HARD_MAX_MEMBERS, MemberRequest, check_request
    from ania_nb.errors import ToolError

    members = [MemberRequest(f"m{i}") for i in range(HARD_MAX_MEMBERS + 1)]
    with pytest.raises(ToolError, match=r"too many members: 11 \(at most 10\)"):
        check_request("t", members, 50)  # the config caps it at 10 too; this is the last guard
    assert len(check_request("t", members[:HARD_MAX_MEMBERS], 50)[1]) == HARD_MAX_MEMBERS


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"task": "  ", "members": [{"name": "a"}]}, "task is empty"),
        ({"task": "t", "members": []}, "members is empty"),
        ({"task": "t", "members": [{"name": n} for n in "abc"]}, "too many members: 3 (at most 2)"),
        ({"task": "t", "members": [{"name": "a"}, {"name": " a "}]}, "'a' is used twice"),
        ({"task": "t", "members": [{"name": " "}]}, "member 1 has an empty name"),
    ],
)
async def test_team_run_refuses_bad_requests_before_running_anyone(
    llm, make_agent, arguments, message
):
    agent = team_agent(make_agent, **{"team.max_members": 2})
    script = Scripted(("team_run", arguments))
    llm.responder = script
    result = await agent.chat("go", session=SESSION)
    assert result.ok and script.member_requests == []
    text = script.tool_result()
    assert text.startswith("Error executing tool:") and message in text


async def test_team_run_is_refused_when_the_request_has_30_seconds_or_less_left(llm, make_agent):
    agent = team_agent(make_agent, **{"agent.run_timeout": 25})
    script = Scripted(run_team("t", {"name": "a", "role": "r"}))
    llm.responder = script
    await agent.chat("go", session=SESSION)
    assert script.member_requests == []
    assert "cannot start the agent team" in script.tool_result()


async def test_team_run_is_refused_once_the_sessions_token_quota_is_used_up(llm, make_agent):
    agent = team_agent(make_agent, **{"quota.daily_tokens": 100})
    llm.route(MEMBER_MARK, reply("the member used a lot", usage=usage(150, 0)))
    name, arguments = run_team("t", {"name": "a", "role": "r"})
    llm.script(
        reply(tool_calls=[tool_call(name, arguments)], usage=usage(5, 0)),
        reply(tool_calls=[tool_call(name, arguments)], usage=usage(5, 0)),
        reply("gave up", usage=usage(5, 0)),
    )
    result = await agent.chat("go", session=SESSION)
    assert result.ok  # the run started under the limit; its first team used it up
    first, second = result.tool_calls
    assert first.error is None
    assert second.error and second.error.startswith(
        "agent team not started: today's token quota of this session is used up"
    )
    assert sum(1 for r in llm.requests if MEMBER_MARK in system_of(r)) == 1  # nobody ran again


# ------------------------------------------------------------------ running a team


async def test_members_run_in_parallel_with_their_roles_and_the_usage_adds_up(llm, make_agent):
    agent = team_agent(make_agent)
    all_in = threading.Barrier(3, timeout=10)  # broken (→ failed members) unless all 3 overlap

    def member(request: Any) -> Any:
        all_in.wait()
        return reply(f"result of {system_of(request)[:30]}", usage=usage(10, 5))

    script = Scripted(
        run_team(
            "Compare A and B.",
            {"name": "researcher"},
            {"name": "Quinn", "role": "You test claims.", "task": "Check A."},
            {"name": "编辑"},
        ),
        member,
    )
    llm.responder = script
    events: list[RunEvent] = []
    result = await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events.append))
    assert result.ok and result.text == "done"
    starts = [e.data for e in events if e.kind == "child" and e.data["kind"] == "child_start"]
    assert [(c["label"], c["data"]["role"]) for c in starts] == [
        ("researcher", "研究员"),
        ("Quinn", "You test claims."),
        ("编辑", "编辑"),
    ]
    report = script.tool_result()
    assert report.startswith("[Agent team finished]")
    assert "3 members (3 succeeded · 0 failed)" in report.splitlines()[0]
    heads = [line for line in report.splitlines() if line.startswith("=====")]
    assert heads == [
        "===== Member 1/3: researcher =====",
        "===== Member 2/3: Quinn =====",
        "===== Member 3/3: 编辑 =====",
    ]
    tasks = {system_of(r): r.messages[-1]["content"] for r in script.member_requests}
    assert len(tasks) == 3
    prompts = sorted(tasks)
    assert any(builtin_role("researcher").description in p for p in prompts)
    assert any("webSearch" in p and "webExplore" in p and "get_msg_history" in p for p in prompts)
    assert any(p.startswith("You are Quinn. You test claims.") for p in prompts)
    assert any(builtin_role("editor").description in p for p in prompts)
    assert all(COMMON_NOTE in p for p in prompts)
    for prompt, task in tasks.items():
        own = "\n\nCheck A." if prompt.startswith("You are Quinn") else ""
        assert task.endswith(f"] {TASK_PREFIX}Compare A and B.{own}")
    # Usage: every LLM call of parent and members is in the parent's tally and record.
    assert result.usage.total_tokens == 55 + 110 + 3 * 15
    record = await (await agent.host.open_store()).runs.get(result.run_id)
    assert record.total_tokens == 55 + 110 + 3 * 15


async def test_members_never_see_subagent_team_or_todo_tools(llm, make_agent):
    agent = team_agent(make_agent, **{"agent.builtin_tools": True})
    script = Scripted(run_team("t", {"name": "a", "role": "r"}))
    llm.responder = script
    await agent.chat("go", session=SESSION)
    parent_tools = tool_names(script.parent_requests[0])
    assert {"team_run", "team_create", "subagent_run"} <= parent_tools
    (member,) = script.member_requests
    forbidden = {n for n in parent_tools if n.startswith(("team_", "subagent_"))} | {"todo_write"}
    assert tool_names(member) and not tool_names(member) & forbidden


async def test_roles_come_from_saved_teams_of_the_session_then_global(llm, make_agent):
    agent = team_agent(make_agent)
    teams = TeamStore(await agent.host.open_store())
    await teams.create(SESSION, "mine", [{"name": "Ann", "role": "session Ann"}])
    await teams.create(
        GLOBAL_SCOPE,
        "shared",
        [{"name": "Ann", "role": "global Ann"}, {"name": "Bo", "role": "global Bo"}],
    )
    script = Scripted(run_team("t", {"name": "Ann"}, {"name": "Bo"}, {"name": "Zed"}))
    llm.responder = script
    await agent.chat("go", session=SESSION)
    prompts = [system_of(r) for r in script.member_requests]
    assert any(p.startswith("You are Ann. session Ann") for p in prompts)
    assert any(p.startswith("You are Bo. global Bo") for p in prompts)
    assert not any("global Ann" in p for p in prompts)
    zed = [p for p in prompts if "You are Ann" not in p and "You are Bo" not in p]
    assert len(zed) == 1 and zed[0].startswith(SUBAGENT_PROMPT)  # the plain subagent prompt
    report = script.tool_result()
    assert (
        "===== Member 3/3: Zed =====\n(unrecognised role “Zed”: run as a plain subagent)" in report
    )


async def test_a_failed_member_is_reported_and_the_others_still_count(llm, make_agent):
    from ania_nb.testing import error

    limits = {"team.max_result_chars": 1000, "subagent.max_result_chars": 4000}
    agent = team_agent(make_agent, **{"retry.max_attempts": 1, **limits})

    def member(request: Any) -> Any:
        if "You are Bad." in system_of(request):
            return error(400, "bad member")
        if "You are Empty." in system_of(request):
            return reply("", usage=usage(1, 1))
        return reply("Y" * 5000, usage=usage(10, 5))

    script = Scripted(
        run_team(
            "t",
            {"name": "Good", "role": "g"},
            {"name": "Bad", "role": "b"},
            {"name": "Empty", "role": "e"},
        ),
        member,
    )
    llm.responder = script
    await agent.chat("go", session=SESSION)
    report = script.tool_result()
    assert report.splitlines()[0].endswith("3 members (2 succeeded · 1 failed)")
    assert report.endswith("===== Member 3/3: Empty =====\n(the member returned nothing)")
    good = report.split("===== Member 1/3: Good =====\n")[1].split("\n=====")[0]
    note = "\n… (result too long, cut; the original has 5000 characters)"
    assert good.rstrip("\n") == "Y" * (1000 - len(note)) + note  # 1000 characters, note included
    bad = report.split("===== Member 2/3: Bad =====\n")[1].split("\n=====")[0]
    assert bad.startswith("Failed:") and "bad member" in bad


async def test_child_events_form_one_nested_transcript_per_member(llm, make_agent):
    agent = team_agent(make_agent)
    script = Scripted(
        run_team("t", {"name": "a", "role": "role of a"}, {"name": "b", "role": "role of b"})
    )
    llm.responder = script
    events: list[RunEvent] = []
    await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events.append))
    children = [e.data for e in events if e.kind == "child"]
    call_id = next(e.data["id"] for e in events if e.kind == "tool_start")
    assert {c["call_id"] for c in children} == {call_id}
    for i, label in enumerate("ab"):
        mine = [c for c in children if c["child_id"] == f"{call_id}:{i}"]
        assert {c["label"] for c in mine} == {label} and not any(c["background"] for c in mine)
        kinds = [c["kind"] for c in mine]
        assert kinds[0] == "child_start" and kinds[-1] == "child_end"
        assert "run_start" in kinds and "run_end" in kinds
        assert mine[0]["data"] == {"role": f"role of {label}", "task": "t"}
        end = mine[-1]["data"]
        assert end["status"] == "success" and end["text"] == "member result"
        assert end["usage"]["total_tokens"] == 15 and end["elapsed"] >= 0
    starts = [i for i, c in enumerate(children) if c["kind"] == "child_start"]
    assert starts == [0, 1]  # every member announced before any of them runs
    tool_end = next(e for e in events if e.kind == "tool_end")
    assert events.index(tool_end) > max(events.index(e) for e in events if e.kind == "child")


def test_team_tools_are_json_schemas_with_the_reference_parameters():
    from ania_nb.agents.team_tools import team_tools

    tools = {t.name: t for t in team_tools(None, SESSION)}  # type: ignore[arg-type]
    assert sorted(tools) == ["team_create", "team_delete", "team_list", "team_run"]
    run = tools["team_run"].parameters_schema()
    assert set(run["required"]) == {"task", "members"} and "timeout_sec" in run["properties"]
    assert json.dumps(tools["team_create"].parameters_schema())
    assert tools["team_create"].side_effects and tools["team_delete"].side_effects


# ------------------------------------------------------------------ %ania team


async def test_ania_team_manages_global_and_session_teams(llm, tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    from IPython.core.error import UsageError

    from ania_nb.notebook.extension import NotebookState
    from ania_nb.notebook.manage import run_ania

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)  # the session: nb:default
    state = NotebookState(SimpleNamespace(user_ns={}))
    state.overrides.update(
        {
            "llm.base_url": llm.base_url,
            "llm.api_key": llm.api_key,
            "llm.model": "scripted",
            "store.data_dir": str(tmp_path / "data"),
            "skills.dir": str(tmp_path / "no-skills"),
            "mcp.config_file": str(tmp_path / "no-mcp.json"),
        }
    )
    try:
        await run_ania(
            state, "team create 评审组 规划师 'Rita=reviews the plan' --desc 'two steps'"
        )
        await run_ania(state, "team create --session mine Sam=summarises")
        capsys.readouterr()
        await run_ania(state, "team list")
        out = capsys.readouterr().out
        assert "global teams (1):\n1. 评审组 (2 members)\n   description: two steps\n" in out
        assert "   members: 规划师 / Rita" in out
        assert "teams of nb:default (1):\n1. mine (1 members)\n   members: Sam" in out
        teams = TeamStore(await state.agent().host.open_store())
        (saved,) = await teams.list(GLOBAL_SCOPE)
        assert [(m.name, m.role) for m in saved.members] == [
            ("规划师", ""),
            ("Rita", "reviews the plan"),
        ]
        with pytest.raises(UsageError, match="already exists"):
            await run_ania(state, "team create 评审组 X=y")
        with pytest.raises(UsageError, match="contains ' '"):
            await run_ania(state, "team create 'bad name' X=y")
        with pytest.raises(UsageError, match="usage: %ania team"):
            await run_ania(state, "team rename a b")
        await run_ania(state, "team delete 评审组")
        await run_ania(state, "team delete mine")  # global scope: not there
        out = capsys.readouterr().out
        assert "deleted team 评审组 from global" in out and "no team named 'mine' in global" in out
        assert await teams.list(GLOBAL_SCOPE) == []
        assert [t.name for t in await teams.list("nb:default")] == ["mine"]
    finally:
        await state.close_agent()


async def test_built_in_roles_are_found_whatever_the_case_of_the_name(llm, make_agent):
    agent = team_agent(make_agent)
    script = Scripted(run_team("Compare A and B.", {"name": "  Researcher "}, {"name": "EDITOR"}))
    llm.responder = script
    events: list[RunEvent] = []
    result = await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events.append))
    assert result.ok
    starts = [e.data for e in events if e.kind == "child" and e.data["kind"] == "child_start"]
    assert sorted(c["data"]["role"] for c in starts) == sorted(["研究员", "编辑"])
    prompts = [system_of(r) for r in script.member_requests]
    assert any(builtin_role("researcher").description in p for p in prompts)
    assert any(builtin_role("editor").description in p for p in prompts)


async def test_stopping_the_session_stops_every_member_and_keeps_their_tokens(llm, make_agent):
    import asyncio

    agent = team_agent(make_agent)
    release = threading.Event()

    def member(request: Any) -> Any:
        release.wait(20)
        return reply("too late", usage=usage(10, 5))

    script = Scripted(run_team("t", {"name": "a", "role": "r"}, {"name": "b", "role": "r"}), member)
    llm.responder = script
    events: list[RunEvent] = []
    chat = asyncio.create_task(
        agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events.append))
    )
    try:
        await asyncio.to_thread(llm.wait_for_requests, 3, 10)  # the parent and both members
        assert agent.stop(SESSION)
        result = await asyncio.wait_for(chat, 10)
    finally:
        release.set()
    assert result.status == "stopped"
    ends = [e.data["data"] for e in events if e.kind == "child" and e.data["kind"] == "child_end"]
    assert [(e["status"], e["error"]) for e in ends] == [("stopped", "cancelled")] * 2
    runs = await (await agent.host.open_store()).runs.list(session=SESSION)
    assert sorted(r.status for r in runs) == ["stopped", "stopped", "stopped"]


async def test_tokens_a_stopped_member_already_used_are_in_the_callers_tally(llm, make_agent):
    import asyncio

    agent = team_agent(make_agent)
    release = threading.Event()
    both_waiting = threading.Barrier(3, timeout=20)  # both members' second calls and the test

    def member(request: Any) -> Any:
        if request.messages[-1]["role"] != "tool":  # first call: tokens spent, then a tool call
            return reply(tool_calls=[tool_call("no_such_tool", {})], usage=usage(10, 5))
        both_waiting.wait()  # a member asks again only after it counted its first answer
        release.wait(20)  # second call: still waiting when the session is stopped
        return reply("too late", usage=usage(1000, 1000))

    script = Scripted(run_team("t", {"name": "a", "role": "r"}, {"name": "b", "role": "r"}), member)
    llm.responder = script
    chat = asyncio.create_task(agent.chat("go", session=SESSION))
    try:
        await asyncio.to_thread(both_waiting.wait)  # each member is in its second call
        assert agent.stop(SESSION)
        result = await asyncio.wait_for(chat, 10)
    finally:
        release.set()
    assert result.status == "stopped"
    runs = await (await agent.host.open_store()).runs.list(session=SESSION)
    parent = min(runs, key=lambda r: r.id)  # the parent's run started first
    assert parent.total_tokens == 55 + 2 * 15  # its own call and each member's first call


async def test_a_member_gets_only_the_time_the_parent_has_left_minus_30_seconds(llm, make_agent):
    import time

    from ania_nb.agents.team import MemberRequest, team_run
    from ania_nb.engine.usage import Usage
    from ania_nb.tools import ToolContext

    agent = team_agent(make_agent)
    release = threading.Event()

    def member(request: Any) -> Any:
        release.wait(20)
        return reply("too late")

    llm.responder = member
    tally = Usage()
    ctx = ToolContext(
        session=SESSION,
        call_id="c1",
        run_state={"deadline": time.monotonic() + 31.5, "usage": tally},
    )
    try:
        report = await team_run(agent.host, ctx, "t", [MemberRequest("a", "r")], timeout_sec=600)
    finally:
        release.set()
    assert "(0 succeeded · 1 failed)" in report
    failure = report.split("===== Member 1/1: a =====\n")[1]
    assert failure.startswith("Failed: the request took longer than 1.") and failure.endswith(" s")


async def test_members_get_the_team_round_limit(llm, make_agent):
    limits = {"team.max_iterations": 2, "subagent.max_iterations": 10}
    agent = team_agent(make_agent, **limits)

    def member(request: Any) -> Any:  # a member that would call tools forever
        return reply(tool_calls=[tool_call("no_such_tool")], usage=usage(1, 1))

    script = Scripted(run_team("t", {"name": "a", "role": "r"}), member)
    llm.responder = script
    await agent.chat("go", session=SESSION)
    assert 2 <= len(script.member_requests) <= 3  # the limit, perhaps plus a forced last answer


async def test_team_tools_exist_only_when_enabled(llm, make_agent):
    agent = make_agent(
        overrides={"subagent.enable": True, "agent.builtin_tools": True}
    )  # team.enable: False
    llm.script(reply("hi"))
    await agent.chat("hello", session=SESSION)
    names = tool_names(llm.requests[0])
    assert "subagent_run" in names and not names & {"team_run", "team_create", "team_list"}


async def test_the_python_api_saves_and_reads_global_teams(make_agent):
    agent = make_agent(overrides={"team.enable": True, "agent.builtin_tools": True})
    teams = await agent.agents.teams()
    await teams.create("global", "reviewers", [{"name": "critic", "role": "Find the flaws."}])
    assert [t.name for t in await teams.list("global")] == ["reviewers"]
    again = await agent.agents.teams()
    assert (await again.get("global", "reviewers")).members[0].role == "Find the flaws."
