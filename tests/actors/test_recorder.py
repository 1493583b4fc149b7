"""The recorder on a real nats-server and each store: one poison event never stops it.

Before the poison-message rule, a status event the store could never write (an attempt or a
result beyond 64 bits on MongoDB, an attempt beyond 64 bits on SQLite) raised out of the
recorder, stopped the scheduler process, was redelivered to the next recorder and stopped that
one too: no status was recorded anywhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from actors.metrics import Metrics
from actors.recorder import Recorder
from bus.nats import Bus, BusConfig
from core.ids import execution_id
from core.model import ExecutionStatus, StatusEvent
from core.ports import JobStore
from jobsched.natsserver import NatsServer
from store.sqlite import SqliteStore
from tests.store.backends import fake_mongo_store

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "mongo-fake"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    s: JobStore
    if request.param == "sqlite":
        s = SqliteStore(tmp_path / "recorder.db")
        await s.open()
    else:
        s = await fake_mongo_store()
    yield s
    await s.close()


@pytest.fixture
async def bus(nats_server: NatsServer, prefix: str) -> AsyncIterator[Bus]:
    b = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await b.connect()
    await b.ensure_streams()
    yield b
    await b.close()


def status(job_id: str, status: ExecutionStatus, attempt: int = 1, **fields: object) -> StatusEvent:
    event = StatusEvent(
        execution_id=execution_id(job_id, T0),
        job_id=job_id,
        owner="alice",
        partition=1,
        task_id="noop",
        status=status,
        attempt=attempt,
        at=T0 + timedelta(seconds=attempt if attempt < 1000 else 1),
        scheduled_for=T0,
    )
    return msgspec.structs.replace(event, **fields)


async def until(
    condition: Callable[[], Awaitable[bool]], what: str, timeout_seconds: float = 15
) -> None:
    try:
        async with asyncio.timeout(timeout_seconds):
            while not await condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_a_poison_event_is_dead_lettered_and_the_events_behind_it_are_recorded(
    bus: Bus, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    before = [status("job-a", ExecutionStatus.RUNNING)]
    poison = status("job-b", ExecutionStatus.RUNNING, attempt=2**63)  # no store's integer
    behind = [
        status("job-c", ExecutionStatus.SUCCEEDED, result={"n": 2**64}, finished_at=T0),
        status("job-a", ExecutionStatus.SUCCEEDED, attempt=2, finished_at=T0),
    ]
    for ev in [*before, poison]:
        await bus.publish_status(ev)
    await bus.js.publish(bus.config.status_subject("alice", "job-x"), b"\x00 not a status event")
    for ev in behind:
        await bus.publish_status(ev)
    metrics = Metrics()
    recorder = Recorder(bus, store, batch=16, metrics=metrics)

    with caplog.at_level(logging.ERROR, logger="actors.recorder"):
        async with asyncio.TaskGroup() as tg:
            running = tg.create_task(recorder.run(), name="recorder under test")

            async def recorded() -> bool:
                runs = await store.get_executions([e.execution_id for e in behind])
                return {r.status for r in runs} == {ExecutionStatus.SUCCEEDED} and len(runs) == 2

            await until(recorded, "the events behind the poison to be recorded")
            await until(lambda: _letters(store, 2), "two dead letters")
            assert not running.done(), "the recorder stopped"
            recorder.stop()

    c = await store.get_execution(execution_id("job-c", T0))
    assert c is not None and c.result == {"n": str(2**64)}  # kept, as text: no store's integer
    assert await store.get_execution(poison.execution_id) is None
    letters = await store.dead_letters(limit=10)
    assert sorted(x.reason for x in letters) == ["rejected", "undecodable"]
    rejected = next(x for x in letters if x.reason == "rejected")
    assert rejected.execution_id == poison.execution_id and rejected.job_id == "job-b"
    assert b'"attempt":9223372036854775808' in rejected.data and rejected.size == len(rejected.data)
    undecodable = next(x for x in letters if x.reason == "undecodable")
    assert undecodable.data == b"\x00 not a status event" and undecodable.job_id is None
    assert undecodable.subject == bus.config.status_subject("alice", "job-x")
    assert _count(metrics, "rejected") == 1 and _count(metrics, "undecodable") == 1
    assert len([r for r in caplog.records if "dead letter" in r.getMessage()]) == 2
    assert await bus.consumer_backlog(bus.config.status_stream, "recorder") == 0


async def test_a_redelivered_poison_event_is_stored_once(bus: Bus, store: JobStore) -> None:
    """A recorder that dies after storing a dead letter and before acking it: the redelivery
    carries the same stored id, so the next recorder's letter is the same one, stored once."""
    await bus.publish_status(status("job-b", ExecutionStatus.RUNNING, attempt=2**63))
    recorder = Recorder(bus, store)
    ids = []
    for _ in range(2):
        consumer = await bus.recorder_consumer()
        try:
            [delivery] = await consumer.fetch(16, timeout_seconds=5.0)
        finally:
            await consumer.close()
        ids.append(delivery.stored_id)
        await store.dead_letter([recorder._letter(delivery, "rejected", "refused")])
        await delivery.nak()  # "died" before the ack: redelivered at once
    assert ids[0] == ids[1] and ids[0].startswith(f"{bus.config.status_stream}:1:")
    assert [x.id for x in await store.dead_letters(limit=10)] == ids[:1]


async def _letters(store: JobStore, n: int) -> bool:
    return len(await store.dead_letters(limit=10)) >= n


def _count(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("jobsched_dead_letters_total", {"reason": reason})
    return value or 0.0
