"""`Quota`: daily token limits checked before work, against counters kept by the usage ledger.

Semantics are *check, then add*: a run, clock run, subagent launch or team run is refused when
the session's or everyone's tokens counted today have reached a limit; a run that starts under
the limit may finish over it (each call's tokens are counted with the step that stores its
result, so a crash loses at most the call in flight, and nothing depends on how many run
records are kept). Counting is on
whenever ``quota.enable`` is, limits or not; a day starts at midnight in ``quota.timezone``.

With ``quota.fallback_model`` set, a used-up limit does not refuse work: `fallback` says that
the run goes on with that model, under its own optional limits (``quota.fallback_daily_tokens``
per session, ``quota.fallback_global_daily_tokens`` for everyone, counted from the ledger's
calls of that model); only when those are used up too does `check` refuse. The first reply of
a session each day that the fallback model answers carries ``quota.fallback_notice``
(remembered in the store's ``quota_notices`` namespace, so a restart does not repeat it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from ..catalogue import language_for, say
from ..engine.usage import Tokens, Usage
from .days import day_of, days_back, describe_wait, next_midnight, zone
from .pricing import cost, usage_cost
from .report import DayUsage, ModelUsage, SessionUsage, UsageReport

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..store import DayCount, Store

log = logging.getLogger(__name__)

Clock = Callable[[], float]


NOTICES_NAMESPACE = "quota_notices"  # "<day>|<session>": the fallback notice was given


@dataclass(frozen=True)
class Denial:
    """Why work was refused: which limit, how much is used, and when it resets.

    ``model`` is set when the limit of ``quota.fallback_model`` refused (the quota's own limit
    was used up before).
    """

    scope: Literal["session", "global"]
    session: str
    limit: int
    used: int
    resets_at: datetime
    message: str
    model: str = ""


@dataclass(frozen=True)
class Fallback:
    """A run goes on with ``model`` because ``exhausted`` is used up (see `Quota.fallback`).

    ``notice`` is the text the reply starts with ("" when the session had it today already);
    ``day`` is the quota day it is remembered for (`Quota.noticed`).
    """

    model: str
    exhausted: Denial
    notice: str
    day: str


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
        """A `Denial` if ``session`` or all sessions reached today's limit, else None.

        With ``quota.fallback_model``, a used-up limit refuses only once the fallback model's
        own limits are used up too.
        """
        exhausted = await self._exhausted(session)
        if exhausted is None or not self._settings().quota.fallback_model:
            return exhausted
        return await self._fallback_denial(session, exhausted)

    async def fallback(self, session: str) -> Fallback | None:
        """The quota fallback a run of ``session`` starting now uses, None: the usual model.

        None too without ``quota.fallback_model``. A run admitted by `check` goes on with the
        fallback even if its limits were reached meanwhile (check, then add).
        """
        settings = self._settings().quota
        if not settings.fallback_model:
            return None
        exhausted = await self._exhausted(session)
        if exhausted is None:
            return None
        day = self.today()
        notice = ""
        if settings.fallback_notice != "":
            kv = (await self._open_store()).kv(NOTICES_NAMESPACE)
            if not await kv.get(_notice_key(day, session)):
                resets = self.resets_at()
                zone_name = settings.timezone or resets.tzname() or "local time"
                fields = {"model": settings.fallback_model, "resets": f"{resets:%H:%M} {zone_name}"}
                if settings.fallback_notice is None:  # the built-in text, in the chat's language
                    language = language_for(self._settings().ui.language, session)
                    notice = say("notice.quota_fallback", language, **fields)
                else:
                    notice = settings.fallback_notice.format(**fields)
        return Fallback(settings.fallback_model, exhausted, notice, day)

    async def noticed(self, session: str, fallback: Fallback) -> None:
        """Remember that ``session`` got the fallback's notice on its day (once per day)."""
        kv = (await self._open_store()).kv(NOTICES_NAMESPACE)
        await kv.set(_notice_key(fallback.day, session), True)

    async def _exhausted(self, session: str) -> Denial | None:
        """The quota's own limit ``session`` (or everyone) reached today, if any."""
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

    async def _fallback_denial(self, session: str, exhausted: Denial) -> Denial | None:
        """A `Denial` when the fallback model's own limit is used up too, else None."""
        settings = self._settings().quota
        model = settings.fallback_model
        ledger = (await self._open_store()).usage
        day = self.today()
        limits: list[tuple[Literal["session", "global"], int, str | None]] = [
            ("session", settings.fallback_daily_tokens, session),
            ("global", settings.fallback_global_daily_tokens, None),
        ]
        for scope, limit, who in limits:
            if not limit:
                continue
            used = await ledger.used_by_model(day, model, who)
            if used >= limit:
                per = "per session per day" if scope == "session" else "per day for everyone"
                also = f"and so is the fallback model's ({model}: {used:,} of {limit:,} {per})"
                return self._denial(
                    scope, session, limit, used, model=model, also=also, first=exhausted
                )
        return None

    def _denial(
        self,
        scope: Literal["session", "global"],
        session: str,
        limit: int,
        used: int,
        *,
        model: str = "",
        also: str = "",
        first: Denial | None = None,
    ) -> Denial:
        resets = self.resets_at()
        wait = describe_wait(resets.timestamp() - self.now())
        zone_name = self._settings().quota.timezone or resets.tzname() or "local time"
        if first is not None:  # the fallback's limit, after the quota's own
            what = f"{_what(first.scope, first.used, first.limit)}, {also}"
        else:
            what = _what(scope, used, limit)
        message = f"{what}; it resets at {resets:%H:%M} {zone_name} (in {wait})"
        return Denial(scope, session, limit, used, resets, message, model)

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
        today = self.today()
        oldest = (date.fromisoformat(today) - timedelta(days=keep - 1)).isoformat()
        store = await self._open_store()
        notices = store.kv(NOTICES_NAMESPACE)
        for key in await notices.keys():  # only today's notices matter
            if key.split("|", 1)[0] < today:
                await notices.delete(key)
        return await store.usage.prune(oldest)

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
        """Count tokens spent outside any run record (an embeddings endpoint, a lost record)."""
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
        fallback = settings.fallback_model
        roles = model_roles(config)
        models = [
            ModelUsage(r.key, r.prompt, r.completion, r.cached, r.total, roles.get(r.key, ""))
            for r in await ledger.models(today, session)
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
            models=models,
            fallback_model=fallback,
            fallback_limit=settings.fallback_daily_tokens,
            fallback_global_limit=settings.fallback_global_daily_tokens,
            fallback_used=await ledger.used_by_model(today, fallback, session) if fallback else 0,
            embeddings=embeddings_note(config),
        )


