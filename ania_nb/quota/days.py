"""Quota days: the calendar date in the quota's time zone, and when the next one starts."""

from __future__ import annotations

from datetime import date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo


def zone(name: str) -> tzinfo | None:
    """The time zone called ``name`` (validated by the config); None = the machine's local time."""
    return ZoneInfo(name) if name else None


def local(at: float, tz: tzinfo | None) -> datetime:
    """The aware datetime of the epoch time ``at`` in ``tz`` (None: local time)."""
    moment = datetime.fromtimestamp(at, tz)
    return moment if tz is not None else moment.astimezone()


def day_of(at: float, tz: tzinfo | None) -> str:
    """The quota day (ISO date) of the epoch time ``at``."""
    return local(at, tz).date().isoformat()


def next_midnight(at: float, tz: tzinfo | None) -> datetime:
    """When the quota day after the one holding ``at`` starts (aware)."""
    moment = local(at, tz)
    tomorrow = moment.date() + timedelta(days=1)
    start = datetime(tomorrow.year, tomorrow.month, tomorrow.day, tzinfo=moment.tzinfo)
    if tz is None:  # the machine's zone: let it pick the offset valid at that midnight
        start = datetime(tomorrow.year, tomorrow.month, tomorrow.day).astimezone()
    return start


def days_back(day: str, count: int) -> list[str]:
    """The ``count`` days ending with ``day``, oldest first."""
    last = date.fromisoformat(day)
    return [(last - timedelta(days=n)).isoformat() for n in range(count - 1, -1, -1)]


def describe_wait(seconds: float) -> str:
    """A short duration like ``5 h 12 min`` or ``40 s``."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes = rest // 60
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min"
    return f"{seconds} s"
