"""JSON files that people edit while the agent runs (hooks, slash commands).

`WatchedJSON` re-reads its file at most every ``ttl`` seconds, parses it again only when the text
changed, and keeps the last good value when an edit breaks it (saying why once per bad text).
`write_atomic` replaces a file in one step so a reader never sees half of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from .._atomic import write_text_atomic

log = logging.getLogger(__name__)

T = TypeVar("T")

RELOAD_SECONDS = 5.0


class WatchedJSON(Generic[T]):
    """The parsed content of a JSON file, kept fresh within ``ttl`` seconds of an edit.

    A missing or blank file means ``empty``. ``parse`` turns the decoded JSON into the value and
    raises `ValueError` with a specific message when the content is wrong.
    """

    def __init__(
        self,
        path: Path,
        parse: Callable[[Any], T],
        empty: T,
        *,
        what: str,
        ttl: float = RELOAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.what = what
        self.ttl = ttl
        self.clock = clock
        self.error: str | None = None  # why the current file text is not in use
        self._parse = parse
        self._empty = empty
        self._value = empty
        self._raw: str | None = None  # text the value was parsed from
        self._bad_raw: str | None = None  # last rejected text, so the warning is said once
        self._checked_at: float | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> T:
        """The current value, re-reading the file if the last read is older than ``ttl``."""
        now = self.clock()
        if self._checked_at is not None and now - self._checked_at < self.ttl:
            return self._value
        async with self._lock:
            if self._checked_at is None or self.clock() - self._checked_at >= self.ttl:
                try:
                    raw = await asyncio.to_thread(read_text, self.path)
                except (OSError, UnicodeDecodeError) as exc:
                    self._reject(f"\x00{exc}", f"cannot be read: {exc}")
                else:
                    self._update(raw)
                self._checked_at = self.clock()
        return self._value

    def invalidate(self) -> None:
        """Make the next `get` read the file (after a write made by this process)."""
        self._checked_at = None

    def _update(self, raw: str) -> None:
        if raw == self._raw:
            return  # unchanged: no re-parse
        try:
            value = self.parse_text(raw)
        except ValueError as exc:
            self._reject(raw, str(exc))
            return
        self._value, self._raw, self._bad_raw, self.error = value, raw, None, None

    def _reject(self, raw: str, reason: str) -> None:
        """Keep the last good value; warn once per bad text."""
        if raw == self._bad_raw:
            return
        self._bad_raw = raw
        where = f"{self.what} {str(self.path)!r}"
        self.error = f"{where} is invalid, keeping the last good one: {reason}"
        log.warning("%s", self.error)

    def parse_text(self, raw: str) -> T:
        """Parse file text (blank → ``empty``); raises `ValueError` saying what is wrong."""
        if not raw.strip():
            return self._empty
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        return self._parse(data)


def read_text(path: Path) -> str:
    """The file's text ('' when missing); call through `asyncio.to_thread`."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


async def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (temporary file + rename), off the loop."""
    await asyncio.to_thread(write_text_atomic, path, text)
