"""The backend seam: the same text, order and numbers on SQLite and PostgreSQL; clear errors."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _sql import fetch, scalar

from ania_nb.errors import StoreError, UsageError
from ania_nb.store import Store, ToolCallRecord
from ania_nb.store.db import POSTGRES, SQLITE, Conn, clean_text, to_json, transaction
from ania_nb.store.postgres import PostgresDatabase, _pg_sql
from ania_nb.store.schema import MIGRATIONS, statement_for
from ania_nb.store.sqlite import SqliteDatabase

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

AWKWARD_KEYS = ["b", "B", "_x", "a", "é", "Z", "a b", "a-b", "10", "9", "中", "😀", "A"]


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    s = await Store.open(tmp_path / "data")
    yield s
    await s.close()


# --- dialect probes: what differs between the engines must not show ------------------------


async def test_text_keys_sort_by_code_point_on_both(store: Store) -> None:
    kv = store.kv("probe")
    for key in AWKWARD_KEYS:
        await kv.set(key, 1)
    assert await kv.keys() == sorted(AWKWARD_KEYS)  # Python's order: code points ("C")
    for session in AWKWARD_KEYS:
        await store.history.append(session, [{"role": "user", "content": "x"}])
    assert await store.history.sessions() == sorted(AWKWARD_KEYS)


async def test_nul_is_cleaned_the_same_way_everywhere(store: Store) -> None:
    await store.kv("probe").set("k", {"a\x00b": ["c\x00d"]})
    assert await store.kv("probe").get("k") == {"a\ufffdb": ["c\ufffdd"]}
    await store.history.append("s", [{"role": "user", "content": "hi\x00there"}])
    assert await store.history.load("s") == [{"role": "user", "content": "hi\ufffdthere"}]
    with pytest.raises(UsageError, match="NUL"):  # an id is exact or refused, never merged
        await store.history.append("s\x00", [{"role": "user", "content": "x"}])
    run_id = await store.runs.start("s", "in\x00put", sender="an\x00a")
    await store.runs.finish(run_id, "success", reply="re\x00ply", error=None)
    record = await store.runs.get(run_id)
    assert record is not None
    assert (record.input, record.sender, record.reply) == (
        "in\ufffdput",
        "an\ufffda",
        "re\ufffdply",
    )


def test_clean_text_and_to_json_share_one_rule() -> None:
    assert clean_text("a\x00b\ud800c") == "a\ufffdb\ufffdc"
    assert to_json({"k\x00": "v\x00"}) == '{"k\ufffd": "v\ufffd"}'
    # A lone surrogate survives as a JSON escape (the round trip gives the same str back).
    assert to_json("\ud800") == '"\\ud800"'


async def test_ids_are_assigned_by_the_database(store: Store) -> None:
    first = await store.runs.start("s", "one")
    second = await store.runs.start("s", "two")
    assert second > first > 0
    op = await store.oplog.add("config", "set", actor="ana", detail="x")
    assert op > 0


async def test_tool_calls_are_appended_as_json_up_to_the_cap(store: Store) -> None:
    run_id = await store.runs.start("s", "tools")
    calls = [
        ToolCallRecord("bash", '{"cmd": "ls"}', "ok", None, 5),
        ToolCallRecord("web", "{}", "", "bad \ud800 \x00 ✓", 7),
    ]
    for call in calls:
        await store.runs.add_tool_call(run_id, call)
    record = await store.runs.get(run_id)
    assert record is not None
    assert [c.name for c in record.tool_calls] == ["bash", "web"]
    assert record.tool_calls[1].error == "bad \ufffd \ufffd ✓"  # cleaned before the store
    assert record.tool_calls_total == 2


@pytest.mark.parametrize("stored", ["1.5", '"7"', "true", "null", "[1]", '{"n": 1}', '"01"'])
async def test_incr_refuses_every_non_integer_value_and_keeps_it(store: Store, stored: str) -> None:
    import json

    kv = store.kv("probe")
    await kv.set("k", json.loads(stored))
    with pytest.raises(Exception, match="not an integer"):
        await kv.incr("k")
    assert await kv.get("k") == json.loads(stored)


async def test_incr_counts_big_and_negative_numbers(store: Store) -> None:
    kv = store.kv("probe")
    assert await kv.incr("n", 2**40) == 2**40
    assert await kv.incr("n", -(2**41)) == -(2**40)
    assert await kv.get("n") == -(2**40)


# --- deferred statements: sent later on PostgreSQL, never lost, never half-kept -----------

_KV_INSERT = "INSERT INTO kv (ns, key, value, updated_at) VALUES (?, ?, ?, 0)"


async def test_a_deferred_write_is_sent_even_when_nothing_follows_it(store: Store) -> None:
    async def op(conn: Conn) -> None:
        await conn.defer(_KV_INSERT, ("d", "k", "1"))

    await store.db.run(op)  # the operation ends right after: its end sends what it deferred
    assert await store.kv("d").get("k") == 1


async def test_a_failing_deferred_write_fails_its_transaction_and_keeps_nothing(
    store: Store,
) -> None:
    async def op(conn: Conn) -> None:
        async with transaction(conn):
            await conn.defer(_KV_INSERT, ("d", "a", "1"))
            # The same key again: refused (on PostgreSQL only when the COMMIT carries it).
            await conn.defer(_KV_INSERT, ("d", "a", "2"))

    with pytest.raises(StoreError, match=r"(?i)unique|duplicate"):
        await store.db.run(op)
    assert await store.kv("d").keys() == []  # the first write went with the transaction

    async def and_then_read(conn: Conn) -> Any:
        with pytest.raises(conn.errors):
            await op(conn)
        # The same connection, at once: rolled back, not left in a failed transaction.
        return await conn.fetchval("SELECT count(*) FROM kv WHERE ns = ?", ("d",))

    assert await store.db.run(and_then_read) == 0


async def test_deferred_writes_go_in_order_before_the_next_read(store: Store) -> None:
    async def op(conn: Conn) -> tuple[Any, ...] | None:
        async with transaction(conn):
            await conn.defer(_KV_INSERT, ("d", "q", "1"))
            await conn.defer("UPDATE kv SET value = ? WHERE ns = ? AND key = ?", ("'x%?", "d", "q"))
            return await conn.fetchone("SELECT value FROM kv WHERE ns = ? AND key = ?", ("d", "q"))

    assert await store.db.run(op) == ("'x%?",)  # quotes, % and ? survive the binding


# --- the schema: one list of steps for both -------------------------------------------------


def _columns_sqlite(path: Path) -> dict[str, list[tuple[str, str, int, Any, int]]]:
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            t: [tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info({t})")]
            for t in sorted(tables)
            if not t.startswith("sqlite_")
        }


@pytest.mark.sqlite_only
@pytest.mark.parametrize("version", range(len(MIGRATIONS)))
async def test_an_upgraded_sqlite_store_ends_identical_to_a_fresh_one(
    tmp_path: Path, version: int
) -> None:
    fresh = tmp_path / "fresh.db"
    await (await SqliteDatabase.open(fresh)).close()
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        for step in MIGRATIONS[:version]:
            for statement in step:
                conn.execute(statement_for(statement, SQLITE))
        conn.execute(f"PRAGMA user_version = {version}")
    await (await SqliteDatabase.open(old)).close()
    assert _columns_sqlite(old) == _columns_sqlite(fresh)


def test_postgres_ddl_uses_identities_wide_integers_and_c_collation() -> None:
    ddl = statement_for(MIGRATIONS[0][1], POSTGRES)
    assert "GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY" in ddl
    assert 'TEXT COLLATE "C"' in ddl and "DOUBLE PRECISION" in ddl and "AUTOINCREMENT" not in ddl
    assert statement_for(MIGRATIONS[0][1], SQLITE) == MIGRATIONS[0][1]  # SQLite's DDL unchanged


def test_placeholders_are_rewritten_outside_literals_only() -> None:
    sql = "SELECT ?, :now - x, y::json, '^-?(0|1)$', '50%', 'it''s ?' WHERE a = :a2"
    assert _pg_sql(sql) == (
        "SELECT %s, %(now)s - x, y::json, '^-?(0|1)$', '50%%', 'it''s ?' WHERE a = %(a2)s"
    )


# --- PostgreSQL only: opening ---------------------------------------------------------------


async def _pg_columns(db: Any) -> list[tuple[Any, ...]]:
    async def op(conn: Conn) -> list[tuple[Any, ...]]:
        return await conn.fetchall(
            "SELECT table_name, column_name, data_type, is_nullable, column_default, "
            "collation_name, is_identity FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, column_name"
        )

    return await db.run(op)


@pytest.fixture
def on_postgres(backend: str) -> None:
    """Only the PostgreSQL half (each data dir a fresh database: the backend fixture)."""
    if backend != "postgres":
        pytest.skip("about PostgreSQL")


async def test_pg_a_store_upgraded_from_each_version_ends_identical(
    on_postgres: None, tmp_path: Path
) -> None:
    fresh = await Store.open(tmp_path / "fresh")
    expected = await _pg_columns(fresh.db)
    url = fresh.db.location
    await fresh.close()
    for version in range(len(MIGRATIONS)):
        s = await Store.open(tmp_path / f"v{version}")
        db = s.db

        async def reset(conn: Conn, version: int = version) -> None:
            await conn.execute("DROP SCHEMA public CASCADE")
            await conn.execute("CREATE SCHEMA public")
            await conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for step in MIGRATIONS[:version]:
                for statement in step:
                    await conn.execute(statement_for(statement, POSTGRES))
            await conn.execute("INSERT INTO schema_version VALUES (?)", (version,))

        await db.run(reset)
        where = db.location
        await s.close()
        assert where != url
        reopened = await Store.open(tmp_path / f"v{version}")
        try:
            assert await _pg_columns(reopened.db) == expected, version
            assert await scalar(reopened.db, "SELECT version FROM schema_version") == len(
                MIGRATIONS
            )
        finally:
            await reopened.close()


async def test_pg_newer_schema_and_foreign_tables_are_refused(
    on_postgres: None, tmp_path: Path
) -> None:
    s = await Store.open(tmp_path / "a")
    from _sql import execute

    await execute(s.db, "UPDATE schema_version SET version = 999")
    await s.close()
    with pytest.raises(StoreError, match="newer than this ania-nb understands"):
        await Store.open(tmp_path / "a")

    other = await Store.open(tmp_path / "b")

    async def foreign(conn: Conn) -> None:
        await conn.execute("DROP SCHEMA public CASCADE")
        await conn.execute("CREATE SCHEMA public")
        await conn.execute("CREATE TABLE invoices (n INTEGER)")

    await other.db.run(foreign)
    await other.close()
    with pytest.raises(StoreError, match="not ania-nb's \\(invoices\\)"):
        await Store.open(tmp_path / "b")


@pytest.mark.sqlite_only  # once: it needs no server
async def test_an_unreachable_server_is_one_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://ania:hunter2@127.0.0.1:{port}/ania"
    with pytest.raises(StoreError) as info:
        await PostgresDatabase.open(url)
    message = str(info.value)
    assert message.startswith(
        f"cannot connect to the store at postgresql://ania:***@127.0.0.1:{port}/ania"
    )
    assert "hunter2" not in message and "\n" not in message


async def test_pg_several_processes_opening_a_fresh_database_migrate_it_once(
    on_postgres: None, tmp_path: Path
) -> None:
    s = await Store.open(tmp_path / "m")
    url = s.db._url  # type: ignore[attr-defined]

    async def empty(conn: Conn) -> None:
        await conn.execute("DROP SCHEMA public CASCADE")
        await conn.execute("CREATE SCHEMA public")

    await s.db.run(empty)
    await s.close()
    script = (
        "import asyncio, sys\n"
        "from ania_nb.store import Store\n"
        "async def main():\n"
        "    s = await Store.open(sys.argv[2], url=sys.argv[1])\n"
        "    await s.kv('m').incr('opened')\n"
        "    await s.close()\n"
        "asyncio.run(main())\n"
    )
    import sys

    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            url,
            str(tmp_path / f"p{i}"),
            stderr=asyncio.subprocess.PIPE,
        )
        for i in range(4)
    ]
    errors = [(await p.communicate())[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    s = await Store.open(tmp_path / "m")
    try:
        assert await s.kv("m").get("opened") == 4
        assert await fetch(s.db, "SELECT version FROM schema_version") == [(len(MIGRATIONS),)]
    finally:
        await s.close()


# --- store.url: the Agent, the CLI and serve on PostgreSQL ----------------------------------


@pytest.mark.sqlite_only  # once: it names its own database
async def test_an_agent_with_store_url_keeps_everything_in_postgresql(
    make_agent: Any, llm: Any, pg_url: str, tmp_path: Path
) -> None:
    from ania_nb.testing import reply

    llm.script(reply("hello from the store"))
    agent = make_agent(overrides={"store.url": pg_url})
    assert (await agent.chat("hi", session="s1")).text == "hello from the store"
    await agent.aclose()
    assert not (tmp_path / "data" / "ania.db").exists()  # nothing went to SQLite
    store = await Store.open(tmp_path / "elsewhere", url=pg_url)
    try:
        user, answer = await store.history.load("s1")
        assert user["content"].endswith("] hi")  # stamped with the time it was sent
        assert answer["content"] == "hello from the store"
        [run] = await store.runs.list(session="s1")
        assert (run.status, run.reply) == ("success", "hello from the store")
    finally:
        await store.close()


@pytest.mark.sqlite_only  # once: it needs a server or none, not the fixture's
@pytest.mark.parametrize("case", ["unreachable", "wrong password"])
async def test_serve_says_in_one_line_why_the_store_cannot_be_opened(
    case: str, pg_cluster: Any, tmp_path: Path, llm: Any
) -> None:
    import os
    import socket
    import sys

    if case == "unreachable":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"postgresql://ania:hunter2@127.0.0.1:{port}/ania"
    else:
        url = pg_cluster.url().replace(pg_cluster.password, "hunter2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANIA_")} | {
        "ANIA_STORE__URL": url,
        "ANIA_STORE__DATA_DIR": str(tmp_path / "data"),
        "ANIA_LLM__BASE_URL": llm.base_url,
        "ANIA_LLM__MODEL": "scripted",
        "ANIA_LLM__API_KEY": "k",
        "ANIA_SKILLS__DIR": str(tmp_path / "no-skills"),
        "ANIA_MCP__CONFIG_FILE": str(tmp_path / "no-mcp.json"),
        "ANIA_RUNNER__PORT": "0",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ania_nb",
        "serve",
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    text = (out + err).decode()
    assert proc.returncode == 2, text
    assert "cannot start: cannot connect to the store at postgresql://ania:***@" in text, text
    assert "hunter2" not in text and "Traceback" not in text
