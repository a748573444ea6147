"""Session-level advisory locks on a dedicated PostgreSQL connection (leaders, replica identity).

A lock that must outlive any transaction — "this process is the clock's leader", "this replica
is alive" — is a *session* advisory lock (``pg_try_advisory_lock``) held on a connection of its
own: never one of the pool's, which are lent to any operation and may be recycled. The server
drops the lock when the session ends, so:

- a killed process (kill -9) loses its locks as soon as the kernel closes its socket (~0.1 s on
  one host);
- a vanished host is noticed by TCP keepalives (`KEEPALIVE_*`: ~11 s) — or sooner by the idle
  timeout below;
- a *frozen* process (SIGSTOP, a stalled event loop) keeps its socket open, so the session is
  given ``idle_session_timeout``: the server ends a session that sent nothing for that long. The
  holder must `ping` more often than that (its heartbeat); a frozen one stops pinging and loses
  its locks ``idle_timeout`` seconds after its last ping. When it wakes, its next statement
  fails and `ping` returns False: it must stop acting as the holder at once (the caller's job,
  and whatever it did in between must be fenced by the data, e.g. a unique key).

``idle_session_timeout`` needs PostgreSQL 14; an older server refuses it and the connection is
opened without it (logged once): frozen holders are then replaced only by TCP keepalives.
psycopg is imported lazily, inside this package only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from ania_nb.addresses import mask_url
from ania_nb.errors import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["DEFAULT_IDLE_TIMEOUT", "AdvisoryLocks", "advisory_key"]

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 4.0  # seconds without a statement before the server ends the session
CONNECT_TIMEOUT_S = 10
# TCP keepalives: first probe after 5 s of silence, then every 2 s, dead after 3 unanswered.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 5, 2, 3
APPLICATION_NAME_MAX = 63  # PostgreSQL truncates longer names (NAMEDATALEN - 1)


def advisory_key(name: str) -> int:
    """The advisory-lock key of ``name``: a signed 64-bit integer, the same in every process."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=b"ania-nb").digest()
    return int.from_bytes(digest, "big", signed=True)


class AdvisoryLocks:
    """One dedicated autocommit connection and the session advisory locks it holds.

    Nothing is connected until the first `try_lock`; a lost connection (server restart, idle
    timeout, network) drops every lock, and the next `try_lock` connects again.
    """

    def __init__(
        self,
        url: str,
        *,
        application_name: str = "ania-nb",
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        """Hold locks on the database ``url``, in a session ended after ``idle_timeout`` idle s.

        ``idle_timeout`` 0: the session is never ended for being idle.
        """
        self._url = url
        self.application_name = application_name[:APPLICATION_NAME_MAX]
        self.idle_timeout = idle_timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._held: set[str] = set()

    @property
    def location(self) -> str:
        """The server and database, without the password."""
        return mask_url(self._url)

    def holds(self, name: str) -> bool:
        """Whether this connection held ``name`` at its last statement (see `ping`)."""
        return name in self._held

    async def try_lock(self, name: str) -> bool:
        """Take the lock ``name`` if no other session holds it (never waits); True when held.

        Raises `StoreError` when the server cannot be reached (no lock is held then).
        """
        if name in self._held:
            return True
        conn = await self._connection()
        taken = await self._query(
            conn, "SELECT pg_try_advisory_lock(%s)", (advisory_key(name),), repr(name)
        )
        if taken:
            self._held.add(name)
        return bool(taken)

    async def unlock(self, name: str) -> None:
        """Give ``name`` up (another session may take it at once); a lock not held is a no-op."""
        if name not in self._held:
            return
        self._held.discard(name)
        if self._conn is not None:
            with contextlib.suppress(StoreError):  # a lost connection took the lock with it
                await self._query(
                    self._conn, "SELECT pg_advisory_unlock(%s)", (advisory_key(name),), "unlock"
                )

    async def ping(self) -> bool:
        """The heartbeat: one statement, so the session is not idle; False when it was lost.

        False means every lock this object held is gone (`holds` says False from now on).
        """
        if self._conn is None:
            return False
        try:
            await self._query(self._conn, "SELECT 1", (), "ping")
        except StoreError:
            return False
        return True

    async def holders(self, name: str) -> list[str]:
        """The application names of the sessions holding ``name`` (empty when it is free)."""
        key = advisory_key(name)
        conn = await self._connection()
        rows = await self._query(
            conn,
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.classid = %s AND l.objid = %s",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            "list holders",
            all_rows=True,
        )
        return [str(row[0]) for row in rows]

    async def close(self) -> None:
        """Close the connection (its locks are released by the server); again is a no-op."""
        conn, self._conn = self._conn, None
        self._held.clear()
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # closing a broken connection: nothing left to release
                log.debug("closing the advisory-lock connection failed", exc_info=True)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        import psycopg

        self._held.clear()
        options: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "application_name": self.application_name,
            "keepalives": 1,
            "keepalives_idle": KEEPALIVE_IDLE_S,
            "keepalives_interval": KEEPALIVE_INTERVAL_S,
            "keepalives_count": KEEPALIVE_COUNT,
        }
        if self.idle_timeout > 0:
            options["options"] = f"-c idle_session_timeout={int(self.idle_timeout * 1000)}"
        try:
            try:
                self._conn = await psycopg.AsyncConnection.connect(self._url, **options)
            except psycopg.OperationalError as exc:
                if "idle_session_timeout" not in str(exc):
                    raise
                log.warning(  # before PostgreSQL 14: no such setting
                    "the server at %s has no idle_session_timeout (PostgreSQL < 14): a frozen "
                    "lock holder is replaced only when TCP keepalives give up",
                    self.location,
                )
                options.pop("options")
                self._conn = await psycopg.AsyncConnection.connect(self._url, **options)
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot open the advisory-lock connection to {self.location}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
            ) from exc
        return self._conn

    async def _query(
        self,
        conn: psycopg.AsyncConnection[Any],
        sql: str,
        params: tuple[Any, ...],
        what: str,
        *,
        all_rows: bool = False,
    ) -> Any:
        """Run one statement; a failure closes the connection (its locks are gone)."""
        import psycopg

        try:
            cur = await conn.execute(sql, params)
            if all_rows:
                return await cur.fetchall()
            row = await cur.fetchone()
            return None if row is None else row[0]
        except psycopg.Error as exc:
            await self.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"advisory lock {what} on {self.location} failed: {first}") from exc
