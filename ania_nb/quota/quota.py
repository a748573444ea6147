"""`Quota`: daily token limits checked before work, against counters kept by the usage ledger.

Semantics are *check, then add*: a run, clock run, subagent launch or team run is refused when
the session's or everyone's tokens counted today have reached a limit; a run that starts under
the limit may finish over it (each call's tokens are counted with the step that stores its
result, so a crash loses at most the call in flight, and nothing depends on how many run
records are kept). Counting is on
whenever ``quota.enable`` is, limits or not; a day starts at midnight in ``quota.timezone``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from ..engine.usage import Tokens, Usage
from .days import day_of, days_back, describe_wait, next_midnight, zone
from .pricing import cost, usage_cost
from .report import DayUsage, SessionUsage, UsageReport

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..store import DayCount, Store

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class Denial:
    """Why work was refused: which limit, how much is used, and when it resets."""

    scope: Literal["session", "global"]
    session: str
    limit: int
    used: int
    resets_at: datetime
    message: str


class Quota:
    """Checks, counts, resets and reports token usage (see the module docstring).

    ``settings`` returns the current config (limits may change while running); ``open_store``
    opens the agent's store; ``now`` is the clock (tests inject one to roll the date over).
    """

    def __init__(
        self,
        settings: Callable[[], Config],
        open_store: Callable[[], Awaitable[Store]],
        *,
        now: Clock = time.time,
    ) -> None:
        self._settings = settings
        self._open_store = open_store
        self.now = now

    @property
    def enabled(self) -> bool:
        """Whether tokens are counted (and limits apply)."""
        return self._settings().quota.enable

    def today(self) -> str:
        """The current quota day (ISO date in ``quota.timezone``)."""
        return day_of(self.now(), zone(self._settings().quota.timezone))

    def counting_day(self) -> str | None:
        """The day a finishing run counts on, None while counting is off."""
        return self.today() if self.enabled else None

    def resets_at(self) -> datetime:
        """When the current quota day ends."""
        return next_midnight(self.now(), zone(self._settings().quota.timezone))

    async def check(self, session: str) -> Denial | None:
        """A `Denial` if ``session`` or all sessions reached today's limit, else None."""
        settings = self._settings().quota
        if not settings.enable or not (settings.daily_tokens or settings.global_daily_tokens):
            return None
        ledger = (await self._open_store()).usage
        day = self.today()
        if settings.daily_tokens:
            used = await ledger.used(day, session)
            if used >= settings.daily_tokens:
                return self._denial("session", session, settings.daily_tokens, used)
        if settings.global_daily_tokens:
            used = await ledger.used(day)
            if used >= settings.global_daily_tokens:
                return self._denial("global", session, settings.global_daily_tokens, used)
        return None

    def _denial(
        self, scope: Literal["session", "global"], session: str, limit: int, used: int
    ) -> Denial:
        resets = self.resets_at()
        wait = describe_wait(resets.timestamp() - self.now())
        zone_name = self._settings().quota.timezone or resets.tzname() or "local time"
        what = (
            f"today's token quota of this session is used up ({used:,} of {limit:,} tokens per "
            "session per day)"
            if scope == "session"
            else f"today's token quota of all sessions is used up ({used:,} of {limit:,} tokens "
            "per day for everyone)"
        )
        message = f"{what}; it resets at {resets:%H:%M} {zone_name} (in {wait})"
        return Denial(scope, session, limit, used, resets, message)

    def cost(self, usage: Usage) -> float | None:
        """The cost of ``usage`` at the configured prices (None when any model is unpriced)."""
        return usage_cost(usage, self._settings().pricing.models)

    async def reset(self, session: str | None = None, *, actor: str | None = None) -> int:
        """Zero today's counter of ``session`` (None: every session); logged to the op log.

        Returns the tokens that were counted. The daily totals (history) are kept.
        """
        store = await self._open_store()
        day = self.today()
        cleared = await store.usage.reset(day, session)
        who = session if session is not None else "all sessions"
        await store.oplog.add(
            "quota",
            "reset",
            actor=actor,
            session=session,
            detail=f"reset {who} for {day}: {cleared:,} tokens cleared",
        )
        log.info("quota reset of %s for %s by %s (%d tokens)", who, day, actor or "?", cleared)
        return cleared

    async def prune(self) -> int:
        """Delete per-session counters older than ``quota.retention_days``; returns the rows."""
        keep = self._settings().quota.retention_days
        oldest = (date.fromisoformat(self.today()) - timedelta(days=keep - 1)).isoformat()
        return await (await self._open_store()).usage.prune(oldest)

    async def prune_at_start(self) -> None:
        """`prune`, logged; a failure only delays it (the agent opens regardless)."""
        try:
            pruned = await self.prune()
        except Exception:
            log.exception("could not prune old usage counters")
        else:
            if pruned:
                log.info("pruned %d usage counters older than quota.retention_days", pruned)

    async def add(self, session: str, by_model: dict[str, Tokens]) -> int:
        """Count tokens spent outside any run record (rare: the record could not be written)."""
        day = self.counting_day()
        if day is None:
            return 0
        return await (await self._open_store()).usage.add(day, session, by_model)

    async def report(self, days: int = 14, session: str | None = None) -> UsageReport:
        """Today's usage per session against the limits and the last ``days`` days' totals.

        With ``session``, the days are that session's (kept ``quota.retention_days``) and have
        no cost (its counters are not split by model).
        """
        if days < 1:
            raise ValueError(f"days must be at least 1, got {days}")
        config = self._settings()
        settings = config.quota
        ledger = (await self._open_store()).usage
        today = self.today()
        span = days_back(today, days)
        current = await ledger.sessions(today, today)
        sessions = [
            SessionUsage(c.key, c.prompt, c.completion, c.cached, c.total, settings.daily_tokens)
            for c in current
            if session is None or c.key == session
        ]
        totals: dict[str, dict[str, Tokens]] = {d: {} for d in span}
        if session is None:
            for row in await ledger.daily(span[0], today):
                totals[row.day][row.key] = _tokens(row)
        else:
            for row in await ledger.sessions(span[0], today):
                if row.key == session:
                    totals[row.day][""] = _tokens(row)
        prices = config.pricing.models
        resets = self.resets_at()
        history = [
            DayUsage.of(day, by_model, None if session is not None else cost(by_model, prices))
            for day, by_model in totals.items()
        ]
        return UsageReport(
            today=today,
            timezone=settings.timezone or (resets.tzname() or "local"),
            resets_at=resets,
            enabled=settings.enable,
            session_limit=settings.daily_tokens,
            global_limit=settings.global_daily_tokens,
            global_used=sum(c.total for c in current),
            sessions=sessions,
            days=history,
            session=session,
            currency=config.pricing.currency,
        )


def _tokens(row: DayCount) -> Tokens:
    return Tokens(row.prompt, row.completion, row.cached, row.total)
