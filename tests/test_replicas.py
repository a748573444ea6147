"""Replicas of the runner on one PostgreSQL store, in one process: every replica receives every
event (as a OneBot implementation pushes each event to every connection), exactly one answers.

Real Routers and Agents on the scripted server and a real PostgreSQL database shared by all;
each replica has its own in-memory adapter and data directory. Killing a replica for real
(kill -9, SIGSTOP) is played by the multi-process test, tests/test_runner_replicas.py.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from pathlib import Path
from typing import Any

import pytest
from _waits import until
from runner_memory import MemoryAdapter, blocker
from test_runner_router import APPROVAL, danger_tool

from ania_nb.errors import StoreError
from ania_nb.orchestration import claims
from ania_nb.runner.model import ChatRef, Incoming
from ania_nb.runner.router import Router
from ania_nb.store import InboxRow, Store
from ania_nb.store.db import Conn
from ania_nb.store.replicas import list_replicas, service_status
from ania_nb.testing import reply, tool_call

_ids = itertools.count(1)


class Replica:
    def __init__(self, agent: Any, adapter: MemoryAdapter, router: Router) -> None:
        self.agent, self.adapter, self.router = agent, adapter, router

    async def store(self) -> Store:
        return await self.agent.host.open_store()


@pytest.fixture
async def replicas(make_agent: Any, pg_url: str, tmp_path: Path) -> Any:
    started: list[Replica] = []

    async def factory(n: int, **overrides: Any) -> list[Replica]:
        made = []
        for _ in range(n):
            i = len(started)
            agent = make_agent(
                data_dir=tmp_path / f"replica{i}",
                tools=overrides.pop("tools", ()) if i == 0 else (),
                overrides={"store.url": pg_url, "runner.replica_id": f"r{i}", **overrides},
            )
            adapter = MemoryAdapter()
            router = Router(agent, adapter)
            await router.start()
            await adapter.start(router.handle)
            replica = Replica(agent, adapter, router)
            started.append(replica)
            made.append(replica)
        return made

    yield factory
    for replica in started:
        await replica.router.close(0)
        await replica.agent.aclose()  # before the database is dropped


def event(chat: ChatRef, user: str, text: str) -> Incoming:
    """One platform event, with the id every replica receives it under."""
    return Incoming(
        message_id=f"m{next(_ids)}",
        chat=chat,
        sender_id=user,
        sender_name=f"user{user}",
        text=text,
        mentioned=chat.kind == "group",
    )


async def broadcast(replicas: list[Replica], message: Incoming) -> None:
    """Deliver ``message`` to every replica at once."""
    await asyncio.gather(*(r.adapter.receive(message) for r in replicas))


async def rows(store: Store, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    async def read(conn: Conn) -> list[tuple[Any, ...]]:
        return await conn.fetchall(sql, params)

    return await store.db.run(read)


async def settled(store: Store) -> bool:
    """No inbox row waits and every outbox row was sent."""
    [(open_in, open_out)] = await rows(
        store,
        "SELECT (SELECT count(*) FROM inbox WHERE state IN ('pending', 'running')), "
        "(SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending'))",
    )
    return open_in == 0 and open_out == 0


async def wait_settled(store: Store) -> None:
    for _ in range(600):
        if await settled(store):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replicas did not answer everything within 30 s")


def overlapping(runs: list[tuple[str, float, float]]) -> list[str]:
    """Sessions with two runs whose [started, finished] intervals overlap."""
    found = []
    for session in {r[0] for r in runs}:
        spans = sorted((s, f) for name, s, f in runs if name == session)
        found += [session for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    return found


async def test_every_event_broadcast_to_three_replicas_is_answered_exactly_once(
    llm: Any, replicas: Any
) -> None:
    llm.loop = True
    llm.script(reply("ok"))
    three = await replicas(3)
    chats = [ChatRef("private", str(n)) for n in range(6)]
    chats += [ChatRef("group", str(900 + n)) for n in range(6)]
    events = [event(chats[n % len(chats)], str(n % 7), f"question {n}") for n in range(60)]
    for i in range(0, len(events), 6):  # six chats at a time, every replica receiving each
        await asyncio.gather(*(broadcast(three, e) for e in events[i : i + 6]))
    store = await three[0].store()
    await wait_settled(store)
    inbox = await store.inbox.list()
    assert len(inbox) == 60 and {e.state for e in inbox} == {"answered"}
    [(runs,)] = await rows(store, "SELECT count(*) FROM runs WHERE status = 'success'")
    replies = [o for o in await store.outbox.list() if o.kind == "reply"]
    assert len(replies) == runs == len(llm.requests)  # one reply per run, one run per batch
    answered_by = [e.run_id for e in inbox]
    assert set(answered_by) == {o.run_id for o in replies}  # every row's run replied
    sent = [m for r in three for m in r.adapter.sent]
    assert len(sent) == len(await store.outbox.list(states=["sent"]))  # no row sent twice
    assert sorted(m.text for m in sent if m.text == "ok") == ["ok"] * runs
    spans = await rows(store, "SELECT session, started_at, finished_at FROM runs")
    assert overlapping(spans) == []
    # the work was shared: more than one replica answered
    answering = await rows(store, "SELECT DISTINCT owner_start FROM runs")
    assert len(answering) > 1


async def test_a_verdict_stored_by_another_replica_answers_the_approval_where_the_run_waits(
    llm: Any, replicas: Any
) -> None:
    llm.script(reply(tool_calls=[tool_call("danger", {"what": "it"})]), reply("done"))
    a, b = await replicas(2, tools=[danger_tool()], **APPROVAL)
    chat = ChatRef("private", "1")
    await a.adapter.receive(event(chat, "1", "please do it"))  # only A: A runs it
    await a.adapter.wait_sent(lambda m: m.text.startswith("【工具审批】"))
    verdict = event(chat, "1", "允许")
    await b.adapter.receive(verdict)  # B stores it first: B knows of no approval
    await a.adapter.receive(verdict)  # A finds it stored
    sent = a.adapter.sent + b.adapter.sent
    await until(lambda: any(m.text == "done" for m in a.adapter.sent + b.adapter.sent), "done")
    sent = a.adapter.sent + b.adapter.sent
    assert sum(m.text.startswith("已允许：danger") for m in sent) == 1
    assert [m.text for m in sent].count("done") == 1
    [run] = await a.agent.runs(session=chat.session)
    assert run.tool_calls[0].result == "did it"
    assert len(llm.requests) == 2 and "允许" not in str(llm.requests[1].messages)


async def test_a_stop_stored_by_another_replica_stops_the_run_where_it_runs(
    llm: Any, replicas: Any
) -> None:
    wait_here, started, _release = blocker()
    llm.script(reply(tool_calls=[tool_call("wait_here")]), reply("never"))
    a, b = await replicas(2, tools=[wait_here])
    chat = ChatRef("private", "2")
    await a.adapter.receive(event(chat, "2", "work"))
    await asyncio.wait_for(started.wait(), 10)
    await b.adapter.receive(event(chat, "2", "/stop"))  # B cannot claim it: A is told
    await until(
        lambda: any(m.text == "AI 响应已被停止" for m in a.adapter.sent + b.adapter.sent), "stop"
    )
    [run] = await a.agent.runs(session=chat.session)
    assert run.status == "stopped"


async def test_messages_a_dead_replica_left_are_taken_over_by_the_sweep(
    llm: Any, replicas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "SWEEP_SECONDS", 0.1)
    monkeypatch.setattr(claims, "SWEEP_AGE", 0.1)
    llm.script(reply("answered after all"))
    [a] = await replicas(1, **{"runner.resume": "notify"})
    # What a killed replica leaves, appearing while this one runs: a stored message nobody
    # claimed (the kill came between the insert and the claim) and a run cut off in its
    # session, owned by a replica whose lock is gone.
    store = await a.store()
    row = InboxRow("memory", "10000", "m-dead", "f:7", "qq:7", {"text": "hi"}, kind="message")

    async def dead_replica(conn: Conn) -> None:
        await conn.execute(
            "INSERT INTO runs (session, input, status, started_at, owner_host, owner_pid, "
            "owner_start) VALUES ('f:8', 'cut off', 'running', 1, ?, 1, 'replica:gone')",
            (socket.gethostname(),),
        )
        await conn.execute(
            "INSERT INTO inbox (source, account, message_key, session, sender, kind, "
            "payload, received_at, state, run_id, updated_at) VALUES ('memory', '10000', "
            "'m-cut', 'f:8', 'qq:8', 'message', '{\"text\": \"long\"}', 1, 'running', "
            "(SELECT max(id) FROM runs), 1)"
        )

    await store.db.run(dead_replica)
    assert await store.inbox.accept(row) is not None
    await a.adapter.wait_sent(lambda m: m.text == "answered after all")
    notice = await a.adapter.wait_sent(lambda m: m.chat == ChatRef("private", "8"))
    assert "重启" in notice.text
    assert {e.message_key: e.state for e in await store.inbox.list()} == {
        "m-dead": "answered",
        "m-cut": "notified",
    }


async def test_a_live_replicas_id_is_refused_and_status_lists_the_replicas(
    llm: Any, replicas: Any, make_agent: Any, pg_url: str, tmp_path: Path
) -> None:
    [a] = await replicas(1)
    twin = make_agent(
        data_dir=tmp_path / "twin", overrides={"store.url": pg_url, "runner.replica_id": "r0"}
    )
    with pytest.raises(StoreError, match="replica id 'r0' is in use by a live replica"):
        await Router(twin, MemoryAdapter()).start()
    store = await a.store()
    [info] = await store.db.run(list_replicas)
    assert (info.id, info.alive) == ("r0", True)
    status = await store.db.run(service_status)
    assert status.to_json()["replicas"][0]["alive"] is True
    assert "r0" in status.to_text() and "replicas alive: 1" in status.to_text()
    await a.router.close(0)
    await a.agent.aclose()  # a clean stop unregisters it
    after = await Store.open(tmp_path / "reader", url=pg_url)
    try:
        assert await after.db.run(list_replicas) == []
    finally:
        await after.close()


async def test_only_the_clocks_leader_does_the_knowledge_upkeep(
    llm: Any, replicas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ania_nb.agent as agent_module

    monkeypatch.setattr(agent_module, "KB_UPKEEP_SECONDS", 0.05)
    a, b = await replicas(2)
    upkept: list[str] = []
    for replica in (a, b):
        knowledge = replica.agent.knowledge
        real = knowledge.upkeep

        async def upkeep(real: Any = real, name: str = replica.agent.replica.id) -> None:
            upkept.append(name)
            await real()  # the real compaction (a spy, not a stand-in)

        monkeypatch.setattr(knowledge, "upkeep", upkeep)
        monkeypatch.setattr(knowledge, "exists", lambda: True)
    await until(lambda: len(upkept) >= 3, "upkeeps")
    leader = a if a.agent.clock.active else b
    assert [a.agent.clock.active, b.agent.clock.active].count(True) == 1
    assert set(upkept) == {leader.agent.replica.id}
