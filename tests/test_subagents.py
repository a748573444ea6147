"""Subagents: parallel synchronous children, time budget, stop, background injection, no recursion,
truncation, usage, SubagentStop, and the clock-run variant [orig §4.4, §5.1, §5.2].

The parent and its children share one scripted server: children are routed by the subagent
prompt (`llm.route(CHILD, ...)`), the parent by its absence (`PARENT`).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from _waits import until

from ania_nb import Callbacks, RunEvent, RunResult, ToolContext, tool
from ania_nb.agents import Agents
from ania_nb.agents.background import PREVIEW_CHARS, Child, completion_text
from ania_nb.agents.clock_children import REPORT_HEADER, ClockChildren
from ania_nb.agents.subagent import (
    MAX_TIMEOUT,
    PARENT_RESERVE,
    BudgetError,
    child_budget,
    truncate_result,
)
from ania_nb.engine.usage import Usage
from ania_nb.orchestration import Conversation, Delivery, OneShotJob
from ania_nb.testing import RecordedRequest, error, reply, tool_call, usage

SESSION = "nb:sub"
CHILD = "You are a subagent"  # in the subagent prompt: routes the children's requests


def PARENT(request: RecordedRequest) -> bool:
    """The parent's requests: everything without the subagent prompt."""
    return CHILD not in request.system


def sub_agent(make_agent: Callable[..., Any], **overrides: Any) -> Any:
    """An Agent with the subagent tools (wired here until the Agent wires `Agents` itself)."""
    agent = make_agent(
        overrides={"subagent.enable": True, "agent.builtin_tools": True, **overrides}
    )
    if getattr(agent, "agents", None) is None:
        agents = Agents(agent.host)
        agent.add_session_tools(agents.session_tools)
        agent._test_agents = agents
    return agent


def subagents(agent: Any) -> Any:
    """The Agent's registry of running subagents."""
    return agent.agents.subagents


def run(task: str, **args: Any) -> Any:
    return tool_call("subagent_run", {"task": task, **args})


class Events:
    """A front end's on_event: keeps ``child`` events and lets a test wait for one."""

    def __init__(self) -> None:
        self.children: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def __call__(self, event: RunEvent) -> None:
        if event.kind == "child":
            self.children.append(event.data)
            self.changed.set()

    def kinds(self, child_id: str) -> list[str]:
        return [e["kind"] for e in self.children if e["child_id"] == child_id]

    def end(self, child_id: str) -> dict[str, Any]:
        [end] = [
            e["data"]
            for e in self.children
            if e["child_id"] == child_id and e["kind"] == "child_end"
        ]
        return end

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async def loop() -> None:
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), 10)


def said(request: RecordedRequest) -> str:
    """The last message's text without the time stamp the Agent puts before a turn."""
    return re.sub(r"^\[\d{4}-[^\]]*\] ", "", request.messages[-1]["content"])


def tool_results(request: RecordedRequest) -> list[str]:
    return [m["content"] for m in request.messages if m.get("role") == "tool"]


def child_requests(llm: Any) -> list[RecordedRequest]:
    return [r for r in llm.requests if CHILD in r.system]


# --------------------------------------------------------------------------- synchronous


async def test_parallel_subagents_are_in_flight_together_and_both_results_return(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    both_asked = threading.Barrier(2, timeout=10)  # each child's request waits for the other's

    def child(request: RecordedRequest) -> Any:
        both_asked.wait()  # a sequential run would never get here twice: BrokenBarrierError
        task = request.messages[-1]["content"].split("\n", 1)[1]
        return reply(f"result of {task}", usage=usage(7, 3))

    llm.responder = child
    llm.route(
        PARENT,
        reply(tool_calls=[run("alpha"), run("beta")], usage=usage(10, 5)),
        reply("both done", usage=usage(10, 5)),
    )
    events = Events()
    result = await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events))
    assert result.text == "both done"
    first, second = tool_results(llm.requests[-1])
    assert first.startswith("[Subagent finished] ") and first.endswith("\nresult of alpha")
    assert second.endswith("\nresult of beta")
    assert "s · LLM rounds 1 · tokens 10\n" in first
    asked = sorted(said(r) for r in child_requests(llm))
    assert asked == ["【子代理任务】\nalpha", "【子代理任务】\nbeta"]
    # nested transcripts: each child's own events arrive wrapped, ending with child_end
    ids = sorted({e["child_id"] for e in events.children})
    assert len(ids) == 2
    for child_id in ids:
        kinds = events.kinds(child_id)
        assert kinds[0] == "child_start" and kinds[-1] == "child_end"
        assert "run_start" in kinds and "run_end" in kinds
        assert events.end(child_id)["status"] == "success"
    calls = {e["call_id"] for e in events.children}
    assert calls == {c.id for c in result.tool_calls}
    # usage: every LLM call counted once in the parent's run, and in its record
    assert result.usage.total_tokens == 2 * 15 + 2 * 10


