"""The Upcoming heatmap and its DST marks: pure functions on fixed instants (Europe/Berlin
changes on 2026-03-29 01:00 UTC, 02:00 → 03:00, and 2026-10-25 01:00 UTC, 03:00 → 02:00)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from core import heatmap as hm
from core import schedule as schedules
from core.model import CronSchedule, IntervalSchedule, Schedule

BERLIN = ZoneInfo("Europe/Berlin")
SPRING = datetime(2026, 3, 27, tzinfo=UTC)
AUTUMN = datetime(2026, 10, 23, tzinfo=UTC)


def nightly(**rules: str) -> CronSchedule:
    return CronSchedule(expression="30 2 * * *", timezone="Europe/Berlin", **rules)  # type: ignore[arg-type]


def jobs(schedule: Schedule, start: datetime, n: int = 1) -> list[hm.ScheduledJob]:
    first = schedules.first_run_at(schedule, start)
    assert first is not None
    return [hm.ScheduledJob(f"job-{i}", "noop", first, schedule) for i in range(n)]


def week(
    schedule: Schedule, start: datetime, n: int = 1, zone: str = "Europe/Berlin"
) -> hm.UpcomingHeatmap:
    s, e = hm.window(start)
    return hm.heatmap(
        hm.group_jobs(jobs(schedule, start, n)),
        start=s,
        end=e,
        display=ZoneInfo(zone),
        display_name=zone,
    )


def test_a_gap_shift_moves_the_occurrence_to_the_gaps_end_and_says_so() -> None:
    data = week(nightly(), SPRING, n=3)
    assert data.fires == 3 * 7 and data.jobs == 3
    hours = {d.date: d.hours for d in data.days}
    assert hours["2026-03-28"][2] == 3 and hours["2026-03-29"][2] == 0
    assert hours["2026-03-29"][3] == 3  # 02:30 does not exist that night: it runs at 03:00
    [mark] = data.marks
    assert (mark.at, mark.kind, mark.rule, mark.jobs) == (
        datetime(2026, 3, 29, 1, tzinfo=UTC), "shifted", "gap: shift", 3
    )  # fmt: skip
    assert mark.job_ids == ["job-0", "job-1", "job-2"]
    [change] = data.transitions
    assert (change.at, change.offset_before_seconds, change.offset_after_seconds) == (
        datetime(2026, 3, 29, 1, tzinfo=UTC), 3600, 7200
    )  # fmt: skip


def test_a_gap_skip_drops_the_occurrence_and_marks_where() -> None:
    data = week(nightly(gap="skip"), SPRING)
    assert data.fires == 6
    assert sum({d.date: d.hours for d in data.days}["2026-03-29"]) == 0
    assert [(m.at, m.kind, m.rule) for m in data.marks] == [
        (datetime(2026, 3, 29, 1, tzinfo=UTC), "skipped", "gap: skip")
    ]


@pytest.mark.parametrize(("fold", "fires", "kinds"), [
    ("once", 7, ["fold-first"]), ("both", 8, ["fold-first", "fold-second"])
])  # fmt: skip
def test_a_fold_runs_once_or_twice_as_the_rule_says(
    fold: str, fires: int, kinds: list[str]
) -> None:
    data = week(nightly(fold=fold), AUTUMN)
    assert data.fires == fires
    assert [m.kind for m in data.marks] == kinds
    assert {m.rule for m in data.marks} == {f"fold: {fold}"}
    assert {d.date: d.hours for d in data.days}["2026-10-25"][2] == fires - 6


def test_expressions_that_are_not_fixed_time_get_no_marks() -> None:
    hourly = CronSchedule(expression="0 * * * *", timezone="Europe/Berlin")
    data = week(hourly, SPRING)
    assert data.marks == [] and data.fires == 7 * 24 - 1  # the lost hour has no o'clock
    assert data.busiest_fires == 1


def test_intervals_count_per_hour_and_the_busiest_hour_is_the_earliest_peak() -> None:
    every_20_min = IntervalSchedule(every_seconds=1200, start_at=SPRING + timedelta(minutes=5))
    data = week(every_20_min, SPRING, zone="UTC")
    assert data.fires == 7 * 24 * 3
    assert all(h == 3 for d in data.days for h in d.hours)
    assert (data.busiest_at, data.busiest_fires) == (SPRING, 3)
    assert data.transitions == []


def test_fire_times_past_the_cap_are_truncated() -> None:
    every_second = CronSchedule(expression="* * * * * *")
    data = week(every_second, SPRING, zone="UTC")
    assert data.truncated and data.fires <= hm.MAX_FIRES_PER_SCHEDULE


@pytest.mark.parametrize("every_seconds", [1, 0.25, 45, 60, 600, 1000, 5400])
def test_interval_counts_equal_the_fire_times_one_by_one(every_seconds: float) -> None:
    """The constant-time counts (whole minutes, divisors of a minute) and the loop (others)
    agree with core.schedule's own fire times, minute by minute."""
    schedule = IntervalSchedule(
        every_seconds=every_seconds, start_at=SPRING + timedelta(seconds=37.5)
    )
    _, end = hm.window(SPRING)
    data = week(schedule, SPRING, zone="UTC")
    expected = Counter[tuple[str, int]]()
    t = schedule.start_at
    while t is not None and t < end:
        expected[(t.date().isoformat(), t.hour)] += 1
        t = schedules.next_run_after(schedule, t)
    got = {(d.date, h): n for d in data.days for h, n in enumerate(d.hours) if n}
    assert got == dict(expected)
    assert data.fires == sum(expected.values()) and not data.truncated


