"""`UsageReport`: what the usage views show, as plain data, and its plain-text table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.usage import Tokens


@dataclass(frozen=True)
class SessionUsage:
    """One session's tokens today and its daily limit (0 = unlimited)."""

    session: str
    prompt: int
    completion: int
    cached: int
    total: int
    limit: int = 0

    @property
    def share(self) -> float | None:
        """Used / limit (may exceed 1: check, then add), None without a limit."""
        return self.total / self.limit if self.limit else None


@dataclass(frozen=True)
class DayUsage:
    """One day's tokens (all sessions, or one) and their cost when every model is priced."""

    day: str
    prompt: int = 0
    completion: int = 0
    cached: int = 0
    total: int = 0
    cost: float | None = None
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, day: str, by_model: Mapping[str, Tokens], cost: float | None) -> DayUsage:
        """Sum ``by_model`` into one day."""
        return cls(
            day,
            sum(t.prompt for t in by_model.values()),
            sum(t.completion for t in by_model.values()),
            sum(t.cached for t in by_model.values()),
            sum(t.total for t in by_model.values()),
            cost,
            tuple(m for m in by_model if m),
        )


@dataclass(frozen=True)
class ModelUsage:
    """One model's tokens today and what it is used for (``role``: main, quota fallback, …)."""

    model: str
    prompt: int = 0
    completion: int = 0
    cached: int = 0
    total: int = 0
    role: str = ""


@dataclass(frozen=True)
class UsageReport:
    """Today's usage per session against the limits, and daily totals (oldest first)."""

    today: str
    timezone: str
    resets_at: datetime
    enabled: bool
    session_limit: int
    global_limit: int
    global_used: int
    sessions: list[SessionUsage] = field(default_factory=list)
    days: list[DayUsage] = field(default_factory=list)
    session: str | None = None  # the days are this session's
    currency: str = "$"
    models: list[ModelUsage] = field(default_factory=list)  # today's, most used first
    fallback_model: str = ""  # quota.fallback_model ("" = none: used-up limits refuse)
    fallback_limit: int = 0  # its tokens per session per day (0 = unlimited)
    fallback_global_limit: int = 0  # its tokens per day for everyone (0 = unlimited)
    fallback_used: int = 0  # its tokens today: the session's, or everyone's
    embeddings: str = ""  # what the embedder costs, in words

    def to_text(self) -> str:
        """The report as a plain-text table (terminals, and notebooks without widgets)."""
        resets = f"{self.resets_at:%H:%M}"
        lines = [f"Usage on {self.today} ({self.timezone}); the day resets at {resets}"]
        if not self.enabled:
            lines.append("quota.enable is off: nothing is counted or limited")
        limit = f"{self.global_limit:,}" if self.global_limit else "unlimited"
        lines.append(f"All sessions today: {self.global_used:,} tokens (limit {limit})")
        if self.sessions:
            lines.append("")
            rows = [
                (
                    s.session,
                    f"{s.total:,}",
                    f"{s.limit:,}" if s.limit else "-",
                    f"{s.share:.0%}" if s.share is not None else "-",
                    f"{s.prompt:,}",
                    f"{s.completion:,}",
                    f"{s.cached:,}",
                )
                for s in self.sessions
            ]
            lines += _table(
                ("session", "tokens", "limit", "used", "prompt", "completion", "cached"), rows
            )
        who = f"session {self.session}" if self.session else "all sessions"
        if self.models:
            lines += ["", f"Models today, {who}:"]
            by_model = [
                (
                    f"{m.model or '(unnamed)'} ({m.role})" if m.role else m.model or "(unnamed)",
                    f"{m.total:,}",
                    f"{m.prompt:,}",
                    f"{m.completion:,}",
                    f"{m.cached:,}",
                )
                for m in self.models
            ]
            lines += _table(("model", "tokens", "prompt", "completion", "cached"), by_model)
        notes = [self.fallback_text(), f"Embeddings: {self.embeddings}" if self.embeddings else ""]
        if any(notes):
            lines += ["", *(n for n in notes if n)]
        lines += ["", f"Daily tokens, {who}, last {len(self.days)} days:"]
        priced = any(d.cost is not None for d in self.days)
        rows = [
            (
                d.day,
                f"{d.total:,}",
                f"{d.prompt:,}",
                f"{d.completion:,}",
                f"{d.cached:,}",
                *((_money(d.cost, self.currency),) if priced else ()),
            )
            for d in self.days
        ]
        header = ("day", "tokens", "prompt", "completion", "cached")
        lines += _table((*header, "cost") if priced else header, rows)
        return "\n".join(lines)

    def fallback_text(self) -> str:
        """The quota fallback in one line ('' without ``quota.fallback_model``)."""
        if not self.fallback_model:
            return ""
        limits = ", ".join(
            (
                _limit_words(self.fallback_limit, "per session"),
                _limit_words(self.fallback_global_limit, "for everyone"),
            )
        )
        who = f"session {self.session}" if self.session else "all sessions"
        return (
            f"Quota fallback: {self.fallback_model} answers once a limit is used up (its own "
            f"limits per day: {limits}); {self.fallback_used:,} tokens today in {who}"
        )


def _limit_words(limit: int, per: str) -> str:
    return f"{limit:,} tokens {per}" if limit else f"no limit {per}"


def _money(value: float | None, currency: str) -> str:
    return "-" if value is None else f"{currency}{value:,.4f}"


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Aligned columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return [line(header), *(line(r) for r in rows)]
