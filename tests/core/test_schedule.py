"""Fire-time rules of core.schedule: validation, first and next runs, misfire planning.

Expected instants are written out by hand from the schedule's definition (or taken from the
real-world cases of tests/cases/scheduling-cases.json, cited by id), never recomputed with the
functions under test.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from core import schedule as schedule_module
from core.cron import parse_cron
from core.errors import InvalidCron, InvalidRequest
from core.model import (
    CronSchedule,
    ImmediateSchedule,
    IntervalSchedule,
    MisfirePolicy,
    OnceSchedule,
    Schedule,
)
from core.schedule import (
    DEFAULT_MISFIRE_GRACE_SECONDS,
    MAX_ON_TIME,
    DuePlan,
    Misfire,
    _scan_steps,
    first_run_at,
    next_run_after,
    normalize,
    plan_buffered,
    plan_due,
)
from core.timeutil import isoformat_z

CASES_FILE = Path(__file__).resolve().parent.parent / "cases" / "scheduling-cases.json"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PLUS_2 = timezone(timedelta(hours=2))
MINUTELY = CronSchedule(expression="* * * * *")


def utc(text: str) -> datetime:
    """An instant written as ``2026-06-01T10:21:00Z``."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def case(case_id: str) -> dict[str, Any]:
    cases: list[dict[str, Any]] = json.loads(CASES_FILE.read_text(encoding="utf-8"))
    return next(c for c in cases if c["id"] == case_id)


def dispatches(schedule: Schedule, next_run_at: datetime, now: datetime) -> list[DuePlan]:
    """What a scheduler that wakes at ``now`` dispatches: plans until the next run is in the future."""
    plans: list[DuePlan] = []
    due: datetime | None = next_run_at
    while due is not None and due <= now:
        plan = plan_due(schedule, due, now)
        plans.append(plan)
        assert len(plans) < 1000, "the plan never leaves the past"
        due = plan.next_run_at
    return plans


def field_of(err: InvalidRequest) -> list[str]:
    return [e.field for e in err.errors]


# --- normalize -----------------------------------------------------------------------------


def test_normalize_rejects_execute_at_without_an_offset() -> None:
    """Case S03-executeAt-without-offset: a naive executeAt is refused, never guessed."""
    with pytest.raises(InvalidRequest) as caught:
        normalize(OnceSchedule(execute_at=datetime(2026, 9, 1, 3, 0)), NOW)

    assert field_of(caught.value) == ["schedule.executeAt"]
    assert caught.value.status == 422
    assert "offset" in caught.value.errors[0].reason


def test_normalize_converts_execute_at_to_utc() -> None:
    """Case S03-executeAt-without-offset: 05:00+02:00 is stored as 03:00Z."""
    got = normalize(OnceSchedule(execute_at=datetime(2026, 9, 1, 5, 0, tzinfo=PLUS_2)), NOW)

    assert got == OnceSchedule(execute_at=utc("2026-09-01T03:00:00Z"))
    assert isinstance(got, OnceSchedule)
    assert got.execute_at.utcoffset() == timedelta(0)


def test_normalize_rejects_an_execute_at_far_in_the_past() -> None:
    """Case S02-once-job-in-the-past, "far past": 422 naming executeAt."""
    with pytest.raises(InvalidRequest) as caught:
        normalize(OnceSchedule(execute_at=utc("2020-01-01T00:00:00Z")), NOW)

    assert field_of(caught.value) == ["schedule.executeAt"]
    assert caught.value.status == 422
    assert "past" in caught.value.errors[0].reason
    assert caught.value.errors[0].reason.endswith(f"{isoformat_z(NOW)})"), "instants in UTC, Z"


def test_normalize_accepts_a_slightly_late_execute_at_in_utc_milliseconds() -> None:
    """Case S02-once-job-in-the-past, "1 s late": accepted (it runs at once)."""
    late = datetime(2026, 6, 1, 13, 59, 59, 123_456, tzinfo=PLUS_2)

    got = normalize(OnceSchedule(execute_at=late), NOW)

    assert got == OnceSchedule(execute_at=datetime(2026, 6, 1, 11, 59, 59, 123_000, tzinfo=UTC))


