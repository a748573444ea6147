"""Run bookkeeping never fails a run: the journal under pruning, lost rows and bad values."""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ania_nb.errors import UsageError
from ania_nb.store import RunJournal, Store, ToolCallRecord
from ania_nb.store.db import Conn
from ania_nb.store.owner import Owner, current_owner, is_alive, start_token

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

USER = {"role": "user", "content": "hi"}


def _round(n: int) -> list[dict]:
    call = {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": f"result {n}"},
    ]


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "data", run_log_max_entries=5)
    yield s
    await s.close()


class Begun(list[int]):
    """Run ids as they begin; ``all`` is set once ``expected`` have."""

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.all = asyncio.Event()

    def add(self, run_id: int) -> None:
        self.append(run_id)
        if len(self) >= self.expected:
            self.all.set()


async def _one_run(
    journal: RunJournal, session: str, rounds: int, begun: Begun, gate: asyncio.Event
) -> int:
    run_id, _ = await journal.begin(session, "go", sender=None, message=USER, load_history=False)
    begun.add(run_id)
    await gate.wait()
    for n in range(rounds):
        await journal.record_round(
            session, run_id, _round(n), [ToolCallRecord("f", "{}", f"result {n}", None, 1)]
        )
        await asyncio.sleep(0)
    await journal.finish(
        session,
        run_id,
        "success",
        messages=[{"role": "assistant", "content": "done"}],
        usage={"total_tokens": 3, "iterations": rounds + 1},
        reply="done",
    )
    return run_id


async def test_many_concurrent_runs_with_a_tiny_run_log_all_complete(small: Store) -> None:
    begun = Begun(61)
    gate = asyncio.Event()
    long = asyncio.create_task(_one_run(small.journal, "long", 3, begun, gate))
    tasks = [
        asyncio.create_task(_one_run(small.journal, f"s{i}", 1, begun, gate)) for i in range(60)
    ]
    await asyncio.wait_for(begun.all.wait(), 60)  # 61 runs in flight against a cap of 5
    assert await small.runs.count() == 61
    gate.set()
    ids = await asyncio.gather(long, *tasks)
    assert sorted(ids) == sorted(begun)
    for i in range(60):
        assert [m["role"] for m in await small.history.load(f"s{i}")] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
    assert len(await small.history.load("long")) == 1 + 3 * 2 + 1
    for run_id in ids[-5:]:  # the newest records survive, complete
        record = await small.runs.get(run_id)
        assert record is not None
        assert (record.status, record.tool_calls_total) == ("success", 1)
    await small.runs.finish(await small.runs.start("x", "after"), "success")
    assert await small.runs.count() == 5  # pruned back once nothing runs
    assert await small.runs.list(status="running") == []


async def test_a_long_run_outlives_hundreds_of_later_runs(small: Store) -> None:
    journal = small.journal
    run_id, _ = await journal.begin("long", "work", sender=None, message=USER, load_history=False)
    await journal.record_round("long", run_id, _round(0), [ToolCallRecord("f", "{}", "r", None, 1)])
    gate = asyncio.Event()
    gate.set()
    await asyncio.gather(*(_one_run(journal, f"s{i}", 0, Begun(0), gate) for i in range(200)))
    await journal.record_round("long", run_id, _round(1), [ToolCallRecord("f", "{}", "r", None, 1)])
    await journal.finish("long", run_id, "success", reply="finally")
    record = await small.runs.get(run_id)
    assert record is not None
    assert (record.status, record.reply, record.tool_calls_total) == ("success", "finally", 2)
    assert len(await small.history.load("long")) == 5


async def test_a_deleted_record_row_is_recreated_and_history_kept(
    small: Store, caplog: pytest.LogCaptureFixture
) -> None:
    journal = small.journal
    run_id, _ = await journal.begin("s", "work", sender="ana", message=USER, load_history=False)

    async def delete(conn: Conn) -> None:
        await conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    await small.db.run(delete)
    with caplog.at_level(logging.WARNING, logger="ania_nb.store.journal"):
        await journal.record_round(
            "s", run_id, _round(0), [ToolCallRecord("f", "{}", "r", None, 2)]
        )
        await small.db.run(delete)
        await journal.finish(
            "s", run_id, "success", messages=[{"role": "assistant", "content": "ok"}]
        )
    assert "re-creating it" in caplog.text
    assert [m["role"] for m in await small.history.load("s")] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    record = await small.runs.get(run_id)
    assert record is not None
    assert (record.id, record.status, record.input, record.sender) == (
        run_id,
        "success",
        "work",
        "ana",
    )


async def test_a_run_unknown_to_this_journal_still_gets_its_history(
    small: Store, caplog: pytest.LogCaptureFixture
) -> None:
    other = RunJournal(small.db, max_entries=5)  # e.g. a journal that did not begin the run
    with caplog.at_level(logging.WARNING, logger="ania_nb.store.journal"):
        await other.record_round("s", 9999, _round(0), [ToolCallRecord("f", "{}", "r", None, 2)])
        await other.finish("s", 9999, "error", messages=[{"role": "assistant", "content": "x"}])
    assert "run 9999 has no record" in caplog.text
    assert len(await small.history.load("s")) == 3
    assert await small.runs.get(9999) is None