def test_marks_of_a_jobs_next_fire_times() -> None:
    schedule = nightly(fold="both")
    first = schedules.first_run_at(schedule, AUTUMN)
    times = schedules.upcoming(schedule, first, 5)
    marks = hm.marks_of(schedule, times)
    assert [(m.at.isoformat(), m.kind) for m in marks] == [
        ("2026-10-25T00:30:00+00:00", "fold-first"), ("2026-10-25T01:30:00+00:00", "fold-second")
    ]  # fmt: skip
    assert hm.marks_of(IntervalSchedule(every_seconds=60), times) == []


EXPRESSIONS = [
    "*/5 * * * *", "*/15 * * * *", "0 * * * *", "10 */2 * * *", "*/10 8-17 * * *",
    "30 2 * * *", "0 6,18 * * *", "*/20 * * * * *", "0 0 1 * *", "0 8 * * 1-5", "@hourly",
    "45 6 * * 1", "0 9 1,15 * *", "*/10 8-17 * * 1-5", "0 3 * * 0", "0 0 1-7 * 1", "59 23 31 12 *",
]  # fmt: skip


RARE = {"0 0 1 * *", "0 9 1,15 * *", "0 0 1-7 * 1", "59 23 31 12 *", "45 6 * * 1", "0 3 * * 0"}
"""Expressions that may fire not at all in a window, or not before an end time in it."""


@pytest.mark.parametrize("expression", EXPRESSIONS)
@pytest.mark.parametrize(
    "zone", ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
)
@pytest.mark.parametrize(
    "now",
    [datetime(2026, 12, 2, 9, 17, 30, tzinfo=UTC), SPRING, AUTUMN + timedelta(days=6, hours=5)],
    ids=["no-transition", "spring", "autumn"],
)
def test_fire_times_from_matching_wall_times_equal_the_iterators(
    expression: str, zone: str, now: datetime
) -> None:
    """An expression's fire times from its matching wall times shifted by the zone's offset (a
    zone without a transition in the window; else the iterator's anyway) are the iterator's,
    minute by minute; so are the marks, the cap and an end time inside the window."""
    start, end = hm.window(now)
    for schedule in (
        CronSchedule(expression=expression, timezone=zone),
        CronSchedule(expression=expression, timezone=zone, end_at=start + timedelta(days=3, minutes=5)),
    ):  # fmt: skip
        first = schedules.first_run_at(schedule, now)
        if first is None:  # a rare one ends before its first fire time
            assert expression in RARE and schedule.end_at is not None
            continue
        fast = hm._cron_fires(schedule, first, start, end)
        slow = hm._cron_fires(schedule, first, start, end, fast=False)
        assert fast == slow
        assert sum(fast.bins.values()) > 0 or expression in RARE
