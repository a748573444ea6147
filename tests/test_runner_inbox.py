"""The durable inbox and outbox behind the router: re-sent events, floods, recovery at start.

A real Agent on the scripted server, the in-memory adapter and a real store; a "crash" is a
store left as a killed process leaves it (rows pending, running, sending), then a new Agent and
Router opened on it.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from _waits import until
from runner_memory import MemoryAdapter, blocker

from ania_nb import tool
from ania_nb.catalogue import say
from ania_nb.orchestration import Delivery
from ania_nb.orchestration.outbox import delivery_payload
from ania_nb.runner.chat import incoming_meta, model_text
from ania_nb.runner.model import ChatRef, Incoming
from ania_nb.runner.router import Router
from ania_nb.store import InboxRow, InboxState, OutboxRow, Store
from ania_nb.store.db import Conn
from ania_nb.store.mailbox import owner_text
from ania_nb.store.owner import Owner
from ania_nb.testing import reply, tool_call

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

OVERFLOW = "排队消息太多啦，稍后再试试吧~"


class Served:
    def __init__(self, agent: Any, adapter: MemoryAdapter, router: Router) -> None:
        self.agent, self.adapter, self.router = agent, adapter, router

    async def settle(self) -> None:
        await asyncio.wait_for(self.router.wait_idle(), 10)

    def texts(self, chat: ChatRef) -> list[str]:
        return [m.text for m in self.adapter.sent_to(chat)]

    async def store(self) -> Store:
        return await self.agent.host.open_store()


@pytest.fixture
async def serve(make_agent: Any) -> Any:
    routers: list[Router] = []

    async def factory(**kwargs: Any) -> Served:
        agent = make_agent(**kwargs)
        adapter = MemoryAdapter()
        router = Router(agent, adapter)
        await router.start()
        await adapter.start(router.handle)
        routers.append(router)
        return Served(agent, adapter, router)

    yield factory
    for router in routers:
        await router.close(0)


# ------------------------------------------------------------------ accept


async def test_a_re_sent_event_is_stored_once_and_answered_once(llm, serve):
    llm.script(reply("hello"), reply("must not be asked"))
    s = await serve()
    chat = ChatRef("private", "5")
    kept = await s.adapter.receive(s.adapter.private("5", "hi"))
    await s.settle()
    await s.adapter.receive(kept)  # the platform re-sends the same event (same message id)
    await s.settle()
    assert s.texts(chat) == ["hello"] and len(llm.requests) == 1
    [row] = await (await s.store()).inbox.list()
    assert (row.source, row.account, row.message_key, row.state) == (
        "memory",
        "10000",
        kept.message_id,
        "answered",
    )
    [out] = await (await s.store()).outbox.list()
    assert (out.kind, out.state, out.run_id) == ("reply", "sent", row.run_id)


async def test_a_re_sent_command_runs_once(llm, serve):
    s = await serve()
    chat = ChatRef("private", "5")
    kept = await s.adapter.receive(s.adapter.private("5", "/plan on"))
    await s.settle()
    s.agent.set_plan_mode("f:5", False)
    await s.adapter.receive(kept)
    await s.settle()
    assert len(s.texts(chat)) == 1 and not s.agent.plan_mode("f:5")  # not switched on again


async def test_a_flood_gets_one_overflow_notice_per_busy_period(llm, serve):
    wait_here, started, release = blocker()
    llm.script(reply(tool_calls=[tool_call("wait_here")]), reply("first"), reply("the rest"))
    s = await serve(tools=[wait_here], overrides={"agent.queue_size": 1})
    chat = ChatRef("private", "5")
    await s.adapter.receive(s.adapter.private("5", "work"))
    await asyncio.wait_for(started.wait(), 10)
    for n in range(30):
        await s.adapter.receive(s.adapter.private("5", f"flood {n}"))
    release.set()
    await s.settle()
    texts = s.texts(chat)
    assert texts.count(OVERFLOW) == 1  # not 29
    assert texts[-2:] == ["first", "the rest"]
    states = [e.state for e in await (await s.store()).inbox.list()]
    assert states.count("dropped") == 29 and states.count("answered") == 2


async def test_each_busy_period_gets_its_own_overflow_notice(llm, serve):
    wait_here, started, release = blocker()
    llm.script(
        reply(tool_calls=[tool_call("wait_here")]),
        reply("first"),
        reply("queued one"),
        reply(tool_calls=[tool_call("wait_here")]),
        reply("second"),
        reply("queued two"),
    )
    s = await serve(tools=[wait_here], overrides={"agent.queue_size": 1})
    chat = ChatRef("private", "5")
    for period in range(2):
        started.clear()
        release.clear()
        await s.adapter.receive(s.adapter.private("5", f"work {period}"))
        await asyncio.wait_for(started.wait(), 10)
        for n in range(3):
            await s.adapter.receive(s.adapter.private("5", f"flood {period}.{n}"))
        release.set()
        await s.settle()
    assert s.texts(chat).count(OVERFLOW) == 2  # one per busy period, not one per chat
    assert s.texts(chat)[-2:] == ["second", "queued two"]


# ------------------------------------------------------------------ recovery


def incoming(user: str, message_id: str, text: str) -> Incoming:
    return Incoming(message_id, ChatRef("private", user), user, f"user{user}", text)


def inbox_row(message: Incoming, state: str = "pending") -> InboxRow:
    payload = {
        "text": model_text(message),
        "images": [],
        "model": None,
        "plan": False,
        "meta": incoming_meta(message),
    }
    return InboxRow(
        "memory",
        "10000",
        message.message_id,
        message.chat.session,
        f"qq:{message.sender_id}",
        payload,
        state=state,  # type: ignore[arg-type]
    )


async def crashed_store(
    data: Path, *, side_effects: bool = False
) -> tuple[list[int], list[int], int]:
    """A store as a killed runner leaves it: f:1 has two messages nobody started, f:2 one whose
    run was cut off (its record ``running``, its owner dead), the outbox a row being sent and a
    row not sent yet. Returns the pending ids, the cut-off ids and the cut-off run's id."""
    store = await Store.open(data)
    try:
        pending = [
            await store.inbox.accept(inbox_row(incoming("1", "m1", "first question"))),
            await store.inbox.accept(inbox_row(incoming("1", "m2", "second question"))),
        ]
        cut = await store.inbox.accept(inbox_row(incoming("2", "m3", "long job")))
        assert cut is not None and None not in pending
        run_id, _ = await store.journal.begin(
            "f:2",
            "long job",
            sender="qq:2",
            message={"role": "user", "content": "long job"},
            load_history=False,
            effects=[InboxState((cut,), "running")],
        )
        if side_effects:
            await store.journal.mark_side_effects(run_id)
        delivery = Delivery("f:3", "already half-sent", "notice")
        await store.outbox.add(OutboxRow("f:3", "notice", delivery_payload(delivery)))
        await store.outbox.claim("f:3")  # "sending" when the process died
        later = Delivery("f:3", "never sent", "notice")
        await store.outbox.add(OutboxRow("f:3", "notice", delivery_payload(later)))

        async def dead_owner(conn: Conn) -> None:
            await conn.execute("UPDATE runs SET owner_pid = 999999999, owner_start = 'gone'")
            dead = owner_text(Owner(socket.gethostname(), 999999999, "gone"))
            await conn.execute("UPDATE outbox SET owner = ? WHERE state = 'sending'", (dead,))

        await store.db.run(dead_owner)
        return [i for i in pending if i is not None], [cut], run_id
    finally:
        await store.close()


