"""Backfill's pure rules: the fire times of a past range, the overlap policy among them, and the
bulk actions' progress (core.backfill, core.bulk)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.backfill import MAX_BACKFILL_RUNS, fire_times, planned_statuses
from core.bulk import (
    BatchCounts,
    BulkAction,
    BulkFilter,
    BulkKind,
    BulkStatus,
    after_batch,
    phase_query,
    replay_nonce,
)
from core.model import (
    CronSchedule,
    ExecutionStatus,
    ImmediateSchedule,
    IntervalSchedule,
    Job,
    OverlapPolicy,
    Schedule,
)

T0 = datetime(2026, 3, 28, 0, 0, tzinfo=UTC)
QUEUED, SKIPPED = ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED


def job(schedule: Schedule, **fields: object) -> Job:
    return Job(
        id="j",
        owner="alice",
        task_id="noop",
        schedule=schedule,
        created_at=T0,
        updated_at=T0,
        **fields,  # type: ignore[arg-type]
    )


def hours(h: float) -> datetime:
    return T0 + timedelta(hours=h)


def test_cron_fire_times_cover_from_inclusive_to_exclusive() -> None:
    j = job(CronSchedule(expression="0 * * * *"))
    assert fire_times(j, hours(1), hours(4), limit=100) == [hours(1), hours(2), hours(3)]
    assert fire_times(j, hours(1) + timedelta(milliseconds=1), hours(2), limit=100) == []


def test_cron_fire_times_follow_the_zone_through_a_dst_change() -> None:
    """Europe/Berlin springs forward on 2026-03-29 at 02:00 local: 02:30 does not exist and
    shifts to 03:00 (``gap: shift``), as the scheduler runs it."""
    j = job(CronSchedule(expression="30 2 * * *", timezone="Europe/Berlin"))
    times = fire_times(j, hours(0), hours(72), limit=100)
    assert times == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # 03:00 CEST (shifted)
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]


def test_fire_times_stay_within_start_and_end() -> None:
    j = job(CronSchedule(expression="0 * * * *", start_at=hours(2), end_at=hours(4)))
    assert fire_times(j, hours(0), hours(10), limit=100) == [hours(2), hours(3), hours(4)]
    i = job(IntervalSchedule(every_seconds=3600, start_at=hours(2), end_at=hours(4)))
    assert fire_times(i, hours(0), hours(10), limit=100) == [hours(2), hours(3), hours(4)]


def test_interval_fire_times_keep_the_grid_of_the_latest_run() -> None:
    i = job(
        IntervalSchedule(every_seconds=1800), last_scheduled_for=hours(5) + timedelta(minutes=10)
    )
    got = fire_times(i, hours(0), hours(2), limit=100)
    assert [t.minute for t in got] == [10, 40, 10, 40]
    assert got[0] == hours(0) + timedelta(minutes=10)


def test_fire_times_are_bounded_one_past_the_limit() -> None:
    j = job(CronSchedule(expression="* * * * *"))
    assert len(fire_times(j, hours(0), hours(100), limit=MAX_BACKFILL_RUNS)) == 1001


def test_a_one_time_job_has_no_fire_times_to_backfill() -> None:
    assert fire_times(job(ImmediateSchedule()), hours(0), hours(10), limit=10) == []


@pytest.mark.parametrize(
    ("policy", "active", "expected"),
    [
        (OverlapPolicy.ALLOW, False, [QUEUED, QUEUED, QUEUED]),
        (OverlapPolicy.ALLOW, True, [QUEUED, QUEUED, QUEUED]),
        (OverlapPolicy.FORBID, False, [QUEUED, SKIPPED, SKIPPED]),
        (OverlapPolicy.FORBID, True, [SKIPPED, SKIPPED, SKIPPED]),
        (OverlapPolicy.BUFFER_ONE, False, [QUEUED, SKIPPED, SKIPPED]),
        (OverlapPolicy.REPLACE, False, [SKIPPED, SKIPPED, QUEUED]),
        (OverlapPolicy.REPLACE, True, [SKIPPED, SKIPPED, QUEUED]),
    ],
)
def test_the_overlap_policy_among_backfilled_runs(
    policy: OverlapPolicy, active: bool, expected: list[ExecutionStatus]
) -> None:
    assert planned_statuses(3, policy, active=active) == expected
    assert planned_statuses(0, policy, active=active) == []


def action(statuses: list[ExecutionStatus], **filters: object) -> BulkAction:
    return BulkAction(
        id="b",
        kind=BulkKind.CANCEL,
        filter=BulkFilter(statuses=statuses, **filters),  # type: ignore[arg-type]
        actor="alice",
        created_at=hours(10),
        updated_at=hours(10),
        lease_expires_at=hours(10),
        lease_owner="gw",
        status=BulkStatus.RUNNING,
    )


def test_a_bulk_action_walks_its_phases_and_finishes() -> None:
    a = action([ExecutionStatus.QUEUED, ExecutionStatus.RUNNING], scheduled_to=hours(20))
    q = phase_query(a)
    assert q is not None and q.status == QUEUED and q.scheduled_to == hours(10)  # not after it
    a = after_batch(a, "c1", BatchCounts(done=2, skipped=1), hours(11), lease_seconds=30)
    assert (a.phase, a.cursor, a.done, a.skipped) == (0, "c1", 2, 1)
    assert a.lease_expires_at == hours(11) + timedelta(seconds=30)
    a = after_batch(a, None, BatchCounts(done=1), hours(12), lease_seconds=30)
    assert (a.phase, a.cursor, a.status) == (1, None, BulkStatus.RUNNING)
    q = phase_query(a)
    assert q is not None and q.status == ExecutionStatus.RUNNING
    a = after_batch(a, None, BatchCounts(failed=1), hours(13), lease_seconds=30)
    assert (a.status, a.finished_at, a.lease_owner) == (BulkStatus.SUCCEEDED, hours(13), None)
    assert (a.done, a.skipped, a.failed) == (3, 1, 1)
    assert phase_query(a) is None


def test_a_replay_nonce_is_fixed_per_action_and_run() -> None:
    assert replay_nonce("b", "r1") == replay_nonce("b", "r1")
    assert len({replay_nonce("b", "r1"), replay_nonce("b", "r2"), replay_nonce("c", "r1")}) == 3
    assert len(replay_nonce("b", "r1")) == 8
