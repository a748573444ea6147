"""The server backend: PostgreSQL through psycopg 3 (async) and a psycopg-pool connection pool.

Operations run on the event loop with a pooled connection in autocommit mode: a statement outside
``transaction()`` commits on its own, as on SQLite. Placeholders are written SQLite's way (``?``
and ``:name``) and rewritten once per statement text (``%s``, ``%(name)s``). Many processes may
share one database: migrations take an advisory lock, and operations whose writers must not
interleave take ``conn.lock(key)`` (a transaction-scoped advisory lock).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ania_nb._storage_cause import storage_cause, storage_text
from ania_nb.addresses import mask_url
from ania_nb.errors import StoreError

from .db import POSTGRES, Params, transaction
from .locks import DEFAULT_IDLE_TIMEOUT, AdvisoryLocks
from .owner import Owner, current_owner
from .schema import MIGRATIONS, OWN_TABLES, statement_for

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

__all__ = ["PostgresConn", "PostgresDatabase"]

P = ParamSpec("P")
T = TypeVar("T")

POOL_MAX = 10  # connections per process; each run holds one only for one operation
CONNECT_TIMEOUT_S = 10
IDLE_IN_TRANSACTION_MS = 4000  # no operation waits on its client for this long mid-transaction
_MIGRATION_LOCK = 0x616E6961  # "ania": every ania-nb process migrating this database waits on it


class PostgresConn:
    """`ania_nb.store.db.Conn` over a psycopg `AsyncConnection`."""

    dialect = POSTGRES

    def __init__(self, raw: psycopg.AsyncConnection[Any], owner: Owner | None = None) -> None:
        """Wrap a pooled connection for one operation that writes rows of ``owner``."""
        import psycopg

        self.raw = raw
        self.owner = owner or current_owner()
        self.errors: tuple[type[Exception], ...] = (psycopg.Error,)
        # Deferred statements, bound on this side, sent before the next statement in the
        # same round trip (one simple query): a round trip costs far more than the binding.
        self._deferred: list[str] = []
        self._binder: psycopg.AsyncClientCursor[Any] | None = None

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; return the number of rows it changed."""
        if sql == "ROLLBACK":
            self._deferred.clear()  # never sent: nothing of it to undo
            if self.raw.info.transaction_status == _IDLE:
                return 0  # the BEGIN was still waiting here: no transaction to end
        cur = await self._send(sql, params)
        return cur.rowcount

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement once per parameter row (several rows pipelined by psycopg)."""
        batch = [_storable(row) for row in rows]
        if len(batch) <= 1:
            # psycopg pipelines every executemany; entering and leaving pipeline mode costs
            # more than the one round trip a single row needs (most history writes are one).
            if batch:
                await self._send(sql, batch[0])
            return
        await self.flush()
        async with self.raw.cursor() as cur:
            await cur.executemany(_pg_sql(sql), batch)

    async def defer(self, sql: str, params: Params = ()) -> None:
        """Queue a statement nobody reads the result of; it goes with the next statement."""
        self._deferred.append(self._bind(sql, params))

    async def flush(self) -> None:
        """Send the deferred statements now (if any)."""
        if self._deferred:
            batch = "; ".join(self._deferred)
            self._deferred.clear()
            await self.raw.cursor().execute(batch.encode(), prepare=False)

    async def fetchone(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        """Run one statement; return its first row, or None."""
        cur = await self._send(sql, params)
        return await cur.fetchone()

    async def fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Run one statement; return all its rows."""
        cur = await self._send(sql, params)
        return await cur.fetchall()

    async def fetchval(self, sql: str, params: Params = ()) -> Any:
        """Run one statement; return the first column of its first row (None without rows)."""
        cur = await self._send(sql, params)
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def lock(self, key: str) -> None:
        """Wait for the transaction-scoped advisory lock on ``key`` (released at commit)."""
        await self._send("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))

    async def _send(self, sql: str, params: Params) -> psycopg.AsyncCursor[Any]:
        """Run ``sql`` after the deferred statements, in one round trip; its cursor."""
        if not self._deferred:
            return await self.raw.execute(_pg_sql(sql), _storable(params))
        # One simple query: the server runs the statements in order and stops at the first
        # error; the cursor is moved on to the last statement's result (``sql``'s).
        batch = "; ".join([*self._deferred, self._bind(sql, params)])
        self._deferred.clear()
        cur = self.raw.cursor()
        await cur.execute(batch.encode(), prepare=False)
        while cur.nextset():
            pass
        return cur

    def _bind(self, sql: str, params: Params) -> str:
        """``sql`` with ``params`` bound as literals (psycopg's client-side quoting)."""
        if self._binder is None:
            import psycopg

            self._binder = psycopg.AsyncClientCursor(self.raw)
        return self._binder.mogrify(_pg_sql(sql), _storable(params))


_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction open on the connection

_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|::|\?|(?<![\w:]):([A-Za-z_]\w*)|%")


@lru_cache(maxsize=2048)
def _pg_sql(sql: str) -> str:
    """``sql`` with SQLite placeholders (``?``, ``:name``) in psycopg's form; ``%`` escaped.

    Quoted literals and identifiers keep their ``?`` and ``:``; ``::`` casts stay casts.
    """

    def convert(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if match.group(1):
            return f"%({match.group(1)})s"
        return token.replace("%", "%%")  # a literal, an identifier or a cast

    return _PLACEHOLDER.sub(convert, sql)


def _storable(params: Params) -> Params:
    """``params`` as SQLite would store them: NUL in text as U+FFFD, booleans as 0/1.

    PostgreSQL refuses NUL in text and a boolean for an integer column (flags are integers,
    as on SQLite).
    """
    if isinstance(params, dict):
        if any(_needs_change(v) for v in params.values()):
            return {k: _changed(v) for k, v in params.items()}
        return params
    if any(_needs_change(v) for v in params):
        return tuple(_changed(v) for v in params)
    return params


def _needs_change(value: Any) -> bool:
    """Whether `_changed` would change ``value``."""
    return isinstance(value, bool) or (isinstance(value, str) and "\x00" in value)


def _changed(value: Any) -> Any:
    """A parameter PostgreSQL stores as SQLite does."""
    if isinstance(value, bool):
        return int(value)
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


class PostgresDatabase:
    """An open PostgreSQL store: a connection pool; operations run on the event loop."""

    dialect = POSTGRES

    def __init__(self, url: str, pool: psycopg_pool.AsyncConnectionPool[Any]) -> None:
        """Wrap an open pool; use :meth:`open` instead."""
        self._url = url
        self._pool = pool
        self._closed = False
        # The process, until it serves as a replica (`ania_nb.store.replicas`): then its rows
        # name the replica, alive while the replica's lock is held.
        self.owner = current_owner()

    @property
    def location(self) -> str:
        """The server and database, without the password."""
        return mask_url(self._url)

    @property
    def url(self) -> str:
        """The connection URL, password included (for the replica's own connections)."""
        return self._url

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @classmethod
    async def open(cls, url: str) -> PostgresDatabase:
        """Connect to ``url``, create or upgrade the schema, open the pool.

        Raises `StoreError` saying what went wrong (server unreachable, credentials refused,
        schema from a newer ania-nb, a database holding other tables) — never a bare traceback.
        """
        psycopg, psycopg_pool = _import_driver()
        where = mask_url(url)
        try:
            first = await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            )
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to the store at {where}: {_first_line(exc)}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the store at {where}: {_first_line(exc)}") from exc
        try:
            await _migrate(PostgresConn(first), where)
        except psycopg.Error as exc:
            raise StoreError(f"migrating the store at {where} failed: {_first_line(exc)}") from exc
        finally:
            await first.close()
        pool = psycopg_pool.AsyncConnectionPool(
            url,
            min_size=1,
            max_size=POOL_MAX,
            kwargs={
                "autocommit": True,
                "connect_timeout": CONNECT_TIMEOUT_S,
                # A process frozen inside a transaction (SIGSTOP) would hold its row and
                # advisory locks for ever: the server ends such a transaction, so the others go
                # on (the clock's replacement of a frozen leader counts on it).
                "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
            },
            open=False,
            name="ania-store",
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            await pool.close()
            raise StoreError(f"cannot connect to the store at {where}: {_first_line(exc)}") from exc
        return cls(url, pool)

    async def run(
        self,
        fn: Callable[Concatenate[PostgresConn, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run the operation ``fn(conn, *args, **kwargs)`` with a pooled connection."""
        import psycopg

        if self._closed:
            raise StoreError(
                f"the store at {self.location} is closed; open it again before using it "
                f"(operation {_op_name(fn)!r})"
            )
        try:
            async with self._pool.connection() as raw:
                conn = PostgresConn(raw, self.owner)
                result = await fn(conn, *args, **kwargs)
                await conn.flush()  # what the operation deferred after its last statement
                return result
        except psycopg.Error as exc:
            what = f"store operation {_op_name(fn)!r} failed on {self.location}"
            cause = storage_cause(exc)  # the server's disk (SQLSTATE 53100 says it in words)
            if cause is not None:
                text = storage_text(cause, f"{what} (the database server's disk)", _first_line(exc))
                raise StoreError(text, cause=cause) from exc
            raise StoreError(f"{what}: {_first_line(exc)}") from exc

    def advisory_locks(
        self, *, application_name: str = "ania-nb", idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    ) -> AdvisoryLocks:
        """A dedicated connection to this database for session advisory locks (`store.locks`).

        Not from the pool; the caller closes it.
        """
        return AdvisoryLocks(
            self._url, application_name=application_name, idle_timeout=idle_timeout
        )

    async def close(self) -> None:
        """Close the pool (waits for operations holding a connection); again is a no-op."""
        if not self._closed:
            self._closed = True
            await self._pool.close()

    def __repr__(self) -> str:
        """Show the server and whether the store is open."""
        state = "closed" if self._closed else "open"
        return f"<PostgresDatabase {self.location!r} {state}>"


def _import_driver() -> tuple[Any, Any]:
    """The driver modules (psycopg, psycopg_pool), or a StoreError saying how to install them."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise StoreError(
            "store.url names a PostgreSQL server, but psycopg is not installed: "
            "pip install 'ania-nb[postgres]'"
        ) from exc
    return psycopg, psycopg_pool


def _first_line(exc: BaseException) -> str:
    """The first line of a driver error (psycopg adds context lines)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _op_name(fn: Callable[..., Any]) -> str:
    """Name a store operation readably for error messages."""
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


async def _migrate(conn: PostgresConn, where: str) -> None:
    """Apply every migration step past ``schema_version``, under the migration lock."""
    async with transaction(conn):
        await conn.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = await conn.fetchone("SELECT version FROM schema_version")
        version = 0 if row is None else int(row[0])
        if version > len(MIGRATIONS):
            raise StoreError(
                f"the store at {where} has schema version {version}, newer than this ania-nb "
                f"understands ({len(MIGRATIONS)}); upgrade ania-nb"
            )
        if version == 0:
            await _check_is_ours(conn, where)
        for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in step:
                await conn.execute(statement_for(statement, POSTGRES))
            if row is None and number == version + 1:
                await conn.execute("INSERT INTO schema_version (version) VALUES (?)", (number,))
            else:
                await conn.execute("UPDATE schema_version SET version = ?", (number,))


async def _check_is_ours(conn: PostgresConn, where: str) -> None:
    """Refuse, before creating anything, a schema that holds tables other than ania-nb's."""
    rows = await conn.fetchall(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
    )
    foreign = sorted({name for (name,) in rows} - OWN_TABLES - {"schema_version"})
    if foreign:
        shown = ", ".join(foreign[:5]) + (" …" if len(foreign) > 5 else "")
        raise StoreError(
            f"the store at {where} holds tables that are not ania-nb's ({shown}); it was left "
            "untouched. Give ania-nb a database (or schema) of its own"
        )
