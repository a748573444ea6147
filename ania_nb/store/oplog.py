"""The op log: a small append-only audit trail of who changed what (skills, approvals, config)."""

from __future__ import annotations

import builtins
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ania_nb.errors import UsageError
from ania_nb.text import cut

from .db import clean_text, transaction
from .runlog import positive_int

if TYPE_CHECKING:
    from .db import Conn, Database

MAX_DETAIL_CHARS = 500
MAX_LABEL_CHARS = 64

_COLUMNS = "id, at, category, action, actor, session, detail"


@dataclass(frozen=True)
class OpRecord:
    """One audited operation as stored."""

    id: int
    at: float
    category: str
    action: str
    actor: str | None
    session: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for JSON and display."""
        return asdict(self)


class OpLog:
    """Append audit entries and list them newest first; keeps the newest ``max_entries`` rows."""

    def __init__(self, db: Database, max_entries: int = 500) -> None:
        """Log into ``db``, evicting the oldest rows beyond ``max_entries``."""
        self._db = db
        self.max_entries = positive_int("max_entries", max_entries)

    async def add(
        self,
        category: str,
        action: str,
        *,
        actor: str | None = None,
        session: str | None = None,
        detail: str = "",
    ) -> int:
        """Record one operation (``detail`` cut to 500 characters); return its id."""
        row = (
            _label("category", category),
            _label("action", action),
            _optional("actor", actor),
            _optional("session", session),
            cut(_text("detail", detail), MAX_DETAIL_CHARS),
        )
        return await self._db.run(_insert, row, time.time(), self.max_entries)

    async def list(
        self,
        *,
        category: str | None = None,
        action: str | None = None,
        session: str | None = None,
        limit: int = 50,
    ) -> builtins.list[OpRecord]:
        """Return entries newest first, optionally only one category, action or session."""
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        for column, value in (("category", category), ("action", action), ("session", session)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(_text(column, value))
        positive_int("limit", limit)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return await self._db.run(_select, where, tuple(params), limit)

    async def count(self) -> int:
        """How many entries are stored."""
        return await self._db.run(_count)


def _text(name: str, value: object) -> str:
    """Reject non-string fields with a message naming the field."""
    if not isinstance(value, str):
        raise UsageError(f"op log {name} must be a string, got {type(value).__name__}")
    return clean_text(value)


def _label(name: str, value: object) -> str:
    """Category and action are short non-empty labels used for filtering."""
    text = _text(name, value)
    if not text or len(text) > MAX_LABEL_CHARS:
        raise UsageError(f"op log {name} must be 1-{MAX_LABEL_CHARS} characters, got {text!r:.80}")
    return text


def _optional(name: str, value: object) -> str | None:
    return None if value is None else _text(name, value)


# Store operations: each receives the connection first (see ``Database.run``).


async def _insert(conn: Conn, row: tuple[Any, ...], now: float, max_entries: int) -> int:
    """Insert one entry and evict the oldest beyond ``max_entries``, atomically."""
    async with transaction(conn):
        inserted = await conn.fetchone(
            "INSERT INTO oplog (at, category, action, actor, session, detail) "
            "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
            (now, *row),
        )
        # One eviction at a time: two processes evicting at once on PostgreSQL would each
        # count the other's row as kept.
        await conn.lock("oplog")
        await conn.execute(
            "DELETE FROM oplog WHERE id IN "
            f"(SELECT id FROM oplog ORDER BY id DESC {conn.dialect.limit_all} OFFSET ?)",
            (max_entries,),
        )
    assert inserted is not None  # an INSERT … RETURNING always returns its row
    return int(inserted[0])


async def _select(
    conn: Conn, where: str, params: tuple[Any, ...], limit: int
) -> builtins.list[OpRecord]:
    """Rows matching ``where`` (built from fixed clauses only), newest first."""
    rows = await conn.fetchall(
        f"SELECT {_COLUMNS} FROM oplog {where} ORDER BY id DESC LIMIT ?", (*params, limit)
    )
    return [OpRecord(*row) for row in rows]


async def _count(conn: Conn) -> int:
    """Total rows."""
    return int(await conn.fetchval("SELECT count(*) FROM oplog"))
