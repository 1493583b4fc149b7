"""Actors on fakes: the scheduler on a fake clock, the in-memory bus (``tests/fakes.py``) and a
real SQLite store in a temporary directory; no NATS, no real waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from actors.scheduler import Scheduler
from core.clock import FakeClock
from core.ids import partition_of
from core.model import Execution, IntervalSchedule, Job, Schedule
from core.settings import SchedulerConfig
from store.sqlite import SqliteStore
from tests.fakes import FakeBus, FakeCancelSignals

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PARTITIONS = 4


def at(seconds: float) -> datetime:
    """``T0`` plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def job(
    job_id: str = "j1",
    *,
    next_run_at: datetime | None = None,
    schedule: Schedule | None = None,
    **fields: Any,
) -> Job:
    """A job of user alice, due at ``next_run_at`` (default ``at(10)``), every 60 s."""
    return Job(
        id=job_id,
        owner="alice",
        task_id="noop",
        schedule=schedule or IntervalSchedule(every_seconds=60, start_at=T0),
        partition=partition_of(job_id, PARTITIONS),
        created_at=T0 - timedelta(hours=1),
        updated_at=T0 - timedelta(hours=1),
        next_run_at=next_run_at or at(10),
        **fields,
    )


class FakeOwnership:
    """Ownership the test hands out and takes away (a lease gained, lost or fenced)."""

    def __init__(self, partitions: Collection[int] = range(PARTITIONS)) -> None:
        self._owned = frozenset(partitions)
        self._stop = asyncio.Event()
        self.stopped = False
        self._gained: Callable[[frozenset[int]], None] | None = None
        self._lost: Callable[[frozenset[int]], None] | None = None

    @property
    def owned(self) -> frozenset[int]:
        return self._owned

    async def run(
        self, on_gained: Callable[[frozenset[int]], None], on_lost: Callable[[frozenset[int]], None]
    ) -> None:
        self._gained, self._lost = on_gained, on_lost
        on_gained(self._owned)
        await self._stop.wait()

    def stop(self) -> None:
        self.stopped = True
        self._stop.set()

    def lose(self, partitions: Collection[int]) -> None:
        gone = frozenset(partitions) & self._owned
        self._owned -= gone
        assert self._lost is not None
        self._lost(gone)

    def gain(self, partitions: Collection[int]) -> None:
        new = frozenset(partitions) - self._owned
        self._owned |= new
        assert self._gained is not None
        self._gained(new)


@dataclass
class SchedulerRig:
    store: SqliteStore
    bus: FakeBus
    clock: FakeClock
    markers: FakeCancelSignals
    ownership: FakeOwnership
    scheduler: Scheduler
    task: asyncio.Task[None]

    async def idle(self) -> None:
        """Wait until the main loop and the publisher both sleep on the fake clock: the
        scheduler did everything it can do at the clock's current time."""
        await self.clock.until_asleep(2)

    async def to(self, seconds: float) -> None:
        """Move the clock to ``at(seconds)`` and wait until the scheduler is idle again."""
        await self.clock.set(at(seconds))
        await self.idle()

    async def execution(self, execution_id: str) -> Execution:
        found = await self.store.get_execution(execution_id)
        assert found is not None, f"no execution {execution_id}"
        return found

    async def job(self, job_id: str = "j1") -> Job:
        return await self.store.get_job("alice", job_id)


@asynccontextmanager
async def scheduler_rig(
    tmp_path: Path,
    jobs: Collection[Job] = (),
    *,
    store: SqliteStore | None = None,
    start: datetime = T0,
    **config: Any,
) -> AsyncIterator[SchedulerRig]:
    """A running scheduler over ``jobs``, idle at ``start``; stopped (and awaited) on exit.

    ``config`` overrides :class:`SchedulerConfig` (default here: no prepare-ahead, no drain,
    so a stop returns at once).
    """
    store = store or SqliteStore(tmp_path / "jobs.db")
    await store.open()
    for j in jobs:
        await store.create_job(j)
    clock = FakeClock(start)
    bus = FakeBus()
    markers = FakeCancelSignals()
    ownership = FakeOwnership()
    settings: dict[str, Any] = {"prepare_ahead_seconds": 0.0, "drain_seconds": 1.0} | config
    scheduler = Scheduler(
        store,
        bus,
        clock,
        SchedulerConfig(partitions=PARTITIONS, **settings),
        markers=markers,
        ownership=ownership,
        scheduler_id="s1",
        timer=clock,
    )
    task = asyncio.create_task(scheduler.run(), name="scheduler under test")
    rig = SchedulerRig(store, bus, clock, markers, ownership, scheduler, task)
    try:
        async with asyncio.timeout(5):
            await scheduler.ready.wait()
        await rig.idle()
        yield rig
    finally:
        scheduler.stop()
        try:
            async with asyncio.timeout(5):
                await task
        finally:
            task.cancel()
            await store.close()
