"""Pending approvals survive a restart: stored with the run's state before the card is shown,
suspended at close (the run ends ``interrupted``, no tool result), asked again by a new Agent on
the same data dir, and the verdict continues the same conversation from the pending call."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from typing import Any

import pytest
from _sql import execute, fetch
from _waits import until

from ania_nb import Callbacks, UsageError, tool
from ania_nb.orchestration import Delivery
from ania_nb.store import Store
from ania_nb.testing import reply, tool_call

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

SESSION = "g:1"
written: list[str] = []
quick_runs: list[str] = []


@tool(side_effects=True)
def write_note(text: str) -> str:
    """Write a note (a side effect)."""
    written.append(text)
    return f"wrote {text}"


@tool
def quick() -> str:
    """Finish at once."""
    quick_runs.append("ran")
    return "quick done"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    written.clear()
    quick_runs.clear()


class FrontEnd:
    """A front end's request_approval and outbox subscriber: what it was shown, what it got."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.requests: list[Any] = []
        self.deliveries: list[Delivery] = []
        self.rows_when_shown: list[str | None] = []  # the approval row's state as it was shown
        agent.outbox.callbacks_for = lambda session: self.callbacks
        agent.outbox.subscribe(self.deliveries.append)

    @property
    def callbacks(self) -> Callbacks:
        return Callbacks(request_approval=self.show)

    async def show(self, request: Any) -> None:
        row = await self.agent.host.open_store()
        stored = await row.approvals.get(request.id)
        self.rows_when_shown.append(stored.state if stored is not None else None)
        self.requests.append(request)


def approval_agent(make_agent: Any, **overrides: Any) -> Any:
    return make_agent(
        tools=[write_note, quick],
        overrides={"approval.enable": True, "approval.tools": ["write_note"], **overrides},
    )


async def rows(agent: Any) -> list[tuple[str, str]]:
    store = await agent.host.open_store()
    found = await fetch(store.db, "SELECT id, state FROM approvals ORDER BY created_at")
    return [tuple(r) for r in found]


async def suspended_run(make_agent: Any, llm: Any) -> tuple[Any, str, Any]:
    """A run of agent A waiting for write_note's approval (quick already ran), then A closed.

    Returns the request id, the suspended run's result and the data dir's first front end.
    """
    first = approval_agent(make_agent)
    front = FrontEnd(first)
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "x"}), tool_call("quick")]))
    task = asyncio.create_task(
        first.chat("note x", session=SESSION, sender="qq:7", callbacks=front.callbacks)
    )
    await until(lambda: front.requests and quick_runs, "the card and the sibling's result")
    request = front.requests[0]
    assert front.rows_when_shown == ["pending"]  # stored before the front end was told
    await first.aclose()
    result = await task
    return request.id, result, front


async def test_close_suspends_then_a_new_agent_resumes_and_allow_runs_the_tool(
    make_agent: Any, llm: Any, tmp_path: Any
) -> None:
    request_id, result, _ = await suspended_run(make_agent, llm)
    assert (result.status, result.error) == ("interrupted", "suspended waiting for an approval")
    assert written == []  # the pending call did not run
    second = approval_agent(make_agent)
    hooked: list[str] = []
    second.add_hook("PreToolUse", lambda event, payload: hooked.append(payload["tool_name"]))
    front = FrontEnd(second)
    history = await second.history(SESSION)
    assert [m["role"] for m in history] == ["user"]  # no tool result written, no open call
    [original] = await second.runs(session=SESSION)
    assert (original.status, original.error) == ("interrupted", "suspended waiting for an approval")
    assert await rows(second) == [(request_id, "suspended")]

    llm.script(reply("noted after the restart"))
    posted = await second.resume_approvals()
    assert [(r.id, r.resent, r.tool, r.requester) for r in posted] == [
        (request_id, True, "write_note", "qq:7")
    ]
    await until(lambda: front.requests, "the card posted again")
    assert [r.id for r in front.requests] == [request_id]
    with pytest.raises(UsageError, match="only the requester or an admin"):
        second.answer_approval(request_id, allow=True, approver="qq:8")  # same rules as before
    second.answer_approval(request_id, allow="允许", approver="qq:7")
    await until(lambda: front.deliveries, "the resumed run's reply")
    [delivery] = front.deliveries
    assert (delivery.text, delivery.status) == ("noted after the restart", "success")
    assert written == ["x"] and quick_runs == ["ran"]  # the sibling's result was kept, not rerun
    assert hooked == []  # PreToolUse does not run twice for the decided call
    tool_results = [m for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_results] == ["wrote x", "quick done"]
    assert llm.requests[-1].messages[1]["content"].endswith("note x")  # the same conversation
    resumed, _ = await second.runs(session=SESSION)
    assert resumed.status == "success"
    assert resumed.input.startswith(f"[resumed run {original.id}: write_note allowed]")
    roles = [m["role"] for m in await second.history(SESSION)]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    assert await rows(second) == [(request_id, "allowed")]


