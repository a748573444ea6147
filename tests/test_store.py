"""Tests for ania_nb.store against real SQLite files in tmp_path."""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import ania_nb.store as store_pkg
from ania_nb.errors import StoreError, UsageError
from ania_nb.store import RunLog, Store, ToolCallRecord
from ania_nb.store import history as history_mod
from ania_nb.store.db import Conn
from ania_nb.store.runlog import INTERRUPTED_ERROR
from ania_nb.store.schema import MIGRATIONS
from ania_nb.store.sqlite import BUSY_TIMEOUT_S, SqliteDatabase

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "data")
    yield s
    await s.close()


def _scalar(sql: str):
    async def fn(conn: Conn):
        return await conn.fetchval(sql)

    fn.__qualname__ = f"scalar({sql})"
    return fn


def _write_sqlite(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        for sql in statements:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


# --- Database ------------------------------------------------------------------------------


def test_all_is_sorted_and_exported() -> None:
    assert store_pkg.__all__ == sorted(store_pkg.__all__)
    for name in store_pkg.__all__:
        assert getattr(store_pkg, name) is not None


@pytest.mark.sqlite_only
async def test_pragmas_wal_and_schema_version(store: Store) -> None:
    assert store.db.path == (store.db.path.parent / "ania.db")
    assert store.db.path.is_file()
    assert await store.db.run(_scalar("PRAGMA journal_mode")) == "wal"
    assert await store.db.run(_scalar("PRAGMA foreign_keys")) == 1
    assert await store.db.run(_scalar("PRAGMA busy_timeout")) == BUSY_TIMEOUT_S * 1000
    assert await store.db.run(_scalar("PRAGMA synchronous")) == 1  # NORMAL
    assert await store.db.run(_scalar("PRAGMA user_version")) == len(MIGRATIONS)


@pytest.mark.sqlite_only
async def test_statements_run_on_the_store_thread(store: Store) -> None:
    async def where(conn: Conn) -> tuple[int, str]:
        await conn.execute("SELECT 1")
        return threading.get_ident(), threading.current_thread().name

    first = await store.db.run(where)
    second = await store.db.run(where)
    assert first[0] != threading.get_ident()
    assert first[1].startswith("ania-store")
    assert first == second  # one thread for every statement


@pytest.mark.sqlite_only
async def test_sqlite_errors_become_store_errors_naming_op_and_path(store: Store) -> None:
    with pytest.raises(StoreError) as info:
        await store.db.run(_scalar("SELECT * FROM no_such_table"))
    message = str(info.value)
    assert "no_such_table" in message
    assert str(store.db.path) in message
    assert "scalar(SELECT * FROM no_such_table)" in message


async def test_non_sqlite_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ania.db"
    content = b"these are my notes, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(StoreError) as info:
        await SqliteDatabase.open(path)
    assert "not an ania-nb database" in str(info.value)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content
    # No -wal/-shm side files either: nothing was written next to it.
    assert await asyncio.to_thread(os.listdir, tmp_path) == ["ania.db"]


async def test_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    await asyncio.to_thread(
        _write_sqlite, path, "CREATE TABLE invoices (n INTEGER)", "INSERT INTO invoices VALUES (7)"
    )
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not an ania-nb database"):
        await SqliteDatabase.open(path)
    assert path.read_bytes() == before


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ania.db"
    await asyncio.to_thread(_write_sqlite, path, "PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer than this ania-nb understands"):
        await SqliteDatabase.open(path)


async def test_close_is_idempotent_and_closed_store_raises(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    kv = s.kv("app")
    await kv.set("k", 1)
    await asyncio.gather(s.close(), s.close())
    await s.close()
    assert s.db.closed
    with pytest.raises(StoreError) as info:
        await kv.get("k")
    assert "closed" in str(info.value)
    assert s.db.location in str(info.value)
    with pytest.raises(StoreError, match="closed"):
        await s.history.load("s")


async def test_data_persists_across_reopen(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    await s.kv("app").set("answer", {"n": 42})
    await s.history.append("s1", [{"role": "user", "content": "hi"}])
    run_id = await s.runs.start("s1", "hi", sender="ana")
    await s.runs.finish(run_id, "success", reply="hello")
    await s.close()

    s = await Store.open(tmp_path)
    try:
        assert await s.kv("app").get("answer") == {"n": 42}
        assert await s.history.load("s1") == [{"role": "user", "content": "hi"}]
        record = await s.runs.get(run_id)
        assert record is not None
        assert (record.status, record.reply, record.sender) == ("success", "hello", "ana")
    finally:
        await s.close()


# --- KV ------------------------------------------------------------------------------------


async def test_kv_crud_and_prefixes(store: Store) -> None:
    kv = store.kv("app")
    assert await kv.get("missing") is None
    assert await kv.get("missing", default=5) == 5
    for key in ["user:b", "user:a", "User:c", "user%x", "order:1"]:
        await kv.set(key, key.upper())
    await kv.set("user:a", "overwritten")
    assert await kv.get("user:a") == "overwritten"
    assert await kv.keys() == ["User:c", "order:1", "user%x", "user:a", "user:b"]
    # Prefixes are literal and case-sensitive: no LIKE wildcards.
    assert await kv.keys("user:") == ["user:a", "user:b"]
    assert await kv.keys("user%") == ["user%x"]
    assert await kv.items("user:") == [("user:a", "overwritten"), ("user:b", "USER:B")]
    assert await kv.delete("user:a") is True
    assert await kv.delete("user:a") is False
    assert await kv.delete_prefix("user") == 2
    assert await kv.keys() == ["User:c", "order:1"]
    # Namespaces are isolated.
    other = store.kv("other")
    assert await other.keys() == []
    await other.set("order:1", "mine")
    assert await kv.get("order:1") == "ORDER:1"
    assert await other.delete_prefix("") == 1
    assert await kv.keys() == ["User:c", "order:1"]


async def test_kv_json_round_trip(store: Store) -> None:
    kv = store.kv("json")
    value = {
        "text": "héllo 漢字 🙂",
        "n": [1, 2.5, -3, None, True, False],
        "nested": {"a": {"b": [{"c": []}, {}]}},
        "tuple": (1, 2),
        "big": 2**70,
    }
    await kv.set("v", value)
    got = await kv.get("v")
    assert got == {**value, "tuple": [1, 2]}
    assert isinstance(got["n"][1], float)


async def test_kv_incr_is_atomic_under_concurrency(store: Store) -> None:
    kv = store.kv("counters")
    results = await asyncio.gather(*(kv.incr("hits", i) for i in range(1, 51)))
    assert await kv.get("hits") == sum(range(1, 51))
    assert max(results) == sum(range(1, 51))
    assert len(set(results)) == 50  # each task saw its own step
    assert await kv.incr("fresh") == 1
    assert await kv.incr("fresh", -3) == -2
    await kv.set("set_int", 10)
    assert await kv.incr("set_int", 5) == 15


async def test_kv_incr_on_non_integer_is_refused(store: Store) -> None:
    kv = store.kv("counters")
    await kv.set("name", "bob")
    await kv.set("ratio", 1.5)
    with pytest.raises(UsageError, match=r"'name'.*not an integer"):
        await kv.incr("name")
    with pytest.raises(UsageError, match="not an integer"):
        await kv.incr("ratio")
    with pytest.raises(UsageError, match="amount must be an int"):
        await kv.incr("x", 1.0)  # type: ignore[arg-type]
    assert await kv.get("name") == "bob"
    assert await kv.get("ratio") == 1.5


@pytest.mark.parametrize("name", ["", "Upper", "1abc", "a b", "a/b", "a" * 65, None])
async def test_kv_invalid_namespace(store: Store, name: object) -> None:
    with pytest.raises(UsageError, match="invalid KV namespace"):
        store.kv(name)  # type: ignore[arg-type]


async def test_kv_valid_namespace_edges(store: Store) -> None:
    for name in ["a", "a" * 64, "x1_.-y"]:
        assert store.kv(name).namespace == name


async def test_kv_non_serialisable_value_keeps_old_value(store: Store) -> None:
    kv = store.kv("app")
    await kv.set("cfg", {"ok": True})
    with pytest.raises(UsageError, match=r"'cfg'.*not JSON-serialisable"):
        await kv.set("cfg", {"bad": object()})
    with pytest.raises(UsageError, match="'cfg'"):
        await kv.set("cfg", math.nan)
    with pytest.raises(UsageError, match="non-empty strings"):
        await kv.set("", 1)
    assert await kv.get("cfg") == {"ok": True}


# --- Chat history --------------------------------------------------------------------------

RICH = [
    {"role": "system", "content": "be brief"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "look"}, {"type": "text", "text": "[image]"}],
    },
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "thinking…",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
    {"role": "assistant", "content": "答案是 42"},
]


async def test_history_append_load_per_session(store: Store) -> None:
    h = store.history
    await h.append("s2", RICH[:2])
    await h.append("s2", RICH[2:])
    await h.append("s1", [{"role": "user", "content": "other"}])
    await h.append("s1", [])
    assert await h.load("s2") == RICH
    assert await h.load("s1") == [{"role": "user", "content": "other"}]
    assert await h.load("nobody") == []
    assert await h.count("s2") == 5
    assert await h.sessions() == ["s1", "s2"]


async def test_history_replace_and_clear(store: Store) -> None:
    h = store.history
    await h.append("s", RICH)
    await h.append("keep", [{"role": "user", "content": "untouched"}])
    summary = [{"role": "system", "content": "summary"}, {"role": "user", "content": "next"}]
    await h.replace("s", summary)
    assert await h.load("s") == summary
    assert await h.clear("s") == 2
    assert await h.clear("s") == 0
    assert await h.sessions() == ["keep"]
    assert await h.load("keep") == [{"role": "user", "content": "untouched"}]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"role": "robot", "content": "x"}, "role 'robot'"),
        ({"content": "no role"}, "role None"),
        ("just text", "must be a dict"),
        ({"role": "user", "content": object()}, "not JSON-serialisable"),
    ],
)
async def test_history_bad_message_never_loses_data(store: Store, bad: object, match: str) -> None:
    h = store.history
    await h.append("s", RICH)
    good = {"role": "user", "content": "fine"}
    with pytest.raises(UsageError, match=match):
        await h.replace("s", [good, bad])  # type: ignore[list-item]
    with pytest.raises(UsageError, match=match):
        await h.append("s", [good, bad])  # type: ignore[list-item]
    assert await h.load("s") == RICH


