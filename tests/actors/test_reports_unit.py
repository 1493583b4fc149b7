"""The worker's report batcher (:mod:`actors.reports`) on the fake bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest

from actors.reports import ReportBatcher
from core.errors import BusUnavailable
from core.ids import execution_id
from core.model import ExecutionStatus, StatusEvent
from tests.actors.harness import T0
from tests.fakes import FakeBus


class GatedBus(FakeBus):
    """A fake bus whose batches wait for ``gate`` once it is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = asyncio.Event()

    async def publish_statuses(self, events: Sequence[StatusEvent]) -> list[BusUnavailable | None]:
        self.in_flight.set()
        await self.gate.wait()
        return await super().publish_statuses(events)


def report(job_id: str, status: ExecutionStatus = ExecutionStatus.SUCCEEDED) -> StatusEvent:
    return StatusEvent(
        execution_id=execution_id(job_id, T0),
        job_id=job_id,
        owner="alice",
        partition=0,
        task_id="noop",
        status=status,
        attempt=1,
        at=T0,
        scheduled_for=T0,
    )


@asynccontextmanager
async def batcher(bus: FakeBus) -> AsyncIterator[ReportBatcher]:
    b = ReportBatcher(bus, "worker[w1]")
    task = asyncio.create_task(b.run(), name="batcher under test")
    await asyncio.sleep(0)  # let it start
    try:
        yield b
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_lone_report_goes_out_alone_and_is_stored() -> None:
    bus = GatedBus()
    async with batcher(bus) as b, asyncio.timeout(5):
        await b.publish(report("a"))

    assert bus.status_batches == [1]
    assert [e.job_id for e in bus.statuses] == ["a"]


async def test_reports_made_while_a_batch_is_in_flight_go_out_together() -> None:
    bus = GatedBus()
    bus.gate.clear()
    async with batcher(bus) as b, asyncio.timeout(5):
        first = asyncio.ensure_future(b.publish(report("a")))
        await bus.in_flight.wait()
        rest = [asyncio.ensure_future(b.publish(report(j))) for j in ("b", "c", "d")]
        await asyncio.sleep(0)
        assert not any(f.done() for f in [first, *rest])  # none acknowledged yet
        bus.gate.set()
        await asyncio.gather(first, *rest)

    assert bus.status_batches == [1, 3]
    assert [e.job_id for e in bus.statuses] == ["a", "b", "c", "d"]


async def test_a_refused_report_fails_alone() -> None:
    bus = GatedBus()
    async with batcher(bus) as b, asyncio.timeout(5):
        bus.fail("publish_status", 1)  # the first report of the batch
        futures = [asyncio.ensure_future(b.publish(report(j))) for j in ("a", "b", "c")]
        results = await asyncio.gather(*futures, return_exceptions=True)

    assert bus.status_batches == [3]
    assert isinstance(results[0], BusUnavailable) and results[1:] == [None, None]
    assert [e.job_id for e in bus.statuses] == ["b", "c"]


async def test_reports_held_when_it_stops_fail_and_later_ones_go_straight_to_the_bus() -> None:
    bus = GatedBus()
    bus.gate.clear()
    async with batcher(bus) as b:
        held = asyncio.ensure_future(b.publish(report("a")))
        await bus.in_flight.wait()
    with pytest.raises(BusUnavailable):
        await held

    bus.gate.set()
    async with asyncio.timeout(5):
        await b.publish(report("b"))
    assert [e.job_id for e in bus.statuses] == ["b"]
    assert bus.status_batches == []  # "b" went through publish_status