async def test_finish_overrides_a_wrong_interrupted_mark_but_not_a_real_outcome(
    small: Store, caplog: pytest.LogCaptureFixture
) -> None:
    journal = small.journal
    run_id, _ = await journal.begin("s", "work", sender=None, message=USER, load_history=False)

    async def mark(conn: Conn) -> None:
        await conn.execute("UPDATE runs SET status = 'interrupted' WHERE id = ?", (run_id,))

    await small.db.run(mark)  # what an older ania-nb in another process would do
    await journal.record_round("s", run_id, _round(0), [ToolCallRecord("f", "{}", "r", None, 2)])
    with caplog.at_level(logging.WARNING, logger="ania_nb.store.journal"):
        await journal.finish("s", run_id, "success", reply="ok")
    record = await small.runs.get(run_id)
    assert record is not None
    assert (record.status, record.reply, record.tool_calls_total) == ("success", "ok", 1)
    assert "marked interrupted" in caplog.text

    second, _ = await journal.begin("s", "again", sender=None, message=USER, load_history=False)
    await small.runs.finish(second, "stopped")
    await journal.finish("s", second, "success", messages=[{"role": "assistant", "content": "z"}])
    record = await small.runs.get(second)
    assert record is not None
    assert record.status == "stopped"
    assert (await small.history.load("s"))[-1] == {"role": "assistant", "content": "z"}


async def test_a_record_only_run_through_the_journal(small: Store) -> None:
    journal = small.journal
    run_id = await journal.start("task", "one shot", sender="clock")

    async def delete(conn: Conn) -> None:
        await conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    await small.db.run(delete)
    await journal.record_round("task", run_id, [], [ToolCallRecord("f", "{}", "r", None, 2)])
    await journal.finish("task", run_id, "success", usage={"total_tokens": 5}, reply="ok")
    record = await small.runs.get(run_id)
    assert record is not None
    assert (record.status, record.sender, record.reply) == ("success", "clock", "ok")
    assert (record.tool_calls_total, record.total_tokens) == (1, 5)
    assert await small.history.load("task") == []


async def test_malformed_bookkeeping_values_are_stored_not_raised(small: Store) -> None:
    journal = small.journal
    run_id, _ = await journal.begin("s", "work", sender=None, message=USER, load_history=False)
    odd = ToolCallRecord(None, {"x": 1}, 42, None, 1.5)  # type: ignore[arg-type]
    await journal.record_round("s", run_id, _round(0), [odd])
    usage = {"prompt_tokens": "many", "completion_tokens": 7.0, "total_tokens": None}
    await journal.finish("s", run_id, "success", usage=usage, reply=123)  # type: ignore[arg-type]
    record = await small.runs.get(run_id)
    assert record is not None
    assert record.status == "success"
    assert (record.prompt_tokens, record.completion_tokens, record.total_tokens) == (0, 7, 0)
    assert record.reply == "123"
    call = record.tool_calls[0]
    assert (call.name, call.arguments, call.result, call.duration_ms) == ("", "{'x': 1}", "42", 2)
    # A wrong status is a caller bug, not bad data: it is still refused (and nothing is lost).
    with pytest.raises(UsageError, match="invalid final run status"):
        await journal.finish("s", run_id, "done")


async def test_a_record_the_database_refuses_still_leaves_the_steps_history(
    small: Store, caplog: pytest.LogCaptureFixture
) -> None:
    journal = small.journal
    run_id, _ = await journal.begin("s", "work", sender=None, message=USER, load_history=False)
    huge = {"total_tokens": 2**70}  # an int no integer column holds: the close is refused
    with caplog.at_level(logging.WARNING, logger="ania_nb.store.journal"):
        await journal.finish(
            "s", run_id, "success", messages=[{"role": "assistant", "content": "ok"}], usage=huge
        )
    assert [m["role"] for m in await small.history.load("s")] == ["user", "assistant"]
    assert "recording its outcome 'success' failed" in caplog.text
    record = await small.runs.get(run_id)
    assert record is not None and record.status == "running"  # left for recovery, not lost
    await journal.finish("s", run_id, "success", reply="fine")  # a sane close still works
    record = await small.runs.get(run_id)
    assert record is not None and (record.status, record.reply) == ("success", "fine")


async def test_the_global_cap_holds_between_its_checks(tmp_path: Path) -> None:
    limit = 500  # checked every 5 runs (1 %)
    s = await Store.open(tmp_path / "data", run_log_max_entries=limit)
    try:
        counts = []
        for i in range(limit + 60):
            await s.runs.finish(await s.runs.start(f"s{i % 3}", f"run {i}"), "success")
            if i >= limit - 10:
                counts.append(await s.runs.count())
        # Filling up, the table passes the limit by fewer than 5 rows until the next check;
        # from the first eviction on it stays at the limit, also between two checks, and no
        # more is evicted than the room for the 5 runs until the next one.
        assert limit < max(counts[:20]) < limit + 5
        assert max(counts[20:]) == limit
        assert min(counts[20:]) >= limit - 5
    finally:
        await s.close()


