"""Replicas: several processes answering one bot from one PostgreSQL store.

Every replica receives every chat event (OneBot implementations push each event to every
connection) and writes it to the shared inbox, whose unique key lets exactly one insert win.
What makes the rest safe is a claim per *session*: a replica answers a session's messages only
while it holds that session's advisory lock, so one session never has two runs at once.

`PostgresReplica` keeps one dedicated connection (not from the pool) for its whole life, with
TCP keepalives, holding:

- its identity: a session-level advisory lock ``(REPLICA_LOCKS, lock_key(id))``. The rows
  its database writes name it (`ania_nb.store.owner`: start token ``replica:<id>``) and such
  an owner is alive exactly while this lock is held. The server drops every lock of a
  connection that ends: a replica killed with -9 loses them within a fraction of a second;
- the sessions it answers now: ``(SESSION_LOCKS, lock_key(session))``, counted per session in
  this process (`claim`, `hold`, `release`), released when nothing of the session runs here.

A second dedicated connection LISTENs on `CHANNEL`: a replica that stored a message for a
session another replica holds tells the holder (`notify`), which answers it in its next batch
(or, if it is a verdict on the approval it waits for, as that verdict). The table ``replicas``
lists who serves, for ``ania-nb status``.

On SQLite there is one replica, the process itself (`LocalReplica`): every claim succeeds and
nothing is sent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ania_nb.errors import StoreError

from .owner import (
    REPLICA_LOCKS,
    SESSION_LOCKS,
    current_owner,
    held_locks,
    lock_key,
    replica_owner,
)

if TYPE_CHECKING:  # pragma: no cover
    import psycopg

    from .db import Conn, Database
    from .postgres import PostgresDatabase

__all__ = [
    "CHANNEL",
    "LocalReplica",
    "PostgresReplica",
    "Replica",
    "ReplicaInfo",
    "ServiceStatus",
    "default_replica_id",
    "list_replicas",
    "open_replica",
    "service_status",
]

log = logging.getLogger("ania_nb.replicas")

CHANNEL = "ania_inbox"  # LISTEN/NOTIFY channel: "<session>\t<inbox id>" of a deferred message
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 5, 2, 3  # a vanished host: ~11 s
RECONNECT_S = 1.0  # between attempts to get a lost dedicated connection back
SEEN_EVERY_S = 15.0  # how often a replica refreshes ``replicas.seen_at`` (for status only)

Notified = Callable[[str, int], None]


_defaults = itertools.count(1)


def default_replica_id() -> str:
    """``<host>:<pid>`` (``.2``, ``.3``… for more replicas in one process): new at every start."""
    n = next(_defaults)
    return f"{socket.gethostname()}:{os.getpid()}" + (f".{n}" if n > 1 else "")


class Replica:
    """The process as the only replica (SQLite): every claim succeeds, nothing is sent."""

    shared = False  # whether other replicas may answer the same sessions

    def __init__(self, replica_id: str = "") -> None:
        """A replica named ``replica_id`` (default: host and pid)."""
        self.id = replica_id or default_replica_id()

    def held(self, session: str) -> bool:
        """Whether this process holds ``session`` now."""
        return True

    def hold(self, session: str) -> bool:
        """Take one more reference on a session already held; False when it is not held."""
        return True

    async def claim(self, session: str) -> bool:
        """Take a reference on ``session``; False when another replica holds it."""
        return True

    async def release(self, session: str) -> None:
        """Give one reference back; the session is free for others when none is left."""

    async def notify(self, session: str, inbox_id: int) -> None:
        """Tell the session's holder that row ``inbox_id`` waits for it."""

    def on_notified(self, handler: Notified | None) -> None:
        """Call ``handler(session, inbox_id)`` for each row another replica stored."""

    async def locked_sessions(self) -> set[int]:
        """Lock keys of the sessions some replica holds now (empty: nobody can tell)."""
        return set()

    async def close(self) -> None:
        """Give everything up; idempotent."""


LocalReplica = Replica


