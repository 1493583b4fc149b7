"""What ``GET /jobs/{id}/explain`` reads before :func:`core.explain.explain` decides: the job's
latest runs and its owner's runs-quota bucket from the store, its queue's consumer and its
partition's lease from the bus (:class:`core.ports.RunInspector`), concurrently and read only."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from core import quotas as quota_rules
from core.concurrency import ConcurrencyWait
from core.errors import BusUnavailable
from core.explain import (
    RECENT_EXECUTIONS,
    ExplainInput,
    Explanation,
    LeaseView,
    QueueState,
    QuotaState,
    explain,
    finished_job,
)
from core.ids import execution_id
from core.model import Job
from core.ports import JobStore, RunInspector
from core.quotas import Quotas
from core.runs import concurrency_key_of
from core.timeutil import to_epoch_ms

log = logging.getLogger(__name__)


async def explanation(
    store: JobStore, inspector: RunInspector | None, quotas: Quotas, job: Job, now: datetime
) -> Explanation:
    """The explanation of ``job`` at ``now``.

    A check the bus cannot answer now (or any, without ``inspector``) is reported as
    ``check_unavailable``, not an error; none is made for a job with no run left.

    Raises:
        StoreUnavailable: the store did not answer.
    """
    page, (queue, lease, slots), quota = await asyncio.gather(
        store.list_executions(job.owner, job.id, limit=RECENT_EXECUTIONS, cursor=None),
        _inspect(inspector, job, now),
        _runs_quota(store, quotas, job),
    )
    previous = None
    if job.last_dispatched_for is not None:
        previous_id = execution_id(job.id, job.last_dispatched_for)
        previous = next((e for e in page.items if e.id == previous_id), None)
        if previous is None:
            previous = await store.get_execution(previous_id)
    inputs = ExplainInput(
        job=job,
        now=now,
        recent=page.items,
        previous=previous,
        queue=queue,
        lease=lease,
        quota=quota,
        concurrency=slots,
    )
    return Explanation(
        job_id=job.id,
        status=job.status,
        at=now,
        next_run_at=job.next_run_at,
        reasons=explain(inputs),
    )


async def _inspect(
    inspector: RunInspector | None, job: Job, now: datetime
) -> tuple[QueueState | None, LeaseView | None, ConcurrencyWait | None]:
    """The job's queue, lease and concurrency slots (when it has a concurrency key),
    concurrently; None for what the bus did not answer."""
    if inspector is None or finished_job(job):
        return None, None, None
    key = concurrency_key_of(job)
    answers = await asyncio.gather(
        inspector.queue_state(job.queue),
        inspector.partition_lease(job.partition),
        _none()
        if key is None
        else inspector.concurrency_wait(
            job.owner, key, job.max_concurrent or 1, None, to_epoch_ms(now)
        ),
        return_exceptions=True,
    )
    for answer in answers:
        if isinstance(answer, BusUnavailable):
            log.warning("explain %s: %s", job.id, answer, extra={"job_id": job.id})
        elif isinstance(answer, BaseException):
            raise answer
    queue, lease, slots = answers
    return (
        queue if isinstance(queue, QueueState) else None,
        lease if isinstance(lease, LeaseView) else None,
        slots if isinstance(slots, ConcurrencyWait) else None,
    )


async def _none() -> None:
    return None


async def _runs_quota(store: JobStore, quotas: Quotas, job: Job) -> QuotaState | None:
    """The owner's runs quota and its bucket, read without taking a token."""
    if finished_job(job):
        return None
    rate = quotas.runs
    if rate is None:
        return QuotaState(runs_per_minute=0, rate=None)
    key = quota_rules.runs_key(job.owner)
    buckets = await store.read_tokens([key])
    return QuotaState(runs_per_minute=quotas.runs_per_minute, rate=rate, bucket=buckets.get(key))
