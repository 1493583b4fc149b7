"""The JobStore contract for a job's concurrency limit (``concurrencyKey``, ``maxConcurrent``,
``concurrencyPolicy``), run against every backend: stored, read back, changed and removed."""

from __future__ import annotations

import msgspec

from core.concurrency import ConcurrencyPolicy, skip_reason
from core.model import ExecutionStatus, JobStatus
from core.ports import JobChange, JobStore
from tests.store.test_contract import OWNER, at, event, make_execution, make_job


async def test_a_limit_round_trips_and_can_be_changed_and_removed(store: JobStore) -> None:
    job = make_job(
        "job-1",
        parameters={"customer": "acme"},
        next_run_at=at(5),
        concurrency_key="tenant-{customer}",
        max_concurrent=3,
        concurrency_policy=ConcurrencyPolicy.SKIP,
    )
    await store.create_job(job)
    assert await store.get_job(OWNER, "job-1") == job
    assert await store.get_jobs(["job-1"]) == [job]

    changed = msgspec.structs.replace(job.spec, max_concurrent=5)
    after = await store.update_job(
        OWNER,
        "job-1",
        JobChange("changed", allowed_from=frozenset({JobStatus.SCHEDULED}), spec=changed),
        now=at(1),
    )
    assert (after.concurrency_key, after.max_concurrent) == ("tenant-{customer}", 5)

    removed = msgspec.structs.replace(changed, concurrency_key=None)
    after = await store.update_job(
        OWNER,
        "job-1",
        JobChange("changed", allowed_from=frozenset({JobStatus.SCHEDULED}), spec=removed),
        now=at(2),
    )
    assert after.concurrency_key is None
    assert (await store.get_job(OWNER, "job-1")).concurrency_key is None


async def test_a_run_skipped_by_the_concurrency_policy_has_its_skip_reason(
    store: JobStore,
) -> None:
    job = make_job("job-1", concurrency_key="tenant-a", concurrency_policy=ConcurrencyPolicy.SKIP)
    await store.create_job(job)
    queued = make_execution(job, at(1))
    await store.insert_execution(queued)
    reason = skip_reason("tenant-a", 1)
    # the worker's SKIPPED event (it never had an attempt), onto the QUEUED record ...
    await store.apply_events(
        [event(queued, ExecutionStatus.SKIPPED, 0, at(1, 1), finished_at=at(1, 1), error=reason)]
    )
    [stored] = await store.get_executions([queued.id])
    assert (stored.status, stored.skip_reason, stored.error) == (
        ExecutionStatus.SKIPPED,
        reason,
        reason,
    )
    assert stored.trigger == queued.trigger  # the run's other facts are kept
    # ... and one whose record the event creates (its QUEUED record not stored yet)
    late = make_execution(job, at(2))
    await store.apply_events(
        [event(late, ExecutionStatus.SKIPPED, 0, at(2, 1), finished_at=at(2, 1), error=reason)]
    )
    [created] = await store.get_executions([late.id])
    assert (created.status, created.skip_reason) == (ExecutionStatus.SKIPPED, reason)
    # a failed run's error is no skip reason
    failed = make_execution(job, at(3))
    await store.insert_execution(failed)
    await store.apply_events([event(failed, ExecutionStatus.FAILED, 1, at(3, 1), error="boom")])
    assert (await store.get_executions([failed.id]))[0].skip_reason is None
