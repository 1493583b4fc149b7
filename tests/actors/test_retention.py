"""actors.retention.Pruner on a real SQLite store and a real nats-server, with a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from actors.metrics import Metrics
from actors.ownership import StaticOwnership
from actors.retention import Pruner
from bus.nats import Bus, BusConfig
from core.clock import FakeClock
from core.errors import StoreRejected
from core.history import Retention
from core.ids import execution_id, partition_of
from core.model import ExecutionStatus, Job
from core.ports import PruneResult, PruneTarget
from core.settings import RetentionConfig
from jobsched.natsserver import NatsServer
from store.sqlite import SqliteStore
from tests.store.test_contract import OWNER, at, make_job
from tests.store.test_contract_retention import run

PARTITIONS = 8
KEEP_3 = Retention(keep_last=3, max_age_seconds=None)
SUCCEEDED = ExecutionStatus.SUCCEEDED


class CountingStore(SqliteStore):
    """A SQLite store that records every prune call's results."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.prunes: list[list[PruneResult]] = []

    async def prune_executions(
        self, targets: Sequence[PruneTarget], *, limit: int
    ) -> list[PruneResult]:
        results = await super().prune_executions(targets, limit=limit)
        self.prunes.append(results)
        return results


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    s = CountingStore(tmp_path / "x.db")
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def bus(nats_server: NatsServer, prefix: str) -> AsyncIterator[Bus]:
    b = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await b.connect()
    yield b
    await b.close()


def a_job(job_id: str, **fields: Any) -> Job:
    return make_job(job_id, partition=partition_of(job_id, PARTITIONS), **fields)


async def with_runs(store: SqliteStore, job: Job, minutes: range) -> Job:
    await store.create_job(job)
    for m in minutes:
        await store.insert_execution(run(job, m, SUCCEEDED))
    return job


async def kept(store: SqliteStore, job: Job) -> int:
    page = await store.list_executions(OWNER, job.id, limit=500, cursor=None)
    return len(page.items)


async def until(condition: Callable[[], Awaitable[bool]], timeout_seconds: float = 10.0) -> None:
    async with asyncio.timeout(timeout_seconds):
        while not await condition():
            await asyncio.sleep(0.01)


@asynccontextmanager
async def running(pruner: Pruner) -> AsyncIterator[Pruner]:
    async with asyncio.timeout(30), asyncio.TaskGroup() as tg:
        tg.create_task(pruner.run())
        await pruner.ready.wait()
        try:
            yield pruner
        finally:
            pruner.stop()


def pruner_of(
    store: SqliteStore,
    bus: Bus,
    clock: FakeClock,
    *,
    owned: frozenset[int] = frozenset(range(PARTITIONS)),
    default: Retention = KEEP_3,
    **config: Any,
) -> Pruner:
    return Pruner(
        store,
        bus,
        clock,
        RetentionConfig(
            partitions=PARTITIONS,
            history_limit=default.keep_last or 0,
            history_max_age_seconds=default.max_age_seconds or 0,
            **config,
        ),
        ownership=StaticOwnership(owned),
        metrics=Metrics(),
    )


async def test_a_finished_run_notice_prunes_its_job_to_the_limit(
    store: CountingStore, bus: Bus
) -> None:
    clock = FakeClock(at(100))
    job = await with_runs(store, a_job("job-1"), range(1, 11))
    bystander = await with_runs(store, a_job("job-2"), range(1, 11))
    # a first sweep at start prunes every job: wait for it, then add more runs
    async with running(pruner_of(store, bus, clock, sweep_interval_seconds=3600)) as pruner:
        await until(lambda: _eq(kept(store, job), 3))
        await until(lambda: _eq(kept(store, bystander), 3))
        for m in range(11, 16):
            await store.insert_execution(run(job, m, SUCCEEDED))
            await store.insert_execution(run(bystander, m, SUCCEEDED))

        await bus.publish_finished([job.id])

        await until(lambda: _eq(kept(store, job), 3))
        assert await kept(store, bystander) == 8  # no notice: waits for the next sweep
        assert pruner.pruned == 7 + 7 + 5
        assert pruner.metrics.pruned_runs._value.get() == 19