async def test_usage_totals_equal_every_llm_call_and_the_record_shows_them(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    llm.route(CHILD, reply("c1", usage=usage(7, 3)), reply("c2", usage=usage(20, 2)))
    llm.route(
        PARENT,
        reply(tool_calls=[run("a"), run("b")], usage=usage(10, 5)),
        reply("done", usage=usage(11, 4)),
    )
    result = await agent.chat("go", session=SESSION)
    assert len(llm.requests) == 4
    assert result.usage.total_tokens == 15 + 15 + 10 + 22  # every call's scripted usage
    records = await agent.runs(session=SESSION)
    parent = [r for r in records if r.input == "go"]
    assert [r.total_tokens for r in parent] == [62]


async def test_children_never_see_subagent_team_or_todo_tools(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(
        make_agent, **{"team.enable": True, "todo.enable": True, "agent.builtin_tools": True}
    )
    llm.route(CHILD, reply("child done"))
    llm.route(PARENT, reply(tool_calls=[run("look around")]), reply("ok"))
    await agent.chat("go", session=SESSION)
    parent_tools = set(llm.requests[0].tool_names)
    assert {"subagent_run", "subagent_list", "subagent_cancel", "team_run", "todo_write"} <= (
        parent_tools
    )
    [child] = child_requests(llm)
    assert child.tool_names  # it has tools ...
    banned = [
        n for n in child.tool_names if n.startswith(("subagent_", "team_")) or n == "todo_write"
    ]
    assert banned == []  # ... but none that recurse
    assert child.system.startswith("## Subagent\n")


async def test_long_result_is_cut_with_the_original_length_noted(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent, **{"subagent.max_result_chars": 100})
    long = "x" * 250
    llm.route(CHILD, reply(long))
    llm.route(PARENT, reply(tool_calls=[run("write a lot")]), reply("ok"))
    await agent.chat("go", session=SESSION)
    [text] = tool_results(llm.requests[-1])
    meta, body = text.split("\n", 1)
    assert meta.endswith(" · result truncated")
    note = "\n… (result too long, cut; the original has 250 characters)"
    assert body == "x" * (100 - len(note)) + note  # 100 characters, the note included


async def test_a_result_of_exactly_the_limit_is_whole_and_not_called_truncated(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent, **{"subagent.max_result_chars": 100})
    llm.route(CHILD, reply("y" * 100))
    llm.route(PARENT, reply(tool_calls=[run("write exactly enough")]), reply("ok"))
    await agent.chat("go", session=SESSION)
    [text] = tool_results(llm.requests[-1])
    meta, body = text.split("\n", 1)
    assert "truncated" not in meta
    assert body == "y" * 100


async def test_subagent_stop_hook_gets_the_task_and_a_failed_child_is_a_tool_error(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    stops: list[dict[str, Any]] = []
    agent.add_hook("SubagentStop", lambda event, payload: stops.append(payload))
    llm.route(CHILD, error(400, "bad child request"))
    llm.route(PARENT, reply(tool_calls=[run("summarise the report")]), reply("ok"))
    await agent.chat("go", session=SESSION)
    [text] = tool_results(llm.requests[-1])
    assert "subagent failed" in text and "bad child request" in text
    assert len(stops) == 1
    assert "summarise the report" in stops[0]["prompt"]


# --------------------------------------------------------------------------- budget


def test_budget_is_clamped_before_it_is_shrunk() -> None:
    far = time.monotonic() + 10_000
    assert child_budget(1e9, 300, None) == MAX_TIMEOUT
    assert child_budget(1e9, 300, far) == MAX_TIMEOUT  # clamped first: not 10 000 − 30
    assert child_budget(None, 300, far) == 300
    assert child_budget(0, 300, None) == 300
    near = time.monotonic() + 100
    assert 60 < child_budget(1e9, 300, near) <= 100 - PARENT_RESERVE
    assert child_budget(1e9, 300, near, shrink=False) == MAX_TIMEOUT  # background children
    with pytest.raises(BudgetError, match="not enough remaining time"):
        child_budget(10, 300, time.monotonic() + PARENT_RESERVE)


@pytest.mark.parametrize(("left", "starts"), [(29.9, False), (30.0, False), (30.1, True)])
def test_the_parent_keeps_its_30_s_reserve_to_the_boundary(left: float, starts: bool) -> None:
    deadline = 1000.0
    clock = lambda: deadline - left  # noqa: E731 - the parent has exactly `left` seconds
    if starts:
        assert child_budget(300, 300, deadline, now=clock) == pytest.approx(left - PARENT_RESERVE)
        assert child_budget(300, 300, deadline, now=clock, shrink=False) == 300
        return
    for shrink in (True, False):  # background children are refused alike
        with pytest.raises(BudgetError, match=r"has \d+ s left and needs more than 30 s"):
            child_budget(300, 300, deadline, now=clock, shrink=shrink)


def test_texts_are_cut_only_beyond_their_limit() -> None:
    assert truncate_result("y" * 100, 100) == "y" * 100
    note = "\n… (result too long, cut; the original has 101 characters)"
    cut = truncate_result("y" * 101, 100)
    assert cut == "y" * (100 - len(note)) + note and len(cut) == 100  # the note counts


@pytest.mark.parametrize(
    ("status", "head", "body"),
    [
        ("success", "[Subagent finished]", "the answer"),
        ("timeout", "[Subagent timed out]", "Error: subagent timed out (90 s), aborted"),
        ("error", "[Subagent failed]", "Error: subagent failed: the model broke"),
    ],
)
def test_a_background_childs_completion_message_says_how_it_ended(
    status: str, head: str, body: str
) -> None:
    child = Child("7", SESSION, "watch it", 90.0, background=True)
    error = "the model broke" if status == "error" else None
    child.outcome.result = RunResult("the answer", status, SESSION, error=error)
    child.outcome.error = error or ""
    text = completion_text(child, 4000)
    assert text.startswith(f"{head}\nID: 7\nTask: watch it\n\n")
    assert text.endswith(body)


async def test_a_parent_near_its_deadline_gets_a_clear_refusal_and_no_child_runs(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent, **{"agent.run_timeout": 25})
    llm.route(PARENT, reply(tool_calls=[run("too late", timeout_sec=1e9)]), reply("ok"))
    result = await agent.chat("go", session=SESSION)
    assert result.ok
    [text] = tool_results(llm.requests[-1])
    assert "cannot start subagent: not enough remaining time" in text
    assert child_requests(llm) == []


async def test_a_huge_timeout_is_clamped_then_shrunk_to_the_parents_deadline(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent, **{"agent.run_timeout": 100})
    llm.route(CHILD, reply("fine"))
    llm.route(PARENT, reply(tool_calls=[run("quick", timeout_sec=1e9)]), reply("ok"))
    events = Events()
    await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events))
    [start] = [e["data"] for e in events.children if e["kind"] == "child_start"]
    assert 60 < start["timeout"] <= 100 - PARENT_RESERVE


# --------------------------------------------------------------------------- stop, cancel


async def test_stop_cancels_a_waiting_parents_children(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    stops: list[dict[str, Any]] = []
    agent.add_hook("SubagentStop", lambda event, payload: stops.append(payload))
    release = threading.Event()

    def slow_child(request: RecordedRequest) -> Any:
        release.wait(10)
        return reply("too late")

    llm.responder = slow_child
    llm.route(PARENT, reply(tool_calls=[run("a"), run("b")]))
    events = Events()
    chat = asyncio.create_task(
        agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events))
    )
    try:
        await asyncio.to_thread(llm.wait_for_requests, 3, 10)  # parent + both children
        assert agent.stop(SESSION)
        result = await asyncio.wait_for(chat, 10)
    finally:
        release.set()
    assert result.status == "stopped"
    child_runs = [
        r for r in await agent.runs(session=SESSION) if r.input.startswith("【子代理任务】")
    ]
    assert sorted(r.status for r in child_runs) == ["stopped", "stopped"]
    assert len(llm.requests) == 3  # nobody asked anything after the stop
    # SubagentStop follows every child run, a stopped one too.
    assert sorted((p["status"], p["prompt"][-1]) for p in stops) == [
        ("stopped", "a"),
        ("stopped", "b"),
    ]


