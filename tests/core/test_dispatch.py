"""core/dispatch.plan_job: the pure decision for a due job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from core.dispatch import JobPlan, due_at, plan_job, previous_active
from core.ids import execution_id
from core.model import (
    CronSchedule,
    Execution,
    ExecutionStatus,
    IntervalSchedule,
    Job,
    Missed,
    OverlapPolicy,
)

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)


def job(policy: OverlapPolicy = OverlapPolicy.FORBID, **kw: object) -> Job:
    base = Job(
        id="j1",
        owner="alice",
        task_id="noop",
        schedule=IntervalSchedule(every_seconds=10),
        overlap_policy=policy,
        created_at=T0 - timedelta(hours=1),
        updated_at=T0,
        next_run_at=T0,
    )
    return msgspec.structs.replace(base, **kw)


def running(j: Job, at: datetime) -> Execution:
    return Execution(
        id=execution_id(j.id, at), job_id=j.id, owner=j.owner, task_id=j.task_id,
        status=ExecutionStatus.RUNNING, attempt=1, scheduled_for=at, created_at=at, updated_at=at,
    )  # fmt: skip


def kinds(plan: JobPlan) -> list[tuple[str, str]]:
    return [
        (d.execution.status.value, d.execution.scheduled_for.strftime("%H:%M:%S"))
        for d in plan.dispatches
    ]


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
        (OverlapPolicy.FORBID, [("SKIPPED", "10:00:00"), ("QUEUED", "10:00:20")]),
        (OverlapPolicy.REPLACE, [("SKIPPED", "10:00:00"), ("QUEUED", "10:00:20")]),
    ],
)
def test_several_on_time_occurrences_run_together_only_when_overlap_is_allowed(
    policy: OverlapPolicy, expected: list[tuple[str, str]]
) -> None:
    plan = plan_job(
        job(policy), T0 + timedelta(seconds=25), previous=None, buffered=False, scheduler_id="s"
    )
    assert kinds(plan) == expected
    if policy != OverlapPolicy.ALLOW:  # the earlier occurrences: one record, like a misfire
        skipped = plan.dispatches[0].execution
        assert (
            skipped.skip_reason == "overlap: 3 occurrences were due at once; only the latest runs"
        )
        assert skipped.missed == Missed(
            count=2, first=T0, last=T0 + timedelta(seconds=10), policy=policy
        )
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


def test_occurrences_skipped_while_the_previous_run_runs_are_one_record() -> None:
    j = job(last_dispatched_for=T0 - timedelta(seconds=10))
    prev = running(j, T0 - timedelta(seconds=10))

    plan = plan_job(j, T0 + timedelta(seconds=25), previous=prev, buffered=False, scheduler_id="s")

    [d] = plan.dispatches
    assert d.execution.status == ExecutionStatus.SKIPPED
    assert d.execution.skip_reason == f"overlap: previous run {prev.id} is still RUNNING"
    assert d.execution.missed == Missed(
        count=3, first=T0, last=T0 + timedelta(seconds=20), policy=OverlapPolicy.FORBID
    )
    assert (d.expected_next_run_at, d.next_run_at) == (T0, T0 + timedelta(seconds=30))


@pytest.mark.parametrize("periods_behind", [1, 5, 50, 5000])
def test_a_job_far_behind_costs_at_most_three_records(periods_behind: int) -> None:
    """Falling behind must not make a job dearer to dispatch: the overload feedback loop."""
    late = T0 + timedelta(seconds=10 * periods_behind + 5)

    plan = plan_job(job(), late, previous=None, buffered=False, scheduler_id="s")

    assert len(plan.dispatches) <= 3
    assert [k[0] for k in kinds(plan)][-1] == "QUEUED"
    skipped = [d.execution for d in plan.dispatches[:-1]]
    assert sum(e.missed.count if e.missed else 1 for e in skipped) == periods_behind


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


def test_previous_active_is_the_store_status_unless_the_message_is_gone() -> None:
    j = job()
    assert not previous_active(None)
    for status in ExecutionStatus:
        active = status in (
            ExecutionStatus.QUEUED,
            ExecutionStatus.RUNNING,
            ExecutionStatus.RETRYING,
        )
        assert previous_active(msgspec.structs.replace(running(j, T0), status=status)) == active
    run = running(j, T0)
    assert not previous_active(run, ended={run.id})


def test_a_previous_run_known_to_have_ended_does_not_overlap() -> None:
    prev = running(job(), T0 - timedelta(seconds=10))
    plan = plan_job(job(), T0, previous=prev, buffered=False, scheduler_id="s", ended={prev.id})
    assert [d.execution.status for d in plan.dispatches] == [ExecutionStatus.QUEUED]
