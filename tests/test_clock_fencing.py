"""The clock across processes sharing a store: fenced slots, the misfire rule, the PostgreSQL lease.

Every fire is recorded under its ``(task, planned time)`` key before it runs (`SlotTaken` for
the loser, the unique index ``clock_log_slot`` behind it); planned times that passed while no
process held the clock are found at take-over (``clock.misfire``); on PostgreSQL the lease is
the database's ``clock-leader`` advisory lock, so two Agents on one database exclude each other
even in one process, and a leader whose lock session the server ended steps down at once.
The real processes (kill -9, SIGSTOP) are in test_clock_replicas.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from _waits import until

from ania_nb.clock import POLL_SECONDS
from ania_nb.clock.lease import LEADER_IDLE_TIMEOUT, LEADER_LOCK, PostgresLease
from ania_nb.clock.runner import trigger_text
from ania_nb.clock.store import NO_LEADER_ERROR, ClockStore, SlotTaken
from ania_nb.errors import StoreError
from ania_nb.store import Store
from ania_nb.store.locks import AdvisoryLocks, advisory_key
from ania_nb.testing import reply

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

HOUR = 3600.0


def fields(**changes: Any) -> dict[str, Any]:
    """Checked task fields as `Clock.create` hands them to the store."""
    base = {
        "cron": "@every 1h",
        "title": "t",
        "content": "c",
        "target": "nb:x",
        "run_once": 0,
        "timeout": 0.0,
        "created_by": "",
        "creator": "api",
        "note": "",
        "next_run_at": None,
    }
    return {**base, **changes}


async def test_two_fires_of_one_slot_one_wins_and_the_loser_writes_nothing(tmp_path):
    store = await Store.open(tmp_path)
    try:
        clock = ClockStore(store.db)
        task, _ = await clock.create(fields())
        slot = 1_800_000_000.0
        won = await clock.begin_run(
            task.id, trigger_text, manual=False, scheduled_at=slot, next_run_at=slot + HOUR
        )
        assert won is not None and won[1].status == "running" and won[1].scheduled_at == slot
        await clock.finish_run(won[1].id, "success", reply="done")
        with pytest.raises(SlotTaken):  # a second leader in a hand-over gap
            await clock.begin_run(
                task.id, trigger_text, manual=False, scheduled_at=slot, next_run_at=slot + 7
            )
        [entry] = await clock.logs(task.id)
        assert entry.id == won[1].id and entry.status == "success"
        kept = await clock.get(task.id)
        assert kept is not None and kept.next_run_at == slot + HOUR  # the loser changed nothing
        # The next slot is free, and a manual run is no slot: it never conflicts.
        assert await clock.begin_run(task.id, trigger_text, manual=False, scheduled_at=slot + 1)
        for _ in range(2):
            manual = await clock.begin_run(task.id, trigger_text, manual=True, scheduled_at=None)
            assert manual is not None
            await clock.finish_run(manual[1].id, "success")
    finally:
        await store.close()


async def test_the_store_refuses_a_second_entry_of_one_slot_by_itself(tmp_path):
    store = await Store.open(tmp_path)
    try:
        task, _ = await ClockStore(store.db).create(fields())

        async def insert(conn: Any, manual: int) -> None:
            await conn.execute(
                "INSERT INTO clock_log (task_id, title, target, trigger, status, started_at, "
                "manual, scheduled_at) VALUES (?, 't', 'nb:x', 'x', 'success', 1, ?, 5)",
                (task.id, manual),
            )

        await store.db.run(insert, 0)
        with pytest.raises(Exception, match=r"(?i)unique"):  # the index, without the clock's check
            await store.db.run(insert, 0)
        await store.db.run(insert, 1)  # manual rows are no slots
        await store.db.run(insert, 1)
    finally:
        await store.close()


async def test_a_late_fire_stands_only_for_the_slots_nobody_recorded(tmp_path):
    store = await Store.open(tmp_path)
    try:
        clock = ClockStore(store.db)
        task, _ = await clock.create(fields())
        first = await clock.begin_run(task.id, trigger_text, manual=False, scheduled_at=10.0)
        assert first is not None
        await clock.finish_run(first[1].id, "success")
        # A leader that woke from a freeze fires its backlog 5..15: slot 10 is someone else's.
        late = await clock.begin_run(
            task.id, trigger_text, manual=False, scheduled_at=15.0, missed_from=5.0
        )
        assert late is not None and late[1].missed_from == pytest.approx(10.001)
        whole = await clock.begin_run(
            task.id, trigger_text, manual=False, scheduled_at=30.0, missed_from=16.0
        )
        assert whole is not None and whole[1].missed_from == 16.0
    finally:
        await store.close()


@pytest.fixture
def open_clock(make_agent: Callable[..., Any]) -> Callable[..., Any]:
    """Open an Agent (its clock starts with it): ``agent = await open_clock(**overrides)``."""

    async def factory(**overrides: Any) -> Any:
        agent = make_agent(overrides={"clock.default_timeout": 30, **overrides})
        await agent.start()
        agent.clock.poll_interval = 0.05
        return agent

    return factory


async def _restart_after_a_gap(open_clock: Callable[..., Any], hours: int, **overrides: Any):
    """Create an hourly task, stop, pretend ``hours`` and a half passed, start again."""
    agent = await open_clock(**overrides)
    task = await agent.clock.create(cron="@every 1h", title="t", content="c", target="nb:x")
    await agent.aclose()
    stored = round(time.time() - hours * HOUR - HOUR / 2, 3)  # the next fire time it had stored
    store = await Store.open(agent.config.store.data_dir)
    try:
        await ClockStore(store.db).set_next_runs([(task.id, stored)])
    finally:
        await store.close()
    return await open_clock(**overrides), task, stored


async def test_a_restart_after_a_gap_runs_the_missed_slots_once_late(llm, open_clock):
    llm.script(reply("caught up"))
    agent, task, stored = await _restart_after_a_gap(open_clock, hours=3)

    async def one_finished() -> bool:
        return [e.status for e in await agent.clock.logs(task.id)] == ["success"]

    await until(one_finished, "the late run")
    [entry] = await agent.clock.logs(task.id)
    # One run stands for the four slots stored, +1 h, +2 h, +3 h (coalesced).
    assert entry.scheduled_at == pytest.approx(stored + 3 * HOUR)
    assert entry.missed_from == pytest.approx(stored)
    assert entry.reply == "caught up" and len(llm.requests) == 1
    current = await agent.clock.get(task.id)
    assert current is not None and current.next_run_at is not None
    assert current.next_run_at > time.time()  # and the rhythm goes on


async def test_a_restart_after_a_gap_logs_one_skip_when_misfire_is_skip(llm, open_clock):
    agent, task, stored = await _restart_after_a_gap(
        open_clock, hours=2, **{"clock.misfire": "skip"}
    )

    async def logged() -> bool:
        return bool(await agent.clock.logs(task.id))

    await until(logged, "the skipped entry")
    [entry] = await agent.clock.logs(task.id)
    assert (entry.status, entry.error) == ("skipped", NO_LEADER_ERROR)
    assert entry.scheduled_at == pytest.approx(stored + 2 * HOUR)
    assert entry.missed_from == pytest.approx(stored)
    assert llm.requests == []


async def test_a_restart_without_a_gap_fires_nothing_late(llm, open_clock):
    agent = await open_clock()
    task = await agent.clock.create(cron="@every 1h", title="t", content="c", target="nb:x")
    await agent.aclose()
    again = await open_clock()
    assert again.clock.active
    # Nothing was spawned at the take-over but the poll: no late fire is on its way.
    assert [t.get_name() for t in again.clock._spawned] == ["ania-clock-watch"]
    assert await again.clock.logs(task.id) == [] and llm.requests == []


def test_edits_are_polled_for_more_than_once_a_second():
    # An edit made by any process reaches the leader within one poll (test below: it does).
    assert POLL_SECONDS <= 1.0 and POLL_SECONDS < LEADER_IDLE_TIMEOUT / 4


async def test_an_edit_made_by_a_standby_reaches_the_leader(open_clock):
    leader = await open_clock()
    standby = await open_clock()
    assert leader.clock.active and not standby.clock.active
    task = await standby.clock.create(cron="@every 1h", title="t", content="c", target="nb:x")
    await until(lambda: task.id in leader.clock._scheduler.scheduled(), "the leader schedules it")
    await standby.clock.update(task.id, cron="@every 2h")

    async def rescheduled() -> bool:
        return leader.clock._scheduler._signatures.get(task.id) == "@every 2h"

    await until(rescheduled, "the leader applies the edit")


# ---------------------------------------------------------------- the PostgreSQL lease


def _postgres_only(backend: Any) -> None:
    if backend == "sqlite":  # (on PostgreSQL the fixture gives its fresh databases)
        pytest.skip("the lease is a file lock on SQLite (test_clock_lease.py)")


async def test_one_leader_per_database_and_the_standby_names_it(backend, open_clock):
    _postgres_only(backend)
    leader = await open_clock()
    standby = await open_clock()
    assert isinstance(leader.clock._lease, PostgresLease)
    assert leader.clock.active and not standby.clock.active
    text = standby.clock.status_text()
    assert "holds the clock of this database" in text and f"pid {os.getpid()}" in text
    await leader.aclose()  # gives the lock up: the standby takes over within a poll
    await until(lambda: standby.clock.active, "the standby takes over")


async def test_a_leader_whose_lock_session_ended_steps_down_and_another_takes_over(
    backend, open_clock
):
    _postgres_only(backend)
    leader = await open_clock()
    standby = await open_clock()
    leader.clock.poll_interval = 2.0  # the standby (0.05 s) sees the free lease first
    await leader.clock.create(cron="@every 1h", title="t", content="c", target="nb:x")
    await until(lambda: len(leader.clock._scheduler) == 1, "the leader schedules the task")
    # What the server does to a frozen leader's session (idle_session_timeout), or a network cut.
    lease = leader.clock._lease
    assert isinstance(lease, PostgresLease) and lease._locks._conn is not None
    backend_pid = lease._locks._conn.info.backend_pid

    async def end_leader_session(conn: Any) -> None:
        await conn.execute("SELECT pg_terminate_backend(?)", (backend_pid,))

    await (await leader.host.open_store()).db.run(end_leader_session)
    await until(lambda: standby.clock.active, "the standby takes the lease")
    await until(lambda: not leader.clock._scheduler.running, "the old leader stops firing")
    # Holding the lease comes first; the take-over then lists and schedules the tasks.
    await until(lambda: len(standby.clock._scheduler) == 1, "the standby schedules the task")
    assert not leader.clock.active and standby.clock.active


async def test_the_server_ends_a_silent_holders_session_and_frees_its_lock(backend, pg_cluster):
    _postgres_only(backend)
    url = pg_cluster.url()
    frozen = AdvisoryLocks(url, idle_timeout=0.3)
    other = AdvisoryLocks(url, idle_timeout=0)
    try:
        assert await frozen.try_lock("x") and not await other.try_lock("x")
        # The holder sends nothing (as if SIGSTOPped): the server ends its session.
        await until(lambda: other.try_lock("x"), "the lock is free again", limit=10, step=0.1)
        assert not await frozen.ping() and not frozen.holds("x")  # it learns when it wakes
        with pytest.raises(StoreError):
            await AdvisoryLocks("postgresql://nobody@127.0.0.1:1/none").try_lock("x")
    finally:
        await frozen.close()
        await other.close()


def test_advisory_keys_are_stable_signed_64_bit_integers():
    assert advisory_key(LEADER_LOCK) == advisory_key("clock-leader")
    assert advisory_key("a") != advisory_key("b")
    assert all(-(2**63) <= advisory_key(n) < 2**63 for n in ("", "x" * 1000, "中文"))
