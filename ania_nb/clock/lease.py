"""The clock's lease: one scheduler per data directory, held as an exclusive lock on a file.

``<data_dir>/clock.lock`` is locked with ``flock`` for as long as a process runs the scheduler.
The kernel drops the lock when the holder exits or dies (no stale lease to expire, no heartbeat
that a stalled event loop could miss), and ``flock`` locks belong to an open file, so two
Agents in one process exclude each other too. The holder writes who it is into the file, so a
process that lost can say who holds the clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

LOCK_FILENAME = "clock.lock"


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

    async def release(self) -> None:
        """Give the lock up (another process may take it at once); idempotent."""
        file, self._file = self._file, None
        if file is not None:
            await asyncio.to_thread(_unlock, file)

    async def holder(self) -> dict[str, Any] | None:
        """Who wrote the lock file last (pid, host, since), if readable."""
        return await asyncio.to_thread(_read_holder, self.path)


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
