"""Rules of core.cron: syntax, validation, DST policy, time-zone handling and croniter defects."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterBadDateError, croniter

from core.cron import FoldPolicy, GapPolicy, parse_cron, resolve_timezone
from core.errors import InvalidCron, InvalidRequest

NEW_YORK = ZoneInfo("America/New_York")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fires(
    expression: str,
    after: str,
    count: int = 3,
    zone: str = "UTC",
    *,
    gap: GapPolicy = "shift",
    fold: FoldPolicy = "once",
) -> list[str]:
    cron = parse_cron(expression)
    return [iso(f) for f in cron.fire_times(at(after), ZoneInfo(zone), count, gap=gap, fold=fold)]


def croniter_fires(expression: str, after: str, count: int = 3, zone: str = "UTC") -> list[str]:
    it = croniter(expression, at(after).astimezone(ZoneInfo(zone)))
    return [iso(it.get_next(datetime)) for _ in range(count)]


# --- syntax ------------------------------------------------------------------------------------

# 2026-01-01 is a Thursday.
SYNTAX_CASES = [
    ("names", "0 9 * JAN-MAR mon,Wed,FRI", ["2026-01-02T09:00:00Z", "2026-01-05T09:00:00Z"]),
    ("month names", "0 0 1 jan,Jul *", ["2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z"]),
    (
        "list and range",
        "5,10-12 * * * *",
        ["2026-01-01T00:05:00Z", "2026-01-01T00:10:00Z", "2026-01-01T00:11:00Z"],
    ),
    ("step", "*/20 * * * *", ["2026-01-01T00:20:00Z", "2026-01-01T00:40:00Z"]),
    ("start/step", "5/20 * * * *", ["2026-01-01T00:05:00Z", "2026-01-01T00:25:00Z"]),
    ("hour step", "0 */6 * * *", ["2026-01-01T06:00:00Z", "2026-01-01T12:00:00Z"]),
    ("sunday as 0", "0 0 * * 0", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
    ("sunday as 7", "0 0 * * 7", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
    ("sunday by name", "0 0 * * sun", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
    (
        "range ending on sunday",
        "0 0 * * fri-sun",
        ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"],
    ),
    (
        "range 5-7",
        "0 0 * * 5-7",
        ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"],
    ),
    # Both day fields restricted: a day matches if EITHER does (Jan 1 is not strictly after).
    (
        "dom OR dow",
        "0 0 1,20 * mon",
        [
            "2026-01-05T00:00:00Z",
            "2026-01-12T00:00:00Z",
            "2026-01-19T00:00:00Z",
            "2026-01-20T00:00:00Z",
        ],
    ),
    # Vixie: a day field starting with '*' makes the two fields combine by AND: odd Mondays.
    (
        "dom */2 AND dow",
        "0 0 */2 * 1",
        ["2026-01-05T00:00:00Z", "2026-01-19T00:00:00Z", "2026-02-09T00:00:00Z"],
    ),
    ("question mark", "0 0 ? * MON", ["2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z"]),
    ("@yearly", "@yearly", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
    ("@annually", "@annually", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
    ("@monthly", "@monthly", ["2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"]),
    ("@weekly", "@weekly", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
    ("@daily", "@daily", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]),
    ("@midnight", "@Midnight", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]),
    ("@hourly", "@HOURLY", ["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"]),
    (
        "L last day",
        "0 0 L * *",
        ["2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-31T00:00:00Z"],
    ),
    # Jan 15 is a Thursday; Feb 15 and Mar 15 are Sundays, so the nearest weekday is Monday.
    (
        "15W",
        "0 0 15W * *",
        ["2026-01-15T00:00:00Z", "2026-02-16T00:00:00Z", "2026-03-16T00:00:00Z"],
    ),
    # 2026-08-01 is a Saturday: the nearest weekday inside the month is Monday the 3rd.
    ("1W on a Saturday", "0 0 1W 8 *", ["2026-08-03T00:00:00Z", "2027-08-02T00:00:00Z"]),
    # 2026-05-31 is a Sunday: the nearest weekday inside the month is Friday the 29th.
    ("31W on a Sunday", "0 0 31W 5 *", ["2026-05-29T00:00:00Z", "2027-05-31T00:00:00Z"]),
    # Jan 31 and Feb 28 2026 are Saturdays.
    (
        "LW last weekday",
        "0 0 LW * *",
        ["2026-01-30T00:00:00Z", "2026-02-27T00:00:00Z", "2026-03-31T00:00:00Z"],
    ),
    (
        "5#3 third friday",
        "0 0 * * 5#3",
        ["2026-01-16T00:00:00Z", "2026-02-20T00:00:00Z", "2026-03-20T00:00:00Z"],
    ),
    ("fri#3 by name", "0 0 * * fri#3", ["2026-01-16T00:00:00Z", "2026-02-20T00:00:00Z"]),
    ("L5 last friday", "0 0 * * L5", ["2026-01-30T00:00:00Z", "2026-02-27T00:00:00Z"]),
    ("5L last friday", "0 0 * * 5L", ["2026-01-30T00:00:00Z", "2026-02-27T00:00:00Z"]),
    (
        "dom OR 5#3",
        "0 0 13 * 5#3",
        ["2026-01-13T00:00:00Z", "2026-01-16T00:00:00Z", "2026-02-13T00:00:00Z"],
    ),
    (
        "mondays and the third friday",
        "0 0 * * 1,5#3",
        ["2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z", "2026-01-16T00:00:00Z"],
    ),
    # Seconds first (Quartz): second 15 of 12:00, every day.
    ("seconds first", "15 0 12 * * *", ["2026-01-01T12:00:15Z", "2026-01-02T12:00:15Z"]),
    ("every 20 seconds", "*/20 * * * * *", ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z"]),
    ("tabs and spaces", " 0\t9  * * * ", ["2026-01-01T09:00:00Z", "2026-01-02T09:00:00Z"]),
]


@pytest.mark.parametrize(
    ("expression", "expected"), [pytest.param(e, x, id=i) for i, e, x in SYNTAX_CASES]
)
def test_syntax(expression: str, expected: list[str]) -> None:
    assert fires(expression, "2026-01-01T00:00:00Z", len(expected)) == expected


def test_last_day_of_february_in_a_leap_year() -> None:
    assert fires("0 0 L 2 *", "2024-01-01T00:00:00Z", 2) == [
        "2024-02-29T00:00:00Z",
        "2025-02-28T00:00:00Z",
    ]


def test_2100_is_not_a_leap_year() -> None:
    leap_day = parse_cron("0 0 29 2 *")
    assert fires("0 0 29 2 *", "2096-03-01T00:00:00Z", 1) == ["2104-02-29T00:00:00Z"]
    previous = leap_day.previous_at_or_before(at("2103-12-31T00:00:00Z"), ZoneInfo("UTC"))
    assert previous == at("2096-02-29T00:00:00Z")


def test_last_day_or_last_tuesday() -> None:
    # Sep 30 2025 is both; Oct 28 is the last Tuesday, Oct 31 the last day.
    assert fires("0 12 L * L2", "2025-09-26T00:00:00Z", 5) == [
        "2025-09-30T12:00:00Z",
        "2025-10-28T12:00:00Z",
        "2025-10-31T12:00:00Z",
        "2025-11-25T12:00:00Z",
        "2025-11-30T12:00:00Z",
    ]


def test_last_friday_of_a_month_ending_on_friday() -> None:
    # 2025-10-31 is a Friday, so the 24th is not the last one.
    assert fires("0 0 * * 5L", "2025-10-01T00:00:00Z", 2) == [
        "2025-10-31T00:00:00Z",
        "2025-11-28T00:00:00Z",
    ]


def test_six_fields_are_seconds_first_not_trailing_seconds() -> None:
    cron = parse_cron("15 0 12 * * *")
    assert cron.has_seconds
    assert not parse_cron("0 12 * * *").has_seconds
    # Read with trailing seconds (croniter's default): every second of 00:15 on the 12th.
    assert croniter_fires("15 0 12 * * *", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-12T00:15:00Z",
        "2026-01-12T00:15:01Z",
    ]
    assert fires("15 0 12 * * *", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T12:00:15Z",
        "2026-01-02T12:00:15Z",
    ]


def test_macros_equal_their_expansion() -> None:
    after = at("2026-05-05T05:05:05Z")
    for macro, expansion in [
        ("@yearly", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ]:
        assert parse_cron(macro).fire_times(after, NEW_YORK, 3) == parse_cron(expansion).fire_times(
            after, NEW_YORK, 3
        )


def test_rare_expression_fires_in_its_year() -> None:
    # A fifth Friday in February needs a leap year starting February on a Friday: 2036.
    assert fires("0 0 * 2 5#5", "2009-01-01T00:00:00Z", 2) == [
        "2036-02-29T00:00:00Z",
        "2064-02-29T00:00:00Z",
    ]


# --- rejection ---------------------------------------------------------------------------------

REJECTED = [
    ("", "expression", "empty"),
    ("  \t ", "expression", "empty"),
    ("* * * *", "expression", "5 fields"),
    ("0 0 * * * * 2026", "expression", "5 fields"),
    ("60 * * * *", "minute", "out of range"),
    ("* 24 * * *", "hour", "out of range"),
    ("* * 0 * *", "day-of-month", "out of range"),
    ("* * 32 * *", "day-of-month", "out of range"),
    ("* * * 0 *", "month", "out of range"),
    ("* * * 13 *", "month", "out of range"),
    ("* * * * 8", "day-of-week", "out of range"),
    ("60 * * * * *", "second", "out of range"),
    ("*/0 * * * *", "minute", "step"),
    ("* * * * * */0", "day-of-week", "step"),
    ("0/0 * * * * *", "second", "step"),
    ("*/61 * * * *", "minute", "step"),
    ("30-10 * * * *", "minute", "reversed"),
    ("* 20-4 * * *", "hour", "reversed"),
    ("* * * DEC-JAN *", "month", "reversed"),
    ("* * * * fri-mon", "day-of-week", "reversed"),
    ("* * * foo *", "month", "unknown value"),
    ("* * * * funday", "day-of-week", "unknown value"),
    ("* * * JAN-FOO *", "month", "unknown value"),
    ("1,,2 * * * *", "minute", "empty list item"),
    ("*-5 * * * *", "minute", "range"),
    ("? * * * *", "minute", "not allowed here"),
    ("L * * * *", "minute", "not allowed here"),
    ("* * * * 5#6", "day-of-week", "1-5"),
    ("* * * * 5#0", "day-of-week", "1-5"),
    ("0 0 32W * *", "day-of-month", "out of range"),
    ("0 0 L-3 * *", "day-of-month", "not allowed here"),
    ("\u0663 * * * *", "minute", "cannot read"),
    ("H * * * *", "minute", "hashed"),
    ("H(0-29)/10 * * * *", "minute", "hashed"),
    ("0 H * * *", "hour", "hashed"),
    ("R * * * *", "minute", "random"),
    ("@reboot", "expression", "@reboot"),
    ("@every 5m", "expression", "@every"),
    ("@fortnightly", "expression", "unknown macro"),
    ("@daily 0", "expression", "unknown macro"),
    ("CRON_TZ=UTC 0 0 * * *", "expression", "CRON_TZ= prefix"),
    ("TZ=Europe/Berlin 0 0 * * *", "expression", "TZ= prefix"),
    ("0 0 30 2 *", "expression", "never fires"),
    ("0 0 31 4,6,9,11 *", "expression", "never fires"),
    ("0 0 30,31 feb *", "expression", "never fires"),
    # '*/13' starts with '*', so it combines with '2#5' by AND: days 1, 14, 27 are never a 5th.
    ("0 0 */13 * 2#5", "expression", "never fires"),
    ("0," * 300 + "1 * * * *", "expression", "longer than"),
]


@pytest.mark.parametrize(
    ("expression", "cron_field", "reason"),
    [pytest.param(e, f, r, id=f"{f}: {e[:30]!r}") for e, f, r in REJECTED],
)
def test_rejected(expression: str, cron_field: str, reason: str) -> None:
    with pytest.raises(InvalidCron) as caught:
        parse_cron(expression)
    assert caught.value.cron_field == cron_field
    assert reason in caught.value.reason
    assert caught.value.code == "invalid_cron"
    assert caught.value.errors[0].field == "schedule.expression"
    message = caught.value.errors[0].reason
    if cron_field == "expression":
        assert message == caught.value.reason, "a whole-expression error is not 'expression field:'"
    else:
        assert message.startswith(f"{cron_field} field: ")


@pytest.mark.parametrize(
    "expression", ["0 0 29 2 *", "0 0 31 * *", "0 0 L 2 *", "0 0 30 1-2 *", "0 0 31W 2 *"]
)
def test_expressions_that_fire_in_some_month_are_accepted(expression: str) -> None:
    after = at("2026-01-01T00:00:00Z")
    assert parse_cron(expression).next_after(after, ZoneInfo("UTC")) > after


# --- the expression object ---------------------------------------------------------------------


def test_parse_is_cached_and_the_result_immutable_and_hashable() -> None:
    cron = parse_cron("*/5 * * * *")
    assert parse_cron("*/5 * * * *") is cron
    assert cron.source == "*/5 * * * *"
    assert len({cron, parse_cron("*/5 * * * *"), parse_cron("*/6 * * * *")}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cron.source = "* * * * *"  # type: ignore[misc]  # the assignment this test refuses


@pytest.mark.parametrize(
    ("expression", "fixed"),
    [
        ("30 2 * * *", True),
        ("0,30 2 * * *", True),
        ("0 0 1 */3 *", True),
        ("0 1-3 * * *", True),
        ("@daily", True),
        ("0 30 2 * * *", True),
        ("30 * * * *", False),
        ("*/15 2 * * *", False),
        ("0 */2 * * *", False),
        ("0 1-5/2 * * *", False),
        ("@hourly", False),
        ("*/10 30 2 * * *", False),
    ],
)
def test_is_fixed_time_follows_cronie(expression: str, fixed: bool) -> None:
    assert parse_cron(expression).is_fixed_time is fixed


def test_next_is_strictly_after() -> None:
    cron = parse_cron("0 * * * *")
    utc = ZoneInfo("UTC")
    assert iso(cron.next_after(at("2026-01-01T10:00:00Z"), utc)) == "2026-01-01T11:00:00Z"
    assert iso(cron.next_after(at("2026-01-01T09:59:59.999999Z"), utc)) == "2026-01-01T10:00:00Z"
    assert iso(cron.next_after(at("2026-01-01T10:00:00.500Z"), utc)) == "2026-01-01T11:00:00Z"
    seconds = parse_cron("*/10 * * * * *")
    assert iso(seconds.next_after(at("2026-01-01T10:00:10Z"), utc)) == "2026-01-01T10:00:20Z"


def test_results_are_utc_whole_seconds_from_any_offset() -> None:
    cron = parse_cron("30 9 * * *")
    tokyo_morning = datetime(2026, 1, 1, 9, 0, 0, 123456, tzinfo=timezone(timedelta(hours=9)))
    nxt = cron.next_after(tokyo_morning, ZoneInfo("Asia/Tokyo"))
    assert nxt == at("2026-01-01T00:30:00Z")
    assert nxt.tzinfo is UTC
    assert nxt.microsecond == 0


def test_bad_arguments() -> None:
    cron = parse_cron("* * * * *")
    utc = ZoneInfo("UTC")
    with pytest.raises(ValueError, match="naive"):
        cron.next_after(datetime(2026, 1, 1), utc)
    with pytest.raises(ValueError, match="gap"):
        cron.next_after(at("2026-01-01T00:00:00Z"), utc, gap="later")  # type: ignore[arg-type]  # a bad value on purpose
    with pytest.raises(ValueError, match="fold"):
        cron.fire_times(at("2026-01-01T00:00:00Z"), utc, 1, fold="twice")  # type: ignore[arg-type]  # a bad value on purpose
    with pytest.raises(ValueError, match="negative"):
        cron.fire_times(at("2026-01-01T00:00:00Z"), utc, -1)
    assert cron.fire_times(at("2026-01-01T00:00:00Z"), utc, 0) == []


def test_previous_at_or_before() -> None:
    cron = parse_cron("0 */6 * * *")
    utc = ZoneInfo("UTC")
    assert cron.previous_at_or_before(at("2026-01-01T12:00:00Z"), utc) == at("2026-01-01T12:00:00Z")
    assert cron.previous_at_or_before(at("2026-01-01T11:59:59.9Z"), utc) == at(
        "2026-01-01T06:00:00Z"
    )
    assert parse_cron("0 0 29 2 *").previous_at_or_before(at("2026-01-01T00:00:00Z"), utc) == at(
        "2024-02-29T00:00:00Z"
    )


def test_previous_with_seconds() -> None:
    cron = parse_cron("10,50 */5 * * * *")
    utc = ZoneInfo("UTC")
    assert cron.previous_at_or_before(at("2026-01-01T10:03:00Z"), utc) == at("2026-01-01T10:00:50Z")
    assert cron.previous_at_or_before(at("2026-01-01T10:00:49Z"), utc) == at("2026-01-01T10:00:10Z")
    assert cron.next_after(at("2026-01-01T10:00:10Z"), utc) == at("2026-01-01T10:00:50Z")


def test_previous_is_none_after_years_without_a_fire() -> None:
    rare = parse_cron("0 0 * 2 5#5")
    utc = ZoneInfo("UTC")
    assert rare.previous_at_or_before(at("2010-01-01T00:00:00Z"), utc) == at("2008-02-29T00:00:00Z")
    assert rare.previous_at_or_before(at("2030-01-01T00:00:00Z"), utc) is None


# --- daylight saving time ----------------------------------------------------------------------


def test_gap_shift_fires_at_the_end_of_the_gap() -> None:
    # New York skips 02:00-03:00 on 2026-03-08; 03:00 EDT is 07:00Z.
    assert fires("30 2 * * *", "2026-03-07T12:00:00Z", 2, "America/New_York") == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
    ]


def test_gap_shift_from_one_second_before_the_jump() -> None:
    assert fires("30 2 * * *", "2026-03-08T06:59:59Z", 1, "America/New_York") == [
        "2026-03-08T07:00:00Z"
    ]
    assert fires("30 2 * * *", "2026-03-08T07:00:00Z", 1, "America/New_York") == [
        "2026-03-09T06:30:00Z"
    ]


def test_gap_skip_drops_the_day() -> None:
    assert fires("30 2 * * *", "2026-03-07T12:00:00Z", 2, "America/New_York", gap="skip") == [
        "2026-03-09T06:30:00Z",
        "2026-03-10T06:30:00Z",
    ]


def test_several_occurrences_in_one_gap_fire_once() -> None:
    assert fires("0,30 2 * * *", "2026-03-07T12:00:00Z", 3, "America/New_York") == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:00:00Z",
        "2026-03-09T06:30:00Z",
    ]


def test_shifted_occurrence_and_real_one_at_the_same_instant_fire_once() -> None:
    # 02:00 shifts to 03:00, which is also a real 03:00 occurrence.
    assert fires("0 2,3 * * *", "2026-03-07T12:00:00Z", 3, "America/New_York") == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:00:00Z",
        "2026-03-09T07:00:00Z",
    ]


def test_fold_once_fires_on_the_first_pass() -> None:
    # New York repeats 01:00-02:00 on 2026-11-01: 01:30 EDT = 05:30Z, 01:30 EST = 06:30Z.
    assert fires("30 1 * * *", "2026-10-31T12:00:00Z", 2, "America/New_York") == [
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    ]


def test_fold_both_fires_on_both_passes() -> None:
    assert fires("30 1 * * *", "2026-10-31T12:00:00Z", 3, "America/New_York", fold="both") == [
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-02T06:30:00Z",
    ]


def test_fold_once_after_the_first_pass_waits_for_the_next_day() -> None:
    assert fires("30 1 * * *", "2026-11-01T06:00:00Z", 1, "America/New_York") == [
        "2026-11-02T06:30:00Z"
    ]


@pytest.mark.parametrize(("gap", "fold"), [("shift", "once"), ("skip", "both")])
def test_wildcard_minutes_follow_real_time_through_the_fold(
    gap: GapPolicy, fold: FoldPolicy
) -> None:
    assert fires(
        "*/30 1 * * *", "2026-11-01T04:00:00Z", 5, "America/New_York", gap=gap, fold=fold
    ) == [
        "2026-11-01T05:00:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-02T06:00:00Z",
    ]


@pytest.mark.parametrize("gap", ["shift", "skip"])
def test_wildcard_minutes_are_not_caught_up_after_the_gap(gap: GapPolicy) -> None:
    assert fires("*/30 2 * * *", "2026-03-07T12:00:00Z", 2, "America/New_York", gap=gap) == [
        "2026-03-09T06:00:00Z",
        "2026-03-09T06:30:00Z",
    ]


def test_lord_howe_half_hour_gap() -> None:
    # Lord Howe jumps 02:00 -> 02:30 (+10:30 -> +11) at 2026-10-03T15:30Z.
    assert fires("15 2 * * *", "2026-10-03T00:00:00Z", 2, "Australia/Lord_Howe") == [
        "2026-10-03T15:30:00Z",
        "2026-10-04T15:15:00Z",
    ]
    assert fires("15 2 * * *", "2026-10-03T00:00:00Z", 1, "Australia/Lord_Howe", gap="skip") == [
        "2026-10-04T15:15:00Z"
    ]


def test_lord_howe_half_hour_fold() -> None:
    # Lord Howe repeats 01:30-02:00 (+11 -> +10:30) from 2026-04-04T15:00Z.
    assert fires("45 1 * * *", "2026-04-04T12:00:00Z", 2, "Australia/Lord_Howe") == [
        "2026-04-04T14:45:00Z",
        "2026-04-05T15:15:00Z",
    ]
    assert fires("45 1 * * *", "2026-04-04T12:00:00Z", 3, "Australia/Lord_Howe", fold="both") == [
        "2026-04-04T14:45:00Z",
        "2026-04-04T15:15:00Z",
        "2026-04-05T15:15:00Z",
    ]


def test_midnight_gap_in_santiago() -> None:
    # Chile skips 00:00-01:00 on 2026-09-06 (-04 -> -03 at 04:00Z).
    assert fires("0 0 * * *", "2026-09-04T12:00:00Z", 3, "America/Santiago") == [
        "2026-09-05T04:00:00Z",
        "2026-09-06T04:00:00Z",
        "2026-09-07T03:00:00Z",
    ]


@pytest.mark.parametrize(("gap", "fold"), [("shift", "once"), ("skip", "both")])
def test_zone_without_dst(gap: GapPolicy, fold: FoldPolicy) -> None:
    assert fires("30 2 * * *", "2026-03-07T00:00:00Z", 2, "Asia/Kolkata", gap=gap, fold=fold) == [
        "2026-03-07T21:00:00Z",
        "2026-03-08T21:00:00Z",
    ]


def test_previous_follows_the_dst_policy() -> None:
    gap_day = at("2026-03-08T12:00:00Z")
    fixed = parse_cron("30 2 * * *")
    assert fixed.previous_at_or_before(gap_day, NEW_YORK) == at("2026-03-08T07:00:00Z")
    assert fixed.previous_at_or_before(gap_day, NEW_YORK, gap="skip") == at("2026-03-07T07:30:00Z")
    fold_day = at("2026-11-01T12:00:00Z")
    repeated = parse_cron("30 1 * * *")
    assert repeated.previous_at_or_before(fold_day, NEW_YORK) == at("2026-11-01T05:30:00Z")
    assert repeated.previous_at_or_before(fold_day, NEW_YORK, fold="both") == at(
        "2026-11-01T06:30:00Z"
    )


# --- time zones --------------------------------------------------------------------------------


def test_resolve_timezone() -> None:
    assert resolve_timezone("Europe/Berlin") is ZoneInfo("Europe/Berlin")
    assert resolve_timezone("UTC").key == "UTC"
    assert resolve_timezone("Etc/GMT+5").key == "Etc/GMT+5"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("Mars/Olympus_Mons", "unknown time zone"),
        ("utc", "unknown time zone"),
        ("America", "unknown time zone"),
        ("localtime", "not an IANA time zone name"),
        ("posixrules", "not an IANA time zone name"),
        ("/etc/localtime", "not an IANA time zone name"),
        ("../etc/passwd", "not an IANA time zone name"),
        ("posix/Europe/Berlin", "not an IANA time zone name"),
        ("right/UTC", "not an IANA time zone name"),
        ("Europe/Berlin ", "not an IANA time zone name"),
        ("Europe//Berlin", "not an IANA time zone name"),
    ],
)
def test_resolve_timezone_rejects(name: str, reason: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve_timezone(name)
    assert caught.value.errors[0].field == "schedule.timezone"
    assert reason in caught.value.errors[0].reason
    assert not isinstance(caught.value, InvalidCron)


@pytest.fixture
def set_host_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    def apply(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield apply
    monkeypatch.undo()
    time.tzset()


def _dst_sample() -> list[datetime | None]:
    results: list[datetime | None] = []
    for expression, zone, after in [
        ("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z"),
        ("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z"),
        ("*/15 * * * *", "Europe/Berlin", "2026-10-25T00:40:00Z"),
        ("0 9 * * 1-5", "Asia/Tokyo", "2026-01-01T00:00:00Z"),
    ]:
        tz = ZoneInfo.no_cache(zone)
        cron = parse_cron(expression)
        results += cron.fire_times(at(after), tz, 4)
        results.append(cron.previous_at_or_before(at(after), tz))
    return results


def test_results_do_not_depend_on_the_host_time_zone(
    set_host_tz: Callable[[str], None],
) -> None:
    apply = set_host_tz
    apply("UTC")
    baseline = _dst_sample()
    for host in ("America/Los_Angeles", "Pacific/Chatham", "Asia/Kathmandu"):
        apply(host)
        assert time.localtime(1_767_225_600).tm_gmtoff != 0
        assert _dst_sample() == baseline


def test_next_after_is_fast() -> None:
    cron = parse_cron("30 2 * * 1-5")
    after = at("2026-03-01T00:00:00Z")
    cron.next_after(after, NEW_YORK)
    started = time.perf_counter()
    for i in range(1000):
        cron.next_after(after + timedelta(minutes=7 * i), NEW_YORK)
    # About 3 us per call when measured; the bound only catches an accidental minute-by-minute walk.
    assert time.perf_counter() - started < 1.0


# --- croniter defects corrected here -----------------------------------------------------------
# croniter 7.0.0 already gets some historical bugs right, and they stay covered by the case file:
# '*/10' in day-of-month (croniter #178) and get_prev around Feb 29 (C09).


def test_croniter_fires_a_fixed_time_twice_in_the_fold() -> None:
    assert croniter_fires("30 1 * * *", "2026-10-31T12:00:00Z", 2, "America/New_York") == [
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
    ]
    assert fires("30 1 * * *", "2026-10-31T12:00:00Z", 2, "America/New_York") == [
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    ]
    prev = croniter("30 1 * * *", at("2026-11-01T12:00:00Z").astimezone(NEW_YORK))
    assert iso(prev.get_prev(datetime)) == "2026-11-01T06:30:00Z"


def test_croniter_catches_up_a_stepped_hour_after_the_gap() -> None:
    # Hours 0,2,4..: 02:00 does not exist on 2026-03-08 and a stepped hour is not fixed-time.
    assert croniter_fires("0 */2 * * *", "2026-03-08T04:30:00Z", 3, "America/New_York") == [
        "2026-03-08T05:00:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08T08:00:00Z",
    ]
    assert fires("0 */2 * * *", "2026-03-08T04:30:00Z", 3, "America/New_York") == [
        "2026-03-08T05:00:00Z",
        "2026-03-08T08:00:00Z",
        "2026-03-08T10:00:00Z",
    ]
    assert croniter_fires("15 */2 * * *", "2026-10-03T12:00:00Z", 2, "Australia/Lord_Howe") == [
        "2026-10-03T13:45:00Z",
        "2026-10-03T15:30:00Z",
    ]
    assert fires("15 */2 * * *", "2026-10-03T12:00:00Z", 2, "Australia/Lord_Howe") == [
        "2026-10-03T13:45:00Z",
        "2026-10-03T17:15:00Z",
    ]


def test_croniter_ors_a_starred_day_of_month_with_day_of_week() -> None:
    assert croniter_fires("0 0 */2 * 1", "2026-01-01T00:00:00Z") == [
        "2026-01-03T00:00:00Z",
        "2026-01-05T00:00:00Z",
        "2026-01-07T00:00:00Z",
    ]
    assert fires("0 0 */2 * 1", "2026-01-01T00:00:00Z") == [
        "2026-01-05T00:00:00Z",
        "2026-01-19T00:00:00Z",
        "2026-02-09T00:00:00Z",
    ]


def test_croniter_reads_an_equal_range_as_the_whole_field() -> None:
    assert croniter_fires("0 5-5 * * *", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T01:00:00Z",
        "2026-01-01T02:00:00Z",
    ]
    assert fires("0 5-5 * * *", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T05:00:00Z",
        "2026-01-02T05:00:00Z",
    ]
    assert croniter_fires("45-45/20 * * * *", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T00:20:00Z",
        "2026-01-01T00:40:00Z",
    ]
    assert fires("45-45/20 * * * *", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T00:45:00Z",
        "2026-01-01T01:45:00Z",
    ]


def test_croniter_fails_on_day_of_month_with_nth_weekday() -> None:
    with pytest.raises(CroniterBadDateError):
        croniter_fires("0 0 12 * 4#1", "2024-04-01T00:00:00Z")
    # 2024-04-01 is a Monday: first Thursdays are Apr 4 and May 2.
    assert fires("0 0 12 * 4#1", "2024-04-01T00:00:00Z", 4) == [
        "2024-04-04T00:00:00Z",
        "2024-04-12T00:00:00Z",
        "2024-05-02T00:00:00Z",
        "2024-05-12T00:00:00Z",
    ]


def test_croniter_drops_the_last_day_when_combined_with_last_weekday() -> None:
    assert croniter_fires("0 12 L * L2", "2025-09-26T00:00:00Z") == [
        "2025-09-30T12:00:00Z",
        "2025-10-28T12:00:00Z",
        "2025-11-25T12:00:00Z",
    ]
    assert "2025-10-31T12:00:00Z" in fires("0 12 L * L2", "2025-09-26T00:00:00Z")


def test_croniter_accepts_a_date_that_never_comes() -> None:
    assert croniter.is_valid("0 0 30 2 *")
    with pytest.raises(CroniterBadDateError):
        croniter_fires("0 0 30 2 *", "2026-01-01T00:00:00Z", 1)
    with pytest.raises(InvalidCron, match="never fires"):
        parse_cron("0 0 30 2 *")


def test_croniter_wraps_a_reversed_range() -> None:
    assert croniter_fires("30-10 * * * *", "2026-01-01T00:09:00Z", 2) == [
        "2026-01-01T00:10:00Z",
        "2026-01-01T00:30:00Z",
    ]
    with pytest.raises(InvalidCron, match="reversed"):
        parse_cron("30-10 * * * *")


def test_croniter_hashed_and_random_values_are_refused() -> None:
    assert croniter.is_valid("R * * * *")
    assert croniter.is_valid("H * * * *", hash_id="job-1")
    for expression in ("R * * * *", "H * * * *", "H(0-29) * * * *"):
        with pytest.raises(InvalidCron):
            parse_cron(expression)


def test_croniter_expand_from_start_time_is_not_exposed() -> None:
    start = at("2026-05-04T10:07:00Z")
    rebased = croniter("10-50/15 * * * *", start, expand_from_start_time=True)
    assert [iso(rebased.get_next(datetime)) for _ in range(2)] == [
        "2026-05-04T10:22:00Z",
        "2026-05-04T10:37:00Z",
    ]
    for after in ("2026-05-04T10:07:00Z", "2026-05-04T10:03:00Z"):
        assert fires("10-50/15 * * * *", after, 3) == [
            "2026-05-04T10:10:00Z",
            "2026-05-04T10:25:00Z",
            "2026-05-04T10:40:00Z",
        ]


def test_croniter_does_not_read_lw_or_quartz_last_weekday() -> None:
    after = at("2026-01-01T00:00:00Z")
    for expression in ("0 0 LW * *", "0 0 * * 5L"):
        assert not croniter.is_valid(expression)
        assert parse_cron(expression).next_after(after, ZoneInfo("UTC")) == at(
            "2026-01-30T00:00:00Z"
        )
