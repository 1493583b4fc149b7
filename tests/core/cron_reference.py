"""A brute-force reference for cron fire times, independent of croniter and of core.cron.

It parses a five-field expression into sets of allowed values and walks real UTC minutes one by
one, reading each minute's local wall time with zoneinfo, then applies the scheduler's DST rules
directly: a fixed-time expression fires on the first pass of a repeated hour only
(``fold="once"``) and, with ``gap="shift"``, at the first minute after a spring-forward jump if a
skipped wall minute matched; any other expression fires at every real minute whose wall time
matches. It supports names, lists, ranges and steps, not ``L``/``W``/``#`` or seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

MINUTE = timedelta(minutes=1)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


@dataclass(frozen=True)
class ReferenceCron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    day_star: bool
    weekday_star: bool
    fixed_time: bool

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        day_ok = wall.day in self.days
        weekday_ok = wall.isoweekday() % 7 in self.weekdays
        if self.day_star or self.weekday_star:
            return day_ok and weekday_ok
        return day_ok or weekday_ok


def _number(token: str, index: int) -> int:
    if token.isdigit():
        return int(token)
    names = _MONTHS if index == 3 else _DAYS
    return names.index(token.lower()) + (1 if index == 3 else 0)


def _field(text: str, index: int) -> frozenset[int]:
    low, high = _BOUNDS[index]
    star_high = 6 if index == 4 else high
    values: set[int] = set()
    for item in text.split(","):
        body, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if body == "*":
            first, last = low, star_high
        elif "-" in body:
            a, b = body.split("-")
            first, last = _number(a, index), _number(b, index)
            if index == 4 and last == 0 < first:
                last = 7
        else:
            first = _number(body, index)
            last = star_high if step_text else first
        values.update(range(first, last + 1, step))
    if index == 4:
        values = {v % 7 for v in values}
    return frozenset(values)


def parse_reference(expression: str) -> ReferenceCron:
    """Parse a plain five-field expression (names, lists, ranges, steps)."""
    minute, hour, day, month, weekday = expression.split()
    return ReferenceCron(
        minutes=_field(minute, 0),
        hours=_field(hour, 1),
        days=_field(day, 2),
        months=_field(month, 3),
        weekdays=_field(weekday, 4),
        day_star=day.startswith("*"),
        weekday_star=weekday.startswith("*"),
        fixed_time=not minute.startswith("*") and not hour.startswith("*") and "/" not in hour,
    )


def reference_fires(
    cron: ReferenceCron,
    tz: ZoneInfo,
    after: datetime,
    *,
    limit: int,
    window: timedelta,
    gap: str = "shift",
    fold: str = "once",
) -> list[datetime]:
    """Fire instants strictly after ``after`` and at most ``window`` later, up to ``limit`` of them.

    Assumes every UTC offset of ``tz`` is a whole number of minutes.
    """
    after = after.astimezone(UTC)
    minute = after.replace(second=0, microsecond=0) + MINUTE
    end = after + window
    previous_wall = (minute - MINUTE).astimezone(tz).replace(tzinfo=None)
    fires: list[datetime] = []
    while minute <= end and len(fires) < limit:
        local = minute.astimezone(tz)
        wall = local.replace(tzinfo=None, fold=0)
        fire = cron.matches(wall) and (not cron.fixed_time or fold == "both" or local.fold == 0)
        if cron.fixed_time and gap == "shift" and not fire:
            skipped = previous_wall + MINUTE
            while skipped < wall and not fire:
                fire = cron.matches(skipped)
                skipped += MINUTE
        if fire:
            fires.append(minute)
        previous_wall = wall
        minute += MINUTE
    return fires


def transitions(tz: ZoneInfo, first_year: int, last_year: int) -> list[datetime]:
    """UTC instants in the given years at which ``tz`` changes its UTC offset, to the minute."""
    found: list[datetime] = []
    hour = datetime(first_year, 1, 1, tzinfo=UTC)
    stop = datetime(last_year + 1, 1, 1, tzinfo=UTC)
    previous = hour.astimezone(tz).utcoffset()
    while hour < stop:
        offset = hour.astimezone(tz).utcoffset()
        if offset != previous:
            minute = hour - timedelta(hours=1)
            while minute.astimezone(tz).utcoffset() == previous:
                minute += MINUTE
            found.append(minute)
            previous = offset
        hour += timedelta(hours=1)
    return found