class PostgresReplica(Replica):
    """One replica of several on a PostgreSQL store (see the module docstring)."""

    shared = True

    def __init__(self, db: PostgresDatabase, replica_id: str = "") -> None:
        """A replica of the store ``db``; call `start`."""
        super().__init__(replica_id)
        self._url = db.url
        self._db = db
        self._key = lock_key(self.id)
        self._locks: psycopg.AsyncConnection[Any] | None = None
        self._listen: psycopg.AsyncConnection[Any] | None = None
        self._io = asyncio.Lock()  # one statement at a time on the lock connection
        self._counts: dict[str, int] = {}
        self._handler: Notified | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    async def start(self) -> None:
        """Take the replica's identity lock and start listening.

        Raises `StoreError` when another live replica already uses this id.
        """
        self._locks = await self._connect()
        if not await self._fetch("SELECT pg_try_advisory_lock(?::int4, ?::int4)", REPLICA_LOCKS):
            await self._locks.close()
            self._locks = None
            holder = await self._db.run(_replica_row, self.id)
            where = f" (pid {holder.pid} on {holder.host})" if holder else ""
            raise StoreError(
                f"replica id {self.id!r} is in use by a live replica{where}; give each "
                "replica its own --replica-id (or runner.replica_id)"
            )
        self._db.owner = replica_owner(self.id)  # its rows name it from now on
        await self._db.run(_register, self.id, socket.gethostname(), os.getpid(), time.time())
        self._tasks = [
            asyncio.create_task(self._listen_forever(), name="ania-replica-listen"),
            asyncio.create_task(self._seen_forever(), name="ania-replica-seen"),
        ]
        log.info("serving as replica %s", self.id)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        import psycopg

        try:
            return await psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                connect_timeout=10,
                keepalives=1,
                keepalives_idle=KEEPALIVE_IDLE_S,
                keepalives_interval=KEEPALIVE_INTERVAL_S,
                keepalives_count=KEEPALIVE_COUNT,
            )
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the store for the replica lock: {exc}") from exc

    async def _fetch(self, sql: str, namespace: int, name: str | None = None) -> Any:
        """Run an advisory-lock function on the lock connection; its boolean result."""
        from .postgres import _pg_sql

        key = self._key if name is None else lock_key(name)
        assert self._locks is not None
        async with self._io:
            cur = await self._locks.execute(_pg_sql(sql), (namespace, key))
            row = await cur.fetchone()
        return bool(row and row[0])

    def held(self, session: str) -> bool:
        """Whether this process holds ``session`` now."""
        return self._counts.get(session, 0) > 0

    def hold(self, session: str) -> bool:
        """Take one more reference on a session already held; False when it is not held."""
        if not self.held(session):
            return False
        self._counts[session] += 1
        return True

    async def claim(self, session: str) -> bool:
        """Take a reference on ``session``; False when another replica holds it (or no lock)."""
        if self.hold(session):
            return True
        if self._locks is None or self._locks.closed:
            return False
        import psycopg

        try:
            got = await self._fetch(
                "SELECT pg_try_advisory_lock(?::int4, ?::int4)", SESSION_LOCKS, session
            )
        except psycopg.Error as exc:
            self._lost(exc)
            return False
        if not got:
            return False
        if self.hold(session):  # claimed meanwhile by another task here: one lock is enough
            await self._unlock(session)
            return True
        self._counts[session] = 1
        return True

    async def release(self, session: str) -> None:
        """Give one reference back; the lock is released when none is left."""
        count = self._counts.get(session, 0)
        if count <= 0:
            return
        if count > 1:
            self._counts[session] = count - 1
            return
        del self._counts[session]
        await self._unlock(session)

    async def _unlock(self, session: str) -> None:
        import psycopg

        if self._locks is None or self._locks.closed:
            return
        try:
            await self._fetch("SELECT pg_advisory_unlock(?::int4, ?::int4)", SESSION_LOCKS, session)
        except psycopg.Error as exc:
            self._lost(exc)

    def _lost(self, exc: BaseException) -> None:
        """The lock connection broke: every lock of this replica is gone with it."""
        if self._closed:
            return
        log.error(
            "replica %s lost its lock connection (%s): sessions it held may be taken over; "
            "reconnecting",
            self.id,
            exc,
        )
        self._counts.clear()
        self._tasks.append(asyncio.create_task(self._reconnect(), name="ania-replica-reconnect"))

    async def _reconnect(self) -> None:
        while not self._closed:
            await asyncio.sleep(RECONNECT_S)
            try:
                old, self._locks = self._locks, None
                if old is not None:
                    await old.close()
                self._locks = await self._connect()
                if await self._fetch(
                    "SELECT pg_try_advisory_lock(?::int4, ?::int4)", REPLICA_LOCKS
                ):
                    log.info("replica %s has its lock connection back", self.id)
                    return
                log.error("replica id %s was taken by another process meanwhile", self.id)
            except Exception as exc:  # keep trying while the server is away
                log.warning("replica %s: reconnecting failed: %s", self.id, exc)

    async def notify(self, session: str, inbox_id: int) -> None:
        """Tell the session's holder that row ``inbox_id`` waits for it (best effort)."""
        import psycopg

        if self._locks is None or self._locks.closed:
            return  # the sweep finds the row
        try:
            async with self._io:
                await self._locks.execute(
                    "SELECT pg_notify(%s, %s)", (CHANNEL, f"{session}\t{inbox_id}")
                )
        except psycopg.Error as exc:
            self._lost(exc)

    def on_notified(self, handler: Notified | None) -> None:
        """Call ``handler(session, inbox_id)`` for each row another replica stored."""
        self._handler = handler

    async def _listen_forever(self) -> None:
        while not self._closed:
            try:
                self._listen = await self._connect()
                await self._listen.execute(f"LISTEN {CHANNEL}")
                async for note in self._listen.notifies():
                    session, _, raw = note.payload.rpartition("\t")
                    if self._handler is not None and raw.isdigit():
                        try:
                            self._handler(session, int(raw))
                        except Exception:
                            log.exception("a notification handler failed")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # missed notes: the sweep finds the rows
                if self._closed:
                    return
                log.warning("replica %s: listening failed (%s); again shortly", self.id, exc)
                await asyncio.sleep(RECONNECT_S)

    async def _seen_forever(self) -> None:
        while not self._closed:
            await asyncio.sleep(SEEN_EVERY_S)
            try:
                await self._db.run(_seen, self.id, time.time())
            except Exception as exc:  # only for status
                log.debug("replica %s: seen_at not refreshed: %s", self.id, exc)

    async def locked_sessions(self) -> set[int]:
        """Lock keys of the sessions some replica holds now."""
        return await self._db.run(held_locks, SESSION_LOCKS)

    async def close(self) -> None:
        """Release every lock (closing the connections), unregister; idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._counts.clear()
        try:
            await self._db.run(_unregister, self.id)
        except Exception as exc:  # the row is only for status
            log.debug("replica %s not unregistered: %s", self.id, exc)
        for conn in (self._listen, self._locks):
            if conn is not None:
                await conn.close()
        self._db.owner = current_owner()


async def open_replica(db: Database, replica_id: str = "") -> Replica:
    """The process as a replica of ``db``: a `PostgresReplica` (started) on PostgreSQL."""
    from .postgres import PostgresDatabase  # no driver import: only its own module

    if not isinstance(db, PostgresDatabase):
        return LocalReplica(replica_id)
    replica = PostgresReplica(db, replica_id)
    await replica.start()
    return replica


@dataclass(frozen=True)
class ReplicaInfo:
    """One row of ``replicas`` with whether its lock is held now."""

    id: str
    host: str
    pid: int
    started_at: float
    seen_at: float
    alive: bool


async def list_replicas(conn: Conn) -> list[ReplicaInfo]:
    """Every registered replica, alive ones first (by their lock, on PostgreSQL)."""
    rows = await conn.fetchall(
        "SELECT id, host, pid, started_at, seen_at FROM replicas ORDER BY started_at"
    )
    held = await held_locks(conn, REPLICA_LOCKS) if conn.dialect.name == "postgres" else set()
    found = [_info(row, lock_key(row[0]) in held) for row in rows]
    return sorted(found, key=lambda r: not r.alive)


@dataclass(frozen=True)
class ServiceStatus:
    """What ``ania-nb status`` shows: who serves, and what waits in the inbox and outbox."""

    backend: str
    replicas: list[ReplicaInfo]
    inbox: dict[str, int]  # pending / running rows
    outbox: dict[str, int]  # pending / sending rows
    oldest_pending_s: float | None  # age of the oldest inbox row nobody answered yet
    sessions_held: int  # sessions some replica is answering now (PostgreSQL only)

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json`` (health checks)."""
        return {
            "backend": self.backend,
            "replicas": [r.__dict__ for r in self.replicas],
            "inbox": self.inbox,
            "outbox": self.outbox,
            "oldest_pending_s": self.oldest_pending_s,
            "sessions_held": self.sessions_held,
        }

    def to_text(self) -> str:
        """The report for people."""
        now = time.time()
        live = [r for r in self.replicas if r.alive]
        if self.backend == "sqlite":
            lines = ["store: sqlite: one replica (the processes of one host share the file)"]
        else:
            lines = [f"store: {self.backend}; replicas alive: {len(live)}"]
        for r in self.replicas:
            state = "alive" if r.alive else f"gone (last seen {now - r.seen_at:.0f} s ago)"
            lines.append(
                f"  {r.id:<24} pid {r.pid:<7} on {r.host:<16} since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.started_at))}  {state}"
            )
        oldest = "" if self.oldest_pending_s is None else f", oldest {self.oldest_pending_s:.1f} s"
        lines.append(
            f"inbox: {self.inbox.get('pending', 0)} pending{oldest}, "
            f"{self.inbox.get('running', 0)} being answered"
            + (f" ({self.sessions_held} session(s) held)" if self.backend == "postgres" else "")
        )
        lines.append(
            f"outbox: {self.outbox.get('pending', 0)} waiting to be sent, "
            f"{self.outbox.get('sending', 0)} being sent"
        )
        return "\n".join(lines)