async def test_stop_cancels_background_children_and_nothing_is_injected(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    release = threading.Event()

    def slow_child(request: RecordedRequest) -> Any:
        release.wait(10)
        return reply("too late")

    llm.responder = slow_child
    llm.route(PARENT, reply(tool_calls=[run("watch", background=True)]), reply("started it"))
    events = Events()
    result = await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events))
    try:
        assert result.text == "started it"
        parent = [r for r in llm.requests if PARENT(r)]
        assert tool_results(parent[1])[0].startswith("✅ subagent started (ID: 1), running in")
        await asyncio.to_thread(llm.wait_for_requests, 3, 10)  # the child asked
        [child] = subagents(agent).running(SESSION)
        assert agent.stop(SESSION)  # True: a background child was stopped
        await events.wait_for(lambda: "child_end" in events.kinds("1"))
    finally:
        release.set()
    assert events.end("1")["status"] == "stopped"
    assert events.children[0]["background"] is True
    # Whatever the child would inject is queued before its task ends; the session is idle
    # again once an injected message (if any) was answered.
    assert child.handle is not None
    await until(child.handle.done, "the child's task to end")
    await until(lambda: not agent.sessions.get(SESSION).busy, "the session to be idle")
    assert len(llm.requests) == 3  # no injected message was answered