async def test_history_rejects_a_single_dict_instead_of_a_list(store: Store) -> None:
    with pytest.raises(UsageError, match="list of message dicts"):
        await store.history.append("s", {"role": "user", "content": "x"})  # type: ignore[arg-type]


async def test_history_replace_is_atomic_in_the_database(store: Store) -> None:
    await store.history.append("s", RICH)
    # The second row cannot be bound by SQLite, so the insert fails after the delete ran.
    rows = ['{"role": "user", "content": "new"}', object()]
    with pytest.raises(StoreError, match="_insert"):
        await store.db.run(history_mod._insert, "s", rows, time.time(), replace=True)
    assert await store.history.load("s") == RICH


# --- Run log -------------------------------------------------------------------------------


async def test_runlog_tool_calls_truncation_and_finish(store: Store) -> None:
    runs = store.runs
    long_input = "漢" * 600
    run_id = await runs.start("s", long_input, sender="ana")
    running = await runs.get(run_id)
    assert running is not None
    assert running.status == "running"
    assert running.input == "漢" * 499 + "…"
    assert len(running.input) == 500

    args, result = "é" * 600, "r" * 1500
    for i in range(25):
        error = "boom" if i == 1 else None
        await runs.add_tool_call(run_id, ToolCallRecord(f"t{i}", args, result, error, i))
        if i == 2:  # persisted incrementally, before finish
            partial = await runs.get(run_id)
            assert partial is not None
            assert [c.name for c in partial.tool_calls] == ["t0", "t1", "t2"]
            assert partial.tool_calls_total == 3

    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
        "cached_tokens": 64,
        "iterations": 3,
        "last_prompt_tokens": 50,  # not logged, and not an error
    }
    await runs.finish(run_id, "success", usage=usage, reply="x" * 1200)
    record = await runs.get(run_id)
    assert record is not None
    assert record.status == "success"
    assert record.tool_calls_total == 25
    assert [c.name for c in record.tool_calls] == [f"t{i}" for i in range(20)]
    first = record.tool_calls[0]
    assert first.arguments == "é" * 499 + "…"
    assert first.result == "r" * 999 + "…"
    assert first.duration_ms == 0
    assert record.tool_calls[1].error == "boom"
    assert record.reply == "x" * 999 + "…"
    assert (record.prompt_tokens, record.completion_tokens, record.total_tokens) == (100, 20, 120)
    assert (record.cached_tokens, record.iterations) == (64, 3)
    assert record.finished_at is not None
    assert record.finished_at >= record.started_at
    assert isinstance(record.duration_ms, int)
    assert record.duration_ms >= 0
    assert record.error is None
    as_dict = record.to_dict()
    assert as_dict["tool_calls"][0]["name"] == "t0"
    assert as_dict["sender"] == "ana"