async def test_notices_of_jobs_of_other_partitions_are_left_to_their_owner(
    store: CountingStore, bus: Bus
) -> None:
    clock = FakeClock(at(100))
    mine, theirs = a_job("job-1"), a_job("job-3")
    assert mine.partition != theirs.partition
    pruner = pruner_of(store, bus, clock, owned=frozenset({mine.partition}))
    async with running(pruner):
        await until(lambda: _true(pruner.idle))
        await with_runs(store, mine, range(1, 6))
        await with_runs(store, theirs, range(1, 6))

        await bus.publish_finished([theirs.id, mine.id])

        await until(lambda: _eq(kept(store, mine), 3))
        assert await kept(store, theirs) == 5


async def test_the_sweep_ages_out_the_history_of_a_job_that_no_longer_runs(
    store: CountingStore, bus: Bus
) -> None:
    """No run finishes any more (a paused job): the hourly sweep still applies the age rule,
    and keeps the job's latest run."""
    clock = FakeClock(at(20))
    latest = execution_id("job-1", at(5))
    job = await with_runs(store, a_job("job-1", last_execution_id=latest), range(1, 6))
    day = Retention(keep_last=None, max_age_seconds=86400)
    async with running(pruner_of(store, bus, clock, default=day, sweep_interval_seconds=3600)):
        await until(lambda: _true(len(store.prunes) >= 1))
        assert await kept(store, job) == 5

        await clock.advance(timedelta(days=1))

        await until(lambda: _eq(kept(store, job), 1))
        [last] = (await store.list_executions(OWNER, job.id, limit=5, cursor=None)).items
        assert last.id == latest


async def test_a_backlog_is_pruned_in_bounded_batches(store: CountingStore, bus: Bus) -> None:
    """An upgrade: a job with 1,200 finished runs and a limit of 3; no call deletes more than
    the batch, and the job is pruned to its limit without waiting for the next sweep."""
    clock = FakeClock(at(5000))
    job = await with_runs(store, a_job("job-1"), range(1, 1201))

    async with running(pruner_of(store, bus, clock, batch=250)):
        await until(lambda: _eq(kept(store, job), 3))

    deleted = [sum(r.deleted for r in call) for call in store.prunes]
    assert max(deleted) == 250
    assert sum(deleted) == 1197


async def test_a_job_with_its_own_limit_keeps_that_many(store: CountingStore, bus: Bus) -> None:
    clock = FakeClock(at(100))
    own = await with_runs(store, a_job("job-1", history_limit=7), range(1, 21))
    default = await with_runs(store, a_job("job-2"), range(1, 21))

    async with running(pruner_of(store, bus, clock)):
        await until(lambda: _eq(kept(store, default), 3))
        await until(lambda: _eq(kept(store, own), 7))


async def test_no_rule_prunes_nothing(store: CountingStore, bus: Bus) -> None:
    clock = FakeClock(at(100))
    job = await with_runs(store, a_job("job-1"), range(1, 21))
    pruner = pruner_of(store, bus, clock, default=Retention(keep_last=None, max_age_seconds=None))

    async with running(pruner):
        await until(lambda: _true(pruner.idle))
        await bus.publish_finished([job.id])
        await bus.nc.flush()
        await until(lambda: _true(pruner.idle))

    assert await kept(store, job) == 20
    assert store.prunes == []


async def _eq(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def _true(value: bool) -> bool:
    return value


class RefusingStore(CountingStore):
    """Refuses for good every prune that includes one job (a poisoned document)."""

    def __init__(self, path: Path, refused: str) -> None:
        super().__init__(path)
        self.refused = refused

    async def prune_executions(
        self, targets: Sequence[PruneTarget], *, limit: int
    ) -> list[PruneResult]:
        if any(t.job_id == self.refused for t in targets):
            raise StoreRejected(f"job {self.refused}: refused")
        return await super().prune_executions(targets, limit=limit)


async def test_a_job_the_store_refuses_to_prune_holds_back_no_other(
    tmp_path: Path, bus: Bus
) -> None:
    store = RefusingStore(tmp_path / "r.db", refused="job-2")
    await store.open()
    try:
        clock = FakeClock(at(100))
        jobs = [await with_runs(store, a_job(f"job-{i}"), range(1, 8)) for i in range(1, 4)]
        async with running(pruner_of(store, bus, clock)) as pruner:
            await until(lambda: _true(pruner.idle))  # the first sweep, partition by partition
            for job in jobs:
                for m in range(8, 12):
                    await store.insert_execution(run(job, m, SUCCEEDED))

            await bus.publish_finished([j.id for j in jobs])  # one batch of marked jobs

            await until(lambda: _eq(kept(store, jobs[0]), 3))
            await until(lambda: _eq(kept(store, jobs[2]), 3))
        assert await kept(store, jobs[1]) == 11
    finally:
        await store.close()
