"""What made a storage operation fail, when it is the disk's state rather than the data.

A full disk, a read-only mount or a missing write permission reach ania-nb in several forms:
an `OSError` with its errno, a `sqlite3.Error` with its result code (``SQLITE_FULL``,
``SQLITE_READONLY``, ``SQLITE_IOERR_*``, ``SQLITE_CANTOPEN``), or a Rust error from Lance whose
text ends in ``No space left on device (os error 28)`` and a path inside the wheel's build tree.
`storage_cause` recognises them all, also through ``__cause__`` chains, so the store and the
knowledge base raise errors that start with the cause (`storage_text`) instead of an SQLite
code, a Rust source path or "not an ania-nb database". `named_cause` finds the cause again in
a message that went through a run's result (the runner tells chat users).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Final

NO_SPACE: Final = "no space left on device"
READ_ONLY: Final = "read-only file system"
NO_PERMISSION: Final = "permission denied"
CAUSES: Final = (NO_SPACE, READ_ONLY, NO_PERMISSION)

_FIXES = {
    NO_SPACE: "free space on that disk (or move the data directory to a bigger one) and try "
    "again; what was stored before is intact",
    READ_ONLY: "the file system is mounted read-only: remount it read-write or move the data "
    "directory; what was stored before is intact",
    NO_PERMISSION: "this process may not write there: give its user write permission on the "
    "data directory or move it; what was stored before is intact",
}
_ERRNOS = {
    errno.ENOSPC: NO_SPACE,
    errno.EDQUOT: NO_SPACE,  # a quota is a full disk for this user
    errno.EROFS: READ_ONLY,
    errno.EACCES: NO_PERMISSION,
    errno.EPERM: NO_PERMISSION,
}
# Texts of Rust's io::Error (Lance) and of SQLite's messages, lower-cased.
_TEXTS = (
    ("no space left on device", NO_SPACE),
    ("os error 28", NO_SPACE),
    ("disk quota exceeded", NO_SPACE),
    ("database or disk is full", NO_SPACE),
    ("read-only file system", READ_ONLY),
    ("os error 30", READ_ONLY),
    ("permission denied", NO_PERMISSION),
    ("os error 13", NO_PERMISSION),
)
_SQLITE_FULL = 13
# Result codes that may mean the disk refused a write; which cause is asked of the disk.
_SQLITE_DISK = frozenset({8, 10, 14})  # SQLITE_READONLY, SQLITE_IOERR, SQLITE_CANTOPEN


def storage_cause(exc: BaseException, path: str | Path | None = None) -> str | None:
    """The storage cause of ``exc`` or of what it was raised from (`CAUSES`), or None.

    ``path`` (a file or folder the failed operation used) lets an ambiguous SQLite code be
    resolved by looking at its file system: read-only, full, or not writable for this user.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _own_cause(current, path)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _own_cause(exc: BaseException, path: str | Path | None) -> str | None:
    if isinstance(exc, OSError) and exc.errno in _ERRNOS:
        return _ERRNOS[exc.errno]
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            if code & 0xFF == _SQLITE_FULL:
                return NO_SPACE
            if code & 0xFF in _SQLITE_DISK:
                return disk_state(path) if path is not None else None
    text = str(exc).lower()
    return next((cause for pattern, cause in _TEXTS if pattern in text), None)


def disk_state(path: str | Path) -> str | None:
    """Why writing under ``path`` fails, judged from its file system (None: no reason seen)."""
    place = Path(path)
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        info = os.statvfs(place)
    except OSError:
        return None
    if info.f_flag & os.ST_RDONLY:
        return READ_ONLY
    if info.f_bavail == 0 or (info.f_favail == 0 and info.f_files > 0):
        return NO_SPACE
    if not os.access(place, os.W_OK):
        return NO_PERMISSION
    return None


def storage_text(cause: str, what: str, detail: str = "") -> str:
    """A message naming ``cause`` first, then what failed, the raw ``detail`` and the fix."""
    said = f" ({detail})" if detail else ""
    return f"{cause}: {what}{said}; {_FIXES[cause]}"


def named_cause(message: str) -> str | None:
    """The cause a `storage_text` message (possibly wrapped in another) names, or None."""
    lowered = message.lower()
    return next((cause for cause in CAUSES if f"{cause}: " in lowered), None)
