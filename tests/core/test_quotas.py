"""core/quotas: the token bucket rule, the active-jobs check and the smallest interval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.dispatch import plan_job
from core.errors import InvalidRequest, QuotaExceeded
from core.model import (
    CronSchedule,
    ExecutionStatus,
    ImmediateSchedule,
    IntervalSchedule,
    Job,
    MisfirePolicy,
)
from core.quotas import (
    UNLIMITED,
    Bucket,
    Quotas,
    Rate,
    TokenRequest,
    check_active_jobs,
    check_schedule,
    must_count,
    take,
    take_all,
)
from core.settings import load_settings

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
FIVE_PER_SECOND = Rate(per_second=5.0, capacity=10.0)


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_new_bucket_is_full_and_a_burst_empties_it() -> None:
    bucket = None
    for _ in range(10):
        bucket, wait = take(bucket, FIVE_PER_SECOND, 1, T0)
        assert wait == 0.0
    assert bucket is not None and bucket.tokens == 0.0
    after, wait = take(bucket, FIVE_PER_SECOND, 1, T0)
    assert after == bucket, "a denied request takes nothing"
    assert wait == pytest.approx(0.2)  # one token at 5 per second


def test_the_bucket_refills_at_its_rate_up_to_its_capacity() -> None:
    empty = Bucket(0.0, T0)
    granted, wait = take(empty, FIVE_PER_SECOND, 1, later(0.2))
    assert wait == 0.0 and granted.tokens == pytest.approx(0.0)
    full, _ = take(empty, FIVE_PER_SECOND, 1, later(3600))
    assert full.tokens == pytest.approx(9.0), "capped at the capacity, then one taken"


def test_a_request_larger_than_the_bucket_waits_for_a_full_bucket_then_leaves_a_debt() -> None:
    """A catch-up of many runs must run eventually, and the long-run rate must still hold."""
    _, wait = take(Bucket(5.0, T0), FIVE_PER_SECOND, 25, T0)
    assert wait == pytest.approx(1.0), "until the bucket holds its capacity (10)"
    debt, wait = take(Bucket(10.0, T0), FIVE_PER_SECOND, 25, T0)
    assert wait == 0.0 and debt.tokens == -15.0
    _, wait = take(debt, FIVE_PER_SECOND, 1, T0)
    assert wait == pytest.approx(16 / 5), "the debt is repaid before the next token"


def test_a_bucket_written_by_a_clock_ahead_is_not_refilled_backwards() -> None:
    ahead = Bucket(0.0, later(10))
    after, wait = take(ahead, FIVE_PER_SECOND, 1, T0)
    assert wait == pytest.approx(0.2)
    assert after == ahead
    granted, wait = take(Bucket(2.0, later(10)), FIVE_PER_SECOND, 1, T0)
    assert wait == 0.0 and granted.updated_at == later(10), "never moved back in time"


def test_take_all_applies_requests_in_order_and_reports_only_changed_buckets() -> None:
    one = Rate(per_second=1.0, capacity=2.0)
    requests = [TokenRequest("a", 1, one), TokenRequest("a", 1, one), TokenRequest("a", 1, one)]
    requests.append(TokenRequest("b", 5, Rate(per_second=1.0, capacity=1.0)))
    changed, waits = take_all({"b": Bucket(0.0, T0)}, requests, T0)
    assert waits[:3] == [0.0, 0.0, pytest.approx(1.0)]
    assert waits[3] == pytest.approx(1.0)
    assert set(changed) == {"a"} and changed["a"].tokens == 0.0


def test_the_active_jobs_quota_names_its_limit_and_gives_no_retry_time() -> None:
    quotas = Quotas(active_jobs=3)
    check_active_jobs(quotas, 2)
    with pytest.raises(QuotaExceeded) as info:
        check_active_jobs(quotas, 3)
    assert (info.value.limit, info.value.value, info.value.retry_after_seconds) == (
        "activeJobs",
        3,
        None,
    )
    assert info.value.status == 429 and info.value.code == "quota_exceeded"
    check_active_jobs(UNLIMITED, 10**9)


@pytest.mark.parametrize("every", [0.001, 0.5, 0.999])
def test_an_interval_below_the_smallest_one_is_refused_naming_the_field(every: float) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_schedule(Quotas(), IntervalSchedule(every_seconds=every), T0)
    [error] = info.value.errors
    assert error.field == "schedule.everySeconds"
    assert "at least 1 s" in error.reason
    check_schedule(Quotas(), IntervalSchedule(every_seconds=1), T0)
    check_schedule(Quotas(min_interval_seconds=0), IntervalSchedule(every_seconds=every), T0)


def test_a_cron_expression_firing_too_often_is_refused_by_its_smallest_gap() -> None:
    every_minute = Quotas(min_interval_seconds=60)
    check_schedule(every_minute, CronSchedule(expression="* * * * *"), T0)
    check_schedule(every_minute, CronSchedule(expression="0 * * * * *"), T0)  # seconds field
    for expression in ("*/30 * * * * *", "0,1 0 * * * *"):
        with pytest.raises(InvalidRequest) as info:
            check_schedule(every_minute, CronSchedule(expression=expression), T0)
        assert info.value.errors[0].field == "schedule.expression"
    with pytest.raises(InvalidRequest):
        check_schedule(Quotas(min_interval_seconds=120), CronSchedule(expression="* * * * *"), T0)
    check_schedule(Quotas(), CronSchedule(expression="* * * * * *"), T0)  # 1 s is allowed
    check_schedule(Quotas(min_interval_seconds=5), ImmediateSchedule(), T0)


def test_the_settings_default_to_the_documented_quotas_and_zero_turns_them_off() -> None:
    quotas = load_settings({}).gateway.quotas
    assert quotas == Quotas(
        active_jobs=10_000,
        min_interval_seconds=1.0,
        creates_per_second=50.0,
        creates_burst=100,
        runs_per_minute=6_000,
    )
    assert quotas.creates == Rate(50.0, 100.0)
    assert quotas.runs == Rate(100.0, 6000.0)
    off = load_settings(
        {"JOBSCHED_QUOTA_CREATES_PER_SECOND": "0", "JOBSCHED_QUOTA_RUNS_PER_MINUTE": "0"}
    ).scheduler.quotas
    assert off.creates is None and off.runs is None


def test_a_job_held_past_its_grace_names_the_quota_in_its_misfire_record() -> None:
    job = Job(
        id="j1",
        owner="alice",
        task_id="noop",
        schedule=IntervalSchedule(every_seconds=10),
        misfire_policy=MisfirePolicy.RUN_ONCE,
        misfire_grace_seconds=1,
        created_at=T0,
        updated_at=T0,
        next_run_at=later(10),
    )
    plan = plan_job(job, later(60), previous=None, buffered=False, scheduler_id="s", held_by="q")
    skipped, queued = (d.execution for d in plan.dispatches)
    assert skipped.status == ExecutionStatus.SKIPPED and skipped.skip_reason == "misfire: q"
    assert skipped.missed is not None and skipped.missed.count == 5
    assert queued.status == ExecutionStatus.QUEUED and queued.scheduled_for == later(60)
    plain = plan_job(job, later(60), previous=None, buffered=False, scheduler_id="s")
    assert plain.dispatches[0].execution.skip_reason == "misfire"


def test_the_active_jobs_are_counted_only_when_the_creation_rate_could_reach_the_quota() -> None:
    quotas = Quotas(active_jobs=100, creates_per_second=10, creates_burst=20)
    assert must_count(quotas, None, T0), "nothing counted yet"
    assert not must_count(quotas, (50, T0), later(2.9)), "50 + 20 + 10/s * 2.9 s < 100"
    assert must_count(quotas, (50, T0), later(3)), "50 + 20 + 30 reaches 100"
    assert must_count(quotas, (90, T0), T0)
    assert must_count(Quotas(active_jobs=100, creates_per_second=0), (0, T0), T0), "no bound"
    assert not must_count(Quotas(active_jobs=0), None, T0), "no quota"
