"""core/explain.explain: why a job's next run has not started, decided from plain data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from core.concurrency import ConcurrencyWait, Holder, SlotState, explain_wait
from core.explain import (
    OVERDUE_AFTER_SECONDS,
    RULES,
    Code,
    ExplainInput,
    LeaseView,
    QueueState,
    QuotaState,
    Reason,
    explain,
    finished_job,
)
from core.ids import execution_id
from core.model import (
    CronSchedule,
    Execution,
    ExecutionStatus,
    ImmediateSchedule,
    IntervalSchedule,
    Job,
    JobStatus,
    MisfirePolicy,
    Missed,
    OnceSchedule,
    OverlapPolicy,
    RunTrigger,
)
from core.quotas import Bucket, Quotas
from core.scheduling import HELD_BY_QUOTA

NOW = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
QUEUE = QueueState(queue="default", consumer_exists=True, waiting_pulls=1)
RATE = Quotas(runs_per_minute=60).runs
QUOTA = QuotaState(runs_per_minute=60, rate=RATE)


def job(**kw: Any) -> Job:
    base = Job(
        id="j1",
        owner="alice",
        task_id="noop",
        schedule=IntervalSchedule(every_seconds=60),
        partition=3,
        created_at=NOW - timedelta(hours=1),
        updated_at=NOW - timedelta(minutes=5),
        next_run_at=NOW + timedelta(seconds=30),
    )
    return msgspec.structs.replace(base, **kw)


def run(
    j: Job, at: datetime, status: ExecutionStatus = ExecutionStatus.RUNNING, **kw: Any
) -> Execution:
    base = Execution(
        id=execution_id(j.id, at), job_id=j.id, owner=j.owner, task_id=j.task_id,
        status=status, attempt=1, scheduled_for=at, created_at=at, updated_at=at,
        started_at=at if status == ExecutionStatus.RUNNING else None,
    )  # fmt: skip
    return msgspec.structs.replace(base, **kw)


def reasons(j: Job, now: datetime = NOW, **kw: Any) -> list[Reason]:
    lease = LeaseView(partition=3, owner="sched-a", expires_at=now + timedelta(seconds=2))
    inputs: dict[str, Any] = {"queue": QUEUE, "lease": lease, "quota": QUOTA, **kw}
    return explain(ExplainInput(job=j, now=now, **inputs))


def codes(found: list[Reason]) -> list[str]:
    return [r.code for r in found]


def only(found: list[Reason], code: Code) -> Reason:
    [r] = [r for r in found if r.code == code]
    return r


# --- the healthy answer ---------------------------------------------------------------------


def test_a_healthy_job_gets_its_next_run_and_its_scheduler() -> None:
    [r] = reasons(job())
    assert (r.code, r.severity) == ("scheduled", "info")
    assert r.details == {
        "nextRunAt": "2026-06-01T10:00:30.000Z",
        "inSeconds": 30.0,
        "partition": 3,
        "owner": "sched-a",
    }
    assert "in 30 s" in r.message and "scheduler sched-a" in r.message


def test_a_run_due_exactly_now_is_due_not_overdue() -> None:
    [r] = reasons(job(next_run_at=NOW))
    assert r.code == "scheduled" and "due now" in r.message


def test_every_reason_serializes_to_camel_case_json() -> None:
    found = reasons(job(status=JobStatus.PAUSED, next_run_at=None))
    data = msgspec.json.decode(msgspec.json.encode(found[0]))
    assert set(data) == {"code", "severity", "message", "details"}


def test_there_is_always_a_reason() -> None:
    for status in JobStatus:
        assert explain(ExplainInput(job=job(status=status), now=NOW))


# --- job state -----------------------------------------------------------------------------


def test_a_paused_job_is_blocked_by_the_pause_and_nothing_else() -> None:
    found = reasons(job(status=JobStatus.PAUSED, next_run_at=None))
    assert codes(found) == ["paused"]
    assert found[0].severity == "blocking"
    assert found[0].details == {"pausedSince": "2026-06-01T09:55:00.000Z"}


def test_a_cancelled_job_says_so_and_skips_unavailable_checks() -> None:
    found = explain(ExplainInput(job=job(status=JobStatus.CANCELLED, next_run_at=None), now=NOW))
    assert codes(found) == ["cancelled"]


def test_a_one_time_job_that_ran_is_finished_with_its_outcome() -> None:
    j = job(
        schedule=ImmediateSchedule(),
        status=JobStatus.FAILED,
        next_run_at=None,
        last_run_status=ExecutionStatus.FAILED,
        last_execution_id="j1:x",
    )
    [r] = reasons(j)
    assert (r.code, r.details["lastRunStatus"]) == ("finished", "FAILED")
    assert finished_job(j)


def test_a_paused_job_is_not_finished() -> None:
    assert not finished_job(job(status=JobStatus.PAUSED, next_run_at=None))


# --- startAt / endAt ------------------------------------------------------------------------


def test_before_start_at_the_job_has_not_started() -> None:
    start = NOW + timedelta(hours=2)
    j = job(schedule=IntervalSchedule(every_seconds=60, start_at=start), next_run_at=start)
    found = reasons(j)
    assert codes(found) == ["not_started"]
    r = found[0]
    assert r.details["startsInSeconds"] == 7200.0 and "in 2 h" in r.message


def test_at_start_at_exactly_the_job_has_started() -> None:
    j = job(schedule=IntervalSchedule(every_seconds=60, start_at=NOW), next_run_at=NOW)
    assert codes(reasons(j)) == ["scheduled"]


def test_one_millisecond_before_start_at_it_has_not() -> None:
    start = NOW + timedelta(milliseconds=1)
    j = job(schedule=IntervalSchedule(every_seconds=60, start_at=start), next_run_at=start)
    assert codes(reasons(j)) == ["not_started"]


def test_after_end_at_with_no_run_left_the_schedule_ended() -> None:
    end = NOW - timedelta(minutes=1)
    j = job(
        schedule=IntervalSchedule(every_seconds=60, end_at=end),
        status=JobStatus.SUCCEEDED,
        next_run_at=None,
        last_run_status=ExecutionStatus.SUCCEEDED,
    )
    [r] = reasons(j)
    assert (r.code, r.severity, r.details["endAt"]) == ("ended", "info", "2026-06-01T09:59:00.000Z")
    assert "no run is left" in r.message and "SUCCEEDED" in r.message


def test_end_at_passed_while_the_last_occurrence_is_still_pending_is_a_warning() -> None:
    end = NOW - timedelta(seconds=1)
    j = job(schedule=IntervalSchedule(every_seconds=60, end_at=end), next_run_at=end)
    r = only(reasons(j), Code.ENDED)
    assert r.severity == "warning"


def test_end_at_in_the_future_is_no_reason() -> None:
    end = NOW + timedelta(days=1)
    j = job(schedule=IntervalSchedule(every_seconds=60, end_at=end))
    assert codes(reasons(j)) == ["scheduled"]


# --- ownership ------------------------------------------------------------------------------


def test_no_owner_of_the_partition_blocks_dispatch() -> None:
    found = reasons(job(next_run_at=NOW - timedelta(minutes=1)), lease=LeaseView(3, None))
    assert codes(found)[0] == "no_owner"
    assert found[0].details == {"partition": 3}
    assert Code.OVERDUE not in codes(found)  # the blocking reason explains the delay


def test_an_expired_lease_names_the_last_owner() -> None:
    lease = LeaseView(3, "sched-b", expires_at=NOW - timedelta(seconds=1))
    r = only(reasons(job(), lease=lease), Code.NO_OWNER)
    assert r.details["lastOwner"] == "sched-b"


def test_a_lease_expiring_exactly_now_is_expired() -> None:
    lease = LeaseView(3, "sched-b", expires_at=NOW)
    assert Code.NO_OWNER in codes(reasons(job(), lease=lease))


def test_no_owner_does_not_matter_for_a_paused_job() -> None:
    found = reasons(job(status=JobStatus.PAUSED, next_run_at=None), lease=LeaseView(3, None))
    assert codes(found) == ["paused"]


# --- overlap policy ---------------------------------------------------------------------------


def test_buffer_one_waits_for_the_active_previous_run_naming_it() -> None:
    j = job(overlap_policy=OverlapPolicy.BUFFER_ONE, next_run_at=NOW - timedelta(seconds=10))
    prev = run(j, NOW - timedelta(seconds=70))
    found = reasons(j, previous=prev, recent=[prev])
    r = found[0]
    assert (r.code, r.severity, r.details["executionId"]) == (
        "overlap_waiting",
        "blocking",
        prev.id,
    )
    assert prev.id in r.message and "RUNNING" in r.message
    assert Code.OVERDUE not in codes(found)
    assert Code.RUNNING in codes(found)


def test_buffer_one_before_the_due_time_is_a_warning() -> None:
    j = job(overlap_policy=OverlapPolicy.BUFFER_ONE)
    prev = run(j, NOW - timedelta(seconds=30))
    r = only(reasons(j, previous=prev), Code.OVERLAP_WAITING)
    assert r.severity == "warning"


def test_forbid_warns_that_the_next_run_will_be_skipped() -> None:
    j = job(overlap_policy=OverlapPolicy.FORBID)
    prev = run(j, NOW - timedelta(seconds=30), ExecutionStatus.QUEUED)
    r = only(reasons(j, previous=prev), Code.OVERLAP_WILL_SKIP)
    assert r.details["executionStatus"] == "QUEUED"


def test_replace_says_the_previous_run_will_be_cancelled() -> None:
    j = job(overlap_policy=OverlapPolicy.REPLACE)
    prev = run(j, NOW - timedelta(seconds=30))
    found = reasons(j, previous=prev)
    assert only(found, Code.OVERLAP_WILL_REPLACE).severity == "info"
    assert Code.SCHEDULED in codes(found)


def test_allow_has_no_overlap_reason() -> None:
    j = job(overlap_policy=OverlapPolicy.ALLOW)
    prev = run(j, NOW - timedelta(seconds=30))
    assert not [c for c in codes(reasons(j, previous=prev)) if c.startswith("overlap")]


def test_a_finished_previous_run_is_no_overlap() -> None:
    j = job(overlap_policy=OverlapPolicy.BUFFER_ONE, next_run_at=NOW - timedelta(seconds=1))
    prev = run(j, NOW - timedelta(seconds=61), ExecutionStatus.SUCCEEDED)
    assert codes(reasons(j, previous=prev)) == ["scheduled"]


# --- retries, quota, queue --------------------------------------------------------------------


def test_a_retrying_run_waits_out_its_backoff_until_t() -> None:
    j = job(schedule=ImmediateSchedule(), status=JobStatus.RUNNING, next_run_at=None)
    ex = run(
        j, NOW - timedelta(minutes=1), ExecutionStatus.RETRYING,
        attempt=1, max_attempts=3, error="boom", next_attempt_at=NOW + timedelta(seconds=90),
    )  # fmt: skip
    r = reasons(j, recent=[ex])[0]
    assert (r.code, r.severity) == ("retrying", "blocking")
    assert r.details["nextAttemptAt"] == "2026-06-01T10:01:30.000Z"
    assert "attempt 1 of 3 (boom)" in r.message and "in 1 min 30 s" in r.message


def test_a_retry_past_its_backoff_waits_in_the_queue() -> None:
    j = job(schedule=ImmediateSchedule(), status=JobStatus.RUNNING, next_run_at=None)
    ex = run(
        j, NOW - timedelta(minutes=1), ExecutionStatus.RETRYING,
        next_attempt_at=NOW - timedelta(seconds=5),
    )  # fmt: skip
    q = QueueState("default", consumer_exists=True, pending=4)
    found = reasons(j, recent=[ex], queue=q)
    assert only(found, Code.RETRYING).severity == "warning"
    assert only(found, Code.QUEUE_NO_WORKER).details["executionId"] == ex.id


def test_an_empty_runs_bucket_holds_a_due_run_until_it_refills() -> None:
    j = job(next_run_at=NOW - timedelta(seconds=20))
    quota = QuotaState(60, RATE, Bucket(tokens=-1.0, updated_at=NOW))
    r = reasons(j, quota=quota)[0]
    assert (r.code, r.severity) == ("quota_reached", "blocking")
    assert r.details["retryAfterSeconds"] == 2.0  # 2 tokens at 1 per second
    assert r.details["heldUntil"] == "2026-06-01T10:00:02.000Z"


def test_an_empty_runs_bucket_before_the_due_time_is_a_warning() -> None:
    quota = QuotaState(60, RATE, Bucket(tokens=0.0, updated_at=NOW))
    assert only(reasons(job(), quota=quota), Code.QUOTA_REACHED).severity == "warning"


def test_a_bucket_refilled_since_is_no_quota_reason() -> None:
    quota = QuotaState(60, RATE, Bucket(tokens=0.0, updated_at=NOW - timedelta(seconds=1)))
    assert codes(reasons(job(), quota=quota)) == ["scheduled"]


def test_no_runs_quota_is_no_quota_reason() -> None:
    quota = QuotaState(0, None, Bucket(tokens=-100.0, updated_at=NOW))
    assert codes(reasons(job(), quota=quota)) == ["scheduled"]


def test_a_queue_without_consumer_blocks_its_queued_run() -> None:
    j = job(schedule=ImmediateSchedule(), status=JobStatus.SCHEDULED, next_run_at=None)
    ex = run(j, NOW - timedelta(seconds=10), ExecutionStatus.QUEUED, queue="gpu")
    found = reasons(j, recent=[ex], queue=QueueState("gpu", consumer_exists=False))
    r = found[0]
    assert (r.code, r.severity, r.details["queue"]) == ("queue_no_consumer", "blocking", "gpu")
    assert codes(found)[1:] == ["queued"]


def test_a_queue_without_consumer_is_a_warning_before_any_run() -> None:
    found = reasons(job(), queue=QueueState("gpu", consumer_exists=False))
    assert only(found, Code.QUEUE_NO_CONSUMER).severity == "warning"


def test_a_backlog_before_a_queued_run_is_counted() -> None:
    j = job()
    ex = run(j, NOW - timedelta(seconds=30), ExecutionStatus.QUEUED)
    q = QueueState("default", consumer_exists=True, pending=250, in_progress=8)
    r = only(reasons(j, recent=[ex], previous=ex, queue=q), Code.QUEUE_BACKLOG)
    assert (r.details["pending"], r.details["inProgress"]) == (250, 8)
    assert "backlog of 250" in r.message


def test_a_backlog_without_a_run_of_this_job_in_it_is_no_reason() -> None:
    q = QueueState("default", consumer_exists=True, pending=250, in_progress=8)
    assert codes(reasons(job(), queue=q)) == ["scheduled"]


# --- the past: skipped records ------------------------------------------------------------


def test_misfired_runs_name_their_policy_count_and_span() -> None:
    j = job(misfire_policy=MisfirePolicy.SKIP)
    first, last = NOW - timedelta(minutes=30), NOW - timedelta(minutes=1)
    ex = run(
        j, first, ExecutionStatus.SKIPPED, skip_reason="misfire",
        missed=Missed(count=30, first=first, last=last, policy="skip"),
    )  # fmt: skip
    r = only(reasons(j, recent=[ex]), Code.MISFIRED)
    assert r.details["count"] == 30 and r.details["policy"] == "skip"
    assert "30 runs due from 2026-06-01T09:30:00.000Z" in r.message
    assert "misfirePolicy skip" in r.message and r.details["heldByQuota"] is False


def test_a_misfire_caused_by_the_quota_says_so() -> None:
    j = job()
    at = NOW - timedelta(minutes=5)
    ex = run(j, at, ExecutionStatus.SKIPPED, skip_reason=f"misfire: {HELD_BY_QUOTA}")
    r = only(reasons(j, recent=[ex]), Code.MISFIRED)
    assert r.details["heldByQuota"] is True and "quota" in r.message


def test_an_overlap_skip_names_the_run_that_was_active() -> None:
    j = job()
    at = NOW - timedelta(seconds=30)
    why = f"overlap: previous run {execution_id('j1', at - timedelta(minutes=1))} is still RUNNING"
    ex = run(j, at, ExecutionStatus.SKIPPED, skip_reason=why)
    r = only(reasons(j, recent=[ex]), Code.OVERLAP_SKIPPED)
    assert "is still RUNNING" in r.message and r.details["skipReason"] == why


def test_only_skips_newer_than_the_latest_real_run_are_reported() -> None:
    j = job()
    newest = run(j, NOW - timedelta(minutes=1), ExecutionStatus.SKIPPED, skip_reason="misfire")
    ran = run(j, NOW - timedelta(minutes=2), ExecutionStatus.SUCCEEDED)
    older = run(j, NOW - timedelta(minutes=3), ExecutionStatus.SKIPPED, skip_reason="misfire")
    found = reasons(j, recent=[newest, ran, older])
    assert [r.details["executionId"] for r in found if r.code == "misfired"] == [newest.id]


def test_a_misfire_before_its_catch_up_run_is_still_reported() -> None:
    j = job()
    first, last = NOW - timedelta(minutes=10), NOW - timedelta(minutes=2)
    catch_up = run(j, NOW - timedelta(minutes=1), trigger=RunTrigger.CATCH_UP)
    manual = run(j, NOW - timedelta(seconds=90), ExecutionStatus.SUCCEEDED,
                 trigger=RunTrigger.MANUAL)  # fmt: skip
    missed = run(
        j, first, ExecutionStatus.SKIPPED, skip_reason="misfire",
        missed=Missed(count=9, first=first, last=last, policy="runOnce"),
    )  # fmt: skip
    found = reasons(j, recent=[catch_up, manual, missed], previous=catch_up)
    assert only(found, Code.MISFIRED).details["count"] == 9
    assert only(found, Code.RUNNING).details["executionId"] == catch_up.id


def test_a_latest_run_that_failed_is_told_with_its_error() -> None:
    j = job(schedule=ImmediateSchedule(), status=JobStatus.FAILED, next_run_at=None)
    failed = run(
        j, NOW - timedelta(minutes=3), ExecutionStatus.FAILED, attempt=3, max_attempts=3,
        error="TaskFailed: boom", finished_at=NOW - timedelta(minutes=2),
    )  # fmt: skip
    found = reasons(j, recent=[failed])
    assert codes(found) == ["finished", "last_run_failed"]
    r = found[1]
    assert (r.details["executionId"], r.details["error"]) == (failed.id, "TaskFailed: boom")
    assert "after 3 of 3 attempts: TaskFailed: boom" in r.message


def test_a_failure_older_than_a_success_is_no_reason() -> None:
    j = job()
    ok = run(j, NOW - timedelta(minutes=1), ExecutionStatus.SUCCEEDED)
    failed = run(j, NOW - timedelta(minutes=2), ExecutionStatus.FAILED)
    assert codes(reasons(j, recent=[ok, failed])) == ["scheduled"]


# --- in progress, jitter, overdue -------------------------------------------------------------


def test_a_running_one_time_job_names_its_run_and_worker() -> None:
    j = job(schedule=ImmediateSchedule(), status=JobStatus.RUNNING, next_run_at=None)
    ex = run(j, NOW - timedelta(minutes=2), worker_id="w-1")
    [r] = reasons(j, recent=[ex])
    assert (r.code, r.details["workerId"]) == ("running", "w-1")
    assert "since 2026-06-01T09:58:00.000Z, for 2 min" in r.message


def test_jitter_delays_a_run_past_its_scheduled_time() -> None:
    j = job(
        schedule=IntervalSchedule(every_seconds=60, jitter_seconds=3600),
        next_run_at=NOW - timedelta(milliseconds=1),
    )
    found = reasons(j)
    r = only(found, Code.JITTER_DELAY)
    assert str(r.details["dueAt"]) > "2026-06-01T10:00:00.000Z"
    assert Code.OVERDUE not in codes(found)


def test_a_run_due_long_ago_and_not_dispatched_is_overdue() -> None:
    j = job(next_run_at=NOW - timedelta(seconds=OVERDUE_AFTER_SECONDS))
    r = reasons(j)[0]
    assert (r.code, r.details["owner"], r.details["lateSeconds"]) == (
        "overdue",
        "sched-a",
        OVERDUE_AFTER_SECONDS,
    )
    assert Code.SCHEDULED not in codes(reasons(j))


def test_a_run_due_just_under_the_threshold_is_not_overdue() -> None:
    j = job(next_run_at=NOW - timedelta(seconds=OVERDUE_AFTER_SECONDS - 0.001))
    assert codes(reasons(j)) == ["scheduled"]


# --- time zones and DST -------------------------------------------------------------------


def cron_job(expression: str, tz: str, next_run_at: datetime, **kw: Any) -> Job:
    return job(
        schedule=CronSchedule(expression=expression, timezone=tz, **kw), next_run_at=next_run_at
    )


def test_a_cron_job_shows_its_next_run_in_its_zone_after_spring_forward() -> None:
    # Europe/Berlin jumps from 02:00 CET to 03:00 CEST on 2026-03-29: "30 2 * * *" shifts.
    now = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)  # 01:00 CET
    nxt = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST, the first instant after the gap
    [r] = reasons(cron_job("30 2 * * *", "Europe/Berlin", nxt), now=now)
    assert "2026-03-29 03:00:00 CEST in Europe/Berlin" in r.message
    assert r.details["inSeconds"] == 3600.0


def test_the_two_passes_of_a_fall_back_hour_are_told_apart() -> None:
    # America/New_York falls back from 02:00 EDT to 01:00 EST on 2026-11-01.
    first = datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT
    second = datetime(2026, 11, 1, 6, 30, tzinfo=UTC)  # 01:30 EST
    a = reasons(cron_job("30 1 * * *", "America/New_York", first, fold="both"), now=first)
    b = reasons(cron_job("30 1 * * *", "America/New_York", second, fold="both"), now=first)
    assert "01:30:00 EDT" in a[0].message and "01:30:00 EST" in b[0].message
    assert b[0].details["inSeconds"] == 3600.0


def test_a_utc_cron_job_shows_utc_only() -> None:
    [r] = reasons(cron_job("0 * * * *", "UTC", NOW + timedelta(hours=1)))
    assert " in UTC)" not in r.message and "2026-06-01T11:00:00.000Z" in r.message


def test_not_started_across_a_dst_change_counts_real_seconds() -> None:
    # 2026-03-08 US spring forward: from 00:00 EST to 12:00 EDT is 11 real hours, not 12.
    now = datetime(2026, 3, 8, 5, 0, tzinfo=UTC)  # 00:00 EST
    start = datetime(2026, 3, 8, 16, 0, tzinfo=UTC)  # 12:00 EDT
    j = cron_job("0 12 * * *", "America/New_York", start, start_at=start)
    r = only(reasons(j, now=now), Code.NOT_STARTED)
    assert r.details["startsInSeconds"] == 11 * 3600.0
    assert "12:00:00 EDT" in r.message


def test_a_once_job_waiting_for_its_time_is_scheduled() -> None:
    at = NOW + timedelta(days=3)
    j = job(schedule=OnceSchedule(execute_at=at), next_run_at=at)
    [r] = reasons(j)
    assert r.code == "scheduled" and "in 3 d" in r.message


# --- unavailable checks and ordering --------------------------------------------------------


def test_checks_that_could_not_be_made_are_said_not_guessed() -> None:
    found = explain(ExplainInput(job=job(), now=NOW))
    assert codes(found) == ["scheduled", "check_unavailable", "check_unavailable",
                            "check_unavailable"]  # fmt: skip
    assert [r.details["check"] for r in found[1:]] == ["lease", "queue", "quota"]
    assert found[0].details["owner"] is None


def test_reasons_are_ordered_blocking_then_warning_then_info() -> None:
    j = job(overlap_policy=OverlapPolicy.FORBID, next_run_at=NOW - timedelta(minutes=1))
    prev = run(j, NOW - timedelta(minutes=2))
    skipped = run(j, NOW - timedelta(minutes=1, seconds=30), ExecutionStatus.SKIPPED,
                  skip_reason="misfire")  # fmt: skip
    found = reasons(j, previous=prev, recent=[skipped, prev], lease=LeaseView(3, None))
    ranks = [{"blocking": 0, "warning": 1, "info": 2}[r.severity] for r in found]
    assert ranks == sorted(ranks)
    assert codes(found)[0] == "no_owner"
    assert {"overlap_will_skip", "misfired", "running"} <= set(codes(found))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_every_rule_has_a_docstring(rule: object) -> None:
    assert getattr(rule, "__doc__", None)


def test_every_code_is_snake_case_and_unique() -> None:
    values = [c.value for c in Code]
    assert len(values) == len(set(values))
    assert all(v == v.lower() and " " not in v for v in values)


# --- concurrency keys -------------------------------------------------------------------------


def slots(running: list[str], waiting: list[str], limit: int = 1) -> ConcurrencyWait:
    return explain_wait(
        SlotState(
            max_concurrent=limit,
            owner="alice",
            key="tenant-a",
            holders=tuple(
                Holder(execution_id=r, worker_id="w1", order_ms=0, since_ms=0, expires_at_ms=10**15)
                for r in running
            ),
            waiters=tuple(
                Holder(execution_id=w, worker_id="w1", order_ms=i, since_ms=0, expires_at_ms=10**15)
                for i, w in enumerate(waiting)
            ),
        ),
        "tenant-a",
        limit,
        None,
        0,
    )


def test_a_run_waiting_for_a_slot_names_the_key_the_runs_holding_it_and_its_place() -> None:
    j = job(concurrency_key="{tenant}", max_concurrent=1, parameters={"tenant": "tenant-a"})
    mine = run(j, NOW - timedelta(seconds=10), ExecutionStatus.QUEUED)
    found = reasons(j, recent=[mine], concurrency=slots(["other-run"], ["x-run", mine.id]))
    r = only(found, Code.CONCURRENCY_WAITING)
    assert found[0] == r and r.severity == "blocking"
    assert r.details["concurrencyKey"] == "tenant-a"
    assert r.details["runningExecutionIds"] == "other-run"
    assert r.details["position"] == 1 and r.details["executionId"] == mine.id
    assert "'tenant-a'" in r.message and "other-run" in r.message and "1 waiting ahead" in r.message
    # a worker holds it: QUEUED says it waits for the slot, not for a worker
    queued = only(found, Code.QUEUED)
    assert queued.message.endswith("it waits for a slot of concurrency key 'tenant-a'")


def test_a_run_holding_the_slot_is_not_waiting() -> None:
    j = job(concurrency_key="{tenant}", max_concurrent=1, parameters={"tenant": "tenant-a"})
    mine = run(j, NOW - timedelta(seconds=10), ExecutionStatus.RUNNING)
    found = reasons(j, recent=[mine], concurrency=slots([mine.id], []))
    assert "concurrency_waiting" not in codes(found)


def test_every_slot_taken_by_others_warns_that_the_next_run_will_wait() -> None:
    j = job(concurrency_key="{tenant}", max_concurrent=2, parameters={"tenant": "tenant-a"})
    r = only(reasons(j, concurrency=slots(["a", "b"], [], limit=2)), Code.CONCURRENCY_WAITING)
    assert r.severity == "warning" and r.details["running"] == 2
    assert "concurrency_waiting" not in codes(reasons(j, concurrency=slots(["a"], [], limit=2)))


def test_unread_slots_of_a_job_with_a_key_are_said_unavailable() -> None:
    j = job(concurrency_key="{tenant}", max_concurrent=1, parameters={"tenant": "tenant-a"})
    found = reasons(j)
    assert [r.details["check"] for r in found if r.code == "check_unavailable"] == ["concurrency"]
    assert "check_unavailable" not in codes(reasons(job()))
