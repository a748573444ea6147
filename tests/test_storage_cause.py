"""Storage errors name their cause: a full disk, a read-only mount, a missing permission.

Unit checks of `ania_nb._storage_cause`, then a real 16 MB tmpfs (`tests/_tmpfs.py`, skipped
where mounting is not allowed) filled up under the SQLite store and under LanceDB: the errors
start with "no space left on device", a full disk is never "not an ania-nb database", Lance's
Rust error becomes a `KnowledgeError` without the wheel's source paths, a failed background
compaction is a warning and a status line, and nothing stored before is lost.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from typing import Any

import pytest

from ania_nb._storage_cause import (
    NO_PERMISSION,
    NO_SPACE,
    READ_ONLY,
    named_cause,
    storage_cause,
    storage_text,
)
from ania_nb.config import Config
from ania_nb.errors import StoreError
from ania_nb.knowledge import Knowledge, KnowledgeError
from ania_nb.store import Store

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LANCE_ENOSPC = (
    "lance error: LanceError(IO): Generic LocalFileSystem error: Unable to write data: No "
    "space left on device (os error 28), /home/runner/work/lance/lance/rust/lance-file/src/"
    "writer/structural.rs:412:27"
)


# ------------------------------------------------------------------ recognising causes


def test_errno_sqlite_codes_and_lance_texts_are_recognised() -> None:
    assert storage_cause(OSError(errno.ENOSPC, "No space left on device")) == NO_SPACE
    assert storage_cause(OSError(errno.EROFS, "Read-only file system")) == READ_ONLY
    assert storage_cause(OSError(errno.EACCES, "Permission denied")) == NO_PERMISSION
    assert storage_cause(RuntimeError(LANCE_ENOSPC)) == NO_SPACE
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = 13  # type: ignore[attr-defined]
    assert storage_cause(full) == NO_SPACE
    assert storage_cause(ValueError("Table 'x' was not found")) is None
    assert storage_cause(OSError(errno.ENOENT, "No such file")) is None


def test_a_cause_is_found_through_the_exceptions_it_was_raised_from() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise StoreError("writing failed") from inner
    except StoreError as outer:
        assert storage_cause(outer) == NO_SPACE


def test_a_message_names_the_cause_first_and_says_what_to_do() -> None:
    text = storage_text(NO_SPACE, "adding rows failed", "os error 28")
    assert text.startswith("no space left on device: adding rows failed (os error 28); free")
    assert "intact" in text
    assert named_cause(f"could not record the run: {text}") == NO_SPACE
    assert named_cause("store operation failed: database is locked") is None


# ------------------------------------------------------------------ SQLite on a full disk


async def _write_in_a_transaction(conn: Any, key: str) -> None:
    """A store operation writing in a transaction (what most of ania-nb's writes are)."""
    from ania_nb.store.db import transaction

    async with transaction(conn):
        await conn.execute(
            "INSERT INTO kv (ns, key, value, updated_at) VALUES (?, ?, ?, ?)",
            ("test", key, '"' + "x" * 4000 + '"', 0.0),
        )


async def _fill_until_refused(store: Any, disk: Any) -> StoreError:
    """Fill the disk, then write to the store until SQLite refuses (its WAL may have room)."""
    disk.fill()
    for i in range(200):
        try:
            await store.db.run(_write_in_a_transaction, f"k{i}")
        except StoreError as exc:
            return exc
    raise AssertionError("SQLite kept writing on a full disk")


async def test_sqlite_on_a_full_disk_says_so_and_keeps_what_was_stored(small_disk: Any) -> None:
    data = small_disk.path / "data"
    store = await Store.open(data)
    try:
        await store.kv("test").set("kept", "before the disk filled up")
        refused = await _fill_until_refused(store, small_disk)
        assert refused.cause == NO_SPACE
        assert str(refused).startswith("no space left on device: store operation")
        assert "database or disk is full" in str(refused) or "disk I/O" in str(refused)
        assert "no transaction is active" not in str(refused)  # SQLite's error, not ROLLBACK's
    finally:
        await store.close()
    # Opening again on the full disk: never "not an ania-nb database".
    try:
        again = await Store.open(data)
    except StoreError as exc:
        assert "not an ania-nb database" not in str(exc)
        assert exc.cause == NO_SPACE, exc
    else:
        await again.close()
    small_disk.free()
    store = await Store.open(data)
    try:
        assert await store.kv("test").get("kept") == "before the disk filled up"
        check = await store.db.run_sqlite(lambda c: c.execute("PRAGMA integrity_check").fetchone())
        assert check == ("ok",)
    finally:
        await store.close()


async def test_a_new_store_on_a_full_disk_is_no_space_not_a_foreign_file(small_disk: Any) -> None:
    small_disk.fill()
    with pytest.raises(StoreError) as caught:
        await Store.open(small_disk.path / "data")
    assert caught.value.cause == NO_SPACE
    assert "not an ania-nb database" not in str(caught.value)


async def test_sqlite_on_a_read_only_mount_says_read_only(small_disk: Any) -> None:
    data = small_disk.path / "data"
    store = await Store.open(data)
    await store.kv("test").set("kept", "v")
    await store.close()
    small_disk.read_only()
    try:
        try:
            store = await Store.open(data)
        except StoreError as exc:  # SQLite cannot make the WAL index on a read-only mount
            assert exc.cause == READ_ONLY, exc
            assert str(exc).startswith("read-only file system: ")
        else:
            try:
                with pytest.raises(StoreError) as caught:
                    await store.kv("test").set("new", "v")
                assert caught.value.cause == READ_ONLY
            finally:
                await store.close()
    finally:
        small_disk.read_only(False)


async def test_a_run_on_a_full_disk_fails_naming_it_and_the_next_one_works(
    small_disk: Any, llm: Any, make_agent: Any
) -> None:
    from ania_nb.testing import reply

    llm.script(reply("first"), reply("second"), reply("third"))
    agent = make_agent(data_dir=small_disk.path / "data")
    assert (await agent.chat("hello")).text == "first"
    small_disk.fill()
    try:
        result = await agent.chat("on a full disk")
    except StoreError as exc:  # refused before a run could start
        assert exc.cause == NO_SPACE and str(exc).startswith("no space left on device: "), exc
    else:
        assert result.status == "error" and named_cause(result.error or "") == NO_SPACE, result
    small_disk.free()
    again = await agent.chat("room again")
    assert again.status == "success" and again.text in ("second", "third")


# ------------------------------------------------------------------ LanceDB on a full disk


def _lance_config(**overrides: Any) -> Config:
    values: dict[str, Any] = {"embedding.provider": "none"}
    values.update(overrides)
    return Config().with_overrides(values)


async def test_lance_on_a_full_disk_is_a_knowledge_error_naming_it(small_disk: Any) -> None:
    k = Knowledge(_lance_config(), small_disk.path)
    try:
        await k.kb.add("nb:a", "Kept", "stored before the disk filled up")
        small_disk.fill()
        with pytest.raises(KnowledgeError) as caught:
            await k.kb.add("nb:a", "Lost", "word " * 2000)
        text = str(caught.value)
        assert caught.value.cause == NO_SPACE
        assert text.startswith("no space left on device: adding "), text
        assert ".rs:" not in text and "/home/runner" not in text  # no Rust source paths
        small_disk.free()
        assert [d.title for d in await k.kb.documents("nb:a")] == ["Kept"]
        await k.kb.add("nb:a", "After", "stored once there was room again")
        assert {d.title for d in await k.kb.documents("nb:a")} == {"Kept", "After"}
    finally:
        small_disk.free()
        await k.aclose()


async def test_a_compaction_the_full_disk_refused_is_a_warning_and_a_status_line(
    small_disk: Any, caplog: pytest.LogCaptureFixture
) -> None:
    k = Knowledge(_lance_config(), small_disk.path)
    try:
        for i in range(6):  # fragments to compact
            await k.kb.add("nb:a", f"Doc {i}", f"content number {i} " * 40)
        small_disk.fill()
        with caplog.at_level(logging.WARNING, logger="ania_nb.knowledge.tables"):
            await k.upkeep()  # reported, not raised: background work has nobody to raise to
        status = await k.status()
        failed = status.upkeep_errors.get("kb_chunks", "")
        assert failed.startswith("no space left on device: compacting"), status.upkeep_errors
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any("no space left on device" in r.getMessage() for r in warned)
        assert not any(r.exc_info for r in warned)  # a clear line, not a traceback
        small_disk.free()
        await k.upkeep()
        assert (await k.status()).upkeep_errors == {}
        assert len(await k.kb.documents("nb:a")) == 6
    finally:
        small_disk.free()
        await k.aclose()


# ------------------------------------------------------------------ ania-nb commands


def _cli_on(disk: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from ania_nb.cli import main

    toml = tmp_path / "ania.toml"
    toml.write_text(f'[store]\ndata_dir = "{disk.path / "data"}"\n', encoding="utf-8")
    code = main(["runs", "--file", str(toml)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_ania_nb_runs_names_a_full_or_read_only_disk(
    small_disk: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str], state: str
) -> None:
    import asyncio

    async def make() -> None:
        store = await Store.open(small_disk.path / "data")
        await store.runs.finish(await store.runs.start("f:1", "hello", "qq:1"), "success")
        await store.close()

    asyncio.run(make())
    if state == "full":
        small_disk.fill()
    else:
        small_disk.read_only()
    try:
        code, err = _cli_on(small_disk, tmp_path, capsys)
    finally:
        if state != "full":
            small_disk.read_only(False)
    # SQLite cannot make the WAL index (-shm) of the file it opens: that is the disk, not the file.
    assert "not an ania-nb database" not in err
    cause = NO_SPACE if state == "full" else READ_ONLY
    assert code == 2 and err.startswith(f"ania-nb: error: {cause}: "), err
    assert "cannot read the store at" in err and "ania.db" in err
    assert "no transaction is active" not in err  # SQLite's own error, not a follow-up's
