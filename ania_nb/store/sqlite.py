"""The embedded backend: one SQLite file (WAL), one connection on one dedicated thread.

Every operation runs whole on the ``ania-store`` thread (`SqliteDatabase.run`), so SQLite never
blocks the event loop and operations are serialised without locks. The operations are
coroutines (see `ania_nb.store.db`) whose awaits on `SqliteConn` never suspend, so the thread
drives each one to its end in a single step.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from os import PathLike
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from ania_nb._storage_cause import storage_cause, storage_text
from ania_nb.errors import StoreError

from .db import SQLITE, Params, transaction
from .owner import Owner, current_owner
from .schema import MIGRATIONS, OWN_TABLES, statement_for

__all__ = ["BUSY_TIMEOUT_S", "SqliteConn", "SqliteDatabase"]

P = ParamSpec("P")
T = TypeVar("T")

# Several processes may open one directory at once; a writer waits this long for the lock.
BUSY_TIMEOUT_S = 30.0
_NOT_A_DATABASE = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB: the file is not ours


class SqliteConn:
    """`ania_nb.store.db.Conn` over a `sqlite3.Connection` (its awaits never suspend)."""

    dialect = SQLITE
    # OverflowError: an int wider than 64 bits, refused by the driver before the statement.
    errors: tuple[type[Exception], ...] = (sqlite3.Error, OverflowError)

    def __init__(self, raw: sqlite3.Connection) -> None:
        """Wrap the store thread's connection."""
        self.raw = raw

    @property
    def owner(self) -> Owner:
        """The process: one SQLite file is served by the processes of one host."""
        return current_owner()

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; return the number of rows it changed."""
        return self.raw.execute(sql, _storable(params)).rowcount

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement once per parameter row."""
        self.raw.executemany(sql, (_storable(row) for row in rows))

    async def defer(self, sql: str, params: Params = ()) -> None:
        """Run a statement whose result nobody reads (at once: there is no round trip to save)."""
        self.raw.execute(sql, _storable(params))

    async def fetchone(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        """Run one statement; return its first row, or None."""
        row: tuple[Any, ...] | None = self.raw.execute(sql, _storable(params)).fetchone()
        return row

    async def fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Run one statement; return all its rows."""
        return self.raw.execute(sql, _storable(params)).fetchall()

    async def fetchval(self, sql: str, params: Params = ()) -> Any:
        """Run one statement; return the first column of its first row (None without rows)."""
        row = self.raw.execute(sql, _storable(params)).fetchone()
        return None if row is None else row[0]

    async def lock(self, key: str) -> None:
        """Nothing to do: a SQLite write transaction (BEGIN IMMEDIATE) already excludes writers."""


def _storable(params: Params) -> Params:
    """``params`` with NUL in text replaced by U+FFFD (the rule PostgreSQL forces on us)."""
    if isinstance(params, dict):
        if any(isinstance(v, str) and "\x00" in v for v in params.values()):
            return {k: _no_nul(v) for k, v in params.items()}
        return params
    if any(isinstance(v, str) and "\x00" in v for v in params):
        return tuple(_no_nul(v) for v in params)
    return params


def _no_nul(value: Any) -> Any:
    """A text parameter without NUL."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


class SqliteDatabase:
    """An open ania-nb SQLite file whose every operation runs on a private store thread."""

    dialect = SQLITE

    def __init__(self, path: Path, executor: ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
        """Wrap an already-open connection; use :meth:`open` instead."""
        self._path = path
        self._executor = executor
        self._conn = SqliteConn(conn)
        self._closed = False
        self._close_future: asyncio.Future[None] | None = None

    @property
    def owner(self) -> Owner:
        """The process: one SQLite file is served by the processes of one host."""
        return current_owner()

    @property
    def path(self) -> Path:
        """Where the database file lives."""
        return self._path

    @property
    def location(self) -> str:
        """The database file, for messages."""
        return str(self._path)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @classmethod
    async def open(cls, path: str | PathLike[str]) -> SqliteDatabase:
        """Open (creating if needed) the database at ``path`` and bring its schema up to date."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ania-store")
        loop = asyncio.get_running_loop()
        try:
            db_path, conn = await loop.run_in_executor(executor, _connect, Path(path))
        except BaseException:
            await asyncio.to_thread(executor.shutdown, wait=True)
            raise
        return cls(db_path, executor, conn)

    async def run(
        self,
        fn: Callable[Concatenate[SqliteConn, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run the operation ``fn(conn, *args, **kwargs)`` on the store thread."""
        if self._closed:
            raise StoreError(
                f"the store at {self._path} is closed; open it again before using it "
                f"(operation {_op_name(fn)!r})"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn, args, kwargs)

    def run_sqlite(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``fn(raw_connection)`` on the store thread (SQLite-only code: tests, tools)."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, self._conn.raw)

    def _call(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any) -> T:
        """Store-thread side of :meth:`run`: drive the operation, explain SQLite failures."""
        try:
            return _drive(fn(self._conn, *args, **kwargs), fn)
        except sqlite3.Error as exc:
            raise _failure(
                exc, self._path, f"store operation {_op_name(fn)!r} failed on {self._path}"
            ) from exc

    async def close(self) -> None:
        """Close the connection on its thread and stop the thread; calling again is a no-op."""
        if self._close_future is None:
            self._closed = True
            self._close_future = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._close_future)

    async def _shutdown(self) -> None:
        """Close the connection after already-queued operations, then release the thread."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._conn.raw.close)
        except sqlite3.Error as exc:
            raise _failure(exc, self._path, f"closing the store at {self._path} failed") from exc
        finally:
            await asyncio.to_thread(self._executor.shutdown, wait=True)

    def __repr__(self) -> str:
        """Show the file and whether it is open."""
        state = "closed" if self._closed else "open"
        return f"<SqliteDatabase {str(self._path)!r} {state}>"


def _drive(step: Awaitable[T], fn: Callable[..., Any]) -> T:
    """Run a store operation whose awaits never suspend to its end, on this thread."""
    coro: Coroutine[Any, Any, T] = step  # type: ignore[assignment]
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise StoreError(
        f"store operation {_op_name(fn)!r} awaited something other than its connection; "
        "store operations may only await the Conn they are given"
    )


def _op_name(fn: Callable[..., Any]) -> str:
    """Name a store operation readably for error messages."""
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _connect(path: Path) -> tuple[Path, sqlite3.Connection]:
    """Store-thread side of :meth:`SqliteDatabase.open`: connect, configure, migrate."""
    try:
        path = path.expanduser().absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = f"cannot create the directory for the store at {path}"
        raise _failure(exc, path, what) from exc
    try:
        # Autocommit mode: transactions are explicit (see ``transaction``), never implicit.
        # ``timeout`` installs the busy handler before the first statement: another process
        # may be creating or migrating the same file right now.
        conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise _failure(exc, path, f"cannot open the store at {path}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        _check_is_database(conn, path)
        _set_wal(conn, path)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        _migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return path, conn


def _set_wal(conn: sqlite3.Connection, path: Path) -> None:
    """Switch to WAL; a fresh file opened by many processes at once may need a few tries."""
    # Changing the journal mode needs an exclusive lock and does not always wait on the busy
    # handler, so a concurrent opener can get "database is locked" here: wait and retry.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                what = f"cannot switch the store at {path} to WAL mode"
                raise _failure(exc, path, what) from exc
            time.sleep(0.01)
            continue
        if str(mode).lower() != "wal":
            raise StoreError(
                f"the store at {path} cannot use WAL mode (journal mode is {mode!r}); is it on "
                "a network file system? Put the data directory on a local disk"
            )
        return


def _check_is_database(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse, without writing anything, a file that is not an ania-nb database."""
    not_ours = (
        f"{path} is not an ania-nb database; it was left untouched. Move it away or point "
        "the data directory somewhere else."
    )
    try:
        # Reading the header is the first real I/O; a foreign or corrupt file fails here. Both
        # reads see one snapshot: another process may be migrating the file right now.
        conn.execute("BEGIN")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            tables = {row[0] for row in rows}
        finally:
            if conn.in_transaction:  # a failed read ended it: COMMIT would hide the failure
                conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None or code & 0xFF in _NOT_A_DATABASE:
            raise StoreError(f"{not_ours} (SQLite says: {exc})") from exc
        # Anything else (a full disk refusing the WAL index, an I/O error) says nothing about
        # the file's content: it must not be called foreign.
        raise _failure(exc, path, f"cannot read the store at {path}") from exc
    if version == 0 and {t for t in tables if not t.startswith("sqlite_")} - OWN_TABLES:
        raise StoreError(f"{not_ours} (it is an SQLite file holding other tables)")
    if version > len(MIGRATIONS):
        raise StoreError(_too_new(path, version))


def _too_new(path: Path, version: int) -> str:
    """The message for a store written by a newer ania-nb."""
    return (
        f"the store at {path} has schema version {version}, newer than this ania-nb "
        f"understands ({len(MIGRATIONS)}); upgrade ania-nb"
    )


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply every migration step past ``PRAGMA user_version`` in one write transaction.

    The version is read again after taking the write lock: another process opening the same
    directory may have migrated it while this one waited.
    """
    if conn.execute("PRAGMA user_version").fetchone()[0] >= len(MIGRATIONS):
        return  # up to date: no write lock, so parallel opens of a migrated file never queue
    number = 0

    async def migrate(c: SqliteConn) -> None:
        nonlocal number
        async with transaction(c):
            version = c.raw.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise StoreError(_too_new(path, version))
            for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in step:
                    c.raw.execute(statement_for(statement, SQLITE))
                c.raw.execute(f"PRAGMA user_version = {number}")

    try:
        _drive(migrate(SqliteConn(conn)), migrate)
    except sqlite3.Error as exc:
        what = f"migrating the store at {path} to schema version {number or '?'} failed"
        raise _failure(exc, path, what) from exc


def _failure(exc: BaseException, path: Path, what: str) -> StoreError:
    """The `StoreError` of a failed SQLite call: its storage cause first when it has one."""
    cause = storage_cause(exc, path)
    if cause is None:
        return StoreError(f"{what}: {exc}")
    return StoreError(storage_text(cause, what, str(exc)), cause=cause)
