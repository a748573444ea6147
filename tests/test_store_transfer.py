"""Moving a data directory's SQLite store into PostgreSQL (`ania_nb.store.transfer`, #30 item 6).

A directory filled the way a served bot fills it (an Agent's chats through the scripted model,
then the inbox, outbox, clock, teams, op log, KV and approvals through their public APIs) and
one made by ``ania-nb demo`` are copied into fresh PostgreSQL databases; every table must
arrive row for row, new rows must get ids past the copied ones, the source must stay byte for
byte as it was, and ``ania-nb store migrate`` must refuse clearly (exit 2, one line, no
password) what it cannot do. The ``test_cli_*`` tests start processes (SLOW_TESTS).
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from _sql import scalar

from ania_nb import tool
from ania_nb.addresses import mask_url
from ania_nb.agents.team_store import TeamStore
from ania_nb.clock.runner import trigger_text
from ania_nb.clock.store import ClockStore
from ania_nb.errors import StoreError, UsageError
from ania_nb.store import InboxRow, OutboxRow, Store
from ania_nb.store.db import DB_FILENAME, SQLITE, Conn, Database
from ania_nb.store.schema import MIGRATIONS, OWN_TABLES, TABLES, statement_for
from ania_nb.store.transfer import copy_store, open_snapshot
from ania_nb.testing import reply, tool_call

PASSWORD = "n0t-a-real-pw"
BEFORE_THE_LEDGER = 5  # schema version of a store counted before the usage ledger existed


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@pytest.fixture
def fresh_pg(pg_cluster: Any) -> Iterator[Callable[[], str]]:
    """Make empty PostgreSQL databases (no schema yet); each is dropped after the test."""
    made: list[str] = []

    def make() -> str:
        name = f"t_migrate_{len(made)}_{int(time.time() * 1000) % 10**9}"
        pg_cluster.server.create_database(name)
        made.append(name)
        return str(pg_cluster.url(name))

    yield make
    for name in made:
        pg_cluster.server.drop_database(name)


def _task_fields(title: str) -> dict[str, Any]:
    return {
        "cron": "@daily",
        "title": title,
        "content": "report",
        "target": "g:1",
        "run_once": 0,
        "timeout": 0.0,
        "created_by": "qq:1",
        "creator": "ai",
        "note": "",
        "next_run_at": None,
    }


async def _fill_like_a_served_bot(make_agent: Any, llm: Any, data_dir: Path) -> None:
    """Runs, history and usage from real chats; the runner's and tools' rows through the APIs."""
    llm.script(
        reply(tool_calls=[tool_call("echo", {"text": "tasks"})]),
        reply("no tasks"),
        reply("hello"),
        reply("again"),
    )
    # One run record kept per session: f:2's first run is pruned, as a busy bot's are.
    agent = make_agent(
        data_dir=data_dir, tools=[echo], overrides={"store.run_log_max_per_session": 1}
    )
    for text, session in (("tasks?", "g:1"), ("hi", "f:2"), ("more", "f:2")):
        await agent.chat(text, session=session)
    await agent.aclose()

    store = await Store.open(data_dir)
    try:
        first = await store.inbox.accept(InboxRow("onebot", "10000", "m1", "g:1", "qq:1", {"t": 1}))
        assert first is not None
        await store.inbox.accept(InboxRow("onebot", "10000", "m2", "f:2", "qq:2", {"t": "\x00ok"}))
        await store.outbox.add(OutboxRow("g:1", "reply", {"text": "hello"}, run_id=None))
        await store.approvals.add(
            request_id="ap1",
            session="g:1",
            run_id=None,
            deadline=time.time() + 60,
            request={"tool": "bash"},
            checkpoint={"pending": True},
        )
        await TeamStore(store).create("g:1", "writers", [{"name": "ann", "role": "edits"}])
        child = await store.children.start("g:1", "look it up", "member", background=True)
        await store.children.end(child, "finished", "success")
        await store.kv("notes").set("k", {"v": [1, 2]})
        await store.kv("counters").incr("n", 3)
        clock = ClockStore(store.db)
        task, _ = await clock.create(_task_fields("daily"))
        begun = await clock.begin_run(task.id, trigger_text, manual=True, scheduled_at=None)
        assert begun is not None
        await clock.finish_run(begun[1].id, "success", reply="done")
        await store.oplog.add("clock", "create", actor="qq:1", detail=task.id)
        # The newest history rows go: SQLite will not give their ids again, nor may the copy.
        await store.history.append("g:gone", [{"role": "user", "content": "bye"}] * 3)
        await store.history.clear("g:gone")
    finally:
        await store.close()


async def _dump(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    """Every ania-nb table's rows (its columns in the schema's order, by primary key)."""

    async def read(conn: Conn) -> dict[str, list[tuple[Any, ...]]]:
        dumped = {}
        for table in TABLES:
            columns, key = await _layout(conn, table)
            rows = await conn.fetchall(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {key}")
            dumped[table] = [tuple(row) for row in rows]
        return dumped

    return await db.run(read)


_KEYS = {
    "kv": "ns, key",
    "clock_tasks": "id",
    "clock_meta": "key",
    "usage_counters": "day, session",
    "usage_daily": "day, model",
    "approvals": "id",
}


async def _layout(conn: Conn, table: str) -> tuple[list[str], str]:
    if conn.dialect.name == "sqlite":
        columns = [row[1] for row in await conn.fetchall(f"PRAGMA table_info({table})")]
    else:
        rows = await conn.fetchall(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
            "AND table_schema = current_schema() ORDER BY ordinal_position",
            (table,),
        )
        columns = [name for (name,) in rows]
    return columns, _KEYS.get(table, "id")


def _digest(data_dir: Path) -> str:
    """The bytes of the SQLite store (its WAL too, if one is left)."""
    digest = hashlib.sha256()
    for name in (DB_FILENAME, DB_FILENAME + "-wal"):
        path = data_dir / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()


async def _migrate(data_dir: Path, url: str, *, force: bool = False) -> dict[str, int]:
    """What ``ania-nb store migrate`` does, in this process."""
    from ania_nb.store.postgres import PostgresDatabase

    folder = data_dir.parent / f"snapshot-{time.monotonic_ns()}"
    folder.mkdir()
    source = await open_snapshot(data_dir / DB_FILENAME, folder)
    try:
        target = await PostgresDatabase.open(url)
        try:
            return await copy_store(source, target, force=force)
        finally:
            await target.close()
    finally:
        await source.close()


async def _source_dump(data_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    store = await Store.open(data_dir)
    try:
        return await _dump(store.db)
    finally:
        await store.close()


async def _target_dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    from ania_nb.store.postgres import PostgresDatabase

    db = await PostgresDatabase.open(url)
    try:
        return await _dump(db)
    finally:
        await db.close()


async def _last_ids(url: str) -> dict[str, Any]:
    """Each identity sequence's last value (None: never used)."""
    from ania_nb.store.postgres import PostgresDatabase

    async def read(conn: Conn) -> dict[str, Any]:
        rows = await conn.fetchall(
            "SELECT table_name, pg_sequence_last_value(pg_get_serial_sequence(table_name, 'id')"
            "::regclass) FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND column_name = 'id' AND is_identity = 'YES' ORDER BY table_name"
        )
        return dict(rows)

    db = await PostgresDatabase.open(url)
    try:
        return await db.run(read)
    finally:
        await db.close()


