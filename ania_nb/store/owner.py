"""Who owns a running run: the process that started it, and whether that process still exists.

Each run row records its owner as host name + pid + a start token (Linux: boot id and the
process's start time in clock ticks; elsewhere psutil's create time when psutil is importable).
A run is *orphaned* — and may be marked ``interrupted`` — only when its owner is provably gone:

- same host: no process with that pid, a zombie, or a pid now used by a different process
  (the start token differs, e.g. after a reboot or pid reuse);
- another host: the store cannot look, so the run is left alone unless the caller gives a lease
  (``stale_after`` seconds since the run started, e.g. the run timeout plus a margin);
- no owner recorded (rows written before schema version 3): orphaned, as before.

Why not a lease row with a heartbeat: a heartbeat needs a timer writing to the database in every
process for as long as it lives, and a stalled event loop would then look like a dead process.
The pid check needs no writes and is exact on one host — and SQLite's WAL mode, which the store
uses, only works when every process shares one host anyway.

Replicas on a PostgreSQL store may run on many hosts: there a process is a *replica*
(`ania_nb.store.replicas`) that holds a session-level advisory lock for as long as it lives.
Its rows record the start token ``replica:<id>``, and such an owner is alive exactly while its
lock is held — the server drops it when the replica's connection ends (a kill -9 included),
whatever host the replica ran on (`liveness`).
"""

from __future__ import annotations

import os
import socket
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .db import Conn

_PROC = Path("/proc")


@dataclass(frozen=True)
class Owner:
    """The identity of one process: where it runs, its pid and its start token (if knowable)."""

    host: str
    pid: int
    start: str | None


REPLICA_PREFIX = "replica:"  # the start token of a replica's rows: replica:<id>
REPLICA_LOCKS = 0x616E6972  # advisory lock class ("anir") of replica identities
SESSION_LOCKS = 0x616E6973  # advisory lock class ("anis") of sessions being answered

_current: Owner | None = None


def current_owner() -> Owner:
    """The identity of the current process, computed once per pid (a forked child gets its own)."""
    global _current
    pid = os.getpid()
    if _current is None or _current.pid != pid:
        _current = Owner(socket.gethostname(), pid, start_token(pid))
    return _current


def replica_owner(replica_id: str) -> Owner:
    """The owner a replica's rows name: this host and pid, start token ``replica:<id>``."""
    me = current_owner()
    return Owner(me.host, me.pid, f"{REPLICA_PREFIX}{replica_id}")


def lock_key(name: str) -> int:
    """A stable non-negative 31-bit advisory lock key for ``name`` (a replica id, a session)."""
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def replica_of(owner: Owner) -> str | None:
    """The replica id an owner names, or None for a plain process."""
    start = owner.start or ""
    return start[len(REPLICA_PREFIX) :] if start.startswith(REPLICA_PREFIX) else None


async def liveness(conn: Conn, owners: Iterable[Owner]) -> dict[Owner, bool | None]:
    """Whether each owner still runs: True, False, or None when this process cannot tell.

    A replica (on PostgreSQL) is alive while its advisory lock is held, on any host; a plain
    process on this host by its pid (`is_alive`); a plain process on another host: None.
    """
    found: dict[Owner, bool | None] = {}
    replicas: dict[Owner, int] = {}
    here = socket.gethostname()
    for owner in set(owners):
        replica = replica_of(owner)
        if replica is not None and conn.dialect.name == "postgres":
            replicas[owner] = lock_key(replica)
        elif owner.host == here:
            found[owner] = is_alive(owner)
        else:
            found[owner] = None
    if replicas:
        held = await held_locks(conn, REPLICA_LOCKS)
        for owner, key in replicas.items():
            found[owner] = key in held
    return found


def start_token(pid: int) -> str | None:
    """A string that differs between two processes that had the same pid; None if unknowable."""
    if sys.platform.startswith("linux") and _PROC.is_dir():
        stat = _proc_stat(pid)
        if stat is None:
            return None
        return f"{_boot_id()}:{stat[1]}"
    try:
        import psutil  # optional: only where /proc is missing
    except ImportError:
        return None
    try:
        return f"ct:{psutil.Process(pid).create_time():.3f}"
    except (psutil.Error, OSError):
        return None


async def held_locks(conn: Conn, namespace: int) -> set[int]:
    """Keys of the two-part advisory locks ``(namespace, key)`` held now (PostgreSQL)."""
    rows = await conn.fetchall(
        "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
        "AND classid::bigint = ? AND objsubid = 2 AND granted",
        (namespace,),
    )
    return {int(objid) for (objid,) in rows}


def is_alive(owner: Owner) -> bool:
    """Whether ``owner`` (a process on this host) still runs; True when it cannot be told."""
    if owner.pid <= 0:
        return False
    if replica_of(owner) is not None:  # on SQLite: the pid is what can be looked at
        owner = Owner(owner.host, owner.pid, None)
    if sys.platform.startswith("linux") and _PROC.is_dir():
        stat = _proc_stat(owner.pid)
        if stat is None:  # no such process, or hidden from us (hidepid): ask the kernel
            return _signal_probe(owner.pid)
        if stat[0] in ("Z", "X"):  # dead, waiting to be reaped
            return False
        return owner.start is None or owner.start == f"{_boot_id()}:{stat[1]}"
    try:
        import psutil
    except ImportError:
        return _signal_probe(owner.pid)
    try:
        process = psutil.Process(owner.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True  # e.g. access denied: it exists
    return owner.start is None or owner.start == start_token(owner.pid)


def _signal_probe(pid: int) -> bool:
    """POSIX existence check without psutil; on Windows, without psutil, assume alive."""
    if os.name != "posix":
        return True  # os.kill(pid, 0) would *terminate* the process on Windows
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, starttime)`` from ``/proc/<pid>/stat``, or None when there is no such process."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    return fields[0], fields[19]  # field 3 (state) and field 22 (starttime)


_boot: str | None = None


def _boot_id() -> str:
    """The kernel's boot id, so that a pid + start time from before a reboot never matches."""
    global _boot
    if _boot is None:
        try:
            _boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _boot = "-"
    return _boot
