"""What an admin is shown before approving: visible text and bounded, non-blocking file previews.

Approval summaries are built synchronously by the tool gate, so the file preview only ever reads
a regular file (never a FIFO, a device or ``/proc`` pseudo-file that could hang or flood) and at
most ``limit`` characters of it.
"""

from __future__ import annotations

import json
import os
import stat
import unicodedata
from pathlib import Path

__all__ = ["preview_file", "read_bounded", "reveal", "visible"]

# Control, format (zero-width, bidi overrides), private-use, unassigned and line/paragraph
# separators: shown as \\uXXXX so nothing in an argument can hide or reorder what follows.
_HIDDEN = frozenset({"Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp"})


def visible(text: str) -> str:
    """``text`` quoted, with newlines, control and invisible characters escaped."""
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(
        f"\\u{ord(ch):04x}" if unicodedata.category(ch) in _HIDDEN else ch for ch in quoted
    )


def read_bounded(path: str | os.PathLike[str], limit: int) -> tuple[str, int]:
    """Up to ``limit`` characters of a regular file and its size in bytes, without blocking.

    Raises `FileNotFoundError`, `OSError`, or `ValueError` for a file that is not regular.
    """
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file; its content cannot be shown")
        raw = os.read(fd, limit * 4 + 4)  # UTF-8: at most 4 bytes per character
    finally:
        os.close(fd)
    return raw.decode("utf-8", errors="replace")[:limit], info.st_size


def reveal(text: str) -> str:
    """``text`` with control and invisible characters escaped (newlines and tabs kept)."""
    return "".join(
        f"\\u{ord(ch):04x}" if ch not in "\n\t" and unicodedata.category(ch) in _HIDDEN else ch
        for ch in text
    )


def preview_file(path: str | os.PathLike[str], limit: int = 4000) -> str:
    """The first ``limit`` characters of a regular file, or a line in parentheses saying why not."""
    target = Path(path)
    try:
        shown, size = read_bounded(target, limit)
    except FileNotFoundError:
        return f"(the file {target} does not exist yet)"
    except OSError as exc:
        return f"(the file {target} cannot be read: {exc.strerror or exc})"
    except ValueError as exc:
        return f"({exc})"
    if not shown:
        return f"(the file {target} is empty)"
    rest = max(size - len(shown.encode("utf-8", errors="replace")), 0)
    more = f"\n… ({rest} more bytes not shown)" if rest else ""
    return f"{reveal(shown)}{more}"
