"""The orchestration layer: one run path for every kind of run, session bookkeeping, layering."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

import ania_nb
from ania_nb import Callbacks, RunEvent, tool
from ania_nb.engine.repair import MISSING_RESULT, clean_text, repair_history, valid_arguments
from ania_nb.orchestration import (
    RunSpec,
    StoreRecord,
    ToolView,
    callbacks_for,
    execute_run,
)
from ania_nb.testing import reply, tool_call, usage

PACKAGE = Path(ania_nb.__file__).parent

# Which top-level parts of the package each layer may import ([arch §1]; top imports below).
LOWER_LAYERS = {
    "store": set(),
    "config": set(),
    "engine": {"config", "store"},
    "tools": {"engine", "config", "store"},
    "mcp": {"tools", "engine", "config", "store"},
    "skills": {"tools", "engine", "config", "store"},
    "governance": {"tools", "engine", "config", "store", "result"},
    "knowledge": {"tools", "engine", "config", "store", "result"},
    "quota": {"engine", "config", "store"},
    "orchestration": {
        "governance",
        "tools",
        "mcp",
        "skills",
        "engine",
        "config",
        "store",
        "result",
        "prompts",
    },
}
# Orchestration-level packages built on the one run path: agents (subagents, teams) and the
# clock, whose runs may start subagents.
LOWER_LAYERS["agents"] = LOWER_LAYERS["orchestration"] | {"orchestration"}
LOWER_LAYERS["clock"] = LOWER_LAYERS["agents"] | {"agents"}
# Leaf modules anyone may use.
SHARED = {"errors", "_atomic", "_extras", "_http", "_env", "_preview", "_subprocess", "py"}
SHARED |= {"session_keys", "text", "addresses"}  # one helper per idea: keys, cutting, hosts
FORBIDDEN_EVERYWHERE_BELOW_FRONT_ENDS = {"notebook", "runner", "agent", "cli", "demo"}


def _imported_parts(path: Path) -> set[str]:
    """Top-level ``ania_nb`` parts a module imports (absolute or relative)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    depth = len(path.relative_to(PACKAGE).parts) - 1  # folders below ania_nb/
    parts: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names = [node.module or ""]
            else:
                up = node.level - 1
                if up > depth:
                    continue
                base = list(path.relative_to(PACKAGE).parts[:depth][: depth - up])
                names = [".".join(["ania_nb", *base, node.module or ""]).rstrip(".")]
                if not node.module:
                    names = [".".join(["ania_nb", *base, a.name]) for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            bits = name.split(".")
            if bits[0] == "ania_nb" and len(bits) > 1:
                parts.add(bits[1])
    return parts


@pytest.mark.parametrize("layer", sorted(LOWER_LAYERS))
def test_layers_import_only_downwards(layer):
    allowed = LOWER_LAYERS[layer] | SHARED | {layer}
    offenders = {}
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        bad = _imported_parts(path) - allowed
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = sorted(bad)
    assert offenders == {}, f"{layer} imports a layer above it: {offenders}"
    for path in (PACKAGE / layer).rglob("*.py"):
        assert not _imported_parts(path) & FORBIDDEN_EVERYWHERE_BELOW_FRONT_ENDS


def test_the_import_scanner_sees_relative_and_absolute_imports(tmp_path):
    # Guard the guard: a module importing upwards is caught.
    fake = PACKAGE / "engine" / "_probe_for_test.py"
    fake.write_text("from ..orchestration import RunSpec\nimport ania_nb.notebook\n")
    try:
        assert _imported_parts(fake) == {"orchestration", "notebook"}
    finally:
        fake.unlink()


# ------------------------------------------------------------------ one-shot runs


async def test_a_one_shot_run_goes_through_the_same_path(llm, make_agent):
    """A subagent-kind spec: no history, hidden tools refused, only admins may approve, the
    front end gets no intermediate text, SubagentStop fires, the run log has its record."""
    agent = make_agent(
        overrides={
            "approval.enable": True,
            "approval.tools": ["risky"],
            "admin.ids": ["root"],
            "clock.enable": False,  # no clock_* or subagent_* session tools in the list below
            "subagent.enable": False,
        }
    )
    ran: list[str] = []

    @tool
    def risky() -> str:
        """A tool that needs approval."""
        ran.append("risky")
        return "done"

    @tool
    def team_run() -> str:
        """Hidden from one-shot runs."""
        ran.append("team_run")
        return "should not run"

    agent.add_tool(risky)
    agent.add_tool(team_run)
    stops: list[dict] = []
    agent.add_hook("SubagentStop", lambda event, payload: stops.append(payload))
    await agent.start()
    texts: list[str] = []
    refused: list[str] = []

    async def request_approval(request):
        assert request.admin_only
        try:  # the run's requester is nobody: a chat user may not answer
            agent.answer_approval(request.id, allow=True, approver="mallory")
        except ania_nb.UsageError as exc:
            refused.append(str(exc))
        agent.answer_approval(request.id, allow=True, approver="root")

    front = Callbacks(send_text=texts.append, request_approval=request_approval)
    llm.script(
        reply("thinking aloud", tool_calls=[tool_call("team_run"), tool_call("risky")]),
        reply("final answer", usage=usage(10, 5)),
    )
    state = agent.session("sub:1")
    spec = RunSpec(
        kind="subagent",
        session="sub:1",
        text="do the task",
        system_prompt="you are a worker",
        tools=ToolView(state.executor, {"team_run"}),
        record=StoreRecord(agent._rt.store, "sub:1", history=False),
        admin_only_approval=True,
        callbacks=callbacks_for("subagent", front),
        timeout=30,
    )
    result = await execute_run(spec, agent._services)
    assert result.status == "success" and result.text == "final answer"
    assert ran == ["risky"]
    hidden, approved = result.tool_calls
    assert hidden.outcome == "error" and "not found" in hidden.result
    assert (approved.outcome, approved.stage) == ("ok", None)
    assert refused and "needs an admin's approval" in refused[0]
    assert texts == []  # intermediate text never reaches the front end
    assert [t["function"]["name"] for t in llm.requests[0].tools] == ["risky"]
    assert [m["role"] for m in llm.requests[0].messages] == ["system", "user"]
    assert await agent.history("sub:1") == []  # one-shot runs keep no history
    [record] = await agent.runs(session="sub:1")
    assert record.status == "success" and [c.name for c in record.tool_calls] == [
        "team_run",
        "risky",
    ]
    assert [(p["hook_event_name"], p["status"]) for p in stops] == [("SubagentStop", "success")]


async def test_a_main_run_never_escapes_with_a_raw_exception(llm, make_agent):
    """A bug inside the run (here a broken gate for every call, and a failing on_event) still
    ends with a closed record, a run_end event and an error result."""
    agent = make_agent()

    async def broken_compactor(history):
        raise RuntimeError("boom")

    events: list[RunEvent] = []
    llm.script(reply("hi"))
    agent.tool_gate = None
    agent._session_tools.clear()
    await agent.start()
    # Sabotage the model client: a bug-shaped exception instead of an LLMError.
    original = agent._services.llm.complete

    async def exploding(*args, **kwargs):
        raise ZeroDivisionError("bookkeeping bug")

    agent._services.llm.complete = exploding  # type: ignore[method-assign]
    try:
        result = await agent.chat("hello", callbacks=Callbacks(on_event=events.append))
    finally:
        agent._services.llm.complete = original  # type: ignore[method-assign]
    assert result.status == "error"
    assert result.error == "internal error: ZeroDivisionError: bookkeeping bug"
    assert [e.kind for e in events] == ["run_start", "run_end"]
    assert events[-1].data["status"] == "error"
    [record] = await agent.runs()
    assert record.status == "error" and "ZeroDivisionError" in (record.error or "")


# ------------------------------------------------------------------ sessions


def _held_tool(release: asyncio.Event, started: asyncio.Event):
    @tool
    async def hold() -> str:
        """Waits until the test releases it."""
        started.set()
        await release.wait()
        return "released"

    return hold


async def test_a_cancelled_caller_withdraws_only_its_own_queued_message(llm, make_agent):
    release, started = asyncio.Event(), asyncio.Event()
    agent = make_agent(tools=[_held_tool(release, started)])
    llm.script(
        reply(tool_calls=[tool_call("hold")]),
        reply("first done"),
        reply("third done"),
    )
    first = asyncio.create_task(agent.chat("first", session="s", sender="a"))
    await asyncio.wait_for(started.wait(), 10)
    second = asyncio.create_task(agent.chat("second", session="s", sender="b"))
    third = asyncio.create_task(agent.chat("third", session="s", sender="c"))
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(second, 0.05)  # b gives up while queued
    release.set()
    assert (await first).text == "first done"
    assert (await third).text == "third done"
    asked = llm.requests[-1].messages[-1]["content"]
    assert "third" in asked and "second" not in asked
    statuses = sorted(r.status for r in await agent.runs(session="s"))
    assert statuses == ["success", "success"]


async def test_a_cancelled_caller_does_not_stop_a_run_others_wait_for(llm, make_agent):
    release, started = asyncio.Event(), asyncio.Event()
    gate, busy_started = asyncio.Event(), asyncio.Event()

    @tool
    async def block_first() -> str:
        """Holds the session busy so two messages queue into one batch."""
        busy_started.set()
        await gate.wait()
        return "ok"

    agent = make_agent(tools=[_held_tool(release, started), block_first])
    llm.script(
        reply(tool_calls=[tool_call("block_first")]),
        reply("warm-up"),
        reply(tool_calls=[tool_call("hold")]),
        reply("answered both"),
    )
    busy = asyncio.create_task(agent.chat("warm", session="s"))
    await asyncio.wait_for(busy_started.wait(), 10)
    x = asyncio.create_task(agent.chat("x", session="s", sender="a"))
    y = asyncio.create_task(agent.chat("y", session="s", sender="b"))
    await asyncio.sleep(0.01)
    gate.set()
    assert (await busy).text == "warm-up"
    await asyncio.wait_for(started.wait(), 10)  # x and y are being answered together
    assert [p.text for p in agent.session("s").batch] == ["x", "y"]
    x.cancel()
    with pytest.raises(asyncio.CancelledError):
        await x
    release.set()
    result = await y
    assert result.status == "success" and result.text == "answered both"


async def test_stop_twice_and_close_never_leave_a_record_running(llm, make_agent):
    release, started = asyncio.Event(), asyncio.Event()
    agent = make_agent(tools=[_held_tool(release, started)])
    llm.script(reply(tool_calls=[tool_call("hold")]))
    task = asyncio.create_task(agent.chat("go", session="s"))
    await asyncio.wait_for(started.wait(), 10)
    assert agent.stop("s")
    agent.stop("s")
    await agent.aclose()
    assert (await task).status == "stopped"
    from ania_nb.store import Store

    store = await Store.open(agent.data_dir)
    try:
        [record] = await store.runs.list()
        assert record.status == "stopped"
    finally:
        await store.close()


async def test_idle_sessions_are_evicted_and_come_back_with_their_history(llm, make_agent):
    agent = make_agent(overrides={"agent.max_sessions": 3})
    for i in range(5):
        llm.script(reply(f"answer {i}"))
        await agent.chat(f"question {i}", session=f"s{i}")
    assert len(agent.sessions) == 3
    assert agent.sessions.names() == ["s2", "s3", "s4"]
    llm.script(reply("again"))
    await agent.chat("and now?", session="s0")
    sent = [m["content"] for m in llm.requests[-1].messages[1:]]
    assert "question 0" in sent[0] and sent[1] == "answer 0" and "and now?" in sent[2]
    assert "s1" not in agent.sessions.names()


async def test_an_agent_refuses_a_second_event_loop(make_agent):
    agent = make_agent()
    await agent.start()

    def elsewhere():
        return asyncio.run(agent.chat("hi"))

    with pytest.raises(ania_nb.UsageError, match="bound to the event loop"):
        await asyncio.to_thread(elsewhere)


# ------------------------------------------------------------------ history repair


def test_repair_history_fixes_every_broken_shape():
    broken = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": None, "type": "function", "function": {"name": "a", "arguments": "{x"}},
                {"id": "dup", "type": "function", "function": {"name": None, "arguments": None}},
                {"id": "dup", "type": "function", "function": {"name": "b", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "dup", "content": "for the second"},
        {"role": "tool", "tool_call_id": "ghost", "content": "answers nothing"},
        {"role": "user", "content": "next"},
    ]
    fixed, problems = repair_history(broken)
    calls = fixed[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_1_0", "dup", "call_1_2"]
    assert [c["function"]["name"] for c in calls] == ["a", "invalid_tool_call", "b"]
    assert [c["function"]["arguments"] for c in calls] == ['{"_raw": "{x"}', "{}", "{}"]
    tool_ids = [m["tool_call_id"] for m in fixed if m["role"] == "tool"]
    assert tool_ids == ["dup", "call_1_0", "call_1_2"]  # every open call answered, ghost gone
    assert fixed[3]["content"] == MISSING_RESULT and fixed[-1]["content"] == "next"
    assert len(problems) >= 5
    again, none = repair_history(fixed)
    assert again == fixed and none == []


def test_valid_history_is_returned_unchanged():
    good = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "t", "arguments": "{}"},
                    "extra": 1,
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    fixed, problems = repair_history(good)
    assert fixed == good and problems == []


def test_clean_text_and_valid_arguments():
    assert clean_text("a\ud800b") == "a\ufffdb" and clean_text("ok") == "ok"
    assert valid_arguments('{"a": 1}') == '{"a": 1}'
    assert valid_arguments({"a": 1}) == '{"a": 1}'
    assert valid_arguments(None) == "{}" and valid_arguments("  ") == "{}"
    assert valid_arguments("[1]") == '{"_raw": "[1]"}'


async def test_a_broken_stored_history_is_repaired_before_the_next_request(llm, make_agent):
    agent = make_agent()
    await agent.start()
    store = agent._rt.store
    await store.history.append(
        "s",
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "", "type": "function", "function": {"name": "", "arguments": "{"}}
                ],
            },
        ],
    )
    llm.script(reply("fine"))
    result = await agent.chat("again", session="s")
    assert result.ok
    sent = llm.requests[0].messages
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[2]["tool_calls"][0]["id"] == sent[3]["tool_call_id"] != ""
    stored = await agent.history("s")
    assert stored[1]["tool_calls"][0]["function"]["arguments"] == '{"_raw": "{"}'


