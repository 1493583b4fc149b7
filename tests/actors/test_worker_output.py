"""What a task returns or raises reaches the store bounded, whatever it is (real nats-server,
worker, recorder, SQLite and the MongoDB store's fake).

A result holding an integer beyond 64 bits, NUL in a key or a lone surrogate (a file name read
with ``surrogateescape``), and an error message with one: before, the lone surrogate made the
worker's report unencodable (the run was redelivered although it had succeeded, then failed)
and the integer stopped the recorder on MongoDB.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.recorder import Recorder
from actors.worker import Worker
from bus.nats import Bus, BusConfig
from core.clock import SystemClock
from core.ids import execution_id
from core.model import Execution, ExecutionStatus, RunMessage
from core.ports import JobStore
from core.settings import WorkerConfig
from core.tasks import TaskCatalog, TaskContext
from core.values import storable_result
from jobsched.natsserver import NatsServer
from store.sqlite import SqliteStore
from tests.store.backends import fake_mongo_store

RESULT = {"n": 2**64, "key\x00": 1, "file": "report-\udcff.csv", "ok": [1, 2.5, None]}


class NoParams(msgspec.Struct, frozen=True):
    pass


def catalog() -> TaskCatalog:
    tasks = TaskCatalog()

    @tasks.task("odd_result", params=NoParams)
    async def odd_result(params: NoParams, ctx: TaskContext) -> Any:
        return RESULT

    @tasks.task("odd_error", params=NoParams, max_attempts=1)
    async def odd_error(params: NoParams, ctx: TaskContext) -> Any:
        raise OSError("cannot open report-\udcff.csv")

    return tasks


@pytest.fixture(params=["sqlite", "mongo-fake"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    s: JobStore
    if request.param == "sqlite":
        s = SqliteStore(tmp_path / "worker.db")
        await s.open()
    else:
        s = await fake_mongo_store()
    yield s
    await s.close()


async def test_odd_task_output_is_recorded_bounded(
    nats_server: NatsServer, prefix: str, store: JobStore
) -> None:
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    await bus.ensure_streams()
    now = datetime.now(UTC)
    runs = {
        task: RunMessage(
            execution_id=execution_id(f"job-{task}", now),
            job_id=f"job-{task}",
            owner="alice",
            partition=0,
            task_id=task,
            queue="default",
            scheduled_for=now,
            published_at=now,
            max_attempts=1,
        )
        for task in ("odd_result", "odd_error")
    }
    worker = Worker(bus, catalog(), SystemClock(), WorkerConfig(worker_id="w1", cpu_slots=1))
    recorder = Recorder(bus, store)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(worker.run(), name="worker under test")
            tg.create_task(recorder.run(), name="recorder under test")
            await worker.ready.wait()
            assert await bus.publish_runs(list(runs.values())) == [None, None]
            done = await _finished(store, [r.execution_id for r in runs.values()])
            worker.stop()
            recorder.stop()
    finally:
        await bus.close()

    ok, failed = done[runs["odd_result"].execution_id], done[runs["odd_error"].execution_id]
    assert ok.status == ExecutionStatus.SUCCEEDED and ok.attempt == 1
    assert ok.result == storable_result(RESULT)
    assert ok.result == {"n": str(2**64), "key\ufffd": 1, "file": "report-\\udcff.csv",
                         "ok": [1, 2.5, None]}  # fmt: skip
    assert failed.status == ExecutionStatus.FAILED
    assert failed.error == "OSError: cannot open report-\\udcff.csv"


async def _finished(store: JobStore, ids: list[str]) -> dict[str, Execution]:
    async with asyncio.timeout(20):
        while True:
            runs = {r.id: r for r in await store.get_executions(ids)}
            if len(runs) == len(ids) and all(
                r.status in (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED)
                for r in runs.values()
            ):
                return runs
            await asyncio.sleep(0.05)
