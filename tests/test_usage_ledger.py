"""The usage ledger and run-record retention, through real runs on a real SQLite store.

Every answered model call is one ledger row, committed with the journal step that stores its
result; the per-day counters the quotas read are its materialisation, so they equal the
ledger's sums for every day kept and never depend on how many run records are kept, which is
per session (``store.run_log_max_per_session``) plus a global cap that takes from the biggest
sessions first.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from ania_nb import tool
from ania_nb.engine.usage import Tokens
from ania_nb.store import Store
from ania_nb.store.db import DB_FILENAME
from ania_nb.store.schema import MIGRATIONS
from ania_nb.testing import RecordedRequest, reply, tool_call, usage

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

SESSION = "nb:ledger"
# The schema version of a store written by ania-nb before the ledger (main at 5fb532b).
BEFORE_THE_LEDGER = 5


async def ledger_matches_counters(store: Store, since: str = "2000-01-01") -> list[Any]:
    """Assert SUM(ledger) == counters per day and session; return the counters."""
    counters = await store.usage.sessions(since)
    assert await store.usage.ledger(since) == counters
    return counters


def _ledger_rows(data_dir: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data_dir / DB_FILENAME) as conn:
        return conn.execute(
            "SELECT day, session, run_id, model, kind, total_tokens FROM usage_ledger ORDER BY id"
        ).fetchall()


# --------------------------------------------------------------------------- per call


@pytest.mark.sqlite_only
async def test_each_rounds_tokens_are_committed_before_the_next_call(
    llm, make_agent, tmp_path
) -> None:
    """While round 2's tool runs, round 1's call is in the ledger (a kill now would keep it)."""
    seen: list[int] = []
    agent: Any = None

    @tool
    async def look(step: int) -> str:
        """Look once more."""
        store = await agent.host.open_store()
        seen.append(await store.usage.used(agent.quota.today(), SESSION))
        return f"looked {step}"

    agent = make_agent(tools=[look])
    llm.script(
        reply(tool_calls=[tool_call("look", {"step": 1})], usage=usage(100, 10)),
        reply(tool_calls=[tool_call("look", {"step": 2})], usage=usage(200, 20)),
        reply("done", usage=usage(300, 30)),
    )
    result = await agent.chat("look twice", session=SESSION)
    assert result.ok and result.usage.total_tokens == 660
    # Each tool ran before its own round was stored: it sees the calls of the rounds before.
    assert seen == [0, 110]
    store = await agent.host.open_store()
    day = agent.quota.today()
    assert await store.usage.used(day, SESSION) == 660
    [record] = await agent.runs(session=SESSION)
    rows = _ledger_rows(tmp_path / "data")
    assert rows == [
        (day, SESSION, record.id, "scripted", "call", 110),
        (day, SESSION, record.id, "scripted", "call", 220),
        (day, SESSION, record.id, "scripted", "call", 330),
    ]
    assert (record.counted_tokens, record.usage_day) == (660, day)
    await ledger_matches_counters(store)


async def test_a_clock_runs_rounds_count_as_they_are_stored(llm, make_agent) -> None:
    """The clock's recorder counts each round too (task log and run record of the target)."""
    seen: list[int] = []
    agent: Any = None

    @tool
    async def look(step: int) -> str:
        """Look once more."""
        store = await agent.host.open_store()
        seen.append(await store.usage.used(agent.quota.today(), "nb:t"))
        return f"looked {step}"

    agent = make_agent(tools=[look])
    await agent.start()
    llm.route(
        "## Scheduled task",
        reply(tool_calls=[tool_call("look", {"step": 1})], usage=usage(10, 1)),
        reply(tool_calls=[tool_call("look", {"step": 2})], usage=usage(20, 2)),
        reply("all seen", usage=usage(30, 3)),
    )
    task = await agent.clock.create(cron="@yearly", title="t", content="look", target="nb:t")
    entry = await agent.clock.run_now(task.id)
    assert entry.status == "success" and entry.total_tokens == 66
    assert seen == [0, 11]
    store = await agent.host.open_store()
    assert await store.usage.used(agent.quota.today(), "nb:t") == 66
    [record] = await agent.runs(session="nb:t")
    assert record.counted_tokens == 66
    await ledger_matches_counters(store)


