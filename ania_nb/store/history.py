"""Chat history: each session's OpenAI-format messages, in order, appended per turn."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ania_nb.errors import UsageError

from .db import clean_text, to_json, transaction

if TYPE_CHECKING:
    from .db import Conn, Database

ROLES = frozenset({"system", "user", "assistant", "tool"})


class ChatHistory:
    """Per-session message lists; messages are plain dicts stored exactly as given."""

    def __init__(self, db: Database) -> None:
        """Use ``db`` for every read and write."""
        self._db = db

    async def load(self, session: str) -> list[dict[str, Any]]:
        """Return the session's messages in the order they were added."""
        rows = await self._db.run(load_rows, check_session(session))
        return [json.loads(raw) for raw in rows]

    async def append(self, session: str, messages: Sequence[dict[str, Any]]) -> None:
        """Add ``messages`` to the end of the session's history, all or none."""
        encoded = encode_messages(messages)
        await self._db.run(_insert, check_session(session), encoded, time.time(), replace=False)

    async def replace(self, session: str, messages: Sequence[dict[str, Any]]) -> None:
        """Swap the session's whole history for ``messages`` in one transaction."""
        encoded = encode_messages(messages)
        await self._db.run(_insert, check_session(session), encoded, time.time(), replace=True)

    async def clear(self, session: str) -> int:
        """Delete the session's history; return how many messages went."""
        return await self._db.run(_clear, check_session(session))

    async def sessions(self) -> list[str]:
        """Every session that has at least one message, sorted."""
        return await self._db.run(_sessions)

    async def count(self, session: str) -> int:
        """How many messages the session holds."""
        return await self._db.run(_count, check_session(session))


def encode_messages(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Validate messages and serialise each to JSON, before anything touches the database."""
    if isinstance(messages, dict | str | bytes) or not isinstance(messages, Sequence):
        raise UsageError(f"messages must be a list of message dicts, got {type(messages).__name__}")
    encoded: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise UsageError(
                f"message {index} must be a dict, got {type(message).__name__}; nothing was stored"
            )
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise UsageError(
                f"message {index} has role {role!r}; expected one of "
                f"{', '.join(sorted(ROLES))}; nothing was stored"
            )
        try:
            encoded.append(to_json(message))
        except (TypeError, ValueError) as exc:
            raise UsageError(
                f"message {index} ({role}) is not JSON-serialisable ({exc}); nothing was stored"
            ) from exc
    return encoded


def check_session(session: object) -> str:
    """Session ids are non-empty strings."""
    if not isinstance(session, str) or not session:
        raise UsageError(f"session must be a non-empty string, got {session!r}")
    if clean_text(session) != session:
        raise UsageError(
            f"session {session!r} holds a NUL or a lone surrogate, which no store can hold "
            "exactly; use a valid string without NUL as the session id"
        )
    return session


# Store operations: each receives the connection first (see ``Database.run``).


async def load_rows(conn: Conn, session: str) -> list[str]:
    """Raw JSON messages of one session, oldest first."""
    rows = await conn.fetchall(
        "SELECT message FROM chat_history WHERE session = ? ORDER BY id", (session,)
    )
    return [raw for (raw,) in rows]


async def _insert(
    conn: Conn, session: str, encoded: list[Any], now: float, *, replace: bool
) -> None:
    """Insert rows (after deleting the old ones when replacing) in a single transaction."""
    async with transaction(conn):
        await insert_rows(conn, session, encoded, now, replace=replace)


async def insert_rows(
    conn: Conn, session: str, encoded: list[Any], now: float, *, replace: bool
) -> None:
    """Insert rows (inside the caller's transaction; deferred: see `Conn.defer`)."""
    if replace:
        await conn.defer("DELETE FROM chat_history WHERE session = ?", (session,))
    for raw in encoded:
        await conn.defer(
            "INSERT INTO chat_history (session, message, created_at) VALUES (?, ?, ?)",
            (session, raw, now),
        )


async def _clear(conn: Conn, session: str) -> int:
    """Delete one session's rows."""
    return await conn.execute("DELETE FROM chat_history WHERE session = ?", (session,))


async def _sessions(conn: Conn) -> list[str]:
    """Distinct sessions, sorted."""
    rows = await conn.fetchall("SELECT DISTINCT session FROM chat_history ORDER BY session")
    return [session for (session,) in rows]


async def _count(conn: Conn, session: str) -> int:
    """Row count of one session."""
    row = await conn.fetchone("SELECT count(*) FROM chat_history WHERE session = ?", (session,))
    return int(row[0]) if row else 0