@pytest.mark.parametrize(
    ("late_seconds", "grace_seconds", "accepted"),
    [
        (DEFAULT_MISFIRE_GRACE_SECONDS, DEFAULT_MISFIRE_GRACE_SECONDS, True),
        (DEFAULT_MISFIRE_GRACE_SECONDS + 0.001, DEFAULT_MISFIRE_GRACE_SECONDS, False),
        (5.0, 5.0, True),
        (5.001, 5.0, False),
        (-3600.0, 5.0, True),
    ],
)
def test_normalize_grace_boundary(
    late_seconds: float, grace_seconds: float, accepted: bool
) -> None:
    schedule = OnceSchedule(execute_at=NOW - timedelta(seconds=late_seconds))

    if accepted:
        assert normalize(schedule, NOW, grace_seconds=grace_seconds) == schedule
    else:
        with pytest.raises(InvalidRequest):
            normalize(schedule, NOW, grace_seconds=grace_seconds)


@pytest.mark.parametrize("expression", ["61 * * * *", "* * *", "0 0 30 2 *", "@reboot", ""])
def test_normalize_rejects_a_cron_expression_as_core_cron_does(expression: str) -> None:
    with pytest.raises(InvalidCron) as expected:
        parse_cron(expression)

    with pytest.raises(InvalidCron) as caught:
        normalize(CronSchedule(expression=expression), NOW)

    assert caught.value.errors == expected.value.errors
    assert field_of(caught.value) == ["schedule.expression"]


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "/etc/localtime", "localtime"])
def test_normalize_rejects_an_unknown_time_zone(zone: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        normalize(CronSchedule(expression="0 9 * * *", timezone=zone), NOW)

    assert field_of(caught.value) == ["schedule.timezone"]


@pytest.mark.parametrize(
    "schedule",
    [
        ImmediateSchedule(),
        IntervalSchedule(every_seconds=30),
        CronSchedule(expression="30 2 * * 1-5", timezone="America/New_York"),
        OnceSchedule(execute_at=utc("2026-06-02T00:00:00Z")),
    ],
)
def test_normalize_keeps_a_valid_schedule(schedule: Schedule) -> None:
    assert normalize(schedule, NOW) == schedule


# --- first_run_at / next_run_after ---------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "now", "expected"),
    [
        pytest.param(ImmediateSchedule(), NOW, NOW, id="immediate-now"),
        pytest.param(
            OnceSchedule(execute_at=datetime(2026, 6, 2, 11, 0, 0, 250_000, tzinfo=PLUS_2)),
            NOW,
            utc("2026-06-02T09:00:00.250Z"),
            id="once-in-utc",
        ),
        pytest.param(
            IntervalSchedule(every_seconds=90),
            utc("2026-06-01T10:00:00.123Z"),
            utc("2026-06-01T10:01:30.123Z"),
            id="interval-now-plus-every",
        ),
        pytest.param(
            IntervalSchedule(every_seconds=0.25),
            utc("2026-06-01T10:00:00Z"),
            utc("2026-06-01T10:00:00.250Z"),
            id="interval-sub-second",
        ),
        pytest.param(
            CronSchedule(expression="0 9 * * *", timezone="Europe/Berlin"),
            utc("2026-06-01T06:00:00Z"),  # 08:00 in Berlin (CEST, +02:00)
            utc("2026-06-01T07:00:00Z"),
            id="cron-in-zone-today",
        ),
        pytest.param(
            CronSchedule(expression="0 9 * * *", timezone="Europe/Berlin"),
            utc("2026-06-01T07:00:00Z"),  # exactly 09:00 in Berlin: strictly after
            utc("2026-06-02T07:00:00Z"),
            id="cron-strictly-after-now",
        ),
        pytest.param(
            CronSchedule(expression="*/15 * * * *"),
            utc("2026-06-01T10:07:31.5Z"),
            utc("2026-06-01T10:15:00Z"),
            id="cron-utc",
        ),
    ],
)
def test_first_run_at(schedule: Schedule, now: datetime, expected: datetime) -> None:
    got = first_run_at(schedule, now)

    assert got == expected
    assert got.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("schedule", "occurrence", "expected"),
    [
        pytest.param(ImmediateSchedule(), NOW, None, id="immediate"),
        pytest.param(OnceSchedule(execute_at=NOW), NOW, None, id="once"),
        pytest.param(
            IntervalSchedule(every_seconds=90),
            utc("2026-06-01T10:00:00Z"),
            utc("2026-06-01T10:01:30Z"),
            id="interval",
        ),
        pytest.param(
            CronSchedule(expression="*/15 * * * *"),
            utc("2026-06-01T10:00:00Z"),
            utc("2026-06-01T10:15:00Z"),
            id="cron",
        ),
        pytest.param(
            CronSchedule(expression="30 2 * * *", timezone="America/New_York"),
            utc("2026-03-07T07:30:00Z"),  # 02:30 EST; 02:30 on 03-08 is in the DST gap
            utc("2026-03-08T07:00:00Z"),
            id="cron-dst-gap-C02",
        ),
    ],
)
def test_next_run_after(
    schedule: Schedule, occurrence: datetime, expected: datetime | None
) -> None:
    assert next_run_after(schedule, occurrence) == expected