async def test_lone_surrogates_are_stored_and_history_round_trips(small: Store) -> None:
    bad = "half a pair \ud83d here"
    journal = small.journal
    run_id, _ = await journal.begin(
        "s", bad, sender=bad, message={"role": "user", "content": bad}, load_history=False
    )
    tool = {"role": "tool", "tool_call_id": "c0", "content": bad}
    await journal.record_round(
        "s", run_id, [_round(0)[0], tool], [ToolCallRecord("f", bad, bad, bad, 1)]
    )
    await journal.finish("s", run_id, "error", reply=bad, error=bad)
    history = await small.history.load("s")
    assert history[0]["content"] == bad  # exactly, surrogate included
    assert history[2]["content"] == bad
    record = await small.runs.get(run_id)
    assert record is not None
    assert record.input == record.reply == record.error == "half a pair \ufffd here"
    assert record.tool_calls[0].result == "half a pair \ufffd here"
    await small.kv("app").set("k", {"v": bad})
    assert await small.kv("app").get("k") == {"v": bad}
    await small.oplog.add("test", "write", detail=bad)
    assert (await small.oplog.list())[0].detail == "half a pair \ufffd here"
    with pytest.raises(UsageError, match="lone surrogate"):
        await small.history.load(bad)


# --- ownership -----------------------------------------------------------------------------


async def test_mark_interrupted_checks_each_runs_owner(small: Store) -> None:
    me = current_owner()
    ids = {name: await small.runs.start("s", name) for name in ("mine", "reused", "legacy")}
    ids["far"] = await small.runs.start("s", "far")
    ids["far_old"] = await small.runs.start("s", "far_old")

    async def set_owners(conn: Conn) -> None:
        await conn.execute(
            "UPDATE runs SET owner_start = 'another-boot:1' WHERE id = ?", (ids["reused"],)
        )
        await conn.execute(
            "UPDATE runs SET owner_host = NULL, owner_pid = NULL WHERE id = ?", (ids["legacy"],)
        )
        await conn.execute(
            "UPDATE runs SET owner_host = 'elsewhere.example', started_at = ? WHERE id = ?",
            (time.time() - 3600, ids["far_old"]),
        )
        await conn.execute(
            "UPDATE runs SET owner_host = 'elsewhere.example' WHERE id = ?", (ids["far"],)
        )

    await small.db.run(set_owners)
    assert await small.runs.mark_interrupted() == 2  # the reused pid and the legacy row

    async def status(name: str) -> str:
        record = await small.runs.get(ids[name])
        assert record is not None
        return record.status

    assert [await status(n) for n in ("mine", "reused", "legacy", "far", "far_old")] == [
        "running",
        "interrupted",
        "interrupted",
        "running",
        "running",
    ]
    # Another host's run is only marked once past the caller's lease.
    assert await small.runs.mark_interrupted(stale_after=600) == 1
    assert (await status("far_old"), await status("far")) == ("interrupted", "running")
    with pytest.raises(UsageError, match="stale_after"):
        await small.runs.mark_interrupted(stale_after="soon")  # type: ignore[arg-type]
    assert me.host == socket.gethostname()


def test_is_alive_sees_exit_zombies_and_pid_reuse() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        owner = Owner(socket.gethostname(), proc.pid, start_token(proc.pid))
        assert owner.start is not None
        assert is_alive(owner)
        assert not is_alive(Owner(owner.host, owner.pid, "another-boot:1"))
        assert proc.stdin is not None
        proc.stdin.close()
        # Popen reaps only in wait()/poll(): until then the exited child is a zombie.
        stat = Path(f"/proc/{proc.pid}/stat")
        for _ in range(1000):
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        assert not is_alive(owner)
    finally:
        proc.kill()
        proc.wait()
    assert not is_alive(owner)
    assert is_alive(current_owner())


@pytest.mark.sqlite_only
async def test_an_old_schema_is_upgraded_and_its_running_rows_count_as_orphaned(
    tmp_path: Path,
) -> None:
    from ania_nb.store.schema import MIGRATIONS

    path = tmp_path / "ania.db"

    def old_store() -> None:
        conn = sqlite3.connect(path)
        for step in MIGRATIONS[:2]:
            for statement in step:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        conn.execute(
            "INSERT INTO runs (session, input, status, started_at) "
            "VALUES ('s', 'old', 'running', 1.0)"
        )
        conn.commit()
        conn.close()

    await asyncio.to_thread(old_store)
    s = await Store.open(tmp_path)
    try:
        assert await s.runs.mark_interrupted() == 1
        [record] = await s.runs.list()
        assert record.status == "interrupted"
        new = await s.runs.start("s", "new")
        assert await s.runs.mark_interrupted() == 0
        await s.runs.finish(new, "success")
    finally:
        await s.close()
