"""One contract for the bus ports (:mod:`core.ports`), run against the NATS adapter and its
in-memory fake (``tests/fakes.py``), so the fake the actor unit tests run on cannot drift from
the real thing: de-duplication by execution id, "is the run's message still held", the status
stream's sequence and de-duplication, the recorders' consumer, notices.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from bus.nats import Bus, BusConfig
from core.ids import execution_id
from core.model import ExecutionStatus, JobNotice, RunMessage, RunsFinished, StatusEvent
from core.ports import Consumer, Delivery, RecorderBus, SchedulerBus, WorkerBus
from jobsched.natsserver import NatsServer
from tests.fakes import FakeBus

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class AnyBus(SchedulerBus, WorkerBus, RecorderBus):
    """Every role at once (both implementations have them all)."""


@pytest.fixture(params=["nats", "fake"])
async def bus(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[AnyBus]:
    if request.param == "fake":
        yield FakeBus()  # type: ignore[misc]
        return
    server: NatsServer = request.getfixturevalue("nats_server")
    real = Bus(BusConfig(servers=[server.url], prefix=prefix))
    await real.connect()
    await real.ensure_streams()
    try:
        yield real  # type: ignore[misc]
    finally:
        await real.close()


def run(job_id: str = "j1") -> RunMessage:
    return RunMessage(
        execution_id=execution_id(job_id, T0),
        job_id=job_id,
        owner="alice",
        partition=0,
        task_id="noop",
        queue="default",
        scheduled_for=T0,
        published_at=T0,
    )


def report(job_id: str, status: ExecutionStatus, attempt: int = 1) -> StatusEvent:
    return StatusEvent(
        execution_id=execution_id(job_id, T0),
        job_id=job_id,
        owner="alice",
        partition=0,
        task_id="noop",
        status=status,
        attempt=attempt,
        at=T0,
        scheduled_for=T0,
    )


async def fetch_all(consumer: Consumer, *, quiet_seconds: float = 0.3) -> list[Delivery]:
    """Everything the consumer hands out until it stays quiet for ``quiet_seconds`` seconds."""
    out: list[Delivery] = []
    async with asyncio.timeout(10):
        while batch := await consumer.fetch(100, timeout_seconds=quiet_seconds):
            out += batch
    return out


async def test_a_run_published_twice_is_stored_and_delivered_once(bus: AnyBus) -> None:
    assert await bus.publish_runs([run(), run()]) == [None, None]
    assert await bus.publish_runs([run()]) == [None]

    consumer = await bus.work_consumer("default")
    try:
        deliveries = await fetch_all(consumer)
        assert [d.msg_id for d in deliveries] == [run().msg_id]
        await deliveries[0].ack()
    finally:
        await consumer.close()


async def test_a_run_is_held_until_a_worker_acks_or_terminates_it(bus: AnyBus) -> None:
    a, b, c = run("a"), run("b"), run("c")
    await bus.publish_runs([a, b, c])
    ids = [(r.queue, r.execution_id) for r in (a, b, c)]
    assert await bus.runs_in_stream(ids) == {a.execution_id, b.execution_id, c.execution_id}

    consumer = await bus.work_consumer("default")
    try:
        by_id = {d.msg_id: d for d in await fetch_all(consumer)}
        await by_id[a.msg_id].ack()
        await by_id[b.msg_id].term()
        await by_id[c.msg_id].nak(delay_seconds=30)

        async with asyncio.timeout(5):
            while await bus.runs_in_stream(ids) != {c.execution_id}:
                await asyncio.sleep(0.01)
    finally:
        await consumer.close()


async def test_a_run_never_published_is_not_held(bus: AnyBus) -> None:
    assert await bus.runs_in_stream([("default", execution_id("nope", T0))]) == set()


async def test_the_status_sequence_counts_stored_events_once(bus: AnyBus) -> None:
    start = await bus.status_last_seq()

    await bus.publish_status(report("a", ExecutionStatus.RUNNING))
    await bus.publish_status(report("a", ExecutionStatus.RUNNING))  # a retried report
    await bus.publish_status(report("a", ExecutionStatus.SUCCEEDED))
    await bus.publish_events([report("b", ExecutionStatus.QUEUED, 0)])

    assert await bus.status_last_seq() == start + 3


async def test_reports_published_together_are_each_stored_once(bus: AnyBus) -> None:
    start = await bus.status_last_seq()
    await bus.publish_status(report("a", ExecutionStatus.RUNNING))

    results = await bus.publish_statuses(
        [
            report("a", ExecutionStatus.RUNNING),  # a retried report, in the batch
            report("a", ExecutionStatus.SUCCEEDED),
            report("b", ExecutionStatus.SUCCEEDED),
        ]
    )
    assert results == [None, None, None]
    assert await bus.publish_statuses([report("c", ExecutionStatus.FAILED)]) == [None]
    assert await bus.publish_statuses([report("c", ExecutionStatus.FAILED)] * 2) == [None, None]

    assert await bus.status_last_seq() == start + 4
    consumer = await bus.recorder_consumer()
    try:
        ids = [d.msg_id for d in await fetch_all(consumer)]
    finally:
        await consumer.close()
    assert ids == [
        f"{execution_id('a', T0)}|RUNNING|1",
        f"{execution_id('a', T0)}|SUCCEEDED|1",
        f"{execution_id('b', T0)}|SUCCEEDED|1",
        f"{execution_id('c', T0)}|FAILED|1",
    ]


async def test_the_recorders_consumer_receives_every_stored_event(bus: AnyBus) -> None:
    await bus.publish_status(report("a", ExecutionStatus.RUNNING))
    await bus.publish_status(report("a", ExecutionStatus.RUNNING))
    await bus.publish_events([report("b", ExecutionStatus.QUEUED, 0)])

    consumer = await bus.recorder_consumer()
    try:
        deliveries = await fetch_all(consumer)
        assert [d.msg_id for d in deliveries] == [
            f"{execution_id('a', T0)}|RUNNING|1",
            f"{execution_id('b', T0)}|QUEUED|0",
        ]
        for d in deliveries:
            await d.ack()
    finally:
        await consumer.close()


async def test_a_fetch_from_an_empty_queue_returns_nothing_after_its_timeout(
    bus: AnyBus,
) -> None:
    consumer = await bus.work_consumer("empty")
    try:
        assert list(await consumer.fetch(10, timeout_seconds=0.2)) == []
    finally:
        await consumer.close()


async def test_notices_reach_every_subscriber_until_it_closes(bus: AnyBus) -> None:
    @dataclass
    class Heard:
        notices: asyncio.Queue[JobNotice]
        finished: asyncio.Queue[RunsFinished]

    heard = Heard(asyncio.Queue(), asyncio.Queue())

    async def on_notice(n: JobNotice) -> None:
        heard.notices.put_nowait(n)

    async def on_finished(f: RunsFinished) -> None:
        heard.finished.put_nowait(f)

    notices = await bus.subscribe_notices(on_notice)
    finished = await bus.subscribe_finished(on_finished)
    try:
        if isinstance(bus, Bus):  # the subscriptions are on the server once a flush returns
            await bus.nc.flush()
        await bus.notify(JobNotice(job_id="j1", partition=3, next_run_at=T0))
        await bus.publish_finished(["j1", "j2"])

        async with asyncio.timeout(5):
            assert await heard.notices.get() == JobNotice(job_id="j1", partition=3, next_run_at=T0)
            assert await heard.finished.get() == RunsFinished(job_ids=["j1", "j2"])
    finally:
        await notices.close()
        await finished.close()