# --------------------------------------------------------------------------- in process


async def test_a_served_bots_directory_moves_table_for_table_and_its_session_continues(
    make_agent: Any, llm: Any, tmp_path: Path, fresh_pg: Callable[[], str]
) -> None:
    data_dir, url = tmp_path / "bot", fresh_pg()
    await _fill_like_a_served_bot(make_agent, llm, data_dir)
    source = await _source_dump(data_dir)
    before = _digest(data_dir)  # closed, as a bot stopped for the move leaves it

    copied = await _migrate(data_dir, url)

    assert _digest(data_dir) == before  # the source was only read
    assert set(copied) == OWN_TABLES
    assert copied == {table: len(rows) for table, rows in source.items()}
    for table in (
        "chat_history",
        "runs",
        "usage_ledger",
        "inbox",
        "outbox",
        "approvals",
        "children",
    ):
        assert copied[table] > 0, f"the served bot left no {table} rows to move"
    assert await _target_dump(url) == source  # every row, every column, the same ids

    store = await Store.open(data_dir, url=url)
    try:
        # The session goes on where it was: its history, then new rows past the copied ids.
        assert [m["content"] for m in await store.history.load("f:2")][-1] == "again"
        await store.history.append("f:2", [{"role": "user", "content": "on postgres"}])
        assert (await store.history.load("f:2"))[-1]["content"] == "on postgres"
        newest = await scalar(store.db, "SELECT max(id) FROM chat_history")
        assert newest == max(r[0] for r in source["chat_history"]) + 3 + 1  # past the cleared
        run_id = await store.runs.start("f:2", "on postgres")
        # SQLite never reuses a pruned run's id (AUTOINCREMENT); neither does the copy.
        assert run_id > max(row[0] for row in source["runs"])
        new_inbox = await store.inbox.accept(InboxRow("onebot", "10000", "m3", "g:1", None, {}))
        assert new_inbox is not None and new_inbox > max(r[0] for r in source["inbox"])
        assert await store.outbox.add(OutboxRow("g:1", "reply", {})) > source["outbox"][-1][0]
        assert await store.oplog.add("x", "y") > max(r[0] for r in source["oplog"])
        later = await store.children.start("g:1", "again", "member", background=True)
        assert later > max(r[0] for r in source["children"])  # a bg:<id> key is never reused
        clock = ClockStore(store.db)
        [task] = await clock.list()
        begun = await clock.begin_run(task.id, trigger_text, manual=True, scheduled_at=None)
        assert begun is not None and begun[1].id > source["clock_log"][-1][0]
        later, _ = await clock.create(_task_fields("weekly"))
        assert later.id != task.id  # the id counter (clock_meta) moved too
        teams = TeamStore(store)
        assert [t.name for t in await teams.list("g:1")] == ["writers"]
        assert await store.kv("counters").incr("n") == 4
        assert await store.usage.used(source["usage_counters"][0][0], "g:1") > 0
    finally:
        await store.close()