async def test_start_answers_pending_messages_batched_and_announces_a_cut_off_reply(
    llm, serve, tmp_path: Path
):
    pending, cut, run_id = await crashed_store(tmp_path / "data")
    llm.script(reply("both answered"))
    s = await serve()
    await s.settle()
    assert s.texts(ChatRef("private", "1")) == ["both answered"]  # one batch, like a queue
    assert "first question" in str(llm.requests[0].messages[-1])
    assert "second question" in str(llm.requests[0].messages[-1])
    await until(lambda: s.texts(ChatRef("private", "2")), "the cut-off reply's notice")
    [notice] = s.texts(ChatRef("private", "2"))
    assert "long job" in notice and "重启" in notice
    # the row being sent when the process died is never sent again; the next one is, once
    # the adapter is connected (the router started before it)
    await until(lambda: s.texts(ChatRef("private", "3")) == ["never sent"], "the pending row")
    await s.settle()  # sent rows are marked a moment after the send
    store = await s.store()
    states = {e.id: e.state for e in await store.inbox.list()}
    assert [states[i] for i in pending] == ["answered", "answered"]
    assert [states[i] for i in cut] == ["notified"]
    record = await store.runs.get(run_id)
    assert record is not None and record.status == "interrupted"
    assert await resumed(store, run_id) == "notified"
    assert [e.state for e in await store.outbox.list(session="f:3")] == ["uncertain", "sent"]


def asking(words: str) -> Any:
    """A route match: requests whose last message has ``words``."""
    return lambda request: words in str(request.messages[-1])


async def resumed(store: Store, run_id: int) -> str | None:
    async def read(conn: Conn) -> str | None:
        return await conn.fetchval("SELECT resumed FROM runs WHERE id = ?", (run_id,))

    return await store.db.run(read)


