"""Key-value namespaces: JSON values under string keys, one table shared by all namespaces."""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

from ania_nb.errors import UsageError

from .db import to_json

if TYPE_CHECKING:
    from .db import Conn, Database

_NAMESPACE_RE = re.compile(r"[a-z][a-z0-9_.-]{0,63}")

REVISIONS_NAMESPACE = "revisions"
"""The namespace of change counters other processes poll (``mcp``, ``skills``: replicas reload)."""


class KVNamespace:
    """One namespace of the ``kv`` table; values are anything ``json.dumps`` accepts."""

    def __init__(self, db: Database, namespace: str) -> None:
        """Bind to ``namespace`` (lower-case letters, digits, ``_.-``; at most 64 characters)."""
        if not isinstance(namespace, str) or not _NAMESPACE_RE.fullmatch(namespace):
            raise UsageError(
                f"invalid KV namespace {namespace!r}: use 1-64 characters, a lower-case letter "
                "first, then lower-case letters, digits, '_', '.' or '-'"
            )
        self._db = db
        self.namespace = namespace

    async def get(self, key: str, default: Any = None) -> Any:
        """Return the value stored under ``key``, or ``default`` when there is none."""
        raw = await self._db.run(_get, self.namespace, _check_key(key))
        return default if raw is None else json.loads(raw)

    async def set(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-serialisable; tuples come back as lists) under ``key``."""
        _check_key(key)
        # Serialise before touching the database so a bad value never replaces a good one.
        try:
            raw = to_json(value)
        except (TypeError, ValueError) as exc:
            raise UsageError(
                f"cannot store KV key {key!r} in namespace {self.namespace!r}: the value is not "
                f"JSON-serialisable ({exc})"
            ) from exc
        await self._db.run(_set, self.namespace, key, raw, time.time())

    async def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it existed."""
        return await self._db.run(_delete, self.namespace, _check_key(key))

    async def keys(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        return await self._db.run(_keys, self.namespace, _check_prefix(prefix))

    async def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """``(key, value)`` pairs whose key starts with ``prefix``, sorted by key."""
        rows = await self._db.run(_items, self.namespace, _check_prefix(prefix))
        return [(key, json.loads(raw)) for key, raw in rows]

    async def incr(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the integer under ``key`` (missing counts as 0)."""
        _check_key(key)
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise UsageError(f"KV incr amount must be an int, got {type(amount).__name__}")
        result = await self._db.run(_incr, self.namespace, key, amount, time.time())
        if result is None:
            current = await self.get(key)
            raise UsageError(
                f"cannot increment KV key {key!r} in namespace {self.namespace!r}: it holds "
                f"{type(current).__name__} {current!r}, not an integer"
            )
        return result

    async def delete_prefix(self, prefix: str) -> int:
        """Remove every key starting with ``prefix`` (``""``: all); return how many went."""
        return await self._db.run(_delete_prefix, self.namespace, _check_prefix(prefix))

    def __repr__(self) -> str:
        """Show the namespace and the database file."""
        return f"<KVNamespace {self.namespace!r} in {self._db.location!r}>"


def _check_key(key: object) -> str:
    """Keys are non-empty strings."""
    if not isinstance(key, str) or not key:
        raise UsageError(f"KV keys must be non-empty strings, got {key!r}")
    return key


def _check_prefix(prefix: object) -> str:
    """Prefixes are strings (possibly empty)."""
    if not isinstance(prefix, str):
        raise UsageError(f"KV prefix must be a string, got {type(prefix).__name__}")
    return prefix


# Store operations: each receives the connection first (see ``Database.run``).


async def _get(conn: Conn, ns: str, key: str) -> str | None:
    """Raw JSON under ``key`` or None."""
    row = await conn.fetchone("SELECT value FROM kv WHERE ns = ? AND key = ?", (ns, key))
    return None if row is None else row[0]


async def _set(conn: Conn, ns: str, key: str, raw: str, now: float) -> None:
    """Insert or overwrite one key."""
    await conn.execute(
        "INSERT INTO kv (ns, key, value, updated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value, "
        "updated_at = excluded.updated_at",
        (ns, key, raw, now),
    )


async def _delete(conn: Conn, ns: str, key: str) -> bool:
    """Delete one key; True if it existed."""
    return await conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (ns, key)) > 0


# substr() rather than LIKE: LIKE is case-insensitive and treats % and _ as wildcards.
_PREFIX_SQL = "ns = ? AND substr(key, 1, ?) = ?"


async def _keys(conn: Conn, ns: str, prefix: str) -> list[str]:
    """Sorted keys under ``prefix``."""
    rows = await conn.fetchall(
        f"SELECT key FROM kv WHERE {_PREFIX_SQL} ORDER BY key", (ns, len(prefix), prefix)
    )
    return [key for (key,) in rows]


async def _items(conn: Conn, ns: str, prefix: str) -> list[tuple[str, str]]:
    """Sorted ``(key, raw JSON)`` rows under ``prefix``."""
    rows = await conn.fetchall(
        f"SELECT key, value FROM kv WHERE {_PREFIX_SQL} ORDER BY key", (ns, len(prefix), prefix)
    )
    return [(key, raw) for key, raw in rows]


async def _incr(conn: Conn, ns: str, key: str, amount: int, now: float) -> int | None:
    """Add in one UPSERT statement (atomic on both backends); None when not an integer."""
    row = await conn.fetchone(
        "INSERT INTO kv (ns, key, value, updated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (ns, key) DO UPDATE SET "
        "value = CAST(CAST(kv.value AS BIGINT) + CAST(excluded.value AS BIGINT) AS TEXT), "
        "updated_at = excluded.updated_at "
        f"WHERE {conn.dialect.is_json_integer('kv.value')} "
        "RETURNING value",
        (ns, key, str(amount), now),
    )
    return None if row is None else int(row[0])


async def _delete_prefix(conn: Conn, ns: str, prefix: str) -> int:
    """Delete every key under ``prefix``; return how many went."""
    return await conn.execute(f"DELETE FROM kv WHERE {_PREFIX_SQL}", (ns, len(prefix), prefix))