@pytest.mark.parametrize(
    ("schedule", "expected_next"),
    [
        (IntervalSchedule(every_seconds=60), utc("2026-06-01T10:01:00Z")),
        (CronSchedule(expression="*/15 * * * *"), utc("2026-06-01T10:15:00Z")),
    ],
)
def test_the_next_run_counts_from_the_scheduled_time_not_from_now(
    schedule: Schedule, expected_next: datetime
) -> None:
    occurrence = utc("2026-06-01T10:00:00Z")
    for now in (utc("2026-06-01T09:59:59.9Z"), utc("2026-06-01T10:00:45Z")):
        assert plan_due(schedule, occurrence, now) == DuePlan((occurrence,), expected_next, None)


# --- plan_due ------------------------------------------------------------------------------


def test_an_on_time_run_has_no_misfire() -> None:
    plan = plan_due(MINUTELY, utc("2026-06-01T10:00:00Z"), utc("2026-06-01T10:00:20Z"))

    assert plan == DuePlan((utc("2026-06-01T10:00:00Z"),), utc("2026-06-01T10:01:00Z"), None)


def test_a_run_late_by_exactly_the_grace_is_on_time() -> None:
    occurrence = utc("2026-06-01T10:00:00Z")
    now = occurrence + timedelta(seconds=DEFAULT_MISFIRE_GRACE_SECONDS)

    # 10:00 is exactly the grace late, 10:01 is due now: both are on time and both run.
    assert plan_due(MINUTELY, occurrence, now) == DuePlan(
        (occurrence, utc("2026-06-01T10:01:00Z")), utc("2026-06-01T10:02:00Z")
    )


def test_every_occurrence_within_the_grace_runs() -> None:
    every_10s = IntervalSchedule(every_seconds=10)
    occurrence = utc("2026-06-01T10:00:00Z")
    plan = plan_due(every_10s, occurrence, occurrence + timedelta(seconds=25))

    assert plan.runs == tuple(occurrence + timedelta(seconds=s) for s in (0, 10, 20))
    assert plan.next_run_at == occurrence + timedelta(seconds=30)
    assert plan.misfire is None