async def service_status(conn: Conn) -> ServiceStatus:
    """The replicas, the inbox depth and the outbox backlog of the store, read once."""
    inbox = dict(
        await conn.fetchall(
            "SELECT state, count(*) FROM inbox WHERE state IN ('pending', 'running') GROUP BY state"
        )
    )
    outbox = dict(
        await conn.fetchall(
            "SELECT state, count(*) FROM outbox WHERE state IN ('pending', 'sending') "
            "GROUP BY state"
        )
    )
    oldest = await conn.fetchval("SELECT min(received_at) FROM inbox WHERE state = 'pending'")
    postgres = conn.dialect.name == "postgres"
    held = len(await held_locks(conn, SESSION_LOCKS)) if postgres else 0
    return ServiceStatus(
        conn.dialect.name,
        await list_replicas(conn) if postgres else [],
        {str(k): int(v) for k, v in inbox.items()},
        {str(k): int(v) for k, v in outbox.items()},
        None if oldest is None else max(0.0, time.time() - float(oldest)),
        held,
    )


async def _register(conn: Conn, replica_id: str, host: str, pid: int, now: float) -> None:
    await conn.execute(
        "INSERT INTO replicas (id, host, pid, started_at, seen_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
        "started_at = excluded.started_at, seen_at = excluded.seen_at",
        (replica_id, host, pid, now, now),
    )
    # Rows of replicas gone for a day only clutter the status.
    await conn.execute("DELETE FROM replicas WHERE seen_at < ?", (now - 86_400,))


async def _seen(conn: Conn, replica_id: str, now: float) -> None:
    await conn.execute("UPDATE replicas SET seen_at = ? WHERE id = ?", (now, replica_id))


async def _unregister(conn: Conn, replica_id: str) -> None:
    await conn.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))


async def _replica_row(conn: Conn, replica_id: str) -> ReplicaInfo | None:
    row = await conn.fetchone(
        "SELECT id, host, pid, started_at, seen_at FROM replicas WHERE id = ?", (replica_id,)
    )
    return None if row is None else _info(row, True)


def _info(row: tuple[Any, ...], alive: bool) -> ReplicaInfo:
    return ReplicaInfo(str(row[0]), str(row[1]), int(row[2]), float(row[3]), float(row[4]), alive)
