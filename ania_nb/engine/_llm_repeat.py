"""Runaway replies: a model that writes the same line or block of lines over and over.

Small local models sometimes fall into a loop (one quoted error line 96 times, a paragraph
again and again) and would go on until ``llm.max_tokens`` or the run timeout. `RepetitionGuard`
watches the reply line by line: when the last lines are one block of 1 to `MAX_BLOCK` lines
repeated ``repeats`` times in a row, the reply is cut after the block's first copy and
`notice` is appended. Blank lines are ignored (a repeated paragraph is still a repeated
block) and a block needs `MIN_BLOCK_CHARS` visible characters, so runs of ``}`` or ``0,`` in
code or data never count.

A loop without newlines ("I am sorry. I am sorry. …") is caught too: every `INLINE_STEP`
characters of an unfinished line, its tail is checked for a unit repeated ``repeats`` times and
over at least `MIN_INLINE_RUN` characters; the unit must hold a letter and two different
visible characters, so ``=====`` or ``0, 0, 0`` never count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ._llm_wire import Completion

REPETITION = "repetition"
"""The ``finish_reason`` of a reply cut by the guard."""
MAX_BLOCK = 12
"""The longest repeated block looked for, in non-blank lines."""
MIN_BLOCK_CHARS = 12
"""Visible characters a block needs before its repetition counts."""
INLINE_STEP = 256
"""Characters of an unfinished line between two checks for a repetition inside it."""
INLINE_WINDOW = 4096
"""How much of the line's end an inline check looks at."""
MIN_INLINE_RUN = 240
"""Characters a repetition inside one line must cover before it counts."""
_KEY = 24  # characters of the line's end searched for earlier in it


def notice(repeats: int) -> str:
    """The line appended where a runaway reply was cut."""
    return f"\n\n(reply cut: the model wrote the same text {repeats} times in a row)"


class RepetitionGuard:
    """Feeds on reply text; says when it has become a runaway and where to cut it."""

    __slots__ = ("_checked", "_ends", "_lines", "_partial", "_size", "cut_at", "repeats")

    def __init__(self, repeats: int) -> None:
        self.repeats = max(2, repeats)
        self.cut_at: int | None = None
        """Where the reply should end (after the block's first copy), once a runaway is seen."""
        self._lines: list[str] = []  # non-blank lines, stripped
        self._ends: list[int] = []  # the text offset just after each of those lines
        self._partial: list[str] = []  # the unfinished last line
        self._size = 0  # characters fed so far
        self._checked = 0  # `_size` at the last inline check

    def feed(self, piece: str) -> bool:
        """Take the next piece of the reply; True once the reply is a runaway."""
        if self.cut_at is not None:
            return True
        if "\n" not in piece:  # the usual streamed piece: nothing to check yet
            self._partial.append(piece)
            self._size += len(piece)
            if self._size - self._checked >= INLINE_STEP:
                return self._inline()
            return False
        start = self._size
        self._size += len(piece)
        parts = piece.split("\n")
        offset = start
        for index, part in enumerate(parts[:-1]):
            offset += len(part) + 1
            line = "".join(self._partial) + part if index == 0 else part
            self._partial = []
            self._checked = offset
            if self._line(line.strip(), offset):
                return True
        if parts[-1]:
            self._partial.append(parts[-1])
            if self._size - self._checked >= INLINE_STEP:
                return self._inline()
        return False

    def cut(self, text: str) -> str:
        """``text`` cut after the repeated block's first copy, with the notice."""
        if self.cut_at is None:
            return text
        return text[: self.cut_at].rstrip() + notice(self.repeats)

    def _inline(self) -> bool:
        """Check the unfinished line's end for a unit repeated many times in a row."""
        self._checked = self._size
        line = "".join(self._partial)[-INLINE_WINDOW:]
        self._partial = [line]  # keeps the next join short; only the window matters
        if len(line) < MIN_INLINE_RUN:
            return False
        key = line[-_KEY:]
        earlier = line.rfind(key, 0, len(line) - 1)
        if earlier < 0:
            return False
        period = len(line) - _KEY - earlier
        copies = max(self.repeats, -(-MIN_INLINE_RUN // period))
        run = period * copies
        unit = line[-period:]
        if run > len(line) or not _wordy(unit) or line[-run:] != unit * copies:
            return False
        start = len(line) - run
        while start > 0 and line[start - 1] == line[start - 1 + period]:
            start -= 1  # back to where the repetition began: keep its first copy whole
        self.cut_at = self._size - len(line) + start + period
        return True

    def _line(self, line: str, end: int) -> bool:
        if not line:
            return False
        lines, ends = self._lines, self._ends
        lines.append(line)
        ends.append(end)
        if len(lines) > 2 * MAX_BLOCK * self.repeats:  # only the tail can be a runaway
            del lines[:MAX_BLOCK], ends[:MAX_BLOCK]
        count = len(lines)
        for period in range(1, MAX_BLOCK + 1):
            span = period * self.repeats
            if span > count:
                break
            if lines[-1] != lines[-1 - period]:
                continue
            block = lines[count - period :]
            if sum(len(b) for b in block) < MIN_BLOCK_CHARS:
                continue
            if all(lines[-i] == lines[-i - period] for i in range(1, span - period + 1)):
                self.cut_at = ends[count - span + period - 1]
                return True
        return False


def _wordy(unit: str) -> bool:
    return len(set(unit.strip())) >= 2 and any(c.isalpha() for c in unit)


def cut_runaway(text: str, repeats: int) -> str | None:
    """``text`` with a runaway repetition cut (see `RepetitionGuard`), or None if it has none."""
    guard = RepetitionGuard(repeats)
    padded = text + "\n"
    for start in range(0, len(padded), INLINE_STEP):  # as if streamed: inline checks run too
        if guard.feed(padded[start : start + INLINE_STEP]):
            return guard.cut(text)
    return None


def trim_runaway(completion: Completion, repeats: int) -> bool:
    """Cut a whole reply's runaway repetition in place (see `cut_runaway`); True if it had one."""
    text = completion.message.get("content")
    cut = cut_runaway(text, repeats) if isinstance(text, str) else None
    if cut is None:
        return False
    completion.message["content"] = cut
    completion.finish_reason = REPETITION
    completion.notes.append("cut a runaway repetition")
    return True
