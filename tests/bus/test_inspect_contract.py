"""One contract for :class:`core.ports.RunInspector` (``GET /jobs/{id}/explain``'s looks at the
bus), run against :class:`bus.inspect.BusInspector` on a real nats-server and against
:class:`tests.fakes.FakeInspector`: a partition's lease holder, a queue's consumer and its runs
waiting and in progress."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from bus.inspect import BusInspector
from bus.leases import LeaseBucket
from bus.nats import Bus, BusConfig
from core.explain import QueueState
from core.ids import execution_id
from core.model import RunMessage
from core.ports import Leases, RunInspector
from jobsched.natsserver import NatsServer
from tests.fakes import FakeBus, FakeInspector, FakeLeases

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@dataclass
class Setup:
    inspector: RunInspector
    leases: Leases
    bus: FakeBus | Bus


@pytest.fixture(params=["nats", "fake"])
async def setup(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[Setup]:
    if request.param == "fake":
        fake_bus, fake_leases = FakeBus(), FakeLeases()
        yield Setup(FakeInspector(fake_bus, fake_leases), fake_leases, fake_bus)
        return
    server: NatsServer = request.getfixturevalue("nats_server")
    bus = Bus(BusConfig(servers=[server.url], prefix=prefix))
    await bus.connect()
    try:
        yield Setup(BusInspector(bus), LeaseBucket(bus, ttl_seconds=30), bus)
    finally:
        await bus.close()


async def counts(inspector: RunInspector, queue: str, *, pending: int, in_progress: int) -> None:
    """Wait (bounded) until ``queue`` shows these counts."""
    state = None
    try:
        async with asyncio.timeout(5):
            while True:
                state = await inspector.queue_state(queue)
                if (state.pending, state.in_progress) == (pending, in_progress):
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{queue}: {state}") from None


def run(n: int) -> RunMessage:
    job_id = f"j{n}"
    return RunMessage(
        execution_id=execution_id(job_id, T0), job_id=job_id, owner="alice", partition=0,
        task_id="noop", queue="default", scheduled_for=T0, published_at=T0,
    )  # fmt: skip


async def test_the_lease_holder_of_a_partition(setup: Setup) -> None:
    inspector, leases = setup.inspector, setup.leases
    if isinstance(setup.bus, Bus):
        assert (await inspector.partition_lease(2)).owner is None, "no bucket at all"
        await setup.bus.ensure_streams()
    await leases.open()
    assert (await inspector.partition_lease(2)).owner is None
    revision = await leases.acquire(2, "sched-a")
    assert revision is not None
    lease = await inspector.partition_lease(2)
    assert (lease.partition, lease.owner) == (2, "sched-a")
    assert (await inspector.partition_lease(3)).owner is None, "per partition"
    await leases.release(2, revision)
    assert (await inspector.partition_lease(2)).owner is None


async def test_a_queue_consumer_its_waiting_and_running_runs(setup: Setup) -> None:
    inspector, bus = setup.inspector, setup.bus
    if isinstance(bus, Bus):
        await bus.ensure_streams()
    assert await inspector.queue_state("default") == QueueState("default", consumer_exists=False)
    consumer = await bus.work_consumer("default")
    empty = await inspector.queue_state("default")
    assert (empty.consumer_exists, empty.pending, empty.in_progress) == (True, 0, 0)
    assert await bus.publish_runs([run(1), run(2), run(3)]) == [None, None, None]
    waiting = await inspector.queue_state("default")
    assert (waiting.pending, waiting.in_progress) == (3, 0)
    [taken] = await consumer.fetch(1, timeout_seconds=5)
    taking = await inspector.queue_state("default")
    assert (taking.pending, taking.in_progress) == (2, 1)
    await taken.ack()
    await counts(inspector, "default", pending=2, in_progress=0)  # the server applies acks async
    assert not (await inspector.queue_state("other")).consumer_exists, "per queue"
    await consumer.close()
