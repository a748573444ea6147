"""The store's backend seam: one `Database` API, SQLite (embedded) or PostgreSQL underneath.

Every store operation is written once, as ``async def op(conn: Conn, *args)``, in plain SQL with
``?`` (or ``:name``) placeholders, and run with ``await db.run(op, *args)``:

- on SQLite (`ania_nb.store.sqlite`) the whole operation runs on the store's private thread, so
  SQLite never blocks the event loop and operations are serialised without locks. ``Conn``'s
  awaitables never suspend there, so the coroutine runs to its end in one step on that thread;
- on PostgreSQL (`ania_nb.store.postgres`) the operation runs on the event loop with a pooled
  psycopg connection (natively async, no thread hop).

Where the two SQL dialects differ in an *expression*, an operation asks ``conn.dialect`` (the
small table in `Dialect`); where the *transactional* logic differs (who may write at once), it
uses ``conn.lock(key)`` inside ``async with transaction(conn)``: a no-op on SQLite, whose write
transactions are already exclusive, a transaction-scoped advisory lock on PostgreSQL.

Code that keeps its own tables in the store (the clock, saved teams) writes them the same way,
with `transaction`, `clean_text` and `to_json`. `open_database` picks the backend from
``store.url``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from .owner import Owner

__all__ = [
    "DB_FILENAME",
    "Conn",
    "Database",
    "Dialect",
    "Params",
    "clean_text",
    "open_database",
    "to_json",
    "transaction",
]

P = ParamSpec("P")
T = TypeVar("T")

DB_FILENAME = "ania.db"

Params = Sequence[Any] | dict[str, Any]


@dataclass(frozen=True)
class Dialect:
    """The SQL expressions that differ between the backends (everything else is shared)."""

    name: str
    greatest: str  # the two-argument maximum: SQLite's scalar max(), PostgreSQL's GREATEST()
    limit_all: str  # "no limit" before an OFFSET
    begin: str  # opens a write transaction
    for_update: str  # row-lock suffix of a SELECT inside a write transaction

    def json_length(self, column: str) -> str:
        """The number of elements of the JSON array text in ``column``."""
        return (
            f"json_array_length({column})"
            if self.name == "sqlite"
            else f"json_array_length({column}::json)"
        )

    def json_append(self, column: str) -> str:
        """The JSON array text in ``column`` with one element (a ``?`` JSON parameter) added."""
        if self.name == "sqlite":
            return f"json_insert({column}, '$[#]', json(?))"
        return f"({column}::jsonb || jsonb_build_array(?::jsonb))::text"

    def is_json_integer(self, column: str) -> str:
        """A condition: ``column`` holds the JSON text of an integer (never raises on bad JSON)."""
        if self.name == "sqlite":
            # CASE guarantees json_type never sees malformed JSON (AND may not short-circuit).
            return f"CASE WHEN json_valid({column}) THEN json_type({column}) END = 'integer'"
        return f"{column} ~ '^-?(0|[1-9][0-9]*)$'"


SQLITE = Dialect(
    name="sqlite", greatest="max", limit_all="LIMIT -1", begin="BEGIN IMMEDIATE", for_update=""
)
POSTGRES = Dialect(
    name="postgres",
    greatest="GREATEST",
    limit_all="LIMIT ALL",
    begin="BEGIN",
    for_update=" FOR UPDATE",
)


class Conn(Protocol):
    """One connection as a store operation sees it (see the module docstring)."""

    dialect: Dialect
    errors: tuple[type[Exception], ...]  # the driver's errors (to undo a savepoint on failure)

    @property
    def owner(self) -> Owner:
        """Whose rows this operation writes (`ania_nb.store.owner`)."""
        ...

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; return the number of rows it changed."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement once per parameter row."""
        ...

    async def defer(self, sql: str, params: Params = ()) -> None:
        """Run a statement whose result nobody reads; it may be sent with the next statement.

        For writes whose failure fails the whole operation anyway: the error may surface at a
        later statement of the operation (at the latest when it ends), not at this call.
        """
        ...

    async def fetchone(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        """Run one statement; return its first row, or None."""
        ...

    async def fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Run one statement; return all its rows."""
        ...

    async def fetchval(self, sql: str, params: Params = ()) -> Any:
        """Run one statement; return the first column of its first row (None without rows)."""
        ...

    async def lock(self, key: str) -> None:
        """Inside a write transaction: wait until no other writer holds ``key`` (until commit)."""
        ...


class Database(Protocol):
    """An open store database; every operation runs through :meth:`run`."""

    dialect: Dialect

    @property
    def owner(self) -> Owner:
        """The process (or replica) whose rows its operations write."""
        ...

    @property
    def location(self) -> str:
        """Where the data lives, for messages (a file path, or the URL without its password)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        ...

    async def run(
        self,
        fn: Callable[Concatenate[Conn, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run the operation ``fn(conn, *args, **kwargs)`` and return its result."""
        ...

    async def close(self) -> None:
        """Close the connection(s); calling again is a no-op."""
        ...


async def open_database(data_dir: str | PathLike[str], url: str = "") -> Database:
    """Open the store: PostgreSQL when ``url`` is given, else SQLite in ``data_dir``.

    The schema is created or brought up to date (`ania_nb.store.schema`).
    """
    if url:
        from .postgres import PostgresDatabase

        return await PostgresDatabase.open(url)
    from .sqlite import SqliteDatabase

    return await SqliteDatabase.open(Path(data_dir) / DB_FILENAME)


@asynccontextmanager
async def transaction(conn: Conn) -> AsyncIterator[Conn]:
    """Run the block in one write transaction: commit on success, roll back on any error."""
    # SQLite: IMMEDIATE takes the write lock up front, so another process cannot make us fail
    # halfway. PostgreSQL: READ COMMITTED; writers that must not interleave take conn.lock().
    # Deferred: on PostgreSQL the BEGIN travels with the block's first statement.
    await conn.defer(conn.dialect.begin)
    try:
        yield conn
    except BaseException:
        await _roll_back(conn)
        raise
    try:
        await conn.execute("COMMIT")
    except Exception:
        # E.g. a deferred statement sent with the COMMIT failed: nothing of the block stays.
        await _roll_back(conn)
        raise


async def _roll_back(conn: Conn) -> None:
    """Roll back after a failure; one the driver already rolled back is not hidden by this.

    SQLite ends the transaction itself on some errors (SQLITE_FULL, an I/O error): its
    "cannot rollback - no transaction is active" would replace the error that says why.
    """
    with suppress(*conn.errors):
        await conn.execute("ROLLBACK")


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with what no backend stores as text (NUL, lone surrogates) replaced by U+FFFD.

    PostgreSQL refuses NUL in text and UTF-8 cannot hold a lone surrogate; the rule is the same
    on both backends, so both store the same text.
    """
    return _UNSTORABLE.sub("\ufffd", text)


def to_json(value: Any) -> str:
    """JSON text any backend stores: non-ASCII kept as is, NUL cleaned, lone surrogates escaped.

    Raises ``TypeError``/``ValueError`` like ``json.dumps`` (non-serialisable value, NaN).
    """
    raw = json.dumps(value, ensure_ascii=False, allow_nan=False)
    if "\\u0000" in raw:
        # PostgreSQL cannot hold NUL even escaped in JSON: clean every string (keys too), as text.
        raw = json.dumps(_without_nul(value), ensure_ascii=False, allow_nan=False)
    if _SURROGATE.search(raw):
        # Escaped, the surrogate survives the round trip: json.loads gives back the same str.
        raw = json.dumps(_without_nul(value), ensure_ascii=True, allow_nan=False)
    return raw


def _without_nul(value: Any) -> Any:
    """``value`` with every NUL in its strings (keys included) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value