async def test_a_target_with_rows_is_refused_and_force_replaces_them_the_same_way_twice(
    make_agent: Any, llm: Any, tmp_path: Path, fresh_pg: Callable[[], str]
) -> None:
    data_dir, url = tmp_path / "bot", fresh_pg()
    await _fill_like_a_served_bot(make_agent, llm, data_dir)
    source = await _source_dump(data_dir)
    await _migrate(data_dir, url)
    ids_after_first = await _last_ids(url)

    refused = r"already holds ania-nb rows .*chat_history: \d+.*--force"
    with pytest.raises(UsageError, match=refused):
        await _migrate(data_dir, url)
    assert await _target_dump(url) == source  # refused: untouched

    store = await Store.open(data_dir, url=url)  # the target lives on: rows of its own
    try:
        await store.history.append("g:9", [{"role": "user", "content": "only on postgres"}])
        await store.runs.start("g:9", "only on postgres")
    finally:
        await store.close()

    first = await _migrate(data_dir, url, force=True)
    assert await _target_dump(url) == source
    assert await _last_ids(url) == ids_after_first  # the sequences too: as after the first copy
    second = await _migrate(data_dir, url, force=True)
    assert second == first
    assert await _target_dump(url) == source
    assert await _last_ids(url) == ids_after_first


