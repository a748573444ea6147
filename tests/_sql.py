"""One SQL statement against a store's database, on either backend (tests' set-up and checks)."""

from __future__ import annotations

from typing import Any

from ania_nb.store.db import Conn, Database, Params


async def fetch(db: Database, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
    """All rows of ``sql``."""

    async def op(conn: Conn) -> list[tuple[Any, ...]]:
        return await conn.fetchall(sql, params)

    op.__qualname__ = f"fetch({sql})"
    return await db.run(op)


async def scalar(db: Database, sql: str, params: Params = ()) -> Any:
    """The first column of the first row of ``sql`` (None without rows)."""
    rows = await fetch(db, sql, params)
    return rows[0][0] if rows else None


async def execute(db: Database, sql: str, params: Params = ()) -> int:
    """Run ``sql``; the number of rows it changed."""

    async def op(conn: Conn) -> int:
        return await conn.execute(sql, params)

    op.__qualname__ = f"execute({sql})"
    return await db.run(op)
