"""Clock schedules (ania_nb.clock.schedule): the crontab dialect on APScheduler 3 and its errors."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from ania_nb.clock import ClockError
from ania_nb.clock.schedule import describe_period, parse_schedule

UTC = ZoneInfo("UTC")
# A Wednesday, 10:30:00 UTC.
WED = datetime(2026, 12, 2, 10, 30, tzinfo=UTC).timestamp()


def fires(text: str, n: int = 3, after: float = WED) -> list[str]:
    """The next ``n`` fire times after ``after``, as 'Day YYYY-MM-DD HH:MM' in UTC."""
    schedule = parse_schedule(f"TZ=UTC {text}")
    out: list[str] = []
    for _ in range(n):
        after = schedule.next_fire(after)
        assert after is not None
        out.append(datetime.fromtimestamp(after, UTC).strftime("%a %Y-%m-%d %H:%M"))
    return out


def test_five_fields_fire_like_crontab():
    assert fires("0 9 * * 1-5") == [
        "Thu 2026-12-03 09:00",
        "Fri 2026-12-04 09:00",
        "Mon 2026-12-07 09:00",
    ]
    assert fires("*/20 * * * *") == [
        "Wed 2026-12-02 10:40",
        "Wed 2026-12-02 11:00",
        "Wed 2026-12-02 11:20",
    ]


@pytest.mark.parametrize("sunday", ["0", "7", "sun", "SUN"])
def test_weekday_numbers_are_crontabs_where_0_and_7_are_sunday(sunday):
    # APScheduler's own from_crontab would read 0 as Monday.
    assert fires(f"0 12 * * {sunday}", 1) == ["Sun 2026-12-06 12:00"]


def test_weekday_ranges_and_steps_count_from_sunday():
    assert fires("0 0 * * 5-7", 3) == [
        "Fri 2026-12-04 00:00",
        "Sat 2026-12-05 00:00",
        "Sun 2026-12-06 00:00",
    ]
    assert fires("0 0 * * */3", 3) == [  # Sunday, Wednesday, Saturday
        "Sat 2026-12-05 00:00",
        "Sun 2026-12-06 00:00",
        "Wed 2026-12-09 00:00",
    ]


@pytest.mark.parametrize(
    ("field", "days"),
    [
        ("mon-fri", "mon,tue,wed,thu,fri"),
        ("sat,sun", "sun,sat"),
        ("MON-FRI/2", "mon,wed,fri"),
        ("1/2", "mon,wed,fri"),
        ("7-7", "sun"),
        ("0-7", "sun,mon,tue,wed,thu,fri,sat"),
        ("5-7", "sun,fri,sat"),
        ("*", "*"),
        ("?", "*"),
    ],
)
def test_weekday_fields_become_apschedulers_day_names(field, days):
    assert parse_schedule(f"0 9 * * {field}").crontab == f"0 9 * * {days}"


def test_both_day_fields_restricted_match_either_day():
    # Classic cron: the 1st of the month OR every Monday (APScheduler alone would AND them).
    assert fires("0 8 1 * 1", 3) == [
        "Mon 2026-12-07 08:00",
        "Mon 2026-12-14 08:00",
        "Mon 2026-12-21 08:00",
    ]
    assert fires("0 8 1 * 1", 5)[-2:] == ["Mon 2026-12-28 08:00", "Fri 2027-01-01 08:00"]


@pytest.mark.parametrize(
    ("descriptor", "first"),
    [
        ("@hourly", "Wed 2026-12-02 11:00"),
        ("@daily", "Thu 2026-12-03 00:00"),
        ("@midnight", "Thu 2026-12-03 00:00"),
        ("@weekly", "Sun 2026-12-06 00:00"),
        ("@monthly", "Fri 2027-01-01 00:00"),
        ("@yearly", "Fri 2027-01-01 00:00"),
        ("@annually", "Fri 2027-01-01 00:00"),
    ],
)
def test_descriptors(descriptor, first):
    assert fires(descriptor, 1) == [first]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("@every 90s", 90), ("@every 1h30m", 5400), ("@every 1.5h", 5400), ("@every 2m0s", 120)],
)
def test_every_takes_go_durations(text, seconds):
    schedule = parse_schedule(text)
    assert schedule.every == seconds
    assert schedule.next_fire(WED) == WED + seconds
    # Anchored at a planned time, the rhythm continues from it.
    assert schedule.next_fire(WED, first=WED - 10) == WED - 10 + seconds


def test_a_time_zone_prefix_moves_the_fire_times():
    shanghai = parse_schedule("CRON_TZ=Asia/Shanghai 0 8 * * *")
    fire = shanghai.next_fire(WED)
    assert fire is not None
    assert datetime.fromtimestamp(fire, UTC).strftime("%H:%M") == "00:00"  # 08:00 at UTC+8
    assert parse_schedule("TZ=Asia/Shanghai 0 8 * * *").next_fire(WED) == fire


def test_local_time_by_default():
    # A fresh interpreter, so the local zone (TZ, read once per process) is Tokyo's.
    code = (
        "from ania_nb.clock.schedule import parse_schedule; "
        f"print(parse_schedule('0 9 * * *').next_fire({WED}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TZ": "Asia/Tokyo"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    fire = datetime.fromtimestamp(float(out), UTC)
    assert fire.strftime("%a %H:%M") == "Thu 00:00"  # 09:00 at UTC+9


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "the schedule is empty"),
        ("   ", "the schedule is empty"),
        ("* * * *", "has 4 field(s); a cron schedule has 5"),
        ("0 * * * * *", "has 6 field(s); a cron schedule has 5"),
        ("61 * * * *", "minute '61'"),
        ("0 24 * * *", "hour '24'"),
        ("0 0 32 * *", "day of month '32'"),
        ("0 0 * 13 *", "month '13'"),
        ("0 0 * * 8", "day of week: 8 is not a weekday"),
        ("0 0 * * 5-1", "day of week: range '5-1' runs backwards"),
        ("0 0 * * funday", "'funday' is not a weekday"),
        ("@fortnightly", "unknown descriptor '@fortnightly'"),
        ("@every", "'@every' needs a duration"),
        ("@every soon", "'soon' is not a duration"),
        ("@every 10", "'10' is not a duration"),
        ("@every 500ms", "at least 1s"),
        ("CRON_TZ=Mars/Olympus 0 8 * * *", "unknown time zone 'Mars/Olympus'"),
        ("TZ=UTC", "has a time zone but nothing after it"),
    ],
)
def test_invalid_schedules_say_what_is_wrong_and_show_an_example(text, says):
    with pytest.raises(ClockError) as caught:
        parse_schedule(text)
    message = str(caught.value)
    assert says in message
    assert "e.g." in message or "examples:" in message


def test_a_non_string_schedule_is_refused():
    with pytest.raises(ClockError, match="must be a string, got int"):
        parse_schedule(5)  # type: ignore[arg-type]


def test_periods_print_like_go_durations():
    assert describe_period(120) == "2m0s"
    assert describe_period(5400) == "1h30m0s"
    assert describe_period(1) == "1s"