@pytest.mark.parametrize(
    ("policy", "runs", "missed"),
    [
        (MisfirePolicy.RUN_ONCE, ["10:20"], 19),
        (MisfirePolicy.SKIP, [], 20),
        (MisfirePolicy.RUN_ALL, [f"10:{m:02d}" for m in range(11, 21)], 10),
    ],
)
def test_misfire_policies(policy: MisfirePolicy, runs: list[str], missed: int) -> None:
    """20 minutely occurrences 10:01-10:20, all more than the 30 s grace late at 10:20:45."""
    plan = plan_due(
        MINUTELY,
        utc("2026-06-01T10:01:00Z"),
        utc("2026-06-01T10:20:45Z"),
        grace_seconds=30,
        policy=policy,
        max_catch_up=10,
    )

    assert [t.strftime("%H:%M") for t in plan.runs] == runs
    assert plan.next_run_at == utc("2026-06-01T10:21:00Z")
    assert plan.misfire is not None
    assert plan.misfire.missed == missed
    assert plan.misfire.policy == policy
    assert plan.misfire.first_missed == utc("2026-06-01T10:01:00Z")
    assert (
        plan.misfire.last_missed
        == {
            MisfirePolicy.RUN_ONCE: utc("2026-06-01T10:19:00Z"),
            MisfirePolicy.SKIP: utc("2026-06-01T10:20:00Z"),
            MisfirePolicy.RUN_ALL: utc("2026-06-01T10:10:00Z"),
        }[policy]
    )


def test_an_on_time_occurrence_serves_as_the_catch_up_run() -> None:
    plan = plan_due(MINUTELY, utc("2026-06-01T10:01:00Z"), utc("2026-06-01T10:21:30Z"))

    assert plan.runs == (utc("2026-06-01T10:21:00Z"),)
    assert plan.misfire is not None and plan.misfire.missed == 20


def test_s01_misfire_after_downtime_runs_the_latest_occurrence_once() -> None:
    """Case S01-misfire-after-downtime: minutely job, last dispatch 08:29, back at 10:21:30."""
    expected = case("S01-misfire-after-downtime")["expected"]
    scheduled = [utc(d["scheduledTime"]) for d in expected["dispatches"]]

    plan = plan_due(MINUTELY, utc("2026-06-01T08:30:00Z"), utc("2026-06-01T10:21:30Z"))

    assert plan.runs[0] == scheduled[0] == utc("2026-06-01T10:21:00Z")
    assert plan.next_run_at == scheduled[1] == utc("2026-06-01T10:22:00Z")
    assert plan.misfire == Misfire(
        missed=expected["missed_recorded"],
        first_missed=utc("2026-06-01T08:30:00Z"),
        last_missed=utc("2026-06-01T10:20:00Z"),
        policy=MisfirePolicy.RUN_ONCE,
    )
    assert expected["missed_recorded"] == 111


def test_s01_after_the_restart_dispatches_once_then_on_time() -> None:
    """Case S01-misfire-after-downtime: not 112 back-to-back runs, and nextRunAt leaves the past."""
    expected = case("S01-misfire-after-downtime")["expected"]
    scheduled = [utc(d["scheduledTime"]) for d in expected["dispatches"]]

    at_restart = dispatches(MINUTELY, utc("2026-06-01T08:30:00Z"), utc("2026-06-01T10:21:30Z"))
    assert [p.runs[0] for p in at_restart] == scheduled[:1]
    assert at_restart[-1].next_run_at == scheduled[1]

    later = [
        plan_due(MINUTELY, occurrence, occurrence + timedelta(seconds=0.2))
        for occurrence in scheduled[1:]
    ]
    assert [p.runs[0] for p in later] == scheduled[1:]
    assert all(p.misfire is None for p in later)


def test_s01_daily_variant_runs_one_catch_up() -> None:
    """Case S01-misfire-after-downtime, daily variant: "0 3 * * *" down 02:55Z-09:00Z."""
    variant = case("S01-misfire-after-downtime")["input"]["daily_variant"]
    schedule = CronSchedule(expression=variant["expression"])

    plans = dispatches(schedule, utc("2026-06-01T03:00:00Z"), utc("2026-06-01T09:00:00Z"))

    assert len(plans) == variant["expected_catch_up_runs"] == 1
    assert plans[0].runs[0] == utc("2026-06-01T03:00:00Z")
    assert plans[0].next_run_at == utc("2026-06-02T03:00:00Z")
    assert plans[0].misfire is None


