"""The op log against a real SQLite file: append, filter, evict, migrate from schema 1."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import ania_nb.store as store_pkg
from ania_nb.errors import UsageError
from ania_nb.store import OpLog, OpRecord, Store
from ania_nb.store.db import DB_FILENAME, Conn
from ania_nb.store.schema import MIGRATIONS

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "data")
    yield s
    await s.close()


def test_exported_from_the_store_package() -> None:
    assert {"OpLog", "OpRecord"} <= set(store_pkg.__all__)
    assert store_pkg.__all__ == sorted(store_pkg.__all__)


async def test_add_and_list_newest_first_with_all_fields(store: Store) -> None:
    first = await store.oplog.add("skill", "skill_install", actor="ai", session="nb:a", detail="x")
    second = await store.oplog.add("config", "config_set")
    assert second > first
    records = await store.oplog.list()
    assert [r.id for r in records] == [second, first]
    newest, oldest = records
    assert isinstance(newest, OpRecord)
    assert (newest.category, newest.action, newest.actor, newest.session, newest.detail) == (
        "config",
        "config_set",
        None,
        None,
        "",
    )
    assert oldest.to_dict()["actor"] == "ai"
    assert oldest.session == "nb:a"
    assert oldest.at <= newest.at


async def test_filters_combine_and_limit_applies(store: Store) -> None:
    for i in range(3):
        await store.oplog.add("skill", "skill_install", session="s1", detail=f"i{i}")
    await store.oplog.add("skill", "skill_remove", session="s2")
    await store.oplog.add("ai", "tool_approval", session="s1")

    installs = await store.oplog.list(action="skill_install")
    assert [r.detail for r in installs] == ["i2", "i1", "i0"]
    assert len(await store.oplog.list(category="skill")) == 4
    s1_skill = await store.oplog.list(category="skill", session="s1", limit=2)
    assert [r.detail for r in s1_skill] == ["i2", "i1"]
    assert [r.action for r in await store.oplog.list(session="s2")] == ["skill_remove"]
    assert await store.oplog.list(category="nothing") == []


async def test_detail_is_cut_to_500_characters(store: Store) -> None:
    await store.oplog.add("skill", "skill_install", detail="é" * 2000)
    (record,) = await store.oplog.list()
    assert len(record.detail) == 500
    assert record.detail.endswith("…")


async def test_oldest_entries_are_evicted_beyond_max_entries(store: Store) -> None:
    log = OpLog(store.db, max_entries=3)
    for i in range(5):
        await log.add("system", "tick", detail=str(i))
    assert await log.count() == 3
    assert [r.detail for r in await log.list()] == ["4", "3", "2"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"category": "", "action": "a"}, "category must be 1-64"),
        ({"category": "c" * 65, "action": "a"}, "category must be 1-64"),
        ({"category": "c", "action": ""}, "action must be 1-64"),
        ({"category": "c", "action": "a", "detail": 5}, "detail must be a string"),
        ({"category": "c", "action": "a", "actor": 1}, "actor must be a string"),
    ],
)
async def test_bad_entries_are_refused_and_nothing_is_written(
    store: Store, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        await store.oplog.add(**kwargs)  # type: ignore[arg-type]
    assert await store.oplog.count() == 0


async def test_bad_list_arguments_and_bad_max_entries(store: Store) -> None:
    with pytest.raises(UsageError, match="limit must be a positive int"):
        await store.oplog.list(limit=0)
    with pytest.raises(UsageError, match="max_entries"):
        OpLog(store.db, max_entries=0)


async def test_entries_survive_reopening(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    await s.oplog.add("skill", "skill_remove", detail="gone")
    await s.close()
    s = await Store.open(tmp_path)
    try:
        assert [r.detail for r in await s.oplog.list()] == ["gone"]
    finally:
        await s.close()


@pytest.mark.sqlite_only
async def test_a_schema_1_database_is_migrated_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / DB_FILENAME
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO kv (ns, key, value, updated_at) VALUES ('n', 'k', '\"v\"', 0)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()

    s = await Store.open(tmp_path)
    try:
        assert await s.kv("n").get("k") == "v"
        await s.oplog.add("system", "migrated")
        assert [r.action for r in await s.oplog.list()] == ["migrated"]

        async def version(conn: Conn) -> int:
            return int(await conn.fetchval("PRAGMA user_version"))

        assert await s.db.run(version) == len(MIGRATIONS) >= 2
    finally:
        await s.close()