async def test_a_stop_cancels_only_its_own_sessions_background_children(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    await agent.start()
    release = threading.Event()

    def slow_child(request: RecordedRequest) -> Any:
        release.wait(10)
        return reply(f"watched {said(request).rsplit(' ', 1)[-1]}")

    llm.responder = slow_child
    llm.route(
        PARENT,
        reply(tool_calls=[run("watch A", background=True)]),
        reply("started A"),
        reply(tool_calls=[run("watch B", background=True)]),
        reply("started B"),
        reply("B's watch is over"),
    )
    delivered: list[Delivery] = []
    agent.outbox.subscribe(delivered.append)
    events = Events()
    try:
        await agent.chat("go", session="nb:a", callbacks=Callbacks(on_event=events))
        await agent.chat("go", session="nb:b")
        await asyncio.to_thread(llm.wait_for_requests, 6, 10)  # both children are asking
        assert agent.stop("nb:a")
        await events.wait_for(lambda: "child_end" in events.kinds("1"))
        assert [c.task for c in subagents(agent).running("nb:b")] == ["watch B"]
    finally:
        release.set()
    await until(lambda: delivered, "the answer to B's result")
    assert [(d.session, d.text) for d in delivered] == [("nb:b", "B's watch is over")]
    injected = said(llm.requests[-1])
    assert injected.startswith("[Subagent finished]\nID: 2\nTask: watch B")
    assert injected.endswith("watched B")
    assert events.end("1")["status"] == "stopped"


async def test_list_and_cancel_a_background_child(llm: Any, make_agent: Callable[..., Any]) -> None:
    agent = sub_agent(make_agent)
    release = threading.Event()

    def slow_child(request: RecordedRequest) -> Any:
        release.wait(10)
        return reply("too late")

    llm.responder = slow_child
    llm.route(
        PARENT,
        reply(tool_calls=[run("a long watch over the whole weekend, with notes", background=True)]),
        reply(tool_calls=[tool_call("subagent_list")]),
        reply(tool_calls=[tool_call("subagent_cancel", {"id": "1"})]),
        reply(tool_calls=[tool_call("subagent_cancel", {"id": "1"}), tool_call("subagent_list")]),
        reply("cancelled"),
    )
    events = Events()
    try:
        result = await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events))
    finally:
        release.set()
    assert result.text == "cancelled"
    parent = [r for r in llm.requests if PARENT(r)]
    listing = tool_results(parent[2])[-1]
    assert listing.startswith("running subagents (1):\n1. ID: 1 (background) / task: a long watch")
    assert tool_results(parent[3])[-1] == "cancelled subagent 1"
    assert tool_results(parent[4])[-2:] == [
        "no subagent with ID 1 (finished or wrong ID)",
        "no running subagents",
    ]
    await events.wait_for(lambda: "child_end" in events.kinds("1"))
    assert events.end("1")["status"] == "stopped"


