"""The JobStore contract for a job's concurrency limit (``concurrencyKey``, ``maxConcurrent``,
``concurrencyPolicy``), run against every backend: stored, read back, changed and removed."""

from __future__ import annotations

import msgspec

from core.concurrency import ConcurrencyPolicy
from core.model import JobStatus
from core.ports import JobChange, JobStore
from tests.store.test_contract import OWNER, at, make_job


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