def model_roles(config: Config) -> dict[str, str]:
    """What each configured model is for, by name (the first role named wins)."""
    roles: dict[str, str] = {}
    named = [
        (config.quota.fallback_model, "quota fallback"),
        (config.llm.model, "main"),
        (config.fallback.model, "fallback on errors"),
        (config.compressor.model, "compressor"),
        (config.subagent.model, "subagents"),
        (config.vision.model, "vision"),
    ]
    if config.embedding.provider == "endpoint":
        named.insert(0, (config.embedding.model, "embeddings"))
    for model, role in named:
        if model.strip():
            roles.setdefault(model.strip(), role)
    return roles


def embeddings_note(config: Config) -> str:
    """What the embedder of the kb and memory costs, in words."""
    settings = config.embedding
    if settings.provider == "offline":
        return "the offline embedder runs on this machine: no tokens, no cost"
    if settings.provider == "none":
        return "none (full-text search only): no tokens, no cost"
    endpoint = settings.resolved(config.llm)
    host = urlsplit(endpoint.base_url).netloc or endpoint.base_url or "the main endpoint"
    return f"{endpoint.model} at {host}: its tokens count toward the quotas"


def _what(scope: str, used: int, limit: int) -> str:
    """Which of the quota's own limits is used up, in words."""
    if scope == "session":
        return (
            f"today's token quota of this session is used up ({used:,} of {limit:,} tokens per "
            "session per day)"
        )
    return (
        f"today's token quota of all sessions is used up ({used:,} of {limit:,} tokens per day "
        "for everyone)"
    )


def _notice_key(day: str, session: str) -> str:
    return f"{day}|{session}"


def _tokens(row: DayCount) -> Tokens:
    return Tokens(row.prompt, row.completion, row.cached, row.total)
