"""Background subagents that survive restarts: the ``children`` table and the Agent's paths.

The store module on a real SQLite file; the Agent paths with a real Agent on the scripted
server, the router over the in-memory adapter (`runner_memory`) and a real store. A "kill -9"
is a store left as a killed process leaves it (a ``running`` child whose owner is gone), then a
new Agent and Router opened on it. The served process is killed for real in
``tests/test_runner_background.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from _waits import until
from runner_memory import MemoryAdapter
from test_runner_inbox import Served

from ania_nb.agents.background import STOPPED_BY_RESTART
from ania_nb.errors import UsageError
from ania_nb.orchestration.inbox import AGENT_SOURCE, Inbound, stored_role
from ania_nb.runner.model import ChatRef
from ania_nb.runner.router import Router
from ania_nb.store import InboxRow, OutboxRow, Store
from ania_nb.store.db import Conn
from ania_nb.store.mailbox import owner_text
from ania_nb.store.owner import Owner
from ania_nb.store.schema import MIGRATIONS
from ania_nb.testing import RecordedRequest, reply, tool_call

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

CHILD = "You are a subagent"  # in the subagent prompt: routes the children's requests
USER = "5"
CHAT = ChatRef("private", USER)
SESSION = CHAT.session
_message_ids = itertools.count(1)  # unique across restarts (a new adapter counts from 1 again)


def say(s: Served, text: str) -> Any:
    """The user writes ``text`` (a message id no earlier process saw)."""
    message = s.adapter.private(USER, text, message_id=f"m{next(_message_ids)}")
    return s.adapter.receive(message)


def PARENT(request: RecordedRequest) -> bool:
    """The parent's requests: everything without the subagent prompt."""
    return CHILD not in request.system


def background(task: str) -> Any:
    return tool_call("subagent_run", {"task": task, "background": True})


def stopped_text(child_id: int) -> str:
    return STOPPED_BY_RESTART.format(id=child_id)


class HeldChild:
    """The children's model answers only once the test lets it (on the server's thread)."""

    def __init__(self, text: str = "the child's result") -> None:
        self.text = text
        self.go = threading.Event()
        self.asked = threading.Event()

    def __call__(self, request: RecordedRequest) -> Any:
        self.asked.set()
        self.go.wait(20)
        return reply(self.text)

    async def wait_asked(self) -> None:
        assert await asyncio.to_thread(self.asked.wait, 10), "the child never asked the model"


@pytest.fixture
async def serve(make_agent: Any) -> Any:
    """``await serve(...)``: an Agent with the subagent tools behind a started Router."""
    routers: list[Router] = []

    async def factory(**overrides: Any) -> Served:
        agent = make_agent(
            overrides={"subagent.enable": True, "agent.builtin_tools": True, **overrides}
        )
        adapter = MemoryAdapter()
        router = Router(agent, adapter)
        await router.start()
        await adapter.start(router.handle)
        routers.append(router)
        return Served(agent, adapter, router)

    yield factory
    for router in routers:
        await router.close(0)


async def launched(s: Served, llm: Any, held: HeldChild, task: str = "watch the sky") -> None:
    """The user asks; the parent starts a background child and answers; the child is running."""
    llm.route(PARENT, reply(tool_calls=[background(task)]), reply("started it"))
    llm.responder = held  # the parent's requests are all routed: only the child's come here
    await say(s, "go")
    await sent(s, "started it")
    await held.wait_asked()


async def sent(s: Served, text: str) -> None:
    """Wait until ``text`` was sent to the chat."""
    await s.adapter.wait_sent(lambda m: m.chat == CHAT and text in m.text)


async def nothing_sent(s: Served) -> None:
    """A restart that has nothing to tell: no row waits in the outbox and nothing was sent."""
    await s.settle()
    store = await s.store()
    assert await store.outbox.list(states=["pending", "sending"]) == []
    assert s.adapter.sent == []


async def open_store(data: Path) -> Store:
    return await Store.open(data)