def test_a_cron_misfire_in_a_zone_reports_wall_clock_occurrences() -> None:
    schedule = CronSchedule(expression="0 9 * * *", timezone="Europe/Berlin")
    # Due 06-01 09:00 Berlin (07:00Z); back on 06-04 at 10:00 Berlin.
    plan = plan_due(schedule, utc("2026-06-01T07:00:00Z"), utc("2026-06-04T08:00:00Z"))

    assert plan == DuePlan(
        (utc("2026-06-04T07:00:00Z"),),
        utc("2026-06-05T07:00:00Z"),
        Misfire(
            3, utc("2026-06-01T07:00:00Z"), utc("2026-06-03T07:00:00Z"), MisfirePolicy.RUN_ONCE
        ),
    )


@pytest.mark.parametrize(
    ("every_seconds", "late", "run_for", "missed", "last_missed"),
    [
        # due T, T+60, …, T+600 (11 occurrences): run T+600, 10 missed (T … T+540)
        (60, timedelta(minutes=10, seconds=30), timedelta(minutes=10), 10, timedelta(minutes=9)),
        # due T, T+90, …, T+540 (7 occurrences): run T+540, 6 missed (T … T+450)
        (90, timedelta(minutes=10), timedelta(seconds=540), 6, timedelta(seconds=450)),
        # due T, T+61.5: run T+61.5, 1 missed (T)
        (61.5, timedelta(seconds=100), timedelta(seconds=61.5), 1, timedelta(0)),
    ],
)
def test_an_interval_misfire_runs_the_latest_due_occurrence(
    every_seconds: float, late: timedelta, run_for: timedelta, missed: int, last_missed: timedelta
) -> None:
    t = utc("2026-06-01T08:00:00Z")
    plan = plan_due(IntervalSchedule(every_seconds=every_seconds), t, t + late)

    assert plan == DuePlan(
        (t + run_for,),
        t + run_for + timedelta(seconds=every_seconds),
        Misfire(missed, t, t + last_missed, MisfirePolicy.RUN_ONCE),
    )


def test_interval_and_cron_misfires_agree_for_the_same_occurrences() -> None:
    occurrence, now = utc("2026-06-01T08:30:00Z"), utc("2026-06-01T10:21:30Z")

    by_interval = plan_due(IntervalSchedule(every_seconds=60), occurrence, now)

    assert by_interval == plan_due(MINUTELY, occurrence, now)


def test_a_slow_interval_run_beyond_the_grace_is_late_but_not_a_misfire() -> None:
    t = utc("2026-06-01T08:00:00Z")

    plan = plan_due(IntervalSchedule(every_seconds=3600), t, t + timedelta(minutes=5))

    assert plan == DuePlan((t,), t + timedelta(hours=1), None)


@pytest.mark.parametrize(
    "schedule",
    [ImmediateSchedule(), OnceSchedule(execute_at=utc("2026-06-01T08:00:00Z"))],
    ids=["immediate", "once"],
)
def test_a_one_time_job_always_runs_once_however_late(schedule: Schedule) -> None:
    due = utc("2026-06-01T08:00:00Z")

    for late in (timedelta(seconds=1), timedelta(hours=2), timedelta(days=400)):
        assert plan_due(schedule, due, due + late) == DuePlan((due,), None, None)


def test_a_long_cron_misfire_counts_every_missed_occurrence() -> None:
    # Down ten days: occurrences 06-01 00:00 … 06-11 00:00 are due (14401); one runs.
    occurrence, now = utc("2026-06-01T00:00:00Z"), utc("2026-06-11T00:00:30Z")

    plan = plan_due(MINUTELY, occurrence, now)

    assert plan.runs[0] == utc("2026-06-11T00:00:00Z")
    assert plan.next_run_at == utc("2026-06-11T00:01:00Z")
    assert plan.misfire == Misfire(
        14_400, occurrence, utc("2026-06-10T23:59:00Z"), MisfirePolicy.RUN_ONCE
    )


