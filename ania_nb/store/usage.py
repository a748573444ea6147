"""Usage counters: tokens per quota day and session (for limits) and per day and model (history).

A run's tokens are counted in the same transaction that closes its run record (see
``journal.py``), so for every day ``SUM(runs.counted_tokens) == SUM(usage_counters.total)``
until someone resets a counter. Per-session counters are what quotas check; they can be reset
and are pruned after a retention window. The per-day totals are never reset, so the usage
plot's history survives both. A *day* is an ISO date string chosen by the caller (the quota's
time zone), which keeps this module free of clocks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ania_nb.errors import UsageError

from .db import transaction
from .history import check_session

if TYPE_CHECKING:
    from .db import Database

COUNTS = "prompt_tokens, completion_tokens, cached_tokens, total_tokens"


class Tokens(Protocol):
    """Token counts as the engine's ``Tokens`` has them (the store does not import it)."""

    prompt: int
    completion: int
    cached: int
    total: int


@dataclass(frozen=True)
class DayCount:
    """Tokens of one day (and one session or model, depending on the query)."""

    day: str
    key: str  # the session or the model
    prompt: int
    completion: int
    cached: int
    total: int


def check_day(day: str) -> str:
    """An ISO date ``YYYY-MM-DD`` (the only day format stored)."""
    if not isinstance(day, str) or len(day) != 10 or day[4] != "-" or day[7] != "-":
        raise UsageError(f"a usage day is an ISO date like 2026-12-01, got {day!r}")
    if not (day[:4] + day[5:7] + day[8:]).isdigit():
        raise UsageError(f"a usage day is an ISO date like 2026-12-01, got {day!r}")
    return day


def add_counts(
    conn: sqlite3.Connection, day: str, session: str, by_model: Mapping[str, Tokens]
) -> int:
    """Add ``by_model`` to the day's counter of ``session`` and the day's model totals.

    Runs inside the caller's transaction; returns the total tokens added.
    """
    added = 0
    for model, t in by_model.items():
        if not (t.total or t.prompt or t.completion or t.cached):
            continue
        row = (day, model, t.prompt, t.completion, t.cached, t.total)
        conn.execute(
            f"INSERT INTO usage_daily (day, model, {COUNTS}) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (day, model) DO UPDATE SET "
            "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = completion_tokens + excluded.completion_tokens, "
            "cached_tokens = cached_tokens + excluded.cached_tokens, "
            "total_tokens = total_tokens + excluded.total_tokens",
            row,
        )
        conn.execute(
            f"INSERT INTO usage_counters (day, session, {COUNTS}) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (day, session) DO UPDATE SET "
            "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = completion_tokens + excluded.completion_tokens, "
            "cached_tokens = cached_tokens + excluded.cached_tokens, "
            "total_tokens = total_tokens + excluded.total_tokens",
            (day, session, *row[2:]),
        )
        added += t.total
    return added


class UsageLedger:
    """Read, add to, reset and prune the usage counters (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        """Count into ``db``."""
        self._db = db

    async def add(self, day: str, session: str, by_model: Mapping[str, Tokens]) -> int:
        """Count tokens spent outside any run record; returns the total added."""
        day, session = check_day(day), check_session(session)

        def write(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                return add_counts(conn, day, session, by_model)

        return await self._db.run(write)

    async def used(self, day: str, session: str | None = None) -> int:
        """Total tokens counted on ``day`` by ``session`` (None: by all sessions)."""
        day = check_day(day)
        sql = "SELECT SUM(total_tokens) FROM usage_counters WHERE day = ?"
        args: tuple[str, ...] = (day,)
        if session is not None:
            sql, args = sql + " AND session = ?", (day, check_session(session))

        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute(sql, args).fetchone()
            return int(row[0] or 0) if row else 0

        return await self._db.run(read)

    async def sessions(self, since: str, until: str | None = None) -> list[DayCount]:
        """Per-session counters of days ``since <= day <= until``, by day then most used."""
        return await self._rows("usage_counters", "session", since, until)

    async def daily(self, since: str, until: str | None = None) -> list[DayCount]:
        """Per-model totals of days ``since <= day <= until``, by day then most used."""
        return await self._rows("usage_daily", "model", since, until)

    async def reset(self, day: str, session: str | None = None) -> int:
        """Zero the counter of ``session`` (None: every session) for ``day``; returns the tokens.

        The daily totals are kept: a reset lifts a limit, it does not rewrite history.
        """
        day = check_day(day)
        where, args = "day = ?", [day]
        if session is not None:
            where, args = "day = ? AND session = ?", [day, check_session(session)]

        def write(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                row = conn.execute(
                    f"SELECT SUM(total_tokens) FROM usage_counters WHERE {where}", args
                ).fetchone()
                conn.execute(f"DELETE FROM usage_counters WHERE {where}", args)
            return int(row[0] or 0)

        return await self._db.run(write)

    async def prune(self, before: str) -> int:
        """Delete per-session counters of days before ``before``; returns how many rows."""
        before = check_day(before)

        def write(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                return conn.execute("DELETE FROM usage_counters WHERE day < ?", (before,)).rowcount

        return await self._db.run(write)

    async def counted(self, day: str) -> int:
        """What the run records closed on ``day`` counted (``runs.counted_tokens``)."""
        day = check_day(day)

        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT SUM(counted_tokens) FROM runs WHERE usage_day = ?", (day,)
            ).fetchone()
            return int(row[0] or 0)

        return await self._db.run(read)

    async def _rows(self, table: str, key: str, since: str, until: str | None) -> list[DayCount]:
        since = check_day(since)
        until = check_day(until) if until is not None else "9999-12-31"
        sql = (
            f"SELECT day, {key}, {COUNTS} FROM {table} WHERE day >= ? AND day <= ? "
            "ORDER BY day, total_tokens DESC, " + key
        )

        def read(conn: sqlite3.Connection) -> list[DayCount]:
            return [DayCount(*row) for row in conn.execute(sql, (since, until))]

        return await self._db.run(read)