async def test_runlog_short_text_is_kept_verbatim(store: Store) -> None:
    run_id = await store.runs.start("s", "x" * 500)
    await store.runs.add_tool_call(run_id, ToolCallRecord("f", "a" * 500, "r" * 1000, None, 7))
    await store.runs.finish(run_id, "error", error="the model endpoint failed")
    record = await store.runs.get(run_id)
    assert record is not None
    assert record.input == "x" * 500
    assert record.tool_calls[0].arguments == "a" * 500
    assert record.tool_calls[0].result == "r" * 1000
    assert record.status == "error"
    assert record.error == "the model endpoint failed"
    assert record.reply is None


async def test_runlog_list_filters_and_order(store: Store) -> None:
    runs = store.runs
    plan = [("a", "success", 1000.0), ("b", "error", 2000.0), ("a", "timeout", 3000.0)]
    ids = []
    for session, status, started in plan:
        run_id = await runs.start(session, f"{session}@{started}")
        await runs.finish(run_id, status)
        ids.append(run_id)
    running_id = await runs.start("a", "still going")

    async def set_started(conn: Conn) -> None:
        for run_id, (_, _, started) in zip(ids, plan, strict=True):
            await conn.execute("UPDATE runs SET started_at = ? WHERE id = ?", (started, run_id))
        await conn.execute("UPDATE runs SET started_at = 4000 WHERE id = ?", (running_id,))

    await store.db.run(set_started)
    all_ids = [*ids, running_id]
    assert [r.id for r in await runs.list()] == all_ids[::-1]
    assert [r.id for r in await runs.list(limit=2)] == [running_id, ids[2]]
    assert [r.id for r in await runs.list(session="a")] == [running_id, ids[2], ids[0]]
    assert [r.id for r in await runs.list(status="error")] == [ids[1]]
    assert [r.id for r in await runs.list(status="running")] == [running_id]
    assert [r.id for r in await runs.list(since=2000)] == [running_id, ids[2], ids[1]]
    assert [r.id for r in await runs.list(since=1500, until=3000)] == [ids[1]]
    assert [r.id for r in await runs.list(session="a", until=3500)] == [ids[2], ids[0]]
    assert await runs.list(session="zzz") == []
    assert await runs.count() == 4
    with pytest.raises(UsageError, match="invalid run status 'done'"):
        await runs.list(status="done")
    with pytest.raises(UsageError, match="limit"):
        await runs.list(limit=0)


