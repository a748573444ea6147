"""Moving a store between backends: an SQLite data directory's store into PostgreSQL.

`open_snapshot` takes a consistent copy of a data directory's ``ania.db`` through a read-only
connection (the source file is never written) into a file of its own, which `Store`'s normal
open then brings up to this ania-nb's schema — so a store written by an older ania-nb moves
with the same migration steps as one opened in place. `copy_store` copies every table of
`TABLES` with its ids into the target in one transaction and moves each identity sequence
past the largest id, so that rows written afterwards never collide with the copied ones.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from ania_nb.errors import StoreError, UsageError

from .db import Conn, Database, transaction
from .schema import TABLES

__all__ = ["BATCH_ROWS", "copy_store", "open_snapshot"]

BATCH_ROWS = 1000  # rows read from the source and written to the target at a time


def _snapshot_sqlite(db_file: Path, snapshot: Path) -> None:
    """Copy the SQLite database ``db_file`` into ``snapshot``, reading ``db_file`` read-only.

    The copy is one consistent state of the source even while another process writes to it
    (SQLite's online backup). Raises `StoreError` when the file cannot be read as a database.
    """
    try:
        source = sqlite3.connect(f"{db_file.absolute().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store at {db_file} read-only: {exc}") from exc
    try:
        target = sqlite3.connect(snapshot)
        try:
            source.backup(target)
        finally:
            target.close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the store at {db_file}: {exc}") from exc
    finally:
        source.close()


async def open_snapshot(db_file: Path, folder: Path) -> Database:
    """Snapshot the SQLite store ``db_file`` into ``folder`` and open the copy, upgraded.

    ``db_file`` is only read; errors name it, not the copy.
    """
    from .sqlite import SqliteDatabase

    snapshot = folder / db_file.name
    try:
        await asyncio.to_thread(_snapshot_sqlite, db_file, snapshot)
        return await SqliteDatabase.open(snapshot)
    except StoreError as exc:
        raise StoreError(str(exc).replace(str(snapshot.absolute()), str(db_file))) from exc


async def copy_store(source: Database, target: Database, *, force: bool) -> dict[str, int]:
    """Copy every ania-nb table of the SQLite ``source`` into the PostgreSQL ``target``.

    Returns the rows copied per table. One target transaction: the copy is all or nothing. A
    target already holding ania-nb rows is refused (`UsageError`) unless ``force``, which
    deletes them first, so that running the copy again with ``force`` gives the same target.
    Ids are kept; each identity sequence ends at the table's largest id (or at the source's
    own sequence, if that went further: SQLite never gives a deleted row's id again).
    """
    if source.dialect.name != "sqlite":
        raise UsageError(f"the source store at {source.location} is not an SQLite file")
    if target.dialect.name != "postgres":
        raise UsageError(f"the target store at {target.location} is not a PostgreSQL database")

    async def copy(conn: Conn) -> dict[str, int]:
        async with transaction(conn):
            await conn.lock("store-transfer")  # two copies into one database take turns
            present = {t: n for t in TABLES if (n := await _count(conn, t))}
            if present and not force:
                shown = ", ".join(f"{t}: {n}" for t, n in present.items())
                raise UsageError(
                    f"the store at {target.location} already holds ania-nb rows ({shown}); "
                    "nothing was copied. Use --force to replace them with the source's"
                )
            for table in present:
                await conn.execute(f"DELETE FROM {table}")
            copied = {t: await _copy_table(source, conn, t) for t in TABLES}
            for table, rows in copied.items():
                found = await _count(conn, table)
                if found != rows:  # a bug or a concurrent writer: roll everything back
                    raise StoreError(
                        f"copying {table} into {target.location}: {rows} rows copied but "
                        f"{found} found; nothing was copied"
                    )
            return copied

    return await target.run(copy)


async def _count(conn: Conn, table: str) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))


async def _copy_table(source: Database, conn: Conn, table: str) -> int:
    """Copy one table batch by batch; move its identity sequence; the number of rows."""
    columns = await _columns(conn, table)
    source_columns = await source.run(_source_columns, table)
    missing = [c for c in columns if c not in source_columns]
    if missing:
        raise StoreError(
            f"the source store's {table} has no column {missing[0]!r}; its schema is not "
            "this ania-nb's"
        )
    names = ", ".join(columns)
    order = ", ".join(await source.run(_primary_key, table))
    insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
    copied = 0
    while True:
        rows = await source.run(_read_batch, table, names, order, copied)
        if not rows:
            break
        await conn.executemany(insert, rows)
        copied += len(rows)
    if "id" in columns and await _is_identity(conn, table):
        floor = await source.run(_sequence_floor, table)
        await conn.execute(
            "SELECT setval(pg_get_serial_sequence(?, 'id'), "
            f"{conn.dialect.greatest}(coalesce((SELECT max(id) FROM {table}), 0), ?, 1), "
            f"(SELECT count(*) FROM {table}) > 0 OR ? > 0)",
            (table, floor, floor),
        )
    return copied


async def _columns(conn: Conn, table: str) -> list[str]:
    """The target table's columns in their order."""
    rows = await conn.fetchall(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
        (table,),
    )
    return [name for (name,) in rows]


async def _is_identity(conn: Conn, table: str) -> bool:
    found = await conn.fetchval(
        "SELECT is_identity FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ? AND column_name = 'id'",
        (table,),
    )
    return found == "YES"


async def _source_columns(conn: Conn, table: str) -> set[str]:
    return {row[1] for row in await conn.fetchall(f"PRAGMA table_info({table})")}


async def _primary_key(conn: Conn, table: str) -> list[str]:
    """The source table's primary-key columns (its paging order)."""
    rows = await conn.fetchall(f"PRAGMA table_info({table})")
    key = sorted((row[5], row[1]) for row in rows if row[5])
    return [name for _, name in key] or ["rowid"]


async def _read_batch(
    conn: Conn, table: str, names: str, order: str, offset: int
) -> list[tuple[Any, ...]]:
    return await conn.fetchall(
        f"SELECT {names} FROM {table} ORDER BY {order} LIMIT ? OFFSET ?", (BATCH_ROWS, offset)
    )


async def _sequence_floor(conn: Conn, table: str) -> int:
    """The largest id SQLite ever gave in ``table`` (AUTOINCREMENT never reuses one)."""
    value = await conn.fetchval("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,))
    return int(value or 0)
