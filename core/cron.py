"""Cron expressions evaluated in an IANA time zone, with cronie's daylight-saving rules.

Syntax is POSIX/Vixie cron (five fields: minute hour day-of-month month day-of-week) with the
extensions of croniter and Quartz (``L``, ``15W`` and ``LW`` in day-of-month; ``5#3``, croniter's
``L5`` and Quartz's ``5L`` in day-of-week; ``?`` for a whole day field) and an optional sixth
field of seconds placed *first*, as Quartz, Spring and Dkron read it. Every expression is
validated here, with the offending field named in the error.

Fire times are computed here, field by field on the schedule's wall clock, and mapped to instants
through the zone's constant-offset spans; croniter is not called at run time because its calendar
walk is where its defects live. croniter 7.0.0 differs from the rules of this module as follows,
each case shown by a test in tests/core/test_cron.py: a fixed-time job fires on both passes of
the repeated fall-back hour (``30 1 * * *``); a stepped hour is caught up at the end of a
spring-forward gap (``0 */2 * * *``); ``*/2`` in day-of-month is ORed with day-of-week instead of
Vixie's AND; an equal range is read as the whole field (``0 5-5 * * *`` fires hourly); a
day-of-month next to ``n#k`` raises at run time (``0 0 12 * 4#1``) and ``L`` next to ``Ln`` is
ignored; ``0 0 30 2 *`` is accepted and raises at run time; reversed ranges (``30-10``) wrap;
``R`` and ``H`` (with a hash id) are accepted; ``expand_from_start_time`` makes steps depend on
the start time; and a sixth field is read as trailing seconds.

DST rules (cronie's ``MIN_STAR``/``HR_STAR`` rule, extended to hour steps): an expression is
*fixed-time* when neither its minute nor its hour field (nor, with six fields, its second field)
starts with ``*`` and its hour field has no step. A fixed-time occurrence whose wall time falls in
a spring-forward gap fires once at the first instant after the gap (``gap="shift"``) or not at all
(``gap="skip"``); several occurrences in one gap fire once together. An occurrence in the repeated
fall-back hour fires on the first pass only (``fold="once"``) or on both (``fold="both"``). Other
expressions fire at every real instant whose wall time matches: nothing is caught up after a gap,
and both passes of a repeated hour fire.

Cost, measured with Python 3.11 on this project's 2-core machine, warm caches: ``next_after``
takes about 3 µs for ``*/15 * * * *`` in UTC, ``30 2 * * 1-5`` in America/New_York and
``0 9 1-7,15-21 * 1`` in Europe/Berlin alike. The first use of a zone in a year costs about 1 ms
more, to locate that year's offset transitions (cached); parsing costs about 0.2 ms (cached).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import FieldError, InvalidCron, InvalidRequest

__all__ = ["CronExpression", "FoldPolicy", "GapPolicy", "parse_cron", "resolve_timezone"]

GapPolicy = Literal["shift", "skip"]
FoldPolicy = Literal["once", "both"]

MAX_EXPRESSION_LENGTH: Final = 512

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
_SECOND: Final = timedelta(seconds=1)
_DAY_S: Final = 86_400
_MIN_YEAR: Final = 2
_MAX_YEAR: Final = 9998
_NEXT_HORIZON_YEARS: Final = 50
_PREV_HORIZON_YEARS: Final = 8
_MONTH_LENGTHS: Final = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES: Final = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_DAY_NAMES: Final = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}

_FIELD_SEPARATOR: Final = re.compile(r"[ \t]+")
_ITEM: Final = re.compile(
    r"(?P<start>\*|[0-9A-Za-z]+)(?:-(?P<end>[0-9A-Za-z]+))?(?:/(?P<step>[0-9]+))?", re.ASCII
)
_NUMBER: Final = re.compile(r"[0-9]+", re.ASCII)
_NEAREST_WEEKDAY: Final = re.compile(r"([0-9]+)W", re.ASCII | re.IGNORECASE)
_NTH_WEEKDAY: Final = re.compile(r"([0-9A-Za-z]+)#([0-9]+)", re.ASCII)
_LAST_WEEKDAY: Final = re.compile(r"L([0-9A-Za-z]+)|([0-9A-Za-z]+)L", re.ASCII | re.IGNORECASE)
_HASHED: Final = re.compile(r"[HR](?:\(.*\))?(?:/.*)?", re.ASCII)
_ZONE_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+)*", re.ASCII)
_REFUSED_ZONES: Final = frozenset({"localtime", "posixrules"})
_REFUSED_ZONE_PREFIXES: Final = ("posix/", "right/")


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    star_high: int
    names: Mapping[str, int]


_SECOND_FIELD: Final = _FieldSpec("second", 0, 59, 59, {})
_MINUTE_FIELD: Final = _FieldSpec("minute", 0, 59, 59, {})
_HOUR_FIELD: Final = _FieldSpec("hour", 0, 23, 23, {})
_DOM_FIELD: Final = _FieldSpec("day-of-month", 1, 31, 31, {})
_MONTH_FIELD: Final = _FieldSpec("month", 1, 12, 12, _MONTH_NAMES)
_DOW_FIELD: Final = _FieldSpec("day-of-week", 0, 7, 6, _DAY_NAMES)


@dataclass(frozen=True, slots=True)
class _DayRule:
    """Which days of a month match, from the day-of-month and day-of-week fields."""

    dom: frozenset[int]
    dom_last: bool
    dom_last_weekday: bool
    dom_nearest_weekday: frozenset[int]
    dom_star: bool
    dow: frozenset[int]
    dow_nth: frozenset[tuple[int, int]]
    dow_last: frozenset[int]
    dow_star: bool

    def days(self, length: int, first_weekday: int) -> tuple[int, ...]:
        """Matching days of a ``length``-day month whose 1st has cron weekday ``first_weekday``."""
        nearest = {_nearest_weekday(d, length, first_weekday) for d in self.dom_nearest_weekday}
        if self.dom_last_weekday:
            nearest.add(_nearest_weekday(length, length, first_weekday))
        matching = []
        for day in range(1, length + 1):
            weekday = (first_weekday + day - 1) % 7
            dom_ok = day in self.dom or (self.dom_last and day == length) or day in nearest
            dow_ok = (
                weekday in self.dow
                or (weekday, (day - 1) // 7 + 1) in self.dow_nth
                or (weekday in self.dow_last and day + 7 > length)
            )
            if (dom_ok and dow_ok) if self.dom_star or self.dow_star else (dom_ok or dow_ok):
                matching.append(day)
        return tuple(matching)


def _nearest_weekday(day: int, length: int, first_weekday: int) -> int:
    """Quartz's ``W``: the Monday-to-Friday day nearest ``day``, staying inside the month.

    A day past the month's end is read as its last day, as croniter does.
    """
    day = min(day, length)
    weekday = (first_weekday + day - 1) % 7
    if weekday == 6:
        return day - 1 if day > 1 else day + 2
    if weekday == 0:
        return day + 1 if day < length else day - 2
    return day


@dataclass(frozen=True, slots=True)
class CronExpression:
    """A validated cron expression; immutable, hashable and safe to share between threads.

    Build one with :func:`parse_cron`. Fire times are aware UTC datetimes with ``microsecond=0``;
    the expression is evaluated in the zone passed to each method, never the host's.

    Attributes:
        source: the expression as given to :func:`parse_cron`.
        has_seconds: whether it has the leading seconds field (six fields).
        is_fixed_time: whether the DST rules for fixed wall-clock times apply (cronie's rule: the
            minute, hour and second fields do not start with ``*`` and the hour has no step).
    """

    source: str
    has_seconds: bool
    is_fixed_time: bool
    _seconds: tuple[int, ...] = field(repr=False)
    _minutes: tuple[int, ...] = field(repr=False)
    _hours: tuple[int, ...] = field(repr=False)
    _months: tuple[int, ...] = field(repr=False)
    _day_table: tuple[tuple[int, ...], ...] = field(repr=False)

    def next_after(
        self,
        after: datetime,
        tz: ZoneInfo,
        *,
        gap: GapPolicy = "shift",
        fold: FoldPolicy = "once",
    ) -> datetime:
        """The first fire instant strictly after ``after``.

        Call it with the previous *scheduled* time, not with "now", so that an early wake-up or
        a clock step cannot fire one occurrence twice.

        Args:
            after: an aware datetime in any offset; fractions of a second are allowed.
            tz: the IANA zone whose wall clock the expression is read in.
            gap: for fixed-time expressions, what an occurrence inside a spring-forward gap does:
                ``"shift"`` fires it at the first instant after the gap (cronie), ``"skip"`` drops
                it.
            fold: for fixed-time expressions, whether an occurrence in the repeated fall-back hour
                fires on the first pass only (``"once"``, cronie) or on both passes (``"both"``).

        Returns:
            An aware UTC datetime (``tzinfo=datetime.UTC``) with ``microsecond=0``.

        Raises:
            ValueError: ``after`` is naive or outside the years 2-9998, a policy is unknown, or
                no fire time exists within 50 years (impossible for a parsed expression).
        """
        start = _to_epoch_s(after) + 1
        _check_policies(gap, fold)
        instant = self._next_instant(start, tz, gap, fold)
        if instant is None:
            raise ValueError(f"{self.source!r} does not fire within {_NEXT_HORIZON_YEARS} years")
        return _EPOCH + timedelta(seconds=instant)

    def fire_times(
        self,
        after: datetime,
        tz: ZoneInfo,
        count: int,
        *,
        gap: GapPolicy = "shift",
        fold: FoldPolicy = "once",
    ) -> list[datetime]:
        """The next ``count`` fire instants strictly after ``after``, in order.

        Same arguments, units and errors as :meth:`next_after`; ``count`` must not be negative.
        Fewer than ``count`` when the supported calendar (up to year 9998) ends first.
        """
        if count < 0:
            raise ValueError(f"count must not be negative, got {count}")
        _check_policies(gap, fold)
        instant = _to_epoch_s(after)
        fires: list[datetime] = []
        for _ in range(count):
            found = self._next_instant(instant + 1, tz, gap, fold)
            if found is None:  # only near the end of the supported calendar (year 9998)
                break
            instant = found
            fires.append(_EPOCH + timedelta(seconds=instant))
        return fires

    def previous_at_or_before(
        self,
        at: datetime,
        tz: ZoneInfo,
        *,
        gap: GapPolicy = "shift",
        fold: FoldPolicy = "once",
    ) -> datetime | None:
        """The latest fire instant at or before ``at``, for misfire catch-up.

        Args:
            at: an aware datetime in any offset.
            tz: the IANA zone whose wall clock the expression is read in.
            gap: as in :meth:`next_after`.
            fold: as in :meth:`next_after`.

        Returns:
            An aware UTC datetime with ``microsecond=0``, or ``None`` when the expression did not
            fire in the 8 years before ``at`` (8 covers Feb 29 across the non-leap year 2100).

        Raises:
            ValueError: ``at`` is naive or outside the years 2-9998, or a policy is unknown.
        """
        _check_policies(gap, fold)
        instant = self._prev_instant(_to_epoch_s(at), tz, gap, fold)
        return None if instant is None else _EPOCH + timedelta(seconds=instant)

    def wall_times(self, lo: int, hi: int) -> Iterator[int]:
        """Every matching wall-clock time in ``[lo, hi)``, ascending: naive seconds since
        1970-01-01 00:00 (a wall clock, not an instant: a zone's offset turns one into an
        instant only where it is constant, i.e. with no DST transition in between). The fast
        path of counting fire times in a window (:mod:`core.heatmap`): no iterator step per
        fire time."""
        months = frozenset(self._months)
        hours, minutes, seconds = self._hours, self._minutes, self._seconds
        for days in range(lo // _DAY_S, (hi - 1) // _DAY_S + 1):
            day = date.fromordinal(days + _EPOCH_ORDINAL)
            if day.month not in months or day.day not in self._days_of(day.year, day.month):
                continue
            base = days * _DAY_S
            for hour in hours:
                at_hour = base + hour * 3600
                if at_hour + 3600 <= lo:
                    continue
                if at_hour >= hi:
                    return
                for minute in minutes:
                    at_minute = at_hour + minute * 60
                    for second in seconds:
                        wall = at_minute + second
                        if lo <= wall < hi:
                            yield wall

    def _days_of(self, year: int, month: int) -> tuple[int, ...]:
        length = _MONTH_LENGTHS[month]
        if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
            length = 29
        first_weekday = date(year, month, 1).toordinal() % 7
        return self._day_table[(length - 28) * 7 + first_weekday]

    def _next_wall(self, wall: int, last_year: int) -> int | None:
        """The first matching wall time (naive seconds) >= ``wall``; None past ``last_year``."""
        days, second_of_day = divmod(wall, _DAY_S)
        day_date = date.fromordinal(days + _EPOCH_ORDINAL)
        year, month, day = day_date.year, day_date.month, day_date.day
        hour, rest = divmod(second_of_day, 3600)
        minute, second = divmod(rest, 60)
        months, hours, minutes, seconds = self._months, self._hours, self._minutes, self._seconds
        while year <= last_year:
            i = bisect_left(months, month)
            if i == len(months) or months[i] != month:
                if i == len(months):
                    year += 1
                    month = months[0]
                else:
                    month = months[i]
                day, hour, minute, second = 1, 0, 0, 0
                continue
            days_ok = self._days_of(year, month)
            i = bisect_left(days_ok, day)
            if i == len(days_ok):
                year, month = (year + 1, 1) if month == 12 else (year, month + 1)
                day, hour, minute, second = 1, 0, 0, 0
                continue
            if days_ok[i] != day:
                day, hour, minute, second = days_ok[i], 0, 0, 0
            i = bisect_left(hours, hour)
            if i == len(hours):
                day, hour, minute, second = day + 1, 0, 0, 0
                continue
            if hours[i] != hour:
                hour, minute, second = hours[i], 0, 0
            i = bisect_left(minutes, minute)
            if i == len(minutes):
                hour, minute, second = hour + 1, 0, 0
                continue
            if minutes[i] != minute:
                minute, second = minutes[i], 0
            i = bisect_left(seconds, second)
            if i == len(seconds):
                minute, second = minute + 1, 0
                continue
            return _wall_s(year, month, day, hour * 3600 + minute * 60 + seconds[i])
        return None

    def _prev_wall(self, wall: int, first_year: int) -> int | None:
        """The last matching wall time (naive seconds) <= ``wall``; None before ``first_year``."""
        days, second_of_day = divmod(wall, _DAY_S)
        day_date = date.fromordinal(days + _EPOCH_ORDINAL)
        year, month, day = day_date.year, day_date.month, day_date.day
        hour, rest = divmod(second_of_day, 3600)
        minute, second = divmod(rest, 60)
        months, hours, minutes, seconds = self._months, self._hours, self._minutes, self._seconds
        while year >= first_year:
            i = bisect_right(months, month) - 1
            if i < 0 or months[i] != month:
                if i < 0:
                    year -= 1
                    month = months[-1]
                else:
                    month = months[i]
                day, hour, minute, second = 31, 23, 59, 59
                continue
            days_ok = self._days_of(year, month)
            i = bisect_right(days_ok, day) - 1
            if i < 0:
                year, month = (year - 1, 12) if month == 1 else (year, month - 1)
                day, hour, minute, second = 31, 23, 59, 59
                continue
            if days_ok[i] != day:
                day, hour, minute, second = days_ok[i], 23, 59, 59
            i = bisect_right(hours, hour) - 1
            if i < 0:
                day, hour, minute, second = day - 1, 23, 59, 59
                continue
            if hours[i] != hour:
                hour, minute, second = hours[i], 59, 59
            i = bisect_right(minutes, minute) - 1
            if i < 0:
                hour, minute, second = hour - 1, 59, 59
                continue
            if minutes[i] != minute:
                minute, second = minutes[i], 59
            i = bisect_right(seconds, second) - 1
            if i < 0:
                minute, second = minute - 1, 59
                continue
            return _wall_s(year, month, day, hour * 3600 + minute * 60 + seconds[i])
        return None

    def _next_instant(self, start: int, tz: ZoneInfo, gap: str, fold: str) -> int | None:
        """The first fire instant at or after ``start`` (epoch seconds).

        Walks the zone's constant-offset spans forward. Inside a span, wall time = instant +
        offset, so the first matching wall time gives the first fire; a span that begins with a
        gap may add the shifted fire at its start, and one that begins with a fold drops its
        repeated wall times for fixed-time expressions with ``fold="once"``.
        """
        shift = self.is_fixed_time and gap == "shift"
        once = self.is_fixed_time and fold == "once"
        year = _utc_year(start)
        last_year = min(year + _NEXT_HORIZON_YEARS, _MAX_YEAR)
        starts, spans = _zone_year(tz, year)
        i = bisect_right(starts, start) - 1
        known_from, known_match = 1, 0
        while True:
            span_start, span_end, offset, offset_before = spans[i]
            if shift and offset > offset_before and span_start >= start:
                in_gap = self._next_wall(span_start + offset_before, last_year)
                if in_gap is not None and in_gap < span_start + offset:
                    return span_start
            low = max(start, span_start) + offset
            if once and offset < offset_before:
                low = max(low, span_start + offset_before)
            if not known_from <= low <= known_match:
                match = self._next_wall(low, last_year)
                if match is None:
                    return None
                known_from, known_match = low, match
            if known_match < span_end + offset:
                return known_match - offset
            i += 1
            if i == len(spans):
                year += 1
                if year > last_year:
                    return None
                starts, spans = _zone_year(tz, year)
                i = 0

    def _prev_instant(self, at: int, tz: ZoneInfo, gap: str, fold: str) -> int | None:
        """The last fire instant at or before ``at`` (epoch seconds); mirrors _next_instant."""
        shift = self.is_fixed_time and gap == "shift"
        once = self.is_fixed_time and fold == "once"
        year = _utc_year(at)
        first_year = max(year - _PREV_HORIZON_YEARS, _MIN_YEAR)
        starts, spans = _zone_year(tz, year)
        i = bisect_right(starts, at) - 1
        known_until, known_match = 0, 1
        while True:
            span_start, span_end, offset, offset_before = spans[i]
            high = min(at, span_end - 1) + offset
            if not known_match <= high <= known_until:
                match = self._prev_wall(high, first_year)
                if match is None:
                    return None
                known_until, known_match = high, match
            low = span_start + offset
            if once and offset < offset_before:
                low = span_start + offset_before
            if known_match >= low:
                return known_match - offset
            if shift and offset > offset_before and span_start <= at:
                in_gap = self._next_wall(span_start + offset_before, year + 1)
                if in_gap is not None and in_gap < span_start + offset:
                    return span_start
            i -= 1
            if i < 0:
                year -= 1
                if year < first_year:
                    return None
                starts, spans = _zone_year(tz, year)
                i = len(spans) - 1


@lru_cache(maxsize=4096)
def parse_cron(expression: str) -> CronExpression:
    """Parse and validate a cron expression; results are cached, so each is parsed once.

    Accepts five fields (minute hour day-of-month month day-of-week, POSIX/Vixie cron: names,
    lists, ranges, steps, 0 and 7 for Sunday, and the day-of-month/day-of-week OR rule when
    neither field starts with ``*`` or ``?``), six fields with the seconds first (Quartz, Spring,
    Dkron), the macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``, and the
    croniter/Quartz extensions ``L``, ``LW`` and ``15W`` in day-of-month and ``5#3``, ``L5`` and
    ``5L`` in day-of-week.

    Raises:
        InvalidCron: naming the field (``"minute"``, ``"hour"``, ``"day-of-month"``, ``"month"``,
            ``"day-of-week"``, ``"second"`` or ``"expression"``) and the reason: wrong field
            count, a value out of range, step 0, a reversed range, an unknown name, hashed ``H``
            or random ``R`` values, ``@reboot``/``@every``/unknown macros, a ``CRON_TZ=`` prefix,
            an empty expression, or a day that never occurs (``0 0 30 2 *``).
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise InvalidCron("expression", f"is longer than {MAX_EXPRESSION_LENGTH} characters")
    text = expression.strip(" \t")
    if not text:
        raise InvalidCron("expression", "is empty")
    fields = _expand_macro(text) if text.startswith("@") else _FIELD_SEPARATOR.split(text)
    if "=" in fields[0]:
        raise InvalidCron(
            "expression",
            f"a {fields[0].split('=')[0][:16]}= prefix is not supported; "
            "set schedule.timezone instead",
        )
    if len(fields) not in (5, 6):
        raise InvalidCron(
            "expression",
            "needs 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds "
            f"first, got {len(fields)}",
        )
    has_seconds = len(fields) == 6
    second_text = fields[0] if has_seconds else "0"
    minute_text, hour_text, dom_text, month_text, dow_text = fields[-5:]
    seconds = _parse_values(second_text, _SECOND_FIELD)
    minutes = _parse_values(minute_text, _MINUTE_FIELD)
    hours = _parse_values(hour_text, _HOUR_FIELD)
    day_rule = _parse_days(dom_text, dow_text)
    months = _parse_values(month_text, _MONTH_FIELD)
    day_table = tuple(
        day_rule.days(length, first_weekday)
        for length in range(28, 32)
        for first_weekday in range(7)
    )
    if not any(
        day_table[(length - 28) * 7 + first_weekday]
        for month in months
        for length in ((28, 29) if month == 2 else (_MONTH_LENGTHS[month],))
        for first_weekday in range(7)
    ):
        raise InvalidCron("expression", "never fires: no month it allows has a day it allows")
    is_fixed_time = (
        not minute_text.startswith("*")
        and not hour_text.startswith("*")
        and "/" not in hour_text
        and not second_text.startswith("*")
    )
    return CronExpression(
        source=expression,
        has_seconds=has_seconds,
        is_fixed_time=is_fixed_time,
        _seconds=seconds,
        _minutes=minutes,
        _hours=hours,
        _months=months,
        _day_table=day_table,
    )