async def test_runlog_evicts_oldest_finished_beyond_max_entries(store: Store) -> None:
    runs = RunLog(store.db, max_entries=3)
    ids = []
    for i in range(5):
        ids.append(await runs.start("s", f"run {i}"))
        await runs.finish(ids[-1], "success")
    assert await runs.count() == 3
    assert [r.id for r in await runs.list()] == ids[:1:-1]
    assert await runs.get(ids[0]) is None
    with pytest.raises(UsageError, match="evicted"):
        await runs.finish(ids[0], "success")
    with pytest.raises(UsageError, match="evicted"):
        await runs.add_tool_call(ids[1], ToolCallRecord("f", "", "", None, 0))
    with pytest.raises(UsageError, match="max_entries"):
        RunLog(store.db, max_entries=0)


async def test_pruning_never_evicts_a_running_run(store: Store) -> None:
    runs = RunLog(store.db, max_entries=3)
    long = await runs.start("long", "a long job")
    in_flight = [await runs.start("s", f"concurrent {i}") for i in range(4)]
    # Five runs in flight, max three rows: nothing may go while all of them run.
    assert await runs.count() == 5
    for run_id in in_flight:
        await runs.finish(run_id, "success")
    for i in range(20):
        await runs.finish(await runs.start("s", f"later {i}"), "success")
    await runs.add_tool_call(long, ToolCallRecord("bash", "{}", "ok", None, 1))
    await runs.finish(long, "success", reply="done")
    record = await runs.get(long)
    assert record is not None
    assert (record.status, record.reply, record.tool_calls_total) == ("success", "done", 1)
    # Finished rows were pruned around it; now it is the oldest finished row, but the busier
    # session gives way first: its only record stays.
    assert await runs.count() == 3
    await runs.finish(await runs.start("s", "one more"), "success")
    assert await runs.count() == 3
    assert await runs.get(long) is not None
    assert [r.input for r in await runs.list(session="s")] == ["one more", "later 19"]


