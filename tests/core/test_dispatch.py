"""core/dispatch.plan_job: the pure decision for a due job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.dispatch import due_at, plan_job
from core.ids import execution_id
from core.model import (
    CronSchedule,
    Execution,
    ExecutionStatus,
    IntervalSchedule,
    Job,
    OverlapPolicy,
)

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)


def job(policy: OverlapPolicy = OverlapPolicy.FORBID, **kw: object) -> Job:
    base: dict[str, object] = {
        "id": "j1",
        "owner": "alice",
        "task_id": "noop",
        "schedule": IntervalSchedule(every_seconds=10),
        "overlap_policy": policy,
        "created_at": T0 - timedelta(hours=1),
        "updated_at": T0,
        "next_run_at": T0,
    }
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


def running(j: Job, at: datetime) -> Execution:
    return Execution(
        id=execution_id(j.id, at), job_id=j.id, owner=j.owner, task_id=j.task_id,
        status=ExecutionStatus.RUNNING, attempt=1, scheduled_for=at, created_at=at, updated_at=at,
    )  # fmt: skip


def kinds(plan: object) -> list[tuple[str, str]]:
    return [
        (d.execution.status.value, d.execution.scheduled_for.strftime("%H:%M:%S"))
        for d in plan.dispatches
    ]  # type: ignore[attr-defined]


def test_an_on_time_job_is_one_queued_run_that_advances_by_cas() -> None:
    plan = plan_job(job(), T0, previous=None, buffered=False, scheduler_id="s")
    [d] = plan.dispatches
    assert (d.execution.status, d.expected_next_run_at, d.next_run_at) == (
        ExecutionStatus.QUEUED,
        T0,
        T0 + timedelta(seconds=10),
    )
    assert d.execution.id == execution_id("j1", T0)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            OverlapPolicy.ALLOW,
            [("QUEUED", "10:00:00"), ("QUEUED", "10:00:10"), ("QUEUED", "10:00:20")],
        ),
        (
            OverlapPolicy.FORBID,
            [("SKIPPED", "10:00:00"), ("SKIPPED", "10:00:10"), ("QUEUED", "10:00:20")],
        ),
        (
            OverlapPolicy.REPLACE,
            [("SKIPPED", "10:00:00"), ("SKIPPED", "10:00:10"), ("QUEUED", "10:00:20")],
        ),
    ],
)
def test_several_on_time_occurrences_run_together_only_when_overlap_is_allowed(
    policy: OverlapPolicy, expected: list[tuple[str, str]]
) -> None:
    plan = plan_job(
        job(policy), T0 + timedelta(seconds=25), previous=None, buffered=False, scheduler_id="s"
    )
    assert kinds(plan) == expected
    chain = plan.dispatches
    assert [d.expected_next_run_at for d in chain[1:]] == [d.next_run_at for d in chain[:-1]], (
        "a CAS chain"
    )
    assert chain[-1].next_run_at == T0 + timedelta(seconds=30)


def test_forbid_skips_while_the_previous_run_runs() -> None:
    j = job(last_dispatched_for=T0 - timedelta(seconds=10))
    plan = plan_job(
        j, T0, previous=running(j, T0 - timedelta(seconds=10)), buffered=False, scheduler_id="s"
    )
    [d] = plan.dispatches
    assert d.execution.status == ExecutionStatus.SKIPPED
    assert d.execution.skip_reason and d.execution.skip_reason.startswith("overlap: previous run")


def test_buffer_one_waits_then_runs_the_buffered_occurrence_and_records_the_rest() -> None:
    j = job(OverlapPolicy.BUFFER_ONE)
    prev = running(j, T0 - timedelta(seconds=10))
    assert plan_job(j, T0, previous=prev, buffered=False, scheduler_id="s").wait_for == prev.id
    later = plan_job(j, T0 + timedelta(seconds=35), previous=None, buffered=True, scheduler_id="s")
    assert [k for k in kinds(later) if k[0] == "QUEUED"] == [("QUEUED", "10:00:00")]
    skipped = [
        d.execution for d in later.dispatches if d.execution.status == ExecutionStatus.SKIPPED
    ]
    assert skipped and skipped[0].missed is not None and skipped[0].missed.count == 3
    assert later.dispatches[-1].next_run_at == T0 + timedelta(seconds=40)


def test_replace_cancels_the_previous_run() -> None:
    j = job(OverlapPolicy.REPLACE)
    prev = running(j, T0 - timedelta(seconds=10))
    plan = plan_job(j, T0, previous=prev, buffered=False, scheduler_id="s")
    assert plan.cancel == prev.id
    assert kinds(plan) == [("QUEUED", "10:00:00")]


def test_jitter_delays_the_due_time_deterministically() -> None:
    j = job(schedule=CronSchedule(expression="* * * * *", jitter_seconds=30))
    first, second = due_at(j), due_at(j)
    assert first == second and first is not None
    assert T0 <= first <= T0 + timedelta(seconds=30)
    assert (
        plan_job(j, T0, previous=None, buffered=False, scheduler_id="s").not_before == first
        or first == T0
    )