async def test_rerun_answers_a_cut_off_message_again_when_no_side_effects_had_started(
    llm, serve, tmp_path: Path
):
    _, cut, run_id = await crashed_store(tmp_path / "data")
    llm.route(asking("long job"), reply("the long answer"))
    llm.route(asking("first question"), reply("both answered"))
    s = await serve(overrides={"runner.resume": "rerun"})
    await s.settle()
    assert s.texts(ChatRef("private", "2")) == ["the long answer"]
    store = await s.store()
    assert await resumed(store, run_id) == "rerun"
    row = await store.inbox.get(cut[0])
    assert row is not None and row.state == "answered" and row.run_id != run_id


async def test_rerun_notifies_instead_when_a_tool_with_side_effects_had_started(
    llm, serve, tmp_path: Path
):
    _, _, run_id = await crashed_store(tmp_path / "data", side_effects=True)
    llm.route(asking("first question"), reply("both answered"))
    s = await serve(overrides={"runner.resume": "rerun"})
    await s.settle()
    [notice] = s.texts(ChatRef("private", "2"))
    assert "重启" in notice
    store = await s.store()
    assert await resumed(store, run_id) == "notified"
    assert [r for r in llm.requests if "long job" in str(r.messages)] == []


async def test_a_tool_with_side_effects_is_marked_on_the_record_before_it_runs(llm, serve):
    seen: list[int] = []
    s_box: list[Served] = []

    @tool(side_effects=True)
    async def launch() -> str:
        """Do something that cannot be undone."""
        store = await s_box[0].store()

        async def flag(conn: Conn) -> int:
            return await conn.fetchval("SELECT max(side_effects_started) FROM runs")

        seen.append(await store.db.run(flag))
        return "launched"

    llm.script(reply(tool_calls=[tool_call("launch")]), reply("done"))
    s = await serve(tools=[launch])
    s_box.append(s)
    await s.adapter.receive(s.adapter.private("5", "go"))
    await s.settle()
    assert seen == [1]  # committed before the tool ran


# ------------------------------------------------------------------ shutdown


async def test_messages_during_the_shutdown_grace_are_kept_and_answered_after_restart(
    llm, make_agent, tmp_path: Path
):
    wait_here, started, release = blocker()
    llm.script(reply(tool_calls=[tool_call("wait_here")]), reply("finished"))
    agent = make_agent(tools=[wait_here])
    adapter = MemoryAdapter()
    router = Router(agent, adapter)
    await adapter.start(router.handle)
    await adapter.receive(adapter.private("5", "work"))
    await asyncio.wait_for(started.wait(), 10)
    closing = asyncio.create_task(router.close(30))
    await asyncio.sleep(0)
    for n in range(3):
        await adapter.receive(adapter.private("6", f"while closing {n}"))
    await adapter.receive(adapter.private("7", "me too"))
    release.set()
    await asyncio.wait_for(closing, 10)
    await agent.aclose()
    for chat in (ChatRef("private", "6"), ChatRef("private", "7")):  # each chat told once
        assert [m.text for m in adapter.sent_to(chat)] == [say("notice.held", "zh")]

    def answer(request: Any) -> Any:
        asked = str(request.messages[-1])
        return reply("answered 6" if "while closing 2" in asked else "answered 7")

    llm.responder = answer
    again = make_agent()
    adapter2 = MemoryAdapter()
    router2 = Router(again, adapter2)
    await router2.start()
    await adapter2.start(router2.handle)
    await asyncio.wait_for(router2.wait_idle(), 10)
    assert sorted(m.text for m in adapter2.sent) == ["answered 6", "answered 7"]  # once each
    assert [m.text for m in adapter2.sent_to(ChatRef("private", "6"))] == ["answered 6"]
    await router2.close(0)


async def test_the_reply_row_is_written_by_the_runs_finish_step_itself(llm, serve, monkeypatch):
    """A crash right after the finish step (before anything else runs) loses no reply."""
    llm.script(reply("kept"))
    s = await serve()
    # what runs after the run's last transaction never happens, as if the process died there
    monkeypatch.setattr(s.agent, "_batch_finished", lambda *args: None)
    monkeypatch.setattr(s.agent._queues, "_finished", lambda *args: None)
    await s.adapter.receive(s.adapter.private("5", "hi"))
    store = await s.store()
    await until(lambda: not any(x.busy for x in s.agent.sessions), "the run to end")
    [row] = await store.inbox.list()
    [out] = await store.outbox.list()
    assert row.state == "answered" and (out.kind, out.run_id) == ("reply", row.run_id)
    assert out.payload["text"] == "kept"