async def test_subagent_list_shows_a_task_of_exactly_the_preview_length_in_full(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    release = threading.Event()

    def slow_child(request: RecordedRequest) -> Any:
        release.wait(10)
        return reply("too late")

    exact, longer = "e" * PREVIEW_CHARS, "l" * (PREVIEW_CHARS + 1)
    llm.responder = slow_child
    llm.route(
        PARENT,
        reply(tool_calls=[run(exact, background=True), run(longer, background=True)]),
        reply(tool_calls=[tool_call("subagent_list")]),
        reply("listed"),
    )
    try:
        result = await agent.chat("go", session=SESSION)
        assert agent.stop(SESSION)  # both children cancelled: nothing is injected afterwards
    finally:
        release.set()
    assert result.text == "listed"
    listing = tool_results([r for r in llm.requests if PARENT(r)][2])[-1]
    assert f"1. ID: 1 (background) / task: {exact} / " in listing  # exactly the limit: whole
    assert f"2. ID: 2 (background) / task: {'l' * (PREVIEW_CHARS - 1)}… / " in listing


async def test_subagent_cancel_of_a_waited_child_fails_only_that_call(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    release = threading.Event()

    @tool
    async def cancel_it(ctx: ToolContext) -> str:
        """Cancel the sibling subagent once it runs."""
        await until(lambda: subagents(agent).running(ctx.session), "the child to run")
        return "cancelled" if subagents(agent).cancel(ctx.session, "1") else "not found"

    agent.add_tool(cancel_it)

    def slow_child(request: RecordedRequest) -> Any:
        release.wait(10)
        return reply("too late")

    llm.responder = slow_child
    llm.route(PARENT, reply(tool_calls=[run("slow"), tool_call("cancel_it")]), reply("went on"))
    try:
        result = await agent.chat("go", session=SESSION)
    finally:
        release.set()
    assert result.ok and result.text == "went on"  # the parent's run is not cancelled with it
    waited, cancel = result.tool_calls
    assert waited.error == "subagent was cancelled" and cancel.result == "cancelled"


async def test_a_background_child_cancelled_before_it_started_still_ends_properly(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)

    @tool
    def cancel_at_once(ctx: ToolContext) -> str:
        """Cancel subagent 1 in the same round that launched it, as soon as it is launched."""
        registry, deadline = subagents(agent), time.monotonic() + 10
        # In a worker thread, racing the launch (the child's row is written first).
        while registry.get(ctx.session, "1") is None and time.monotonic() < deadline:
            time.sleep(0.001)
        return "cancelled" if registry.cancel(ctx.session, "1") else "not found"

    agent.add_tool(cancel_at_once)
    llm.route(
        PARENT,
        reply(tool_calls=[run("never", background=True), tool_call("cancel_at_once")]),
        reply("ok"),
    )
    events = Events()
    result = await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=events))
    assert result.tool_calls[1].result == "cancelled"
    await events.wait_for(lambda: "child_end" in events.kinds("1"))  # the front end is told
    assert events.end("1")["status"] == "stopped"
    assert subagents(agent).running(SESSION) == [] and child_requests(llm) == []


# --------------------------------------------------------------------------- background