# ------------------------------------------------------------------ context window


async def test_a_long_reply_makes_the_next_turn_compact(llm, make_agent):
    """The decision counts the last prompt *and* what came after it (here a huge reply)."""
    agent = make_agent(overrides={"agent.max_context_tokens": 1000})
    llm.script(
        reply("x" * 4000, usage=usage(100, 2000)),  # small prompt, very long reply
        reply("summary of it", usage=usage(50, 5)),  # the compressor
        reply("short", usage=usage(60, 1)),
    )
    await agent.chat("write a lot")
    result = await agent.chat("and now?")
    assert result.ok
    assert len(llm.requests) == 3
    assert "summarise" in llm.requests[1].messages[0]["content"]


async def test_tool_results_of_one_run_are_counted_before_the_next_call(llm, make_agent):
    @tool
    def big() -> str:
        """Returns a lot."""
        return "y" * 3000

    agent = make_agent(tools=[big], overrides={"agent.max_context_tokens": 2000})
    llm.script(reply("earlier answer", usage=usage(100, 10)))
    await agent.chat("earlier question")
    llm.script(
        reply(tool_calls=[tool_call("big")], usage=usage(300, 5)),
        reply("summary", usage=usage(50, 5)),  # compressor, before the second call
        reply("done", usage=usage(900, 1)),
    )
    result = await agent.chat("use the tool")
    assert result.ok and result.text == "done"
    summary_request = llm.requests[2]
    assert "summarise" in summary_request.messages[0]["content"]
    final = llm.requests[3].messages
    assert final[1]["content"].startswith("Summary of the earlier conversation")
    assert final[-1]["role"] == "tool"


async def test_plan_mode_for_one_run_does_not_touch_the_session(llm, make_agent):
    ran: list[str] = []

    @tool(side_effects=True)
    def write() -> str:
        """Changes the world."""
        ran.append("write")
        return "written"

    agent = make_agent(tools=[write])
    llm.script(reply(tool_calls=[tool_call("write")]), reply("planned"))
    planned = await agent.chat("do it", plan=True)
    [call] = planned.tool_calls
    assert (call.outcome, call.stage) == ("blocked", "plan") and ran == []
    assert "Plan mode" in llm.requests[0].messages[-1]["content"]  # the plan note was sent
    assert not agent.plan_mode("nb:default")
    llm.script(reply(tool_calls=[tool_call("write")]), reply("done"))
    await agent.chat("now do it")
    assert ran == ["write"]