@lru_cache(maxsize=1024)
def resolve_timezone(name: str) -> ZoneInfo:
    """The IANA zone called ``name`` (e.g. ``"Europe/Berlin"``, ``"UTC"``).

    Only zone keys are accepted: no file paths, no ``localtime``, no ``posix/`` or ``right/``
    variants, so every host resolves a name to the same rules.

    Raises:
        InvalidRequest: with a ``FieldError`` on ``schedule.timezone`` when the name is empty,
            malformed or not a known zone.
    """
    if not name.strip():
        raise InvalidRequest(FieldError("schedule.timezone", "is empty"))
    if (
        len(name) > 64
        or _ZONE_NAME.fullmatch(name) is None
        or name in _REFUSED_ZONES
        or name.startswith(_REFUSED_ZONE_PREFIXES)
    ):
        raise InvalidRequest(
            FieldError("schedule.timezone", f"{name[:64]!r} is not an IANA time zone name")
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidRequest(
            FieldError("schedule.timezone", f"unknown time zone {name!r}")
        ) from None


def _expand_macro(text: str) -> list[str]:
    key = text.lower()
    if key in _MACROS:
        return _MACROS[key].split()
    if key == "@reboot":
        raise InvalidCron("expression", "@reboot has no fire time in a scheduler")
    if key.startswith("@every"):
        raise InvalidCron("expression", "@every is not cron syntax; use an interval schedule")
    raise InvalidCron(
        "expression", f"unknown macro {text[:32]!r}; known: {', '.join(sorted(_MACROS))}"
    )


def _parse_values(text: str, spec: _FieldSpec) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        values.update(_parse_item(item, spec))
    return tuple(sorted(values))


def _parse_item(item: str, spec: _FieldSpec) -> range:
    if not item:
        raise InvalidCron(spec.name, "has an empty list item")
    match = _ITEM.fullmatch(item)
    if match is None:
        raise InvalidCron(spec.name, _unreadable(item, spec))
    start_text, end_text, step_text = match.group("start", "end", "step")
    if start_text == "*":
        if end_text is not None:
            raise InvalidCron(spec.name, f"{item!r}: '*' cannot start a range")
        start, end = spec.low, spec.star_high
    else:
        start = _value(start_text, spec)
        if end_text is not None:
            end = _value(end_text, spec)
            if end < start and spec is _DOW_FIELD and end == 0:
                end = 7
            if end < start:
                raise InvalidCron(
                    spec.name, f"range {item!r} is reversed; write the smaller value first"
                )
        elif step_text is not None:
            end = spec.star_high
        else:
            end = start
    if step_text is None:
        return range(start, end + 1)
    step = int(step_text)
    span = spec.star_high - spec.low + 1
    if not 1 <= step <= span:
        raise InvalidCron(spec.name, f"step in {item!r} must be between 1 and {span}")
    return range(start, end + 1, step)


def _value(token: str, spec: _FieldSpec) -> int:
    if _NUMBER.fullmatch(token):
        value = int(token)
    else:
        named = spec.names.get(token.lower())
        if named is None:
            raise InvalidCron(spec.name, _unreadable(token, spec))
        value = named
    if not spec.low <= value <= spec.high:
        raise InvalidCron(spec.name, f"value {token[:16]} is out of range {spec.low}-{spec.high}")
    return value


def _unreadable(token: str, spec: _FieldSpec) -> str:
    upper = token[:16].upper()
    if _HASHED.fullmatch(upper):
        kind = "hashed ('H')" if upper.startswith("H") else "random ('R')"
        return f"{kind} values like {token[:16]!r} are not supported"
    if any(c in upper for c in "LW#?"):
        return f"{token[:16]!r}: 'L', 'W', '#' and '?' are not allowed here"
    if spec.names:
        example = next(iter(spec.names)).upper()
        return f"unknown value {token[:16]!r}; use {spec.low}-{spec.high} or a name like {example}"
    return f"cannot read {token[:16]!r}"


def _parse_days(dom_text: str, dow_text: str) -> _DayRule:
    dom, dom_last, dom_last_weekday, nearest = _parse_dom(dom_text)
    dow, nth, last = _parse_dow(dow_text)
    return _DayRule(
        dom=frozenset(dom),
        dom_last=dom_last,
        dom_last_weekday=dom_last_weekday,
        dom_nearest_weekday=frozenset(nearest),
        dom_star=dom_text.startswith(("*", "?")),
        dow=frozenset(dow),
        dow_nth=frozenset(nth),
        dow_last=frozenset(last),
        dow_star=dow_text.startswith(("*", "?")),
    )


def _parse_dom(text: str) -> tuple[set[int], bool, bool, set[int]]:
    """Days, ``L``, ``LW`` and the ``nW`` days of a day-of-month field."""
    if text == "?":
        return set(range(1, 32)), False, False, set()
    days: set[int] = set()
    nearest: set[int] = set()
    last = last_weekday = False
    for item in text.split(","):
        upper = item.upper()
        nearest_match = _NEAREST_WEEKDAY.fullmatch(item)
        if upper == "L":
            last = True
        elif upper == "LW":
            last_weekday = True
        elif nearest_match is not None:
            nearest.add(_value(nearest_match.group(1), _DOM_FIELD))
        else:
            days.update(_parse_item(item, _DOM_FIELD))
    return days, last, last_weekday, nearest


def _parse_dow(text: str) -> tuple[set[int], set[tuple[int, int]], set[int]]:
    """Weekdays (0 = Sunday), ``(weekday, n)`` for ``n#k`` and the ``Ln``/``nL`` weekdays."""
    if text == "?":
        return set(range(7)), set(), set()
    weekdays: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last: set[int] = set()
    for item in text.split(","):
        nth_match = _NTH_WEEKDAY.fullmatch(item)
        last_match = _LAST_WEEKDAY.fullmatch(item)
        if nth_match is not None:
            number = int(nth_match.group(2))
            if not 1 <= number <= 5:
                raise InvalidCron("day-of-week", f"{item!r}: the week number must be 1-5")
            nth.add((_value(nth_match.group(1), _DOW_FIELD) % 7, number))
        elif last_match is not None:
            token = last_match.group(1) or last_match.group(2)
            last.add(_value(token, _DOW_FIELD) % 7)
        else:
            weekdays.update(v % 7 for v in _parse_item(item, _DOW_FIELD))
    return weekdays, nth, last


def _check_policies(gap: str, fold: str) -> None:
    if gap not in ("shift", "skip"):
        raise ValueError(f"gap must be 'shift' or 'skip', got {gap!r}")
    if fold not in ("once", "both"):
        raise ValueError(f"fold must be 'once' or 'both', got {fold!r}")


def _to_epoch_s(moment: datetime) -> int:
    """Whole seconds since the Unix epoch, rounded down, of an aware datetime."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("naive datetime: an instant needs a UTC offset")
    return (moment - _EPOCH) // _SECOND


def _wall_s(year: int, month: int, day: int, second_of_day: int = 0) -> int:
    """Naive wall-clock seconds since 1970-01-01T00:00 of a calendar day and time of day."""
    return (date(year, month, day).toordinal() - _EPOCH_ORDINAL) * _DAY_S + second_of_day


def _utc_year(instant: int) -> int:
    year = date.fromordinal(instant // _DAY_S + _EPOCH_ORDINAL).year
    if not _MIN_YEAR <= year <= _MAX_YEAR:
        raise ValueError(f"year {year} is outside {_MIN_YEAR}-{_MAX_YEAR}")
    return year


def _offset_s(tz: ZoneInfo, instant: int) -> int:
    offset = datetime.fromtimestamp(instant, tz).utcoffset()
    return 0 if offset is None else offset // _SECOND


_Span = tuple[int, int, int, int]


@lru_cache(maxsize=2048)
def _zone_year(tz: ZoneInfo, year: int) -> tuple[tuple[int, ...], tuple[_Span, ...]]:
    """The constant-offset spans of ``tz`` covering the UTC year ``year``.

    Returns the span starts (for bisecting) and the spans as ``(start, end, offset,
    offset_before)`` in epoch seconds, where ``offset_before`` is the offset one second before
    ``start``. The year's first span starts on January 1 whether or not the offset changes
    there. Transitions are found by sampling the offset daily and bisecting to the second, so two
    transitions less than a day apart that cancel out are not seen (tzdb has none since 1970).
    """
    first = _wall_s(year, 1, 1)
    last = _wall_s(year + 1, 1, 1) - 1
    bounds = [first]
    known, known_offset = first, _offset_s(tz, first)
    sample = first
    while sample < last:
        sample = min(sample + _DAY_S, last)
        sample_offset = _offset_s(tz, sample)
        while sample_offset != known_offset:
            low, high = known, sample
            while high - low > 1:
                middle = (low + high) // 2
                if _offset_s(tz, middle) == known_offset:
                    low = middle
                else:
                    high = middle
            bounds.append(high)
            known, known_offset = high, _offset_s(tz, high)
        known = sample
    ends = [*bounds[1:], last + 1]
    spans = tuple(
        (start, end, _offset_s(tz, start), _offset_s(tz, start - 1))
        for start, end in zip(bounds, ends, strict=True)
    )
    return tuple(bounds), spans
