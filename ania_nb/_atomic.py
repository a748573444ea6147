"""Atomic file replacement for the config files the agent edits (MCP servers, hooks, commands)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` in one step (temp file + fsync + rename); blocking.

    Readers see the old file or the new one, never half of one; the old file's permission bits
    are kept (a new file gets 0644 instead of mkstemp's 0600). Waits while a sandboxed command
    covers something in its folder (see `exclusive`).
    """
    file = Path(path)
    with exclusive(file):
        fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.chmod(tmp, file.stat().st_mode & 0o777)
            except FileNotFoundError:
                os.chmod(tmp, 0o644)
            os.replace(tmp, file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def exclusive(file: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on the folder of ``file`` while ``file`` is replaced there.

    A sandboxed bash command holds a shared one on the folder of every path it covers: the
    kernel uncovers a mount whose file is renamed over on the host, so the replacement waits
    until such commands have ended, and a command starting meanwhile waits for it.
    """
    import fcntl  # POSIX only; imported where used like the clock's lease

    for _attempt in range(5):
        file.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:  # not ours to read: no command of ours covers anything there
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_folder(fd, file.parent):  # not an empty stand-in removed meanwhile
                yield
                return
        finally:
            os.close(fd)
    yield


def _same_folder(fd: int, folder: Path) -> bool:
    try:
        now = os.stat(folder)
    except OSError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