@pytest.mark.sqlite_only
async def test_a_compactions_call_is_a_ledger_row_of_the_run_it_served(
    llm, make_agent, tmp_path
) -> None:
    llm.script(
        reply("Paris is the capital.", usage=usage(900, 20)),  # over 0.8 x 1000: compact next
        reply("The user asked about France.", usage=usage(300, 30)),  # the summary
        reply("As I said, Paris.", usage=usage(120, 10)),
    )
    agent = make_agent(
        overrides={"agent.max_context_tokens": 1000, "compressor.model": "summariser"}
    )
    await agent.chat("capital of France?", session=SESSION)
    result = await agent.chat("remind me?", session=SESSION)
    assert result.usage.total_tokens == 330 + 130
    second, first = await agent.runs(session=SESSION)
    day = agent.quota.today()
    assert [r[2:] for r in _ledger_rows(tmp_path / "data")] == [
        (first.id, "scripted", "call", 920),
        (second.id, "summariser", "call", 330),
        (second.id, "scripted", "call", 130),
    ]
    store = await agent.host.open_store()
    assert await store.usage.used(day, SESSION) == 920 + 330 + 130
    await ledger_matches_counters(store)


@pytest.mark.sqlite_only
async def test_a_round_and_its_tokens_commit_together_or_not_at_all(
    llm, make_agent, tmp_path
) -> None:
    """A ledger write that fails takes the round's history rows with it; the next step counts."""
    database = tmp_path / "data" / DB_FILENAME

    @tool
    async def look(step: int) -> str:
        """Look."""
        return f"looked {step}"

    def final_answer(request: RecordedRequest) -> Any:
        with sqlite3.connect(database) as conn:  # the fault is over once the round failed
            conn.execute("DROP TRIGGER fail_ledger")
        return reply("done", usage=usage(300, 30))

    agent = make_agent(tools=[look])
    llm.script(reply("warm up", usage=usage(1, 1)))
    assert (await agent.chat("hi", session=SESSION)).ok  # the store exists: add the fault
    with sqlite3.connect(database) as conn:
        conn.execute(
            "CREATE TRIGGER fail_ledger BEFORE INSERT ON usage_ledger "
            "BEGIN SELECT RAISE(ABORT, 'the ledger is full'); END"
        )
    llm.script(reply(tool_calls=[tool_call("look", {"step": 1})], usage=usage(100, 10)))
    llm.responder = final_answer
    result = await agent.chat("look", session=SESSION)
    assert result.ok and result.text == "done"
    store = await agent.host.open_store()
    history = await store.history.load(SESSION)
    # The round (assistant tool call + tool result) failed with its ledger row: not stored.
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    # Its call was not lost: the final step counted it with the final answer's.
    day = agent.quota.today()
    assert await store.usage.used(day, SESSION) == 2 + 110 + 330
    [last, _] = await agent.runs(session=SESSION)
    assert (last.counted_tokens, last.tool_calls_total) == (440, 0)
    await ledger_matches_counters(store)