# ------------------------------------------------------------------ delivery


async def test_a_crash_between_the_finish_commit_and_the_write_leaves_the_reply_uncertain(
    llm, make_agent, monkeypatch
):
    """The reply row is claimed in the run's finish step: dying before the write, it is not
    sent again (it may or may not have been written, as after any claim), nor duplicated."""
    from ania_nb.orchestration import delivery

    monkeypatch.setattr(delivery, "CLOSE_WAIT", 0.05)  # the first "process" never hands off
    llm.script(reply("written, then the process died"))
    agent = make_agent()
    adapter = MemoryAdapter()
    router = Router(agent, adapter)
    await router.start()
    await adapter.start(router.handle)
    handed: list[Any] = []
    monkeypatch.setattr(agent.outbox, "handoff", lambda row, row_id: handed.append((row, row_id)))
    await adapter.receive(adapter.private("5", "hi"))
    await until(lambda: handed, "the finish step to commit")
    [(row, row_id)] = handed
    store = await agent.host.open_store()
    out = await store.outbox.get(row_id)
    assert out is not None and (out.kind, out.state, out.attempts) == ("reply", "sending", 1)
    assert row.claimed and adapter.sent == []

    async def died(conn: Conn) -> None:  # the first "process" ends: its pid is another's
        dead = owner_text(Owner(socket.gethostname(), 999999999, "gone"))
        await conn.execute("UPDATE outbox SET owner = ? WHERE state = 'sending'", (dead,))

    await store.db.run(died)
    again = make_agent()  # the restart: same data dir
    adapter2 = MemoryAdapter()
    router2 = Router(again, adapter2)
    await router2.start()
    await adapter2.start(router2.handle)
    await asyncio.wait_for(router2.wait_idle(), 10)
    assert adapter2.sent == [] and len(llm.requests) == 1  # neither sent again nor re-run
    store2 = await again.host.open_store()
    [out] = await store2.outbox.list()
    [entry] = await store2.inbox.list()
    assert (out.state, entry.state) == ("uncertain", "answered")
    await router2.close(0)


class Wire:
    """A deliverer's send that records rows and can hold the next one until released."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.holding = asyncio.Event()

    async def __call__(self, entry: Any) -> tuple[str, str | None]:
        if not self.hold.is_set():
            self.holding.set()
            await self.hold.wait()
        self.sent.append(entry.id)
        return "sent", None


async def deliverer_on(data: Path) -> tuple[Any, Store, Wire]:
    from ania_nb.orchestration.delivery import Deliverer

    async def ready() -> None:
        return None

    store = await Store.open(data)
    wire = Wire()
    return Deliverer(store.outbox, wire, serves=lambda s: True, ready=ready), store, wire


async def test_a_handed_reply_is_written_before_the_deliverer_closes(tmp_path: Path) -> None:
    deliverer, store, wire = await deliverer_on(tmp_path / "data")
    try:
        assert deliverer.reserve("f:1")
        assert not deliverer.reserve("f:1")  # its worker is busy now: the next row waits
        closing = asyncio.create_task(deliverer.aclose())
        await asyncio.sleep(0)  # the close has begun; the step commits only now
        row = OutboxRow("f:1", "reply", {"text": "late"}, claimed=True)
        row_id = await store.outbox.add(row)
        deliverer.handoff("f:1", store.outbox.entry(row, row_id))
        await asyncio.wait_for(closing, 10)
        assert wire.sent == [row_id]
        assert (await store.outbox.get(row_id)).state == "sent"  # type: ignore[union-attr]
        assert not deliverer.reserve("f:2")  # closed
    finally:
        await store.close()


async def test_rows_added_while_a_handed_reply_is_sent_follow_it_in_order(tmp_path: Path) -> None:
    deliverer, store, wire = await deliverer_on(tmp_path / "data")
    try:
        wire.hold.clear()
        assert deliverer.reserve("f:1")
        row = OutboxRow("f:1", "reply", {"text": "the reply"}, claimed=True)
        first = await store.outbox.add(row)
        deliverer.handoff("f:1", store.outbox.entry(row, first))
        await asyncio.wait_for(wire.holding.wait(), 10)
        later = [await store.outbox.add(OutboxRow("f:1", "notice", {"text": t})) for t in "ab"]
        deliverer.wake("f:1")  # once for both, as a busy chat may be woken
        deliverer.wake("f:1")
        wire.hold.set()
        await asyncio.wait_for(deliverer.wait_idle(), 10)
        assert wire.sent == [first, *later]
        assert [e.state for e in await store.outbox.list()] == ["sent"] * 3
    finally:
        await deliverer.aclose()
        await store.close()
