"""The JobStore contract, continued: a run's attempt history (``Execution.attempts``).

Run against every backend of ``conftest.BACKENDS``, with the helpers of ``test_contract``. The
merge rule itself is :func:`core.history.record_attempts` (``tests/core/test_history.py``); these
tests check that each store applies it to the events it records — batched or not, in any order,
by recorders racing each other — and exposes the result.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from core.model import Attempt, Execution, ExecutionStatus, StatusEvent
from core.ports import JobStore
from tests.store.test_contract import (
    OWNER,
    RETRYING,
    RUNNING,
    SUCCEEDED,
    at,
    dispatched_job,
    event,
    execution,
    make_execution,
    make_job,
)

CANCELLED = ExecutionStatus.CANCELLED


async def test_each_attempt_keeps_its_own_start_worker_and_outcome(store: JobStore) -> None:
    """Attempt 1 lost with worker A (no report after RUNNING), attempt 2 failed on B, attempt 3
    succeeded on C: the run's first start stays A's, and each attempt shows its own."""
    _, ex = await dispatched_job(store, next_run_at=at(2))
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1), worker_id="worker-a"),
            event(ex, RUNNING, 2, at(1, 40), started_at=at(1, 40), worker_id="worker-b"),
            event(
                ex,
                RETRYING,
                2,
                at(1, 41),
                started_at=at(1, 40),
                worker_id="worker-b",
                error="ValueError: boom",
                next_attempt_at=at(1, 42),
            ),
        ]
    )
    await store.apply_events(
        [
            event(ex, RUNNING, 3, at(1, 43), started_at=at(1, 43), worker_id="worker-c"),
            event(
                ex,
                SUCCEEDED,
                3,
                at(1, 44),
                started_at=at(1, 43),
                finished_at=at(1, 44),
                worker_id="worker-c",
            ),
        ]
    )

    run = await execution(store, ex.id)

    assert (run.status, run.started_at, run.worker_id) == (SUCCEEDED, at(1, 1), "worker-c")
    assert run.attempts == [
        Attempt(attempt=1, started_at=at(1, 1), worker_id="worker-a"),
        Attempt(
            attempt=2,
            started_at=at(1, 40),
            worker_id="worker-b",
            finished_at=at(1, 41),
            outcome=RETRYING,
            error="ValueError: boom",
            redelivered=True,
        ),
        Attempt(
            attempt=3,
            started_at=at(1, 43),
            worker_id="worker-c",
            finished_at=at(1, 44),
            outcome=SUCCEEDED,
        ),
    ]
    [listed] = (await store.list_executions(OWNER, ex.job_id, limit=10, cursor=None)).items
    assert listed.attempts == run.attempts


RETRIED = [
    (RUNNING, 1, 1.0, "worker-a"),
    (RETRYING, 1, 2.0, "worker-a"),
    (RUNNING, 2, 3.0, "worker-b"),
    (SUCCEEDED, 2, 4.0, "worker-b"),
]
RETRIED_HISTORY = [
    Attempt(
        attempt=1,
        started_at=at(1, 1),
        worker_id="worker-a",
        finished_at=at(1, 2),
        outcome=RETRYING,
        error="boom",
    ),
    Attempt(
        attempt=2,
        started_at=at(1, 3),
        worker_id="worker-b",
        finished_at=at(1, 4),
        outcome=SUCCEEDED,
    ),
]


def retried_events(ex: Execution) -> list[StatusEvent]:
    """RUNNING 1, RETRYING 1, RUNNING 2, SUCCEEDED 2, as the workers report them."""
    starts = {1: at(1, 1), 2: at(1, 3)}
    out = []
    for status, attempt, second, worker in RETRIED:
        fields: dict[str, Any] = {"started_at": starts[attempt], "worker_id": worker}
        if status == RETRYING:
            fields["error"] = "boom"
        if status == SUCCEEDED:
            fields["finished_at"] = at(1, second)
        out.append(event(ex, status, attempt, at(1, second), **fields))
    return out


async def test_the_history_is_the_same_whatever_the_order_and_batching(store: JobStore) -> None:
    """Every order of a retried run's four events, applied one by one (four recorder batches)
    and all at once (one batch), twice (a redelivered batch), gives the same history."""
    for n, order in enumerate(itertools.permutations(range(4))):
        job = make_job(f"job-{n}", next_run_at=at(1))
        await store.create_job(job)
        ex = make_execution(job, at(1))
        await store.insert_execution(ex)
        events = retried_events(ex)
        for i in order:
            await store.apply_events([events[i]])
        assert (await execution(store, ex.id)).attempts == RETRIED_HISTORY, order
        await store.apply_events([events[i] for i in order])
        assert (await execution(store, ex.id)).attempts == RETRIED_HISTORY, order

        together = make_execution(job, at(2))
        await store.insert_execution(together)
        more = retried_events(together)
        await store.apply_events([more[i] for i in order])
        assert (await execution(store, together.id)).attempts == RETRIED_HISTORY, order


async def test_a_late_report_fills_in_what_it_knows_and_rewrites_nothing(store: JobStore) -> None:
    """Attempt 2's RUNNING is recorded before attempt 1's RETRYING (two recorders): attempt 2
    first looks like a redelivery; the late report makes it a retry. A late duplicate of an
    earlier state changes nothing."""
    _, ex = await dispatched_job(store, next_run_at=at(2))
    running_1, retrying_1, running_2, succeeded_2 = retried_events(ex)

    await store.apply_events([running_1, running_2])
    early = (await execution(store, ex.id)).attempts
    assert [(a.attempt, a.outcome, a.redelivered) for a in early] == [
        (1, None, False),
        (2, None, True),
    ]

    await store.apply_events([succeeded_2])
    await store.apply_events([retrying_1])
    assert (await execution(store, ex.id)).attempts == RETRIED_HISTORY

    await store.apply_events([running_1, running_2, retrying_1])
    run = await execution(store, ex.id)
    assert (run.status, run.attempts) == (SUCCEEDED, RETRIED_HISTORY)


async def test_events_before_the_dispatch_record_start_the_history(store: JobStore) -> None:
    job = make_job(next_run_at=at(1))
    ex = make_execution(job, at(1))
    running_1, retrying_1, _, _ = retried_events(ex)

    await store.apply_events([running_1, retrying_1])

    assert (await execution(store, ex.id)).attempts == RETRIED_HISTORY[:1]


async def test_racing_recorders_lose_no_attempt(store: JobStore) -> None:
    """Two recorders apply two batches of one run at the same time (the status stream's consumer
    hands consecutive events to whichever recorder pulls): both batches reach the history."""
    for n in range(5):
        job = make_job(f"job-{n}", next_run_at=at(1))
        await store.create_job(job)
        ex = make_execution(job, at(1))
        await store.insert_execution(ex)
        events = retried_events(ex)

        async with asyncio.timeout(10):
            await asyncio.gather(
                store.apply_events(events[:2]),
                store.apply_events(events[2:]),
            )

        run = await execution(store, ex.id)
        assert (run.status, run.attempts) == (SUCCEEDED, RETRIED_HISTORY)


async def test_a_run_cancelled_before_its_first_attempt_has_no_attempts(store: JobStore) -> None:
    """The re-dispatch sweep closes a lost QUEUED run of a cancelled job (attempt 0)."""
    _, ex = await dispatched_job(store, next_run_at=at(2))

    await store.apply_events(
        [event(ex, CANCELLED, 0, at(1, 30), finished_at=at(1, 30), error="cancelled")]
    )

    run = await execution(store, ex.id)
    assert (run.status, run.attempts) == (CANCELLED, [])


async def test_a_new_run_has_no_attempts(store: JobStore) -> None:
    _, ex = await dispatched_job(store, next_run_at=at(2))

    assert (await execution(store, ex.id)).attempts == []