async def orphan(conn: Conn) -> None:
    """The owner of every running child is gone (as after a kill -9)."""
    await conn.execute("UPDATE children SET owner_pid = 999999999, owner_start = 'gone'")


# ------------------------------------------------------------------ the store module


async def test_a_child_row_starts_running_and_ends_exactly_once(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        first = await store.children.start("f:1", "count the stars", "admin", background=True)
        second = await store.children.start("f:1", "sync job", "member", background=False)
        assert second == first + 1
        row = await store.children.get(first)
        assert row is not None and (row.state, row.role, row.background) == (
            "running",
            "admin",
            True,
        )
        assert row.owner is not None and row.ended_at is None
        assert await store.children.end(first, "stopped", "cancel")
        assert not await store.children.end(first, "finished", "success")  # once only
        ended = await store.children.get(first)
        assert ended is not None and (ended.state, ended.outcome) == ("stopped", "cancel")
        assert [r.id for r in await store.children.list(states=["running"])] == [second]
    finally:
        await store.close()


async def test_bad_input_is_refused_clearly_and_keeps_the_row(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        child = await store.children.start("f:1", "job", "member", background=True)
        with pytest.raises(UsageError, match="a child ends finished, stopped, interrupted"):
            await store.children.end(child, "running")  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="child state must be one of"):
            await store.children.list(states=["lost"])
        with pytest.raises(UsageError, match="a child needs a session"):
            await store.children.start("", "job", "member", background=True)
        with pytest.raises(UsageError, match="payload must be a dict"):
            await store.children.end(
                child,
                "stopped",
                effects=[OutboxRow("f:1", "notice", "not a dict")],  # type: ignore[arg-type]
            )
        row = await store.children.get(child)
        assert row is not None and row.state == "running"
    finally:
        await store.close()


async def test_ids_are_never_reused_after_a_prune(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        old = await store.children.start("f:1", "job", "member", background=True)
        await store.children.end(old, "finished", "success")
        assert await store.children.prune(-60) == 1  # ended "more than -60 s ago": now
        assert await store.children.get(old) is None
        assert await store.children.start("f:1", "job", "member", background=True) > old
    finally:
        await store.close()
    again = await open_store(tmp_path)  # a new process: still no reuse
    try:
        assert await again.children.start("f:1", "job", "member", background=True) > old + 1
    finally:
        await again.close()


def result_row(child_id: int, session: str = "f:1") -> InboxRow:
    inbound = Inbound(AGENT_SOURCE, "", f"bg:{child_id}", session, "subagent", "[done]")
    return inbound.row()


async def test_finish_queues_the_result_in_the_same_transaction_and_never_twice(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path)
    try:
        child = await store.children.start("f:1", "job", "member", background=True)
        inbox_id = await store.children.finish(child, "success", result_row(child))
        [entry] = await store.inbox.list()
        assert inbox_id == entry.id and (entry.source, entry.message_key, entry.state) == (
            "agent",
            f"bg:{child}",
            "pending",
        )
        assert await store.children.finish(child, "success", result_row(child)) is None
        assert len(await store.inbox.list()) == 1
        # A key already taken (an id reused) writes nothing: the child stays running.
        other = await store.children.start("f:1", "job", "member", background=True)
        assert await store.children.finish(other, "success", result_row(child)) is None
        row = await store.children.get(other)
        assert row is not None and row.state == "running"
    finally:
        await store.close()


async def test_a_result_that_cannot_be_stored_leaves_the_child_running(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        child = await store.children.start("f:1", "job", "member", background=True)
        broken = InboxRow(AGENT_SOURCE, "", f"bg:{child}", "f:1", "subagent", {"x": object()})
        with pytest.raises(UsageError, match="JSON-serialisable"):
            await store.children.finish(child, "success", broken)
        row = await store.children.get(child)  # one transaction: the end rolled back too
        assert row is not None and row.state == "running"
        assert await store.inbox.list() == []
    finally:
        await store.close()


async def test_orphans_are_the_running_rows_whose_owner_is_gone(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        dead = await store.children.start("f:1", "job", "member", background=True)
        alive = await store.children.start("f:1", "job", "member", background=True)
        remote = await store.children.start("f:1", "job", "member", background=True)
        ended = await store.children.start("f:1", "job", "member", background=True)
        await store.children.end(ended, "finished", "success")

        async def owners(conn: Conn) -> None:
            await conn.execute(
                "UPDATE children SET owner_pid = 999999999 WHERE id IN (?, ?)", (dead, ended)
            )
            await conn.execute(
                "UPDATE children SET owner_host = 'elsewhere' WHERE id = ?", (remote,)
            )

        await store.db.run(owners)
        assert [r.id for r in await store.children.orphans()] == [dead]
        notice = OutboxRow("f:1", "notice", {"text": "gone"})
        assert await store.children.end(dead, "interrupted", "restart", [notice])
        assert not await store.children.end(dead, "interrupted", "restart", [notice])
        assert len(await store.outbox.list()) == 1  # the notice once, with the state change
        assert [r.id for r in await store.children.list(states=["running"])] == [alive, remote]
    finally:
        await store.close()


@pytest.mark.sqlite_only
async def test_a_store_of_the_previous_version_gets_the_table(tmp_path: Path) -> None:
    store = await open_store(tmp_path)

    async def downgrade(conn: Conn) -> None:
        # Back to the version before the children step (and the steps after it).
        step = next(i for i, st in enumerate(MIGRATIONS) if "children (" in st[0])
        await conn.execute("DROP TABLE children")
        await conn.execute("ALTER TABLE approvals DROP COLUMN verdict")
        await conn.execute("DROP TABLE replicas")
        await conn.execute("ALTER TABLE outbox DROP COLUMN owner")
        await conn.execute("DROP INDEX clock_log_slot")  # the clock's fencing step
        await conn.execute("ALTER TABLE clock_log DROP COLUMN missed_from")
        await conn.execute(f"PRAGMA user_version = {step}")

    await store.db.run(downgrade)
    await store.close()
    store = await open_store(tmp_path)
    try:
        assert await store.children.start("f:1", "job", "member", background=True) == 1
    finally:
        await store.close()


def test_only_the_agents_own_rows_carry_a_role() -> None:
    forged = Inbound("memory", "10000", "m1", "f:1", "qq:1", "hi", meta={"role": "admin"})
    assert stored_role(forged) is None  # a platform's message: its sender's role
    ours = Inbound(AGENT_SOURCE, "", "bg:1", "f:1", "subagent", "r", meta={"role": "admin"})
    assert stored_role(ours) == "admin"
    odd = Inbound(AGENT_SOURCE, "", "bg:2", "f:1", "subagent", "r", meta={"role": "root"})
    assert stored_role(odd) == "member"


# ------------------------------------------------------------------ finishing


async def test_a_finished_result_is_one_inbox_row_answered_by_one_reply(llm: Any, serve: Any):
    held = HeldChild("it is clear tonight")
    s = await serve()
    await launched(s, llm, held)
    store = await s.store()
    [child] = await store.children.list()
    assert (child.state, child.background, child.session) == ("running", True, SESSION)
    llm.route(PARENT, reply("Summary: clear sky"))
    held.go.set()
    await sent(s, "Summary: clear sky")
    await s.settle()
    ended = await store.children.get(child.id)
    assert ended is not None and (ended.state, ended.outcome) == ("finished", "success")
    rows = [e for e in await store.inbox.list() if e.source == AGENT_SOURCE]
    assert [(e.message_key, e.state, e.sender) for e in rows] == [
        (f"bg:{child.id}", "answered", "subagent")
    ]
    replies = [o for o in await store.outbox.list() if o.run_id == rows[0].run_id]
    assert [(o.kind, o.state, o.payload["text"]) for o in replies] == [
        ("reply", "sent", "Summary: clear sky")
    ]
    assert s.adapter.sent_to(CHAT)[-1].text == "Summary: clear sky"
    assert sum("Summary: clear sky" in t for t in s.texts(CHAT)) == 1  # not published again
    said = str(llm.requests[-1].messages[-1]["content"])
    assert f"[Subagent finished]\nID: {child.id}\nTask: watch the sky" in said
    assert said.rstrip().endswith("it is clear tonight")


async def test_the_launch_answers_with_the_stored_id(llm: Any, serve: Any) -> None:
    held = HeldChild()
    s = await serve()
    await launched(s, llm, held)
    [child] = await (await s.store()).children.list()
    results = [m["content"] for r in llm.requests for m in r.messages if m.get("role") == "tool"]
    held.go.set()
    assert any(f"subagent started (ID: {child.id})" in r for r in results)


async def test_a_full_queue_never_drops_a_result(llm: Any, serve: Any) -> None:
    held = HeldChild("late news")
    gate, parent_go = threading.Event(), threading.Event()
    s = await serve(**{"agent.queue_size": 1})
    await launched(s, llm, held)

    def busy(request: RecordedRequest) -> Any:
        gate.set()
        parent_go.wait(20)
        return reply("busy reply")

    llm.responder = lambda r: held(r) if CHILD in r.system else busy(r)
    llm.route(lambda r: PARENT(r) and "third" in str(r.messages[-1]), reply("both read"))
    try:
        await say(s, "second")
        assert await asyncio.to_thread(gate.wait, 10)
        await say(s, "third")  # the queue is full now
        state = s.agent.sessions.get(SESSION)
        await until(lambda: len(state.queue) == 1, "a full queue")
        held.go.set()  # the child ends while the queue is full: its result still waits
        await until(lambda: len(state.queue) == 2, "the result queued past the limit")
    finally:
        held.go.set()
        parent_go.set()
    await s.settle()
    texts = s.texts(CHAT)
    assert "busy reply" in texts and texts.count("both read") == 1
    answered = str(llm.requests[-1].messages[-1]["content"])
    assert "third" in answered and "late news" in answered  # one batch, nothing dropped
    [row] = [e for e in await (await s.store()).inbox.list() if e.source == AGENT_SOURCE]
    assert row.state == "answered"


async def test_cancel_and_stop_end_the_row_stopped_without_a_notice(llm: Any, serve: Any) -> None:
    held = HeldChild()
    s = await serve()
    await launched(s, llm, held)
    store = await s.store()
    [child] = await store.children.list()
    assert s.agent.stop(SESSION)  # /stop: the user's own doing
    await until(lambda: s.agent.background_running == 0, "the child to end")
    held.go.set()
    await s.settle()
    row = await store.children.get(child.id)
    assert row is not None and (row.state, row.outcome) == ("stopped", "stop")
    assert not any("后台任务" in t for t in s.texts(CHAT))
    assert [e for e in await store.inbox.list() if e.source == AGENT_SOURCE] == []


async def test_a_waited_for_child_has_a_row_too_that_ends_with_it(llm: Any, serve: Any) -> None:
    llm.route(
        PARENT,
        reply(tool_calls=[tool_call("subagent_run", {"task": "quick sum"})]),
        reply("it is 4"),
    )
    llm.route(CHILD, reply("4"))
    s = await serve()
    await say(s, "add 2 and 2")
    await sent(s, "it is 4")
    [child] = await (await s.store()).children.list()
    assert (child.background, child.state, child.outcome) == (False, "finished", "success")


# ------------------------------------------------------------------ restarts


async def test_a_shutdown_stops_a_running_child_with_one_notice_and_a_restart_adds_nothing(
    llm: Any, serve: Any, make_agent: Any
) -> None:
    held = HeldChild("never used")
    s = await serve()
    await launched(s, llm, held)
    store = await s.store()
    [child] = await store.children.list()
    try:
        await asyncio.wait_for(s.router.close(0), 20)  # no grace left: stopped at once
    finally:
        held.go.set()
    assert s.texts(CHAT).count(stopped_text(child.id)) == 1  # sent before the exit
    row = await store.children.get(child.id)
    assert row is not None and (row.state, row.outcome) == ("stopped", "restart")
    notices = [o for o in await store.outbox.list() if o.payload["text"] == stopped_text(child.id)]
    assert [(o.kind, o.state) for o in notices] == [("notice", "sent")]
    await s.agent.aclose()
    await nothing_sent(await serve())  # the restart: nothing more to tell


async def test_closing_the_agent_alone_stops_a_child_as_a_restart_does(
    llm: Any, serve: Any
) -> None:
    held = HeldChild("never used")
    s = await serve()
    await launched(s, llm, held)
    store = await s.store()
    [child] = await store.children.list()
    try:
        await asyncio.wait_for(s.agent.aclose(), 20)  # no router shutdown first
    finally:
        held.go.set()
    reopened = await open_store(store.data_dir)
    try:
        row = await reopened.children.get(child.id)
        assert row is not None and (row.state, row.outcome) == ("stopped", "restart")
        notices = [o.payload["text"] for o in await reopened.outbox.list(session=SESSION)]
        assert notices.count(stopped_text(child.id)) == 1  # sent now or after the restart
    finally:
        await reopened.close()


async def test_the_grace_waits_for_a_running_child_and_its_result_is_answered_after_restart(
    llm: Any, serve: Any
) -> None:
    held = HeldChild("finished in the grace")
    s = await serve()
    await launched(s, llm, held)
    closing = asyncio.create_task(s.router.close(30))
    await until(lambda: not s.agent.accepting, "the shutdown to begin")
    assert not closing.done()  # held by the running child
    held.go.set()
    await asyncio.wait_for(closing, 20)
    store = await s.store()
    [child] = await store.children.list()
    assert (child.state, child.outcome) == ("finished", "success")
    [row] = [e for e in await store.inbox.list() if e.source == AGENT_SOURCE]
    assert row.state == "pending"  # stored during the shutdown: answered after the restart
    assert not any("后台任务" in t for t in s.texts(CHAT))
    await s.agent.aclose()
    llm.route(PARENT, reply("read it after the restart"))
    again = await serve()
    await until(lambda: again.texts(CHAT) == ["read it after the restart"], "the late reply")
    await again.settle()
    assert again.texts(CHAT) == ["read it after the restart"]
    assert "finished in the grace" in str(llm.requests[-1].messages[-1]["content"])


async def test_after_a_kill_the_next_start_tells_the_chat_once_and_a_third_start_nothing(
    llm: Any, serve: Any, tmp_path: Path
) -> None:
    store = await open_store(tmp_path / "data")
    try:
        cut = await store.children.start(SESSION, "a long watch", "member", background=True)
        waited = await store.children.start(SESSION, "sync job", "member", background=False)
        await store.db.run(orphan)
    finally:
        await store.close()
    second = await serve()
    await until(lambda: second.texts(CHAT) == [stopped_text(cut)], "the one notice")
    await second.settle()
    assert second.texts(CHAT) == [stopped_text(cut)]  # the synchronous child: its run speaks
    reopened = await second.store()
    for child_id in (cut, waited):
        row = await reopened.children.get(child_id)
        assert row is not None and row.state == "interrupted"
    rows = len(await reopened.outbox.list())
    await second.router.close(0)
    await second.agent.aclose()
    third = await serve()
    await third.settle()
    store = await third.store()
    assert len(await store.outbox.list()) == rows  # nothing new to send, nothing pending
    assert await store.outbox.list(states=["pending", "sending"]) == []
    assert third.adapter.sent == []
    assert await store.children.list(states=["running"]) == []


async def test_a_result_stored_before_a_kill_is_answered_once_after_it(
    llm: Any, serve: Any, tmp_path: Path
) -> None:
    store = await open_store(tmp_path / "data")
    try:
        child = await store.children.start(SESSION, "job", "member", background=True)
        inbound = Inbound(
            AGENT_SOURCE,
            "",
            f"bg:{child}",
            SESSION,
            "subagent",
            f"[Subagent finished]\nID: {child}\nTask: job\n\nthe answer is 42",
            meta={"role": "member", "child_id": str(child)},
        )
        assert await store.children.finish(child, "success", inbound.row())
        await store.db.run(orphan)  # the kill came right after the finish step
    finally:
        await store.close()
    llm.route(PARENT, reply("42, as the subagent found"))
    s = await serve()
    await until(lambda: s.texts(CHAT) == ["42, as the subagent found"], "the reply")
    await s.settle()
    assert s.texts(CHAT) == ["42, as the subagent found"]  # no stop notice: it had finished
    await s.router.close(0)
    await s.agent.aclose()
    await nothing_sent(await serve())


async def test_a_result_reply_whose_send_was_cut_is_never_sent_twice(llm: Any, serve: Any) -> None:
    held = HeldChild("sent or not")
    s = await serve()
    await launched(s, llm, held)
    llm.route(PARENT, reply("the reply to the result"))
    held.go.set()
    await sent(s, "the reply to the result")
    await s.settle()
    store = await s.store()
    [reply_row] = [
        o for o in await store.outbox.list() if o.payload["text"].startswith("the reply")
    ]

    async def cut_while_sending(conn: Conn) -> None:
        # Claimed by the process the kill ended (another pid than this test's).
        dead = owner_text(Owner(socket.gethostname(), 999999999, "gone"))
        await conn.execute(
            "UPDATE outbox SET state = 'sending', owner = ? WHERE id = ?", (dead, reply_row.id)
        )

    await store.db.run(cut_while_sending)  # as if the kill came before "sent" was written
    await s.router.close(0)
    await s.agent.aclose()
    again = await serve()
    await nothing_sent(again)
    row = await (await again.store()).outbox.get(reply_row.id)
    assert row is not None and row.state == "uncertain"


async def test_ids_stay_unique_across_restarts(llm: Any, serve: Any) -> None:
    held = HeldChild("first")
    s = await serve()
    await launched(s, llm, held)
    llm.route(PARENT, reply("read the first"))
    held.go.set()
    await sent(s, "read the first")
    await s.router.close(0)
    await s.agent.aclose()
    again_held = HeldChild("second")
    again = await serve()
    await launched(again, llm, again_held, task="another watch")
    store = await again.store()
    ids = [r.id for r in await store.children.list()]
    assert len(ids) == 2 and ids[1] > ids[0]
    keys = [e.message_key for e in await store.inbox.list() if e.source == AGENT_SOURCE]
    again_held.go.set()
    assert keys == [f"bg:{ids[0]}"]


# ------------------------------------------------------------------ the notebook


async def test_in_a_notebook_the_result_is_injected_as_before_and_the_row_kept(
    llm: Any, make_agent: Any
) -> None:
    agent = make_agent(overrides={"subagent.enable": True, "agent.builtin_tools": True})
    held = HeldChild("notebook result")
    llm.route(PARENT, reply(tool_calls=[background("nb job")]), reply("started"))
    llm.responder = held
    llm.route(PARENT, reply("the notebook's summary"))
    delivered: list[Any] = []
    agent.outbox.subscribe(delivered.append)
    assert (await agent.chat("go", session="nb:bg")).text == "started"
    held.go.set()
    await until(lambda: delivered, "the reply on the outbox")
    assert [(d.text, d.source) for d in delivered] == [("the notebook's summary", "subagent")]
    store = await agent.host.open_store()
    [child] = await store.children.list()
    assert (child.session, child.state) == ("nb:bg", "finished")
    assert await store.inbox.list() == [] and await store.outbox.list() == []