async def test_deny_after_the_restart_gives_the_refusal_to_the_model(
    make_agent: Any, llm: Any
) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    second = approval_agent(make_agent)
    front = FrontEnd(second)
    llm.script(reply("fine, no note"))
    await second.resume_approvals()
    await until(lambda: front.requests, "the card posted again")
    second.answer_approval(request_id, allow="拒绝", approver="qq:7")
    await until(lambda: front.deliveries, "the resumed run's reply")
    assert front.deliveries[0].text == "fine, no note" and written == []
    tool_results = [m["content"] for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert tool_results == ["Tool call not approved: denied by qq:7", "quick done"]
    assert await rows(second) == [(request_id, "denied")]


async def test_a_deadline_passed_while_down_times_out_without_a_card(
    make_agent: Any, llm: Any
) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    # The process was down past the request's deadline (wall clock, set when it was asked).
    second = approval_agent(make_agent)
    store = await second.host.open_store()
    await execute(
        store.db, "UPDATE approvals SET deadline = ? WHERE id = ?", (time.time() - 1, request_id)
    )
    front = FrontEnd(second)
    llm.script(reply("it timed out"))
    assert await second.resume_approvals() == []  # not posted again
    await until(lambda: front.deliveries, "the resumed run's reply")
    assert front.requests == [] and written == []
    tool_results = [m["content"] for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert tool_results[0] == "Tool call not approved: no answer within 120 s, denied automatically"
    assert await rows(second) == [(request_id, "timeout")]


async def test_the_deadline_counts_from_the_original_request(make_agent: Any, llm: Any) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    second = approval_agent(make_agent)
    store = await second.host.open_store()
    # Asked long ago: a little of its time is left after the restart, not a fresh timeout.
    await execute(
        store.db, "UPDATE approvals SET deadline = ? WHERE id = ?", (time.time() + 0.3, request_id)
    )
    front = FrontEnd(second)
    llm.script(reply("too slow"))
    assert [r.id for r in await second.resume_approvals()] == [request_id]
    await until(lambda: front.deliveries, "the resumed run's reply after the timeout")
    assert await rows(second) == [(request_id, "timeout")] and written == []


async def test_a_run_blocked_only_later_is_suspended_once_its_sibling_ends(
    make_agent: Any, llm: Any
) -> None:
    release = asyncio.Event()

    @tool
    async def slow() -> str:
        """Wait for the test."""
        await release.wait()
        return "slow done"

    agent = make_agent(
        tools=[write_note, slow],
        overrides={"approval.enable": True, "approval.tools": ["write_note"]},
    )
    front = FrontEnd(agent)
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "y"}), tool_call("slow")]))
    task = asyncio.create_task(agent.chat("go", session=SESSION, callbacks=front.callbacks))
    await until(lambda: front.requests, "the card")
    assert await agent.suspend_approvals() == 0  # a sibling still runs: not blocked only
    assert not task.done()
    release.set()
    result = await asyncio.wait_for(task, 10)
    assert (result.status, result.error) == ("interrupted", "suspended waiting for an approval")
    assert await rows(agent) == [(front.requests[0].id, "suspended")]
    store = await agent.host.open_store()
    row = await store.approvals.get(front.requests[0].id)
    assert row is not None
    assert [r["result"] for r in row.checkpoint["finished"]] == ["slow done"]


async def test_while_suspending_a_new_question_suspends_its_run_without_a_card(
    make_agent: Any, llm: Any
) -> None:
    agent = approval_agent(make_agent, **{"approval.timeout": 10})  # a break fails sooner
    front = FrontEnd(agent)
    await agent.start()
    assert await agent.suspend_approvals() == 0  # shutdown began; nothing waits yet
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "z"})]))
    result = await agent.chat("late", session=SESSION, callbacks=front.callbacks)
    assert (result.status, result.error) == ("interrupted", "suspended waiting for an approval")
    assert front.requests == [] and written == []
    [(_, state)] = await rows(agent)
    assert state == "suspended"


async def test_two_agents_resuming_at_once_post_a_request_only_once(
    make_agent: Any, llm: Any
) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    second, third = approval_agent(make_agent), approval_agent(make_agent)
    fronts = [FrontEnd(second), FrontEnd(third)]
    await asyncio.gather(second.start(), third.start())
    posted = await asyncio.gather(second.resume_approvals(), third.resume_approvals())
    assert sorted(len(p) for p in posted) == [0, 1]
    await until(lambda: sum(len(f.requests) for f in fronts) == 1, "one card")
    # The owner of the re-posted question still runs: a later start leaves it alone.
    fourth = approval_agent(make_agent)
    FrontEnd(fourth)
    assert await fourth.resume_approvals() == []
    assert request_id in {r.id for f in fronts for r in f.requests}


async def test_a_live_verdict_settles_the_row_and_a_front_end_without_cards_resumes_nothing(
    make_agent: Any, llm: Any
) -> None:
    agent = approval_agent(make_agent)
    front = FrontEnd(agent)
    llm.script(reply(tool_calls=[tool_call("write_note", {"text": "w"})]), reply("done"))
    task = asyncio.create_task(agent.chat("w", session=SESSION, callbacks=front.callbacks))
    await until(lambda: front.requests, "the card")
    agent.answer_approval(session=SESSION, allow=True)
    assert (await task).text == "done"
    assert await rows(agent) == [(front.requests[0].id, "allowed")]
    # A notebook-like front end (no request_approval for this session) leaves rows alone.
    request_id, _, _ = await suspended_run(make_agent, llm)
    other = approval_agent(make_agent)
    assert await other.resume_approvals() == []
    assert (request_id, "suspended") in await rows(other)