async def test_store_passes_run_log_max_entries(tmp_path: Path) -> None:
    s = await Store.open(tmp_path, run_log_max_entries=2)
    try:
        ids = []
        for i in range(3):
            ids.append(await s.runs.start("s", str(i)))
            await s.runs.finish(ids[-1], "success")
        assert [r.id for r in await s.runs.list()] == [ids[2], ids[1]]
    finally:
        await s.close()
    with pytest.raises(UsageError, match="max_entries"):
        await Store.open(tmp_path, run_log_max_entries=0)  # and leaks no connection


_CRASHING_PROCESS = """
import asyncio, os, sys
from ania_nb.store import Store, ToolCallRecord

async def main():
    s = await Store.open(sys.argv[1])
    run_id = await s.runs.start("s", "long job")
    await s.runs.add_tool_call(run_id, ToolCallRecord("bash", "{}", "ok", None, 5))
    print(run_id, flush=True)
    os._exit(0)  # dies without finishing the run or closing the store

asyncio.run(main())
"""


@pytest.mark.sqlite_only
async def test_mark_interrupted_after_the_owning_process_died(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    mine = await s.runs.start("s", "still running here")
    done = await s.runs.start("s", "quick")
    await s.runs.finish(done, "success")
    await s.close()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHING_PROCESS, str(tmp_path), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    crashed = int(out)

    s = await Store.open(tmp_path)
    try:
        assert await s.runs.mark_interrupted() == 1
        assert await s.runs.mark_interrupted() == 0
        record = await s.runs.get(crashed)
        assert record is not None
        assert record.status == "interrupted"
        assert record.error == INTERRUPTED_ERROR
        assert record.tool_calls_total == 1
        finished = await s.runs.get(done)
        assert finished is not None
        assert finished.status == "success"
        # This process is alive: its own run is not touched, on this store or any other.
        still = await s.runs.get(mine)
        assert still is not None
        assert still.status == "running"
        with pytest.raises(UsageError, match="already finished with status 'interrupted'"):
            await s.runs.finish(crashed, "success")
        await s.runs.finish(mine, "success")
    finally:
        await s.close()


async def test_finish_rejects_invalid_status_and_double_finish(store: Store) -> None:
    run_id = await store.runs.start("s", "hi")
    for bad in ["running", "done", ""]:
        with pytest.raises(UsageError, match="invalid final run status"):
            await store.runs.finish(run_id, bad)
    with pytest.raises(UsageError, match="usage\\['total_tokens'\\] must be an int"):
        await store.runs.finish(run_id, "success", usage={"total_tokens": "many"})  # type: ignore[dict-item]
    record = await store.runs.get(run_id)
    assert record is not None
    assert record.status == "running"
    await store.runs.finish(run_id, "stopped")
    with pytest.raises(UsageError, match="already finished with status 'stopped'"):
        await store.runs.finish(run_id, "success")
