"""Cutting text to a length: the one meaning of "at most N characters" in ania-nb.

Every limit counts the whole result. ``cut(text, n)`` is

* ``text`` itself when it has at most ``n`` characters (Python's ``len``: code points);
* otherwise the start of ``text`` (or its end, ``keep="end"``) and a marker, together **never
  longer than** ``n`` characters — the marker's characters count against the limit; white
  space at the cut is dropped (``hello…``, not ``hello …``);
* ``""`` for ``n = 0`` (and a marker longer than the limit is itself cut).

The marker is ``…`` by default; a note such as ``" ...(output truncated)"`` is a marker too,
and a function of the number of characters left out gives notes like "… 120 more characters".
`flatten` is the same cut of a text put on one line. Standard library only: every layer may
import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

__all__ = ["ELLIPSIS", "Marker", "cut", "flatten"]

ELLIPSIS = "…"

Marker = str | Callable[[int], str]
"""What marks a cut: a text, or a function of how many characters of the text were left out."""

_SETTLE_ROUNDS = 8  # a counting marker grows with the digits of its count: a few rounds settle


def cut(
    text: str,
    limit: int,
    *,
    marker: Marker = ELLIPSIS,
    keep: Literal["start", "end"] = "start",
) -> str:
    """``text`` in at most ``limit`` characters, the marker included (see the module docstring).

    ``keep="start"`` keeps the beginning and appends the marker; ``keep="end"`` keeps the end
    (tracebacks, the tail of a log) and puts the marker in front. Raises ValueError for a
    negative limit.
    """
    if limit < 0:
        raise ValueError(f"a length limit must be 0 or more, got {limit}")
    if len(text) <= limit:
        return text
    if callable(marker):
        left_out = len(text) - limit
        for _ in range(_SETTLE_ROUNDS):
            note = marker(left_out)
            piece = _piece(text, limit - len(note), keep)
            if len(text) - len(piece) == left_out:
                break
            left_out = len(text) - len(piece)
    else:
        note = marker
        piece = _piece(text, limit - len(note), keep)
    if len(note) >= limit:
        return note[:limit]
    return note + piece if keep == "end" else piece + note


def _piece(text: str, size: int, keep: str) -> str:
    """What a cut shows of ``text``: ``size`` characters at one end, white space at the cut gone."""
    if size <= 0:
        return ""
    return text[len(text) - size :].lstrip() if keep == "end" else text[:size].rstrip()


def flatten(text: str, limit: int | None = None, *, marker: Marker = ELLIPSIS) -> str:
    """``text`` on one line (every whitespace run one space, none at the ends), then `cut`."""
    line = " ".join(text.split())
    return line if limit is None else cut(line, limit, marker=marker)
