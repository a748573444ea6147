"""Schedules: the cron dialect of the original (robfig/cron's standard parser) on APScheduler 3.

Accepted: five fields (minute hour day-of-month month day-of-week, crontab meaning: 0 and 7 are
Sunday, and a day restricted in both day fields matches when *either* matches), the descriptors
``@hourly @daily @midnight @weekly @monthly @yearly @annually``, ``@every <duration>`` (Go
duration: ``90s``, ``1h30m``, ``1.5h``; at least one second) and an optional ``CRON_TZ=<zone>`` or
``TZ=<zone>`` prefix. Without a prefix, local time.

APScheduler's ``CronTrigger.from_crontab`` numbers weekdays from Monday (its documented 3.x
quirk) and ANDs the two day fields, so both are translated here rather than passed through.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .model import ClockError

if TYPE_CHECKING:  # pragma: no cover
    from apscheduler.triggers.base import BaseTrigger

EXAMPLES = (
    "examples: '0 9 * * 1-5' (09:00 Monday to Friday), '*/15 * * * *' (every 15 minutes), "
    "'@daily', '@every 1h30m', 'CRON_TZ=Asia/Shanghai 0 8 * * *'"
)
DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
# Crontab weekday numbers (0 = Sunday, 7 = Sunday again) → APScheduler's names.
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: the cron text as given, its time zone and how to compute fire times.

    ``every`` is the period in seconds of an ``@every`` schedule (None for cron ones).
    """

    text: str
    timezone: tzinfo
    every: float | None = None
    crontab: str = ""  # the five fields (descriptor expanded, prefix removed)
    # Built once while parsing; cron triggers hold no state, so jobs may share one.
    cron_trigger: BaseTrigger | None = field(default=None, compare=False, repr=False)

    def trigger(self, first: float | None = None) -> BaseTrigger:
        """An APScheduler trigger; ``first`` anchors an ``@every`` period (default: now + it)."""
        from apscheduler.triggers.interval import IntervalTrigger

        if self.every is not None:
            start = None
            if first is not None:
                start = datetime.fromtimestamp(first, self.timezone)
            return IntervalTrigger(seconds=self.every, start_date=start, timezone=self.timezone)
        assert self.cron_trigger is not None
        return self.cron_trigger

    def next_fire(self, after: float | None = None, *, first: float | None = None) -> float | None:
        """The first fire time after ``after`` (default now), as epoch seconds."""
        # Strictly after: a fire time equal to ``after`` (the one just fired) does not count.
        start = (time.time() if after is None else after) + 0.001
        now = datetime.fromtimestamp(start, self.timezone)
        if self.every is not None and first is None:
            return start - 0.001 + self.every
        fire = self.trigger(first).get_next_fire_time(None, now)
        return None if fire is None else fire.timestamp()

    def missed(self, since: float, now: float | None = None) -> tuple[float, float] | None:
        """The oldest and newest fire times from ``since`` (a fire time) up to ``now``, or None.

        What passed unfired while no process held the clock, ``since`` being the task's stored
        next fire time. Cron schedules are scanned for at most `MISSED_SCAN` fire times (the
        newest found stands for the rest); times are to the millisecond, as the clock keys them.
        """
        now = time.time() if now is None else now
        if since > now:
            return None
        if self.every is not None:
            count = int((now - since) // self.every)
            return round(since, 3), round(since + count * self.every, 3)
        trigger = self.trigger()
        first = trigger.get_next_fire_time(None, datetime.fromtimestamp(since, self.timezone))
        if first is None or first.timestamp() > now:
            return None
        newest = first
        for _ in range(MISSED_SCAN):
            fire = trigger.get_next_fire_time(newest, newest + timedelta(seconds=1))
            if fire is None or fire.timestamp() > now:
                break
            newest = fire
        return round(first.timestamp(), 3), round(newest.timestamp(), 3)


CRON_RESOLUTION = 60.0  # seconds: cron schedules have no seconds field
MISSED_SCAN = 10_000  # cron fire times `Schedule.missed` looks at (a week of a minutely task)
GAP_SAMPLES = 512  # fire times looked at for a cron schedule's shortest gap
GAP_SPAN = 400 * 86400.0  # ... within this many seconds of the first one


@functools.lru_cache(maxsize=1024)
def shortest_gap(schedule: Schedule) -> float | None:
    """Seconds between the two closest fire times of ``schedule``; None if it fires once.

    ``@every`` schedules: their period. Cron schedules: the shortest gap among the next
    `GAP_SAMPLES` fire times (within `GAP_SPAN` of the first), which covers every gap of a
    minute, hour and weekday pattern. Takes up to a tenth of a second: call it off the loop.
    """
    if schedule.every is not None:
        return schedule.every
    trigger = schedule.trigger()
    previous = trigger.get_next_fire_time(None, datetime.now(schedule.timezone))
    if previous is None:
        return None
    first, shortest = previous.timestamp(), None
    for _ in range(GAP_SAMPLES - 1):
        fire = trigger.get_next_fire_time(previous, previous + timedelta(seconds=1))
        if fire is None or fire.timestamp() - first > GAP_SPAN:
            break
        gap = fire.timestamp() - previous.timestamp()
        if gap > 0 and (shortest is None or gap < shortest):
            shortest = gap
        previous = fire
    return shortest


def parse_schedule(text: str) -> Schedule:
    """Parse a schedule; `ClockError` says what is wrong and shows valid examples."""
    if not isinstance(text, str):
        raise ClockError(f"the schedule must be a string, got {type(text).__name__}; {EXAMPLES}")
    # Many tasks share a schedule, and a clock with thousands of tasks parses them all at start.
    return _parse(text, _local_zone())


@functools.lru_cache(maxsize=4096)
def _parse(text: str, local: tzinfo) -> Schedule:
    spec = text.strip()
    if not spec:
        raise ClockError(f"the schedule is empty; {EXAMPLES}")
    zone: tzinfo | None = None
    prefix = re.match(r"(CRON_TZ|TZ)=(\S*)\s*", spec)
    if prefix:
        zone = _zone(prefix.group(2), text)
        spec = spec[prefix.end() :]
        if not spec:
            raise ClockError(f"schedule {text!r} has a time zone but nothing after it; {EXAMPLES}")
    tz = zone or local
    lowered = spec.lower()
    if lowered.startswith("@every"):
        return Schedule(text.strip(), tz, every=_every(spec[len("@every") :].strip(), text))
    if spec.startswith("@"):
        fields = DESCRIPTORS.get(lowered)
        if fields is None:
            raise ClockError(
                f"unknown descriptor {spec!r} in schedule {text!r}; the descriptors are "
                f"{', '.join(DESCRIPTORS)} and '@every <duration>'; {EXAMPLES}"
            )
        spec = fields
    parts = spec.split()
    if len(parts) != 5:
        raise ClockError(
            f"schedule {text!r} has {len(parts)} field(s); a cron schedule has 5 "
            f"({', '.join(FIELD_NAMES)}; no seconds field); {EXAMPLES}"
        )
    parts = [_star(p) for p in parts]
    parts[4] = _day_of_week(parts[4], text)
    crontab = " ".join(parts)
    try:
        trigger = _cron_trigger(crontab, tz)
    except ValueError as exc:
        raise ClockError(
            f"invalid cron schedule {text!r}: {_field_hint(crontab, tz, exc)}; {EXAMPLES}"
        ) from exc
    return Schedule(text.strip(), tz, crontab=crontab, cron_trigger=trigger)


def _star(field: str) -> str:
    """Accept, like robfig, ``?`` for ``*`` in the day fields."""
    return "*" if field == "?" else field


def _cron_trigger(crontab: str, tz: tzinfo) -> BaseTrigger:
    """The trigger of five translated fields (day fields ORed when both are restricted)."""
    from apscheduler.triggers.combining import OrTrigger
    from apscheduler.triggers.cron import CronTrigger

    minute, hour, dom, month, dow = crontab.split()

    def make(day: str, day_of_week: str) -> CronTrigger:
        return CronTrigger(
            minute=minute, hour=hour, day=day, month=month, day_of_week=day_of_week, timezone=tz
        )

    if dom != "*" and dow != "*":
        return OrTrigger([make(dom, "*"), make("*", dow)])
    return make(dom, dow)


def _day_of_week(field: str, text: str) -> str:
    """Crontab weekdays (0-7, Sunday = 0 or 7, names) as a list of APScheduler day names."""
    if field == "*":
        return field
    days: set[int] = set()
    for item in field.split(","):
        rng, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise _dow_error(f"step {step_text!r} is not a positive number", text)
            step = int(step_text)
        if rng == "*":
            low, high = 0, 6
        elif "-" in rng:
            a, _, b = rng.partition("-")
            low, high = _day(a, text), _day(b, text)
            if low > high:
                raise _dow_error(f"range {rng!r} runs backwards", text)
        else:
            low = high = _day(rng, text)
            if step_text:
                high = 6  # "1/2": from Monday on, every second day
        days.update(d % 7 for d in range(low, high + 1, step))
    return ",".join(_DAY_NAMES[d] for d in sorted(days))


def _day(token: str, text: str) -> int:
    """One weekday: a number 0-7 (kept, so that ``5-7`` is a range) or a three-letter name."""
    token = token.strip().lower()
    if token.isdigit():
        value = int(token)
        if value > 7:
            raise _dow_error(f"{token} is not a weekday (0-7, 0 and 7 are Sunday)", text)
        return value
    if token in _DAY_NAMES:
        return _DAY_NAMES.index(token)
    raise _dow_error(f"{token!r} is not a weekday (0-7 or sun, mon, …, sat)", text)


def _dow_error(what: str, text: str) -> ClockError:
    return ClockError(f"invalid cron schedule {text!r}: day of week: {what}; {EXAMPLES}")


def _field_hint(crontab: str, tz: tzinfo, exc: ValueError) -> str:
    """APScheduler's message, prefixed with the name of the first field it rejects."""
    from apscheduler.triggers.cron import CronTrigger

    keys = ("minute", "hour", "day", "month", "day_of_week")
    for name, key, value in zip(FIELD_NAMES, keys, crontab.split(), strict=True):
        try:
            CronTrigger(timezone=tz, **{key: value})
        except ValueError as field_exc:
            return f"{name} {value!r}: {field_exc}"
    return str(exc)


def _every(duration: str, text: str) -> float:
    """Seconds of a Go duration (``90s``, ``1h30m``); at least one second."""
    if not duration:
        raise ClockError(
            f"schedule {text!r}: '@every' needs a duration, e.g. '@every 90s' or '@every 1h30m'"
        )
    pos, total = 0, 0.0
    while pos < len(duration):
        match = _DURATION.match(duration, pos)
        if match is None:
            raise ClockError(
                f"schedule {text!r}: {duration!r} is not a duration; write a number with a "
                "unit (h, m, s, ms), e.g. '@every 90s' or '@every 1h30m'"
            )
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if total < 1:
        raise ClockError(
            f"schedule {text!r}: the period must be at least 1s, got {duration!r}; "
            "e.g. '@every 30s'"
        )
    return total


def _zone(name: str, text: str) -> tzinfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ClockError(
            f"schedule {text!r}: unknown time zone {name!r}; use an IANA name, e.g. "
            "'CRON_TZ=Europe/Berlin 0 8 * * *' or 'TZ=UTC @daily'"
        ) from exc


@functools.cache
def _local_zone() -> tzinfo:
    """The local time zone as APScheduler sees it (tzlocal: ``TZ`` or the system's, read once)."""
    from apscheduler.triggers.interval import IntervalTrigger

    zone: tzinfo = IntervalTrigger(seconds=1).timezone  # a trigger without zone takes the local
    return zone


def describe_period(seconds: float) -> str:
    """``5400`` → ``1h30m0s`` (Go's duration format, used in notices)."""
    whole = timedelta(seconds=round(seconds))
    hours, rest = divmod(int(whole.total_seconds()), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
