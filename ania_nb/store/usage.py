"""Usage accounting: a ledger of model calls, and the counters the quotas read.

Every answered model call is one row of ``usage_ledger`` (day, session, run, model, tokens),
written in the transaction of the journal step that stores the call's result (see
``journal.py``), so a crash loses at most the call in flight. The same transaction adds the
row to two materialisations: ``usage_counters`` (tokens per quota day and session: what limits
check, one indexed row per check) and ``usage_daily`` (per day and model: the usage plot's
history, kept after the ledger and the counters are pruned). For every day kept,
``SUM(usage_ledger) == usage_counters`` per session, whatever the run log keeps: a reset is a
``reset`` row taking the counter back to zero, pruning drops a day's ledger rows with its
counters, and a store counted before the ledger existed carries each counter over as one
``carried`` row (the ledger's migration step). A *day* is an ISO date string chosen by the
caller (the quota's time zone), which keeps this module free of clocks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ania_nb.errors import UsageError

from .db import transaction
from .history import check_session

if TYPE_CHECKING:
    from .db import Conn, Database

COUNTS = "prompt_tokens, completion_tokens, cached_tokens, total_tokens"
# One atomic upsert per counter row: concurrent adds from many processes never lose one.
_ADD = (
    "ON CONFLICT ({key}) DO UPDATE SET "
    "prompt_tokens = {table}.prompt_tokens + excluded.prompt_tokens, "
    "completion_tokens = {table}.completion_tokens + excluded.completion_tokens, "
    "cached_tokens = {table}.cached_tokens + excluded.cached_tokens, "
    "total_tokens = {table}.total_tokens + excluded.total_tokens"
)

_LEDGER = (
    f"INSERT INTO usage_ledger (day, session, run_id, model, kind, {COUNTS}, at) "
    "VALUES (?, ?, ?, ?, 'call', ?, ?, ?, ?, ?)"
)
_DAILY = f"INSERT INTO usage_daily (day, model, {COUNTS}) VALUES (?, ?, ?, ?, ?, ?) " + _ADD.format(
    key="day, model", table="usage_daily"
)
_COUNTER = (
    f"INSERT INTO usage_counters (day, session, {COUNTS}) VALUES (?, ?, ?, ?, ?, ?) "
    + _ADD.format(key="day, session", table="usage_counters")
)


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


Call = tuple[str, Tokens]
"""One answered model call: ``(model, tokens)``."""


def as_calls(counted: Mapping[str, Tokens] | Sequence[Call]) -> list[Call]:
    """``counted`` as calls: a mapping by model (totals of some calls) is one call per model."""
    if isinstance(counted, Mapping):
        return list(counted.items())
    return list(counted)


async def add_counts(
    conn: Conn,
    day: str,
    session: str,
    calls: Sequence[Call],
    *,
    run_id: int | None = None,
    now: float | None = None,
) -> int:
    """Write one ledger row per call and add it to the day's counters; returns the total added.

    Runs inside the caller's transaction (deferred: see `Conn.defer`). Calls that used no
    tokens leave no row.
    """
    at = time.time() if now is None else now
    for model, t in calls:
        if not _uses_tokens(t):
            continue
        counts = (t.prompt, t.completion, t.cached, t.total)
        params: tuple[object, ...] = (day, session, run_id, model, *counts, at)
        params += (day, model, *counts, day, session, *counts)
        if conn.dialect.name == "postgres":
            # The three writes as one statement (one round trip): data-modifying WITH clauses.
            await conn.defer(f"WITH ledger AS ({_LEDGER}), daily AS ({_DAILY}) {_COUNTER}", params)
        else:
            await conn.defer(_LEDGER, params[:9])
            await conn.defer(_DAILY, params[9:15])
            await conn.defer(_COUNTER, params[15:])
    return counted_total(calls)


def counted_total(calls: Sequence[Call]) -> int:
    """The tokens `add_counts` adds for ``calls`` (what the run record notes as counted)."""
    return sum(t.total for _, t in calls if _uses_tokens(t))


async def _model_total(conn: Conn, day: str, model: str) -> int:
    """Everyone's tokens of ``model`` on ``day``, each session's since its last reset that day.

    The model's day total (one ``usage_daily`` row) less what the sessions reset that day had
    used of it before their reset: those are found from the reset rows, few, so the day's
    calls are not summed one by one.
    """
    total = await conn.fetchval(
        "SELECT total_tokens FROM usage_daily WHERE day = ? AND model = ?", (day, model)
    )
    resets = await conn.fetchall(
        "SELECT session, MAX(at) FROM usage_ledger WHERE day = ? AND kind = 'reset' "
        "GROUP BY session",
        (day,),
    )
    before = 0
    for session, at in resets:
        used = await conn.fetchval(
            "SELECT SUM(total_tokens) FROM usage_ledger WHERE day = ? AND session = ? "
            "AND model = ? AND kind = 'call' AND at <= ?",
            (day, session, model, at),
        )
        before += int(used or 0)
    return int(total or 0) - before


def _uses_tokens(t: Tokens) -> bool:
    """Whether a call used any tokens (a call that used none leaves no ledger row)."""
    return bool(t.total or t.prompt or t.completion or t.cached)


class UsageLedger:
    """Read, add to, reset and prune the usage counters (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        """Count into ``db``."""
        self._db = db

    async def add(
        self, day: str, session: str, counted: Mapping[str, Tokens] | Sequence[Call]
    ) -> int:
        """Count tokens spent outside any run record (by model, or call by call); the total."""
        day, session = check_day(day), check_session(session)
        calls = as_calls(counted)

        async def write(conn: Conn) -> int:
            async with transaction(conn):
                return await add_counts(conn, day, session, calls)

        return await self._db.run(write)

    async def used(self, day: str, session: str | None = None) -> int:
        """Total tokens counted on ``day`` by ``session`` (None: by all sessions)."""
        day = check_day(day)
        sql = "SELECT SUM(total_tokens) FROM usage_counters WHERE day = ?"
        args: tuple[str, ...] = (day,)
        if session is not None:
            sql, args = sql + " AND session = ?", (day, check_session(session))

        async def read(conn: Conn) -> int:
            row = await conn.fetchone(sql, args)
            return int(row[0] or 0) if row else 0

        return await self._db.run(read)

    async def used_by_model(self, day: str, model: str, session: str | None = None) -> int:
        """Tokens ``model`` answered on ``day`` for ``session`` (None: all sessions).

        Counted from the ledger's calls since each session's last reset that day, so a reset
        lifts this limit too, like the counters'.
        """
        day = check_day(day)
        if session is None:
            return await self._db.run(lambda conn: _model_total(conn, day, model))
        session = check_session(session)
        # The session's last reset of the day first (few rows), then its calls after it.
        sql = (
            "SELECT SUM(total_tokens) FROM usage_ledger WHERE day = ? AND session = ? "
            "AND model = ? AND kind = 'call' AND at > COALESCE((SELECT MAX(at) FROM usage_ledger "
            "WHERE day = ? AND session = ? AND kind = 'reset'), 0)"
        )
        args = (day, session, model, day, session)

        async def read(conn: Conn) -> int:
            total = await conn.fetchval(sql, args)
            return int(total or 0)

        return await self._db.run(read)

    async def models(self, day: str, session: str | None = None) -> list[DayCount]:
        """Tokens by model on ``day``, most used first: everyone's, or ``session``'s.

        Resets do not take them back: this is what was used, not what the limits count.
        """
        day = check_day(day)
        if session is None:
            return await self.daily(day, day)
        counts = ", ".join(f"CAST(SUM({c}) AS BIGINT) AS {c}" for c in COUNTS.split(", "))
        sql = (
            f"SELECT day, model, {counts} FROM usage_ledger WHERE day = ? AND session = ? "
            "AND kind = 'call' GROUP BY day, model ORDER BY total_tokens DESC, model"
        )
        args = (day, check_session(session))

        async def read(conn: Conn) -> list[DayCount]:
            return [DayCount(*row) for row in await conn.fetchall(sql, args)]

        return await self._db.run(read)

    async def sessions(self, since: str, until: str | None = None) -> list[DayCount]:
        """Per-session counters of days ``since <= day <= until``, by day then most used."""
        return await self._rows("usage_counters", "session", since, until)

    async def daily(self, since: str, until: str | None = None) -> list[DayCount]:
        """Per-model totals of days ``since <= day <= until``, by day then most used."""
        return await self._rows("usage_daily", "model", since, until)

    async def ledger(self, since: str, until: str | None = None) -> list[DayCount]:
        """The ledger summed per day and session, shaped and ordered like `sessions`.

        Equal to `sessions` for every day kept (the counters are its materialisation).
        """
        return await self._rows("usage_ledger", "session", since, until, grouped=True)

    async def reset(self, day: str, session: str | None = None) -> int:
        """Zero the counter of ``session`` (None: every session) for ``day``; returns the tokens.

        The daily totals are kept: a reset lifts a limit, it does not rewrite history.
        """
        day = check_day(day)
        where, args = "day = ?", [day]
        if session is not None:
            where, args = "day = ? AND session = ?", [day, check_session(session)]

        async def write(conn: Conn) -> int:
            async with transaction(conn):
                # The ledger keeps the calls and takes the counters back to zero.
                await conn.execute(
                    f"INSERT INTO usage_ledger (day, session, kind, {COUNTS}, at) "
                    "SELECT day, session, 'reset', -prompt_tokens, -completion_tokens, "
                    f"-cached_tokens, -total_tokens, ? FROM usage_counters WHERE {where}",
                    [time.time(), *args],
                )
                total = await conn.fetchval(
                    f"SELECT SUM(total_tokens) FROM usage_counters WHERE {where}", args
                )
                await conn.execute(f"DELETE FROM usage_counters WHERE {where}", args)
            return int(total or 0)

        return await self._db.run(write)

    async def prune(self, before: str) -> int:
        """Delete per-session counters (and their ledger rows) of days before ``before``.

        Returns how many counters; the daily totals per model are kept.
        """
        before = check_day(before)

        async def write(conn: Conn) -> int:
            async with transaction(conn):
                await conn.execute("DELETE FROM usage_ledger WHERE day < ?", (before,))
                return await conn.execute("DELETE FROM usage_counters WHERE day < ?", (before,))

        return await self._db.run(write)

    async def counted(self, day: str) -> int:
        """What the run records noted as counted on ``day`` (``runs.counted_tokens``)."""
        day = check_day(day)

        async def read(conn: Conn) -> int:
            total = await conn.fetchval(
                "SELECT SUM(counted_tokens) FROM runs WHERE usage_day = ?", (day,)
            )
            return int(total or 0)

        return await self._db.run(read)

    async def _rows(
        self, table: str, key: str, since: str, until: str | None, *, grouped: bool = False
    ) -> list[DayCount]:
        since = check_day(since)
        until = check_day(until) if until is not None else "9999-12-31"
        counts = COUNTS
        group = ""
        if grouped:  # the ledger: sum its rows; a day and session summing to nothing has none
            # CAST: PostgreSQL sums integers as numeric.
            counts = ", ".join(f"CAST(SUM({c}) AS BIGINT) AS {c}" for c in COUNTS.split(", "))
            group = (
                f" GROUP BY day, {key} HAVING SUM(prompt_tokens) <> 0 "
                "OR SUM(completion_tokens) <> 0 OR SUM(cached_tokens) <> 0 "
                "OR SUM(total_tokens) <> 0"
            )
        sql = (
            f"SELECT day, {key}, {counts} FROM {table} WHERE day >= ? AND day <= ?{group} "
            "ORDER BY day, total_tokens DESC, " + key
        )

        async def read(conn: Conn) -> list[DayCount]:
            return [DayCount(*row) for row in await conn.fetchall(sql, (since, until))]

        return await self._db.run(read)