async def test_background_result_is_injected_into_an_idle_session(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    await agent.start()
    parent_done = threading.Event()

    def child(request: RecordedRequest) -> Any:
        parent_done.wait(10)  # answer only once the parent's run is over: the session is idle
        return reply("the weather is fine", usage=usage(30, 10))

    llm.responder = child
    llm.route(
        PARENT,
        reply(tool_calls=[run("check the weather", background=True)], usage=usage(5, 5)),
        reply("I started a subagent", usage=usage(5, 5)),
        reply("Summary: fine weather", usage=usage(8, 2)),
    )
    delivered: list[Delivery] = []
    arrived = asyncio.Event()
    agent.outbox.subscribe(lambda d: (delivered.append(d), arrived.set()))
    first = await agent.chat("go", session=SESSION)
    assert first.text == "I started a subagent"
    assert first.usage.total_tokens == 20  # the child's tokens are not this run's
    parent_done.set()
    await asyncio.wait_for(arrived.wait(), 10)
    assert [(d.text, d.source) for d in delivered] == [("Summary: fine weather", "subagent")]
    injected = said(llm.requests[-1])
    assert injected.startswith("[Subagent finished]\nID: 1\nTask: check the weather\n\n")
    assert injected.endswith(" · LLM rounds 1 · tokens 40\nthe weather is fine")
    records = await agent.runs(session=SESSION)
    [answer] = [r for r in records if r.sender == "subagent"]
    assert answer.total_tokens == 10 + 40  # its own call + the child's derived usage


async def test_background_result_waits_for_a_busy_session(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    await agent.start()
    child_ended = threading.Event()
    events = Events()

    def on_event(event: RunEvent) -> None:
        events(event)
        if event.kind == "child" and event.data["kind"] == "child_end":
            child_ended.set()

    def parent_second(request: RecordedRequest) -> Any:
        child_ended.wait(10)  # the child finished while this run is still going
        return reply("still busy, done now")

    llm.route(CHILD, reply("early result"))
    llm.route(PARENT, reply(tool_calls=[run("fast job", background=True)]))
    llm.responder = lambda request: (
        parent_second(request)
        if "[Subagent finished]" not in str(request.messages[-1]["content"])
        else reply("got the result")
    )
    delivered: list[Delivery] = []
    arrived = asyncio.Event()
    agent.outbox.subscribe(lambda d: (delivered.append(d), arrived.set()))
    first = await agent.chat("go", session=SESSION, callbacks=Callbacks(on_event=on_event))
    assert first.text == "still busy, done now"
    assert child_ended.is_set()
    await asyncio.wait_for(arrived.wait(), 10)
    assert [d.text for d in delivered] == ["got the result"]
    parent = [r for r in llm.requests if PARENT(r)]
    assert len(parent) == 3  # launch, the busy run's end, then the injected message
    assert "[Subagent finished]" not in str(parent[1].messages)
    assert "\nearly result" in parent[2].messages[-1]["content"]
    assert events.kinds("1") == ["child_start", "child_end"]  # background: start and end only


async def test_a_result_the_full_queue_cannot_take_is_published_instead(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent, **{"agent.queue_size": 1})
    await agent.start()
    child_go, parent_go = threading.Event(), threading.Event()

    def held(request: RecordedRequest) -> Any:
        (child_go if CHILD in request.system else parent_go).wait(10)
        return reply("child result" if CHILD in request.system else "busy reply")

    llm.route(PARENT, reply(tool_calls=[run("watch", background=True)]), reply("started"))
    llm.responder = held
    delivered: list[Delivery] = []
    agent.outbox.subscribe(delivered.append)
    try:
        assert (await agent.chat("go", session=SESSION)).text == "started"
        busy = asyncio.create_task(agent.chat("second", session=SESSION))
        await asyncio.to_thread(llm.wait_for_requests, 4, 10)  # the child and "second" wait
        queued = asyncio.create_task(agent.chat("third", session=SESSION))  # fills the queue
        await until(lambda: len(agent.sessions.get(SESSION).queue) == 1, "a full queue")
        child_go.set()  # the child ends while the queue is full: its result cannot wait
        await until(lambda: delivered, "the result on the outbox")
    finally:
        child_go.set()
        parent_go.set()
    await asyncio.wait_for(asyncio.gather(busy, queued), 10)
    [only] = delivered
    assert only.title == "subagent 1 (not answered: the queue was full)"
    assert only.text.startswith("[Subagent finished]\nID: 1\nTask: watch")
    assert (only.status, only.meta) == ("success", {"child_id": "1"})


async def test_a_closed_agent_starts_no_background_child(make_agent: Callable[..., Any]) -> None:
    agent = sub_agent(make_agent)
    registry = subagents(agent)
    await agent.aclose()
    with pytest.raises(RuntimeError, match="the agent is closed: no subagent can start"):
        registry.launch(Child("1", SESSION, "late", 60.0, background=True))


# --------------------------------------------------------------------------- clock runs


def clock_job(
    agent: Any, children: ClockChildren, usage_: Usage, conversation: Any, text: str
) -> Any:
    return OneShotJob(
        kind="clock",
        session=SESSION,
        text=text,
        system_prompt="clock run",
        timeout=max(0.001, children.deadline - time.monotonic()),
        usage=usage_,
        conversation=conversation,
        extra_tools=children.tools(),
    )


async def test_clock_children_are_drained_into_the_same_run(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    tally = Usage()
    children = ClockChildren(agent.host, SESSION, time.monotonic() + 120, tally)
    conversation = Conversation(history=[])
    llm.route(CHILD, reply("fact A", usage=usage(7, 3)), reply("fact B", usage=usage(7, 3)))
    llm.route(
        PARENT,
        reply(tool_calls=[run("find A"), run("find B")], usage=usage(10, 0)),
        reply("waiting for my helpers", usage=usage(10, 0)),
        reply("A and B, summarised", usage=usage(10, 0)),
    )

    async def continue_with(text: str) -> Any:
        return await agent.host.run_one_shot(clock_job(agent, children, tally, conversation, text))

    first = await agent.host.run_one_shot(clock_job(agent, children, tally, conversation, "tick"))
    assert first.text == "waiting for my helpers"
    started = tool_results([r for r in llm.requests if PARENT(r)][1])
    assert any("(ID: 1)" in t for t in started) and any("(ID: 2)" in t for t in started)
    final = await children.drain(first, continue_with)
    assert final.text == "A and B, summarised"
    report = said(llm.requests[-1])
    assert report.startswith(REPORT_HEADER)
    assert "--- subagent (ID: 1) ---\nTask: find A\n" in report and report.count("fact ") == 2
    assert tally.total_tokens == 3 * 10 + 2 * 10  # the run's calls and both children
    assert children.running == []


async def test_clock_drain_stops_after_five_rounds_and_cancels_the_rest(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    tally = Usage()
    children = ClockChildren(agent.host, SESSION, time.monotonic() + 120, tally)
    conversation = Conversation(history=[])
    hold_last = threading.Event()
    asked = {"n": 0}

    def child(request: RecordedRequest) -> Any:
        asked["n"] += 1
        if asked["n"] == 6:
            hold_last.wait(10)  # the sixth child never finishes in time
        return reply(f"child {asked['n']}")

    llm.responder = child
    # every run launches one more child: the drain must give up after five reports
    for i in range(6):
        llm.route(PARENT, reply(tool_calls=[run(f"job {i + 1}")]), reply(f"reply {i}"))

    async def continue_with(text: str) -> Any:
        return await agent.host.run_one_shot(clock_job(agent, children, tally, conversation, text))

    try:
        first = await agent.host.run_one_shot(
            clock_job(agent, children, tally, conversation, "tick")
        )
        final = await children.drain(first, continue_with)
    finally:
        hold_last.set()
    assert final.text == "reply 5"
    reports = [r for r in llm.requests if PARENT(r) and REPORT_HEADER in str(r.messages[-1])]
    assert len(reports) == 5
    assert children.running == []
    assert children._children[-1].outcome.cancelled


def task_of(request: RecordedRequest) -> str:
    """The task a child was given (its last message, after the time stamp)."""
    return said(request)


async def test_clock_drain_reports_how_many_still_run_and_a_cancelled_child_not_at_all(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    tally = Usage()
    children = ClockChildren(agent.host, SESSION, time.monotonic() + 120, tally)
    conversation = Conversation(history=[])
    hold_slow, hold_dropped = threading.Event(), threading.Event()

    def child(request: RecordedRequest) -> Any:
        if "dropped" in task_of(request):
            hold_dropped.wait(10)  # cancelled by the run before it answers
        if "slow" in task_of(request):
            hold_slow.wait(10)  # still running at the first report
        return reply(f"done: {task_of(request)[-12:]}")

    llm.responder = child
    llm.route(
        PARENT,
        reply(tool_calls=[run("dropped job"), run("quick job"), run("slow job")]),
        reply(tool_calls=[tool_call("subagent_cancel", {"id": "1"})]),
        reply("waiting"),
        reply("half the answer"),
        reply("the whole answer"),
    )
    reports: list[str] = []

    async def continue_with(text: str) -> Any:
        reports.append(text)
        result = await agent.host.run_one_shot(
            clock_job(agent, children, tally, conversation, text)
        )
        hold_slow.set()  # the slow child ends after the first report
        await until(lambda: children._children[2].handle.done(), "the slow child to end")
        return result

    try:
        first = await agent.host.run_one_shot(
            clock_job(agent, children, tally, conversation, "tick")
        )
        await until(lambda: children._children[1].handle.done(), "the quick child to end")
        # The first round waits until just before the reserve: the slow child is still held.
        children.deadline = time.monotonic() + PARENT_RESERVE + 0.5
        final = await children.drain(first, continue_with)
    finally:
        hold_slow.set()
        hold_dropped.set()
    assert final.text == "the whole answer"
    assert len(reports) == 2
    assert "(ID: 2)" in reports[0] and reports[0].endswith("\n\n1 more still running…")
    assert "(ID: 3)" in reports[1] and "still running" not in reports[1]
    assert all("(ID: 1)" not in report for report in reports)  # cancelled on purpose: silent
    assert children._children[0].outcome.cancelled


async def test_clock_drain_stops_at_a_failed_round(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    tally = Usage()
    children = ClockChildren(agent.host, SESSION, time.monotonic() + 120, tally)
    conversation = Conversation(history=[])
    hold_slow = threading.Event()

    def child(request: RecordedRequest) -> Any:
        if "slow" in task_of(request):
            hold_slow.wait(10)
        return reply("a result")

    llm.responder = child
    llm.route(
        PARENT,
        reply(tool_calls=[run("quick job"), run("slow job")]),
        reply("waiting"),
        error(400, "the model refused the report"),
        reply("an answer after the failure"),
    )
    reports: list[str] = []

    async def continue_with(text: str) -> Any:
        reports.append(text)
        result = await agent.host.run_one_shot(
            clock_job(agent, children, tally, conversation, text)
        )
        hold_slow.set()  # the slow child ends now: a drain that goes on would report it
        await until(lambda: children._children[1].handle.done(), "the slow child to end")
        return result

    try:
        first = await agent.host.run_one_shot(
            clock_job(agent, children, tally, conversation, "tick")
        )
        await until(lambda: children._children[0].handle.done(), "the quick child to end")
        # The first round waits until just before the reserve: the slow child is still held.
        children.deadline = time.monotonic() + PARENT_RESERVE + 0.5
        final = await children.drain(first, continue_with)
    finally:
        hold_slow.set()
    assert len(reports) == 1 and "(ID: 1)" in reports[0]  # no round after the failed one
    assert final.status == "error" and "refused the report" in (final.error or "")
    assert children.running == []


async def test_clock_children_refuse_to_start_with_30_s_or_less_left(make_agent: Any) -> None:
    agent = sub_agent(make_agent)
    children = ClockChildren(agent.host, SESSION, time.monotonic() + 20, Usage())
    with pytest.raises(BudgetError, match="cannot start subagent: not enough remaining time"):
        children.launch("anything", None)
    assert children.running == []


async def test_clock_drain_keeps_the_last_reply_when_nothing_finishes_before_the_reserve(
    llm: Any, make_agent: Callable[..., Any]
) -> None:
    agent = sub_agent(make_agent)
    tally = Usage()
    children = ClockChildren(agent.host, SESSION, time.monotonic() + 120, tally)
    conversation = Conversation(history=[])
    hold = threading.Event()

    def slow_child(request: RecordedRequest) -> Any:
        hold.wait(10)
        return reply("too late")

    llm.responder = slow_child
    llm.route(PARENT, reply(tool_calls=[run("slow")]), reply("my own answer"))

    async def continue_with(text: str) -> Any:
        raise AssertionError("nothing finished: there is nothing to report")

    try:
        first = await agent.host.run_one_shot(
            clock_job(agent, children, tally, conversation, "tick")
        )
        await asyncio.to_thread(llm.wait_for_requests, 3, 10)  # the child is asking
        children.deadline = time.monotonic() + PARENT_RESERVE  # only the reserve is left
        final = await children.drain(first, continue_with)
    finally:
        hold.set()
    assert final is first and final.text == "my own answer"
    assert children.running == [] and children._children[0].outcome.cancelled