async def test_a_store_of_an_older_schema_moves_upgraded_and_the_source_stays_old(
    tmp_path: Path, fresh_pg: Callable[[], str]
) -> None:
    data_dir, url = tmp_path / "old", fresh_pg()
    data_dir.mkdir()
    conn = sqlite3.connect(data_dir / DB_FILENAME, isolation_level=None)
    for step in MIGRATIONS[:BEFORE_THE_LEDGER]:
        for statement in step:
            conn.execute(statement_for(statement, SQLITE))
    conn.execute(f"PRAGMA user_version = {BEFORE_THE_LEDGER}")
    conn.execute(
        "INSERT INTO usage_counters (day, session, prompt_tokens, completion_tokens, "
        "cached_tokens, total_tokens) VALUES ('2026-12-01', 'g:1', 7, 3, 0, 10)"
    )
    conn.execute("INSERT INTO chat_history (session, message, created_at) VALUES ('g:1', '{}', 0)")
    conn.close()
    before = _digest(data_dir)

    copied = await _migrate(data_dir, url)

    assert _digest(data_dir) == before  # upgraded in the snapshot only
    conn = sqlite3.connect(f"{(data_dir / DB_FILENAME).as_uri()}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == BEFORE_THE_LEDGER
    finally:
        conn.close()
    # The ledger's migration step ran on the way: the counter arrived with its carried row.
    assert copied["usage_counters"] == copied["usage_ledger"] == copied["chat_history"] == 1
    store = await Store.open(tmp_path / "unused", url=url)
    try:
        [ledger] = await store.usage.ledger("2026-12-01")
        assert (ledger.key, ledger.total) == ("g:1", 10)
        assert await store.usage.used("2026-12-01", "g:1") == 10
    finally:
        await store.close()


async def test_a_row_postgresql_refuses_fails_the_whole_copy_and_the_target_keeps_its_rows(
    make_agent: Any, llm: Any, tmp_path: Path, fresh_pg: Callable[[], str]
) -> None:
    data_dir, url = tmp_path / "bot", fresh_pg()
    await _fill_like_a_served_bot(make_agent, llm, data_dir)
    await _migrate(data_dir, url)
    kept = await _target_dump(url)
    # SQLite stores text in an INTEGER column; PostgreSQL's BIGINT refuses it — in approvals,
    # the last table copied, so everything before it was already written.
    with sqlite3.connect(data_dir / DB_FILENAME) as conn:
        conn.execute("UPDATE approvals SET resent = 'often'")
    conn.close()

    with pytest.raises(StoreError, match="failed on postgresql://"):
        await _migrate(data_dir, url, force=True)
    assert await _target_dump(url) == kept  # all or nothing: the old rows, nothing half-done


async def test_a_foreign_file_is_refused_by_its_own_name_and_left_alone(tmp_path: Path) -> None:
    data_dir = tmp_path / "notes"
    data_dir.mkdir()
    (data_dir / DB_FILENAME).write_bytes(b"not a database, just notes " * 100)
    before = _digest(data_dir)
    with pytest.raises(StoreError) as caught:
        await open_snapshot(data_dir / DB_FILENAME, tmp_path)
    assert str(data_dir / DB_FILENAME) in str(caught.value)
    assert "not an ania-nb database" in str(caught.value) or "not a database" in str(caught.value)
    assert _digest(data_dir) == before


async def test_the_copy_goes_only_from_sqlite_to_postgresql(
    tmp_path: Path, fresh_pg: Callable[[], str]
) -> None:
    from ania_nb.store.postgres import PostgresDatabase

    sqlite = await Store.open(tmp_path / "a")
    pg = await PostgresDatabase.open(fresh_pg())
    try:
        with pytest.raises(UsageError, match="not a PostgreSQL database"):
            await copy_store(sqlite.db, sqlite.db, force=False)
        with pytest.raises(UsageError, match="not an SQLite file"):
            await copy_store(pg, pg, force=False)
    finally:
        await pg.close()
        await sqlite.close()


# --------------------------------------------------------------------------- the command


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ania_nb", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


async def _migrate_cli(url: str, data_dir: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """``ania-nb store migrate --to url --data-dir data_dir [more]`` in a process."""
    args = ("store", "migrate", "--to", url, "--data-dir", str(data_dir), *more)
    return await asyncio.to_thread(_cli, *args, cwd=data_dir.parent)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ania-nb: error: "), done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    return lines[0]


async def test_cli_migrates_the_demos_directory_and_refuses_then_forces_a_second_time(
    tmp_path: Path, fresh_pg: Callable[[], str]
) -> None:
    data_dir, url = tmp_path / "demo", fresh_pg()
    made = await asyncio.to_thread(_cli, "demo", "--data-dir", str(data_dir), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    source = await _source_dump(data_dir)
    before = _digest(data_dir)

    done = await _migrate_cli(url, data_dir)
    assert done.returncode == 0, done.stderr
    assert f"into {mask_url(url)}" in done.stdout and "***" in mask_url(url)  # no password
    assert f"chat_history {len(source['chat_history']):>12} rows" in done.stdout
    assert _digest(data_dir) == before
    assert await _target_dump(url) == source
    assert source["chat_history"] and source["runs"] and source["usage_ledger"]

    store = await Store.open(data_dir, url=url)  # the demo's session continues on PostgreSQL
    try:
        await store.history.append("demo", [{"role": "user", "content": "next"}])
        assert (await store.history.load("demo"))[-1]["content"] == "next"
        assert await store.runs.start("demo", "next") > max(r[0] for r in source["runs"])
    finally:
        await store.close()

    again = await _migrate_cli(url, data_dir)
    assert "already holds ania-nb rows" in _one_error_line(again)
    forced = [await _migrate_cli(url, data_dir, "--force") for _ in range(2)]
    assert [f.returncode for f in forced] == [0, 0], forced[0].stderr
    assert forced[0].stdout == forced[1].stdout == done.stdout
    assert await _target_dump(url) == source


async def test_cli_refusals_are_one_line_without_the_password(
    tmp_path: Path, pg_admin_url: str
) -> None:
    data_dir = tmp_path / "data"
    store = await Store.open(data_dir)
    await store.history.append("g:1", [{"role": "user", "content": "hi"}])
    await store.close()
    admin = urlsplit(pg_admin_url)
    port = admin.port or 5432

    def url(user: str, host_port: str, db: str = "postgres") -> str:
        return f"postgresql://{user}:{PASSWORD}@{host_port}/{db}"

    with _closed_port() as free:
        unreachable = url("postgres", f"127.0.0.1:{free}")
        cases = {
            unreachable: "cannot connect to the store at postgresql://postgres:***@127.0.0.1",
            # scram: a wrong password and an unknown role read the same (PostgreSQL tells neither)
            url("no_such_role", f"127.0.0.1:{port}"): "password authentication failed",
            url(admin.username or "ania", f"127.0.0.1:{port}"): "password authentication failed",
            f"mysql://u:{PASSWORD}@127.0.0.1/x": "--to must be a postgresql://",
        }
        for target, expected in cases.items():
            done = await _migrate_cli(target, data_dir)
            assert expected in _one_error_line(done), done.stderr
    nothing = await _migrate_cli(pg_admin_url, tmp_path / "none")
    assert "no store in" in _one_error_line(nothing)
    helped = await asyncio.to_thread(_cli, "store", "migrate", "--help", cwd=tmp_path)
    assert "--force" in helped.stdout and "DELETES" in helped.stdout


@contextmanager
def _closed_port() -> Iterator[int]:
    """A loopback port nothing listens on, for as long as the block runs."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        yield int(sock.getsockname()[1])
    finally:
        sock.close()