@pytest.mark.sqlite_only
async def test_a_broken_stored_row_is_refused_clearly_and_the_others_still_resume(
    make_agent: Any, llm: Any, tmp_path: Any
) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    with sqlite3.connect(tmp_path / "data" / "ania.db") as db:  # hand-edited: a broken row
        db.execute(
            "INSERT INTO approvals (id, session, state, created_at, updated_at, deadline, "
            "request, checkpoint) VALUES ('bad1', 'g:1', 'suspended', 0, 0, ?, ?, ?)",
            (time.time() + 60, json.dumps({"tool": "write_note", "summary": "s"}), "{}"),
        )
        db.execute(  # an ended row past the week rows are kept
            "INSERT INTO approvals (id, session, state, created_at, updated_at, deadline, "
            "request, checkpoint) VALUES ('old1', 'g:1', 'allowed', 0, 0, 0, '{}', '{}')"
        )
    second = approval_agent(make_agent)
    FrontEnd(second)
    posted = await second.resume_approvals()
    assert [r.id for r in posted] == [request_id]
    assert "old1" not in {row_id for row_id, _ in await rows(second)}
    store: Store = await second.host.open_store()
    bad = await store.approvals.get("bad1")
    assert bad is not None and bad.state == "error"
    assert bad.reason == "approval row bad1: the stored run state has version None, not 1"


async def test_a_verdict_whose_run_had_not_started_at_close_is_asked_again(
    make_agent: Any, llm: Any
) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    second = approval_agent(make_agent)
    front = FrontEnd(second)
    held = threading.Event()

    def hold(request: Any) -> Any:
        held.wait(10)  # on the server's thread: keeps the session busy until released
        return reply("busy reply")

    llm.responder = hold
    try:
        busy = asyncio.create_task(second.chat("keep busy", session=SESSION))
        await asyncio.to_thread(llm.wait_for_requests, 2, 10)
        await second.resume_approvals()
        await until(lambda: front.requests, "the card posted again")
        second.answer_approval(request_id, allow=True, approver="qq:7")
        await until(lambda: second.session(SESSION).queue, "the resumed run waiting its turn")
        assert await rows(second) == [(request_id, "pending")]  # settled when it starts
        await second.aclose()  # the busy run is stopped; the resumed one never started
        assert (await busy).status == "stopped"
    finally:
        held.set()
        llm.responder = None
    assert await rows(approval_agent(make_agent)) == [(request_id, "suspended")]
    third = approval_agent(make_agent)
    FrontEnd(third)
    assert [r.id for r in await third.resume_approvals()] == [request_id]
    assert written == []


async def test_the_approval_log_refuses_bad_states_clearly_and_keeps_the_row(
    make_agent: Any, llm: Any
) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    store: Store = await approval_agent(make_agent).host.open_store()
    with pytest.raises(UsageError, match="pending or suspended, not 'allowed'"):
        await store.approvals.add(
            request_id="new1",
            session=SESSION,
            run_id=None,
            deadline=time.time(),
            request={},
            checkpoint={},
            state="allowed",
        )
    with pytest.raises(UsageError, match="use claim to take it over"):
        await store.approvals.settle(request_id, "pending")
    row = await store.approvals.get(request_id)
    assert row is not None and row.state == "suspended" and row.checkpoint["pending"]
    assert await store.approvals.get("new1") is None


async def test_a_verdict_kept_on_a_suspended_row_survives_being_suspended_again(
    make_agent: Any, llm: Any
) -> None:
    request_id, _, _ = await suspended_run(make_agent, llm)
    store: Store = await approval_agent(make_agent).host.open_store()
    log = store.approvals
    with pytest.raises(UsageError, match="allowed or denied, not 'timeout'"):
        await log.decide(request_id, "timeout", "", None)
    assert await log.decide(request_id, "denied", "denied by qq:7", "qq:7")
    assert not await log.decide(request_id, "allowed", "approved by qq:7", "qq:7")  # first wins
    [(row, live)] = await log.open_rows()
    assert not live  # suspended: nobody holds it
    claimed = await log.claim(row)
    assert claimed is not None and (claimed.state, claimed.resent) == ("pending", 0)
    assert not await log.decide(request_id, "allowed", "", "qq:7")  # only suspended rows
    # Closed again before its run went on: suspended, still with who decided and why.
    assert await log.settle(request_id, "suspended", "suspended waiting for an approval")
    row = await log.get(request_id)
    assert row is not None
    assert (row.state, row.verdict, row.approver, row.reason) == (
        "suspended",
        "denied",
        "qq:7",
        "denied by qq:7",
    )
    assert await log.settle(request_id, "denied", "denied by qq:7", "qq:7")
    assert await rows(approval_agent(make_agent)) == [(request_id, "denied")]
