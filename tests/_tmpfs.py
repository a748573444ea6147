"""A small tmpfs to fill up: the disk-full and read-only tests' real file system.

Mounted with the mount(2) system call (no ``mount`` process, so the tests stay fast ones);
that needs root with CAP_SYS_ADMIN, else the test is skipped with a message saying so.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

MS_RDONLY, MS_REMOUNT = 1, 32
MNT_DETACH = 2
FILLER = "filler.bin"


class SmallDisk:
    """A tmpfs of ``size`` bytes mounted at ``path``: fill it, free it, make it read-only."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size = path, size
        self._libc = ctypes.CDLL(None, use_errno=True)

    def mount(self) -> None:
        """Mount it, or skip the test where mounting is not allowed."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._call("mount", b"tmpfs", 0, f"size={self.size},mode=0777".encode())

    def _call(self, what: str, source: bytes, flags: int, data: bytes) -> None:
        rc = self._libc.mount(source, str(self.path).encode(), b"tmpfs", flags, data)
        if rc != 0:
            code = ctypes.get_errno()
            if what == "mount" and code in (errno.EPERM, errno.EACCES, errno.ENOSYS):
                pytest.skip(
                    f"cannot mount a tmpfs here ({os.strerror(code)}): the disk-full tests "
                    "need root with CAP_SYS_ADMIN"
                )
            raise OSError(code, f"{what} of a tmpfs at {self.path}: {os.strerror(code)}")

    def unmount(self) -> None:
        """Unmount it (lazily: a store may still hold a file open)."""
        self._libc.umount2(str(self.path).encode(), MNT_DETACH)

    def fill(self) -> None:
        """Take every free byte (big writes, then small ones for the last pages)."""
        with open(self.path / FILLER, "ab", buffering=0) as out:
            for block in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
                try:
                    while True:
                        out.write(b"\0" * block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        assert os.statvfs(self.path).f_bavail == 0

    def free(self) -> None:
        """Give the space back."""
        (self.path / FILLER).unlink(missing_ok=True)

    def read_only(self, on: bool = True) -> None:
        """Remount read-only (or read-write again)."""
        flags = MS_REMOUNT | (MS_RDONLY if on else 0)
        self._call("remount", b"tmpfs", flags, f"size={self.size}".encode())