def test_an_interval_due_since_1970_is_planned_with_an_exact_count_of_missed_runs() -> None:
    # Every 10 s from the epoch, first dispatched at NOW (2026-06-01T12:00:00Z): 178,031,521
    # occurrences are due, far more than stepping through them one by one could count.
    epoch = utc("1970-01-01T00:00:00Z")
    every = IntervalSchedule(every_seconds=10, start_at=epoch)

    plan = plan_due(every, epoch, NOW, policy=MisfirePolicy.SKIP)

    on_time = tuple(NOW - timedelta(seconds=s) for s in (60, 50, 40, 30, 20, 10, 0))
    assert plan == DuePlan(
        on_time,
        NOW + timedelta(seconds=10),
        Misfire(178_031_514, epoch, NOW - timedelta(seconds=70), MisfirePolicy.SKIP),
    )
    buffered = plan_buffered(every, epoch, NOW)
    assert buffered == DuePlan(
        (epoch,),
        NOW + timedelta(seconds=10),
        Misfire(178_031_520, epoch + timedelta(seconds=10), NOW, MisfirePolicy.RUN_ONCE),
    )


@pytest.mark.parametrize("seed", range(20))
def test_interval_plans_computed_in_constant_time_equal_stepping_through_every_occurrence(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    cases = []
    for _ in range(50):
        every = rng.choice([0.001, 0.0015, 0.0019999, 0.0999, 1, 1.2345, 7, 61.5, 3600])
        every_ms = every * 1000
        start = NOW - timedelta(milliseconds=rng.randrange(0, 5000 * int(every_ms) + 1))
        now = NOW + timedelta(microseconds=rng.choice([0, 0, 1, 500, 999]))
        end_at = None
        if rng.random() < 0.3:  # on an occurrence, or just before or after one
            step = next_run_after(IntervalSchedule(every_seconds=every), start)
            assert step is not None
            k = rng.randrange(0, 3000)
            end_at = start + k * (step - start) + timedelta(milliseconds=rng.choice([-1, 0, 0, 1]))
        schedule = IntervalSchedule(every_seconds=every, start_at=start, end_at=end_at)
        grace_seconds = rng.randrange(0, 3000 * int(every_ms) + 1) / 1000
        policy = rng.choice(list(MisfirePolicy))
        keep = rng.choice([1, 3, 10])
        cases.append((schedule, start, now, grace_seconds, policy, keep))

    def plans() -> list[DuePlan]:
        return [
            plan_due(s, start, now, grace_seconds=grace, policy=policy, max_catch_up=keep)
            for s, start, now, grace, policy, keep in cases
        ]

    by_grid = plans()
    monkeypatch.setattr(
        schedule_module,
        "_scan_grid",
        lambda schedule, start, step, now, cutoff, keep: _scan_steps(
            schedule, start, now, cutoff, keep
        ),
    )
    assert by_grid == plans()


def test_at_most_max_on_time_occurrences_within_the_grace_are_planned_at_once() -> None:
    # Every 1 ms with a 7-day grace, due a minute ago: 60,001 occurrences lie within the grace.
    due = NOW - timedelta(minutes=1)
    every = IntervalSchedule(every_seconds=0.001)

    plan = plan_due(every, due, NOW, grace_seconds=7 * 86400, policy=MisfirePolicy.SKIP)

    assert len(plan.runs) == MAX_ON_TIME
    assert plan.runs[0] == NOW - timedelta(milliseconds=MAX_ON_TIME - 1)
    assert plan.runs[-1] == NOW
    assert plan.misfire == Misfire(
        60_001 - MAX_ON_TIME, due, NOW - timedelta(milliseconds=MAX_ON_TIME), MisfirePolicy.SKIP
    )
