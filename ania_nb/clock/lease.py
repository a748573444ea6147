"""The clock's lease: one scheduler per store — a lock on a file, or on the PostgreSQL server.

`open_lease` picks one for the store the clock uses:

- SQLite (`Lease`): ``<data_dir>/clock.lock`` is locked with ``flock`` for as long as a process
  runs the scheduler. The kernel drops the lock when the holder exits or dies (no stale lease
  to expire, no heartbeat that a stalled event loop could miss), and ``flock`` locks belong to
  an open file, so two Agents in one process exclude each other too. The holder writes who it
  is into the file, so a process that lost can say who holds the clock.
- PostgreSQL (`PostgresLease`): replicas have data directories of their own, possibly on other
  hosts, so the lease is the session advisory lock ``clock-leader`` of the shared database, on a
  dedicated connection (`ania_nb.store.locks`): one leader per database. The leader's `check`
  is its heartbeat; the server ends a session silent for `LEADER_IDLE_TIMEOUT` seconds, so a
  frozen leader (SIGSTOP, a stalled loop) loses the lease that long after its last heartbeat,
  and when it wakes its `check` fails and it stops firing. A kill -9 frees the lease at once.
  What a stale leader might still fire before it notices is fenced by the task log's
  ``(task, planned time)`` key (`ania_nb.clock.store`).

Both have the same face: `acquire` (never waits), `check` (the holder's heartbeat: still held?),
`release`, `holder` (who holds it, for messages).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from ..errors import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store
    from ..store.locks import AdvisoryLocks

log = logging.getLogger(__name__)

LOCK_FILENAME = "clock.lock"
LEADER_LOCK = "clock-leader"  # the advisory lock's name (`ania_nb.store.locks.advisory_key`)
LEADER_IDLE_TIMEOUT = 4.0  # seconds: a leader silent this long loses the lease (server side)


class ClockLease(Protocol):
    """What the clock needs of a lease (see the module docstring)."""

    @property
    def held(self) -> bool:
        """Whether this object holds the lease (as of its last acquire or check)."""
        ...

    async def acquire(self) -> bool:
        """Take the lease if it is free (never waits); True when held afterwards."""
        ...

    async def check(self) -> bool:
        """The holder's heartbeat: True while the lease is still held."""
        ...

    async def release(self) -> None:
        """Give the lease up; idempotent."""
        ...

    async def holder(self) -> dict[str, Any] | None:
        """Who holds the lease (pid, host), if it can be told."""
        ...


def open_lease(store: Store) -> ClockLease:
    """The lease for the clock of ``store``: the leader lock on PostgreSQL, else the lock file."""
    from ..store.postgres import PostgresDatabase

    if isinstance(store.db, PostgresDatabase):
        return PostgresLease(
            store.db.advisory_locks(
                application_name=f"ania-nb clock {os.getpid()}@{socket.gethostname()}",
                idle_timeout=LEADER_IDLE_TIMEOUT,
            )
        )
    return Lease(store.data_dir)


class Lease:
    """An exclusive, non-blocking lock on ``<data_dir>/clock.lock``."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        """Lease the clock of ``data_dir`` (nothing is locked until `acquire`)."""
        self.path = Path(data_dir).expanduser().absolute() / LOCK_FILENAME
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._file is not None

    async def acquire(self) -> bool:
        """Take the lock if it is free (never waits for it); True when held afterwards."""
        if self._file is None:
            attempt = asyncio.ensure_future(asyncio.to_thread(_try_lock, self.path))
            try:
                self._file = await asyncio.shield(attempt)
            except asyncio.CancelledError:
                # The thread goes on: give up whatever lock it gets, then stop.
                file = await attempt
                if file is not None:
                    await asyncio.to_thread(_unlock, file)
                raise
        return self._file is not None

    async def check(self) -> bool:
        """Whether the lock is still held (a file lock cannot be lost while the file is open)."""
        return self._file is not None

    async def release(self) -> None:
        """Give the lock up (another process may take it at once); idempotent."""
        file, self._file = self._file, None
        if file is not None:
            await asyncio.to_thread(_unlock, file)

    async def holder(self) -> dict[str, Any] | None:
        """Who wrote the lock file last (pid, host, since), if readable."""
        return await asyncio.to_thread(_read_holder, self.path)


class PostgresLease:
    """The database's ``clock-leader`` session advisory lock, on a connection of its own."""

    def __init__(self, locks: AdvisoryLocks) -> None:
        """Lease through ``locks`` (nothing is connected until `acquire`)."""
        self._locks = locks

    @property
    def held(self) -> bool:
        """Whether this process held the lease at its last acquire or check."""
        return self._locks.holds(LEADER_LOCK)

    async def acquire(self) -> bool:
        """Try the leader lock once; False when another replica holds it or the server is down."""
        try:
            return await self._locks.try_lock(LEADER_LOCK)
        except StoreError as exc:
            log.warning("the clock cannot try its lease: %s", exc)
            return False

    async def check(self) -> bool:
        """The heartbeat (one statement on the lock's connection); False once the lease is lost."""
        return self.held and await self._locks.ping()

    async def release(self) -> None:
        """Give the lease up and close the connection; idempotent."""
        await self._locks.unlock(LEADER_LOCK)
        await self._locks.close()

    async def holder(self) -> dict[str, Any] | None:
        """The pid and host of the leader (from its connection's application name), if any."""
        try:
            names = await self._locks.holders(LEADER_LOCK)
        except StoreError:
            return None
        for name in names:
            who = name.removeprefix("ania-nb clock ")
            pid, _, host = who.partition("@")
            if pid.isdigit():
                return {"pid": int(pid), "host": host}
        return None


def _try_lock(path: Path) -> IO[str] | None:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    file = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - kept open while the lock is held
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by someone else (BlockingIOError) or not lockable
        file.close()
        return None
    try:
        file.seek(0)
        file.truncate()
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        file.write(json.dumps(me))
        file.flush()
    except OSError:
        pass  # the lock is what matters; the note is only for messages
    return file


def _unlock(file: IO[str]) -> None:
    import fcntl

    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    finally:
        file.close()


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
