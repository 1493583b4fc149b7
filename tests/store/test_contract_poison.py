"""One bad value, event or row never stops a loop that serves everyone — the same on every store.

The value range is core/values.py's: results and errors outside it are stored bounded (the same
on every store), a write no store can make raises ``StoreRejected`` (never a driver error, never
"unavailable"), a message set aside is kept as a dead letter, and a row this version cannot read
is skipped, logged once. Runs on every backend of ``conftest.BACKENDS`` (the real MongoDB one
with ``JOBSCHED_TEST_MONGODB_URL``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from core.errors import StoreRejected
from core.model import DeadLetter, ExecutionStatus, OnceSchedule
from core.ports import Dispatch, JobStore
from core.values import MAX_DEPTH, MAX_ERROR_CHARS, MAX_INT, MIN_INT, storable_result
from store.mongo import EXECUTIONS, JOBS, MongoStore
from store.sqlite import SqliteStore
from tests.store.test_contract import (
    FAILED,
    RUNNING,
    SUCCEEDED,
    T0,
    at,
    create,
    dispatched,
    event,
    make_execution,
    make_job,
)

POISONED_RESULT = {
    "n": 2**64,
    "small": MIN_INT - 1,
    "key\x00": "value",
    "text": "file \udcff.csv",
    "rows": [1, 2.5, None, True, {"$dollar": {"dot.ted": MAX_INT}}],
}


def nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"d": value}
    return value


async def test_a_result_or_error_no_store_can_hold_is_recorded_bounded_the_same_everywhere(
    store: JobStore,
) -> None:
    """A task's output is the record of a run that happened: it is stored within the range
    (integers beyond 64 bits as text, NUL in keys as U+FFFD, lone surrogates escaped), never
    refused and never a crash of the recorder."""
    job = make_job(next_run_at=T0)
    await create(store, job)
    ex = await dispatched(store, job, T0, at(1))

    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(seconds=1), started_at=at(seconds=1)),
            event(
                ex, SUCCEEDED, 1, at(seconds=2), finished_at=at(seconds=2), result=POISONED_RESULT
            ),
        ]
    )

    stored = await store.get_execution(ex.id)
    assert stored is not None and stored.status == SUCCEEDED
    assert stored.result == storable_result(POISONED_RESULT)
    assert stored.result["n"] == str(2**64) and stored.result["key\ufffd"] == "value"
    assert stored.result["text"] == "file \\udcff.csv"
    assert stored.result["rows"][4] == {"$dollar": {"dot.ted": MAX_INT}}


async def test_an_error_no_store_can_hold_is_recorded_bounded(store: JobStore) -> None:
    job = make_job(next_run_at=T0, schedule=OnceSchedule(execute_at=T0))
    await create(store, job)
    ex = await dispatched(store, job, T0, None)
    error = "OSError: cannot open \udcff" + "x" * (2 * MAX_ERROR_CHARS)

    await store.apply_events([event(ex, FAILED, 1, at(seconds=2), error=error, result=nested(40))])

    stored = await store.get_execution(ex.id)
    assert stored is not None and stored.error is not None
    assert (
        stored.error.startswith("OSError: cannot open \\udcff")
        and len(stored.error) == MAX_ERROR_CHARS
    )
    assert (await store.get_job(job.owner, job.id)).last_error == stored.error
    inner = stored.result
    for _ in range(MAX_DEPTH):
        inner = inner["d"]
    assert inner == msgspec.json.encode(nested(40 - MAX_DEPTH)).decode()


async def test_a_deep_result_at_the_edge_of_the_range_is_stored_as_it_is(store: JobStore) -> None:
    job = make_job(next_run_at=T0)
    await create(store, job)
    ex = await dispatched(store, job, T0, at(1))
    result = nested(MAX_DEPTH - 1)
    await store.apply_events([event(ex, SUCCEEDED, 1, at(seconds=2), result=result)])
    stored = await store.get_execution(ex.id)
    assert stored is not None and stored.result == result


async def test_an_event_no_store_can_write_is_rejected_and_its_batch_applies_without_it(
    store: JobStore,
) -> None:
    """An attempt beyond 64 bits fits no store's integer: ``StoreRejected`` (this write, for
    good), not a driver error and not "unavailable" (retry forever). The recorder then applies
    the rest of the batch without it."""
    jobs = [make_job(f"job-{i}", next_run_at=T0) for i in range(3)]
    await create(store, *jobs)
    runs = [await dispatched(store, j, T0, at(1)) for j in jobs]
    good = [event(r, RUNNING, 1, at(seconds=1)) for r in (runs[0], runs[2])]
    poison = event(runs[1], RUNNING, 2**63, at(seconds=1))

    with pytest.raises(StoreRejected):
        await store.apply_events([good[0], poison, good[1]])
    with pytest.raises(StoreRejected):
        await store.apply_events([poison])
    await store.apply_events(good)  # the first attempt may have applied some: idempotent

    stored = {e.id: e.status for e in await store.get_executions([r.id for r in runs])}
    assert stored == {runs[0].id: RUNNING, runs[1].id: ExecutionStatus.QUEUED, runs[2].id: RUNNING}


async def test_a_job_the_store_refuses_fails_alone_not_the_jobs_committed_with_it(
    store: JobStore,
) -> None:
    """SQLite commits concurrent creates in one transaction (group commit): one job it cannot
    bind (here an owner no store can encode; the gateway never sends one) must fail alone."""
    good = [make_job(f"good-{i}") for i in range(3)]
    bad = make_job("bad", owner="user-\udcff")

    results = await asyncio.gather(
        *(store.create_job(j) for j in (good[0], bad, *good[1:])), return_exceptions=True
    )

    assert [type(r) for r in results] == [
        type(good[0]),
        StoreRejected,
        type(good[0]),
        type(good[0]),
    ]
    assert sorted(j.id for j in await store.get_jobs([j.id for j in [*good, bad]])) == [
        "good-0",
        "good-1",
        "good-2",
    ]


def letter(letter_id: str, minutes: float, **fields: Any) -> DeadLetter:
    return DeadLetter(
        id=letter_id,
        source="recorder",
        reason="rejected",
        error="the store refuses this write: OverflowError",
        subject="jobsched.status.alice.job-1",
        data=b'{"kind": "run", "attempt": 9223372036854775808}\x00\xff',
        size=51,
        at=at(minutes),
        **fields,
    )


async def test_dead_letters_are_stored_once_and_listed_newest_first(store: JobStore) -> None:
    first = letter("status:7:1000", 1, execution_id="job-1:x", job_id="job-1", owner="alice")
    second = msgspec.structs.replace(
        letter("status:9:1001", 2), reason="undecodable", error="JSON is malformed"
    )

    assert await store.dead_letter([first, second, first]) == 2
    assert await store.dead_letter([second]) == 0  # a redelivery of a message set aside before

    assert await store.dead_letters(limit=10) == [second, first]
    assert await store.dead_letters(limit=1) == [second]


async def test_due_jobs_over_every_partition_are_the_earliest_in_order(store: JobStore) -> None:
    """A scheduler owning thousands of partitions gets one answer, earliest first, whatever
    chunks the store splits the query into."""
    jobs = [
        make_job(f"p{p:04d}", partition=p, next_run_at=at((p * 37) % 113))
        for p in range(0, 4096, 9)
    ]
    await create(store, *jobs)

    due = await store.due_jobs(set(range(4096)), at(60), limit=30)

    wanted = sorted((j for j in jobs if j.next_run_at and j.next_run_at <= at(60)),
                    key=lambda j: j.next_run_at or T0)[:30]  # fmt: skip
    assert [j.next_run_at for j in due] == [j.next_run_at for j in wanted]
    assert len({j.id for j in due}) == 30


async def test_stale_runs_over_every_partition_are_the_oldest_in_order(store: JobStore) -> None:
    jobs = [make_job(f"s{p:04d}", partition=p, next_run_at=T0) for p in range(0, 4096, 11)]
    await create(store, *jobs)
    for i, j in enumerate(jobs):  # dispatched at scattered times: updatedAt = createdAt = then
        run = make_execution(j, T0, now=at((i * 53) % 97))
        await store.dispatch([Dispatch(run, expected_next_run_at=T0, next_run_at=at(500))])

    stale = await store.stale_executions(set(range(4096)), at(80), limit=25)

    times = sorted(at((i * 53) % 97) for i in range(len(jobs)) if at((i * 53) % 97) < at(80))
    assert [e.updated_at for e in stale] == times[:25]


async def corrupt_job(store: JobStore, job_id: str) -> None:
    """Give a stored job a status this version does not know (as a newer jobsched might)."""
    if isinstance(store, SqliteStore):
        await store._w.execute("UPDATE jobs SET status = 'ARCHIVED' WHERE id = ?", (job_id,))
    else:
        assert isinstance(store, MongoStore)
        await store.database[JOBS].update_one({"_id": job_id}, {"$set": {"status": "ARCHIVED"}})


async def corrupt_execution(store: JobStore, execution_id: str) -> None:
    if isinstance(store, SqliteStore):
        await store._w.execute(
            "UPDATE executions SET status = 'PARKED' WHERE id = ?", (execution_id,)
        )
    else:
        assert isinstance(store, MongoStore)
        await store.database[EXECUTIONS].update_one(
            {"_id": execution_id}, {"$set": {"status": "PARKED"}}
        )


async def test_a_row_this_version_cannot_read_is_skipped_logged_once_and_the_rest_served(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A job written by a newer version (or by hand) must not stop the scheduler of every
    partition it owns: its batch reads skip it, and say so once."""
    jobs = [make_job(f"job-{i}", partition=1, next_run_at=at(i)) for i in range(3)]
    await create(store, *jobs)
    runs = [await dispatched(store, j, at(i), at(i + 10)) for i, j in enumerate(jobs)]
    await corrupt_job(store, "job-1")
    await corrupt_execution(store, runs[2].id)
    ids = [j.id for j in jobs]

    with caplog.at_level(logging.DEBUG, logger="store.rows"):
        for _ in range(3):
            assert sorted(j.id for j in await store.get_jobs(ids)) == ["job-0", "job-2"]
            # a scan reads ids and due times only: the job is skipped when it is dispatched
            due = await store.due_jobs({1}, at(60), limit=10)
            assert [j.id for j in due] == ["job-0", "job-1", "job-2"]
            assert [e.id for e in await store.get_executions([r.id for r in runs])] != []
            found = {e.id for e in await store.get_executions([r.id for r in runs])}
            assert found == {runs[0].id, runs[1].id}
            stale = await store.stale_executions({1}, at(60) + timedelta(days=1), limit=10)
            assert {e.id for e in stale} == {runs[0].id, runs[1].id}

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, [r.getMessage() for r in errors]
    assert "job job-1" in errors[0].getMessage() and runs[2].id in errors[1].getMessage()
