"""The JobStore contract, continued: retention (``prune_executions``) and ``partition_jobs``.

Run against every backend of ``conftest.BACKENDS``. The rules: a finished run goes when it is not
among the job's ``keep_last`` most recently finished runs, or when it finished before the cutoff;
an unfinished run and the job's latest run (``keep_id``) never go; at most ``limit`` runs per call.
"""

from __future__ import annotations

from datetime import datetime

import msgspec
import pytest

from core.ids import execution_id
from core.model import TERMINAL_RANK, Execution, ExecutionStatus, Job, state_rank
from core.ports import JobStore, PruneResult, PruneTarget
from tests.store.test_contract import OWNER, at, make_execution, make_job

QUEUED = ExecutionStatus.QUEUED
RUNNING = ExecutionStatus.RUNNING
RETRYING = ExecutionStatus.RETRYING
SUCCEEDED = ExecutionStatus.SUCCEEDED
FAILED = ExecutionStatus.FAILED
SKIPPED = ExecutionStatus.SKIPPED
CANCELLED = ExecutionStatus.CANCELLED


def run(
    job: Job, minute: float, status: ExecutionStatus, *, finished: float | None = None
) -> Execution:
    """A run of ``job`` scheduled at ``minute``, in ``status``; a finished one ended at
    ``finished`` (default: one minute after it was scheduled)."""
    ex = make_execution(job, at(minute))
    if status not in (SUCCEEDED, FAILED, SKIPPED, CANCELLED):
        attempt = 0 if status == QUEUED else 1
        return msgspec.structs.replace(
            ex, status=status, attempt=attempt, state_rank=state_rank(status, attempt)
        )
    end = at(minute + 1 if finished is None else finished)
    return msgspec.structs.replace(
        ex, status=status, attempt=1, state_rank=TERMINAL_RANK, finished_at=end, updated_at=end
    )


async def stored_minutes(store: JobStore, job: Job) -> list[float]:
    """The scheduled minutes of ``job``'s runs still stored, newest first."""
    page = await store.list_executions(OWNER, job.id, limit=500, cursor=None)
    assert page.next_cursor is None
    return [(e.scheduled_for - at(0)).total_seconds() / 60 for e in page.items]


async def job_with(store: JobStore, job_id: str, *runs: tuple[float, ExecutionStatus]) -> Job:
    job = make_job(job_id)
    await store.create_job(job)
    for minute, status in runs:
        assert await store.insert_execution(run(job, minute, status))
    return job


def target(
    job: Job,
    keep_last: int | None = None,
    finished_before: datetime | None = None,
    keep_id: str | None = None,
) -> PruneTarget:
    return PruneTarget(
        job.id, keep_last=keep_last, finished_before=finished_before, keep_id=keep_id
    )


async def test_the_count_rule_keeps_the_most_recently_finished_and_every_unfinished_run(
    store: JobStore,
) -> None:
    job = await job_with(
        store,
        "job-1",
        (1, SUCCEEDED),
        (2, FAILED),
        (3, RUNNING),  # an old run still running: never touched
        (4, SKIPPED),
        (5, CANCELLED),
        (6, RETRYING),
        (7, SUCCEEDED),
        (8, QUEUED),
    )

    [result] = await store.prune_executions([target(job, keep_last=2)], limit=100)

    assert result == PruneResult(deleted=3, complete=True)
    assert await stored_minutes(store, job) == [8, 7, 6, 5, 3]


async def test_the_count_rule_orders_by_finish_time(store: JobStore) -> None:
    """A run scheduled earlier that finished later (a long run, a retry) counts as more recent."""
    job = make_job("job-1")
    await store.create_job(job)
    for minute, finished in ((1, 50), (2, 3), (3, 4), (4, 5)):
        await store.insert_execution(run(job, minute, SUCCEEDED, finished=finished))

    await store.prune_executions([target(job, keep_last=2)], limit=100)

    assert await stored_minutes(store, job) == [4, 1]


async def test_the_age_rule_deletes_runs_finished_before_the_cutoff(store: JobStore) -> None:
    job = await job_with(store, "job-1", (1, SUCCEEDED), (2, SKIPPED), (3, RUNNING), (4, FAILED))

    [result] = await store.prune_executions([target(job, finished_before=at(3.5))], limit=100)

    assert result == PruneResult(deleted=2, complete=True)  # finished at 2 and 3; 4 ended at 5
    assert await stored_minutes(store, job) == [4, 3]


