"""A job whose run the store refuses for good holds back that job only (real nats-server and
SQLite; the refusal is injected by a store wrapper, as no value within the range provokes one).

Before, ``StoreRejected`` (or the driver error it replaces) raised out of the scheduler's loop
and stopped the process, and with it every partition it owned, on every restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from actors.scheduler import Scheduler
from bus.cancel import CancelMarkers
from bus.nats import Bus, BusConfig
from core.clock import SystemClock
from core.errors import StoreRejected
from core.ids import execution_id, partition_of
from core.model import ExecutionStatus, ImmediateSchedule, Job
from core.ports import AnyDispatch, DispatchOutcome
from core.settings import SchedulerConfig
from jobsched.natsserver import NatsServer
from store.sqlite import SqliteStore


class RefusingStore(SqliteStore):
    """SQLite, except that it refuses every dispatch that includes job ``poison``."""

    async def dispatch(self, runs: Sequence[AnyDispatch]) -> list[DispatchOutcome]:
        if any(d.execution.job_id == "poison" for d in runs):
            raise StoreRejected("the store refuses this write (test): poison")
        return await super().dispatch(runs)


def job(job_id: str, now: datetime) -> Job:
    return Job(
        id=job_id,
        owner="alice",
        task_id="noop",
        schedule=ImmediateSchedule(),
        partition=partition_of(job_id, 4),
        created_at=now,
        updated_at=now,
        next_run_at=now,
    )


async def test_a_refused_dispatch_holds_back_its_job_only(
    nats_server: NatsServer, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RefusingStore(tmp_path / "s.db")
    await store.open()
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    await bus.ensure_streams()
    now = SystemClock().now()
    jobs = [job(i, now) for i in ("a", "b", "poison", "c", "d")]
    for j in jobs:
        await store.create_job(j)
    config = SchedulerConfig(partitions=4, scan_interval_seconds=0.2, prepare_ahead_seconds=0)
    scheduler = Scheduler(store, bus, SystemClock(), config, markers=CancelMarkers(bus))
    good = [execution_id(j.id, now) for j in jobs if j.id != "poison"]
    try:
        with caplog.at_level(logging.ERROR, logger="actors.scheduler"):
            async with asyncio.TaskGroup() as tg:
                running = tg.create_task(scheduler.run(), name="scheduler under test")
                async with asyncio.timeout(15):
                    while len(await bus.runs_in_stream(("default", e) for e in good)) < 4:
                        await asyncio.sleep(0.05)
                    await _scans(scheduler, 3)  # the poison job is retried at every scan
                assert not running.done(), "the scheduler stopped"
                scheduler.stop()
        runs = {e.id: e.status for e in await store.get_executions(good)}
        assert runs == dict.fromkeys(good, ExecutionStatus.QUEUED)
        assert await store.get_execution(execution_id("poison", now)) is None
    finally:
        await bus.close()
        await store.close()
    refused = [r for r in caplog.records if "poison" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]  # logged once


async def _scans(scheduler: Any, n: int) -> None:
    """Wait for ``n`` more safety scans (each re-loads the held-back job and tries it again)."""
    for _ in range(n):
        mark = scheduler.state.next_scan
        while scheduler.state.next_scan == mark:
            await asyncio.sleep(0.05)