@pytest.mark.sqlite_only
async def test_a_failed_round_leaves_its_tokens_to_the_next_step(llm, make_agent, tmp_path) -> None:
    """The round's history cannot be written: the final step counts the round's call too."""

    @tool
    async def look(step: int) -> str:
        """Look."""
        return f"looked {step}"

    agent = make_agent(tools=[look])
    llm.script(reply("warm up", usage=usage(1, 1)))
    assert (await agent.chat("hi", session=SESSION)).ok
    with sqlite3.connect(tmp_path / "data" / DB_FILENAME) as conn:
        conn.execute(
            "CREATE TRIGGER fail_round BEFORE INSERT ON chat_history "
            "WHEN NEW.message LIKE '%\"tool\"%' BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        )
    llm.script(
        reply(tool_calls=[tool_call("look", {"step": 1})], usage=usage(100, 10)),
        reply("done", usage=usage(300, 30)),
    )
    result = await agent.chat("look", session=SESSION)
    assert result.ok
    store = await agent.host.open_store()
    day = agent.quota.today()
    assert await store.usage.used(day, SESSION) == 2 + 110 + 330
    [last, _] = await agent.runs(session=SESSION)
    assert last.counted_tokens == 440
    rows = [r for r in _ledger_rows(tmp_path / "data") if r[2] == last.id]
    assert [r[5] for r in rows] == [110, 330]  # still one row per call
    await ledger_matches_counters(store)


# --------------------------------------------------------------------------- at scale


async def test_1000_runs_in_50_sessions_keep_ledger_counters_and_records(llm, make_agent) -> None:
    """Default retention: every session keeps its records; ledger == counters on every day."""
    sessions, per_session, days = 50, 20, 4
    answered: dict[str, int] = {}
    clock = [1_800_000_000.0]

    def respond(request: RecordedRequest) -> Any:
        last = request.messages[-1]
        n = len(llm.requests)
        tokens = usage(10 + n % 7, 1 + n % 3)
        if last["role"] == "user" and "tool" in str(last["content"]):
            return reply(tool_calls=[tool_call("note", {"n": n})], usage=tokens)
        return reply(f"ok {n}", usage=tokens)

    @tool
    def note(n: int) -> str:
        """Note a number."""
        return str(n)

    llm.responder = respond
    agent = make_agent(tools=[note], overrides={"quota.timezone": "UTC"})
    agent.quota.now = lambda: clock[0]
    await agent.start()
    counter = itertools.count()

    async def chat(session: str, i: int) -> None:
        n = next(counter)
        if n and n % (sessions * per_session // days) == 0:
            clock[0] += 86400  # the next quota day, while other runs are in flight
        text = f"use a tool {i}" if i % 3 == 0 else f"hello {i}"
        result = await agent.chat(text, session=session)
        assert result.ok, result.error
        answered[session] = answered.get(session, 0) + result.usage.total_tokens

    async def one_session(k: int) -> None:
        for i in range(per_session):
            await chat(f"nb:s{k:02d}", i)

    await asyncio.gather(*(one_session(k) for k in range(sessions)))
    store = await agent.host.open_store()
    counters = await ledger_matches_counters(store)
    assert len({c.day for c in counters}) == days
    per_session_counted: dict[str, int] = {}
    for c in counters:
        per_session_counted[c.key] = per_session_counted.get(c.key, 0) + c.total
    assert per_session_counted == answered
    for day in {c.day for c in counters}:
        daily = sum(r.total for r in await store.usage.daily(day, day))
        assert daily == await store.usage.used(day)
    kept = await agent.runs(limit=5000)
    assert len(kept) == sessions * per_session
    assert {r.session for r in kept} == set(answered)


# --------------------------------------------------------------------------- retention


async def test_a_busy_session_keeps_its_cap_and_cannot_evict_the_others(tmp_path) -> None:
    store = await Store.open(tmp_path, run_log_max_entries=1000, run_log_max_per_session=5)
    try:
        journal = store.journal
        journal.usage_day = lambda: "2026-12-01"
        for session, runs in (("g:quiet", 3), ("g:busy", 40), ("f:other", 2)):
            for i in range(runs):
                run_id = await journal.start(session, f"{session} {i}")
                await journal.finish(session, run_id, "success", counted={"m": Tokens(1, 1, 0, 2)})
        assert len(await store.runs.list(session="g:busy", limit=100)) == 5
        assert len(await store.runs.list(session="g:quiet", limit=100)) == 3
        assert len(await store.runs.list(session="f:other", limit=100)) == 2
        # Counting never depended on the records: all 45 runs are counted.
        assert await store.usage.used("2026-12-01", "g:busy") == 80
        assert await store.usage.used("2026-12-01") == 90
        await ledger_matches_counters(store)
    finally:
        await store.close()


async def test_the_global_cap_takes_from_the_biggest_sessions_first(tmp_path) -> None:
    store = await Store.open(tmp_path, run_log_max_entries=10, run_log_max_per_session=200)
    try:
        runs = store.runs
        for session in ("g:a", "g:b"):  # the oldest records: a global FIFO would evict them
            for i in range(2):
                await runs.finish(await runs.start(session, f"{session} {i}"), "success")
        for i in range(30):
            await runs.finish(await runs.start("g:busy", f"busy {i}"), "success")
        assert await runs.count() == 10
        assert len(await runs.list(session="g:a")) == 2
        assert len(await runs.list(session="g:b")) == 2
        busy = await runs.list(session="g:busy")
        assert [r.input for r in busy] == [f"busy {i}" for i in range(29, 23, -1)]
        with pytest.raises(Exception, match="max_per_session must be a positive int"):
            await Store.open(tmp_path / "x", run_log_max_per_session=0)
    finally:
        await store.close()


async def test_the_config_key_sets_the_per_session_cap(llm, make_agent) -> None:
    from ania_nb import Config

    field = Config.model_fields["store"].annotation.model_fields["run_log_max_per_session"]
    assert field.default == 200 and "per session" in (field.description or "")
    agent = make_agent(overrides={"store.run_log_max_per_session": 3})
    llm.script(*(reply(f"r{i}", usage=usage(10, 0)) for i in range(7)))
    for i in range(5):
        assert (await agent.chat(f"m{i}", session="nb:a")).ok
    for i in range(2):
        assert (await agent.chat(f"o{i}", session="nb:b")).ok
    assert [r.input for r in await agent.runs(session="nb:a")] == ["m4", "m3", "m2"]
    assert len(await agent.runs(session="nb:b")) == 2
    store = await agent.host.open_store()
    assert await store.usage.used(agent.quota.today(), "nb:a") == 50  # all five counted


# --------------------------------------------------------------------------- upkeep


async def test_reset_and_prune_keep_the_ledger_equal_to_the_counters(tmp_path) -> None:
    store = await Store.open(tmp_path)
    try:
        usage_ = store.usage
        today = date(2026, 12, 1)
        days = [(today - timedelta(days=back)).isoformat() for back in (0, 1, 5)]
        for day in days:
            await usage_.add(day, "nb:a", {"m": Tokens(10, 5, 0, 15)})
            await usage_.add(day, "nb:b", [("m", Tokens(1, 1, 0, 2)), ("n", Tokens(3, 0, 0, 3))])
        assert await usage_.reset(days[0], "nb:a") == 15
        assert await usage_.used(days[0], "nb:a") == 0
        await ledger_matches_counters(store)
        await usage_.add(days[0], "nb:a", {"m": Tokens(1, 0, 0, 1)})
        assert await usage_.used(days[0], "nb:a") == 1
        assert await usage_.reset(days[1]) == 20
        await ledger_matches_counters(store)
        assert await usage_.prune(days[1]) == 2  # day 5 back: both sessions' counters
        counters = await ledger_matches_counters(store)
        assert {c.day for c in counters} == {days[0]}
        assert len(await usage_.daily("2000-01-01")) == 6  # the plot's history stays
    finally:
        await store.close()


async def test_a_models_use_counts_each_session_since_its_last_reset(tmp_path) -> None:
    """What the quota fallback's limits read: one model's tokens, per session and for all."""
    store = await Store.open(tmp_path)
    try:
        usage_, day = store.usage, "2026-12-01"
        for who in ("nb:a", "nb:b", "nb:c"):
            await usage_.add(
                day, who, [("cheap", Tokens(10, 0, 0, 10)), ("main", Tokens(1, 0, 0, 1))]
            )
        await usage_.add("2026-11-30", "nb:a", {"cheap": Tokens(5, 0, 0, 5)})  # another day
        assert await usage_.used_by_model(day, "cheap") == 30
        await usage_.reset(day, "nb:a")
        await usage_.reset(day, "nb:b")
        await usage_.reset(day, "nb:b")  # twice: the last reset counts
        await usage_.add(day, "nb:a", {"cheap": Tokens(4, 0, 0, 4)})
        assert [await usage_.used_by_model(day, "cheap", w) for w in ("nb:a", "nb:b", "nb:c")] == [
            4,
            0,
            10,
        ]
        assert await usage_.used_by_model(day, "cheap") == 14  # each since its own reset
        assert await usage_.used_by_model(day, "main") == 1
        assert await usage_.used_by_model(day, "unknown") == 0
        models = await usage_.models(day, "nb:a")  # what was used, resets or not
        assert [(m.key, m.total) for m in models] == [("cheap", 14), ("main", 1)]
    finally:
        await store.close()


@pytest.mark.sqlite_only
async def test_a_store_counted_before_the_ledger_carries_its_counters_over(tmp_path) -> None:
    """A store of the schema before the ledger: counters, daily totals and records stay."""
    path = tmp_path / DB_FILENAME
    conn = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:BEFORE_THE_LEDGER]:
        for statement in step:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {BEFORE_THE_LEDGER}")
    counts = "prompt_tokens, completion_tokens, cached_tokens, total_tokens"
    old = [("2026-11-30", "g:1", 100, 20, 5, 120), ("2026-12-01", "g:1", 7, 3, 0, 10)]
    old.append(("2026-12-01", "f:2", 40, 2, 1, 42))
    conn.executemany(
        f"INSERT INTO usage_counters (day, session, {counts}) VALUES (?, ?, ?, ?, ?, ?)", old
    )
    conn.execute(
        f"INSERT INTO usage_daily (day, model, {counts}) VALUES ('2026-12-01', 'gpt', 47, 5, 1, 52)"
    )
    conn.execute(
        "INSERT INTO runs (session, input, status, started_at, counted_tokens, usage_day) "
        "VALUES ('g:1', 'hi', 'success', 0, 10, '2026-12-01')"
    )
    conn.close()

    store = await Store.open(tmp_path)
    try:
        counters = await ledger_matches_counters(store)
        assert [(c.day, c.key, c.total) for c in counters] == [
            ("2026-11-30", "g:1", 120),
            ("2026-12-01", "f:2", 42),
            ("2026-12-01", "g:1", 10),
        ]
        assert (counters[0].prompt, counters[0].completion, counters[0].cached) == (100, 20, 5)
        assert await store.usage.used("2026-12-01") == 52
        assert [d.total for d in await store.usage.daily("2026-12-01")] == [52]
        assert await store.usage.counted("2026-12-01") == 10
        rows = _ledger_rows(tmp_path)
        assert {r[4] for r in rows} == {"carried"} and len(rows) == 3
        store.journal.usage_day = lambda: "2026-12-01"
        run_id = await store.journal.start("g:1", "after the upgrade")
        await store.journal.finish("g:1", run_id, "success", counted={"gpt": Tokens(5, 5, 0, 10)})
        assert await store.usage.used("2026-12-01", "g:1") == 20
        await ledger_matches_counters(store)
    finally:
        await store.close()
    again = await Store.open(tmp_path)  # opening again carries nothing twice
    try:
        assert len(_ledger_rows(tmp_path)) == 4
        await ledger_matches_counters(again)
    finally:
        await again.close()