async def test_either_rule_deletes_a_run(store: JobStore) -> None:
    job = await job_with(store, "job-1", *((m, SUCCEEDED) for m in range(1, 9)))

    await store.prune_executions([target(job, keep_last=5, finished_before=at(6))], limit=100)

    assert await stored_minutes(store, job) == [8, 7, 6, 5]  # 5 ended at 6: not before it


async def test_the_latest_run_is_kept_whatever_the_rules(store: JobStore) -> None:
    """The job's summary points to its latest run (``lastExecutionId``): it stays even when it
    is older than the age limit, or not among the most recently finished."""
    job = await job_with(store, "job-1", (1, SUCCEEDED), (2, SUCCEEDED), (3, SUCCEEDED))
    latest = execution_id(job.id, at(1))

    await store.prune_executions(
        [target(job, keep_last=1, finished_before=at(100), keep_id=latest)], limit=100
    )

    assert await stored_minutes(store, job) == [1]
    other = await job_with(store, "job-2", (1, SUCCEEDED), (2, SUCCEEDED), (3, SUCCEEDED))
    await store.prune_executions(
        [target(other, keep_last=1, keep_id=execution_id(other.id, at(2)))], limit=100
    )
    assert await stored_minutes(store, other) == [3, 2]


async def test_pruning_is_bounded_per_call_and_finishes_when_repeated(store: JobStore) -> None:
    first = await job_with(store, "job-1", *((m, SUCCEEDED) for m in range(1, 11)))
    second = await job_with(store, "job-2", *((m, SUCCEEDED) for m in range(1, 4)))
    targets = [target(first, keep_last=3), target(second, keep_last=1)]

    assert await store.prune_executions(targets, limit=4) == [
        PruneResult(deleted=4, complete=False),
        PruneResult(deleted=0, complete=False),  # nothing left of this call's limit
    ]
    assert await store.prune_executions(targets, limit=4) == [
        PruneResult(deleted=3, complete=True),
        PruneResult(deleted=1, complete=False),
    ]
    assert await store.prune_executions(targets, limit=4) == [
        PruneResult(deleted=0, complete=True),
        PruneResult(deleted=1, complete=True),
    ]
    assert await stored_minutes(store, first) == [10, 9, 8]
    assert await stored_minutes(store, second) == [3]


async def test_the_age_rule_is_bounded_too(store: JobStore) -> None:
    job = await job_with(store, "job-1", *((m, SUCCEEDED) for m in range(1, 8)))

    [result] = await store.prune_executions(
        [target(job, keep_last=100, finished_before=at(100))], limit=3
    )

    assert result == PruneResult(deleted=3, complete=False)
    assert await stored_minutes(store, job) == [7, 6, 5, 4]  # the oldest went first


async def test_pruning_touches_no_other_job_and_is_idempotent(store: JobStore) -> None:
    job = await job_with(store, "job-1", *((m, SUCCEEDED) for m in range(1, 6)))
    bystander = await job_with(store, "job-2", *((m, SUCCEEDED) for m in range(1, 6)))
    rules = [target(job, keep_last=2, finished_before=at(3))]

    await store.prune_executions(rules, limit=100)

    assert await store.prune_executions(rules, limit=100) == [PruneResult(0, complete=True)]
    assert await stored_minutes(store, job) == [5, 4]
    assert await stored_minutes(store, bystander) == [5, 4, 3, 2, 1]


@pytest.mark.parametrize("limit", [0, 100])
async def test_a_target_without_rules_deletes_nothing(store: JobStore, limit: int) -> None:
    job = await job_with(store, "job-1", (1, SUCCEEDED), (2, SUCCEEDED))

    assert await store.prune_executions([target(job)], limit=limit) == [PruneResult(0, True)]
    assert await store.prune_executions([], limit=limit) == []
    assert await stored_minutes(store, job) == [2, 1]


async def test_partition_jobs_walks_one_partition_in_id_order(store: JobStore) -> None:
    for i in range(7):
        await store.create_job(make_job(f"job-{i}", partition=i % 2))

    pages: list[list[str]] = []
    after: str | None = None
    while True:
        page = await store.partition_jobs(0, after=after, limit=2)
        if not page:
            break
        pages.append([j.id for j in page])
        after = page[-1].id

    assert pages == [["job-0", "job-2"], ["job-4", "job-6"]]
    assert [j.id for j in await store.partition_jobs(1, after=None, limit=10)] == [
        "job-1",
        "job-3",
        "job-5",
    ]
    assert await store.partition_jobs(5, after=None, limit=10) == []
    [whole] = await store.partition_jobs(1, after="job-3", limit=1)
    assert whole == await store.get_job(OWNER, "job-5")
