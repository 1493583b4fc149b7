"""The recorder's decisions on fakes: the in-memory status consumer, a fake clock pacing the
store retries, a real SQLite store (wrapped to fail on cue).

Each test delivers status events and asserts on what the store holds and how each delivery
was settled: written then acked, kept (in-progress) through a store outage with backoff, left
unacked on a stop, poison set aside as a dead letter, finished-run notices.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec

from actors.recorder import Recorder
from core.clock import FakeClock
from core.errors import StoreRejected, StoreUnavailable
from core.ids import execution_id
from core.model import ExecutionStatus, StatusEvent
from store.sqlite import SqliteStore
from tests.actors.harness import T0, at
from tests.fakes import FakeBus, FakeDelivery, waits

S = ExecutionStatus


class CuedStore(SqliteStore):
    """SQLite whose next ``outages`` writes fail as if it were down, and which refuses for good
    every batch holding an event of an execution in ``refused``."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.outages = 0
        self.refused: set[str] = set()
        self.writes = 0

    async def apply_events(self, events: Sequence[StatusEvent]) -> int:
        self.writes += 1
        if self.outages > 0:
            self.outages -= 1
            raise StoreUnavailable("store down (test)")
        if any(e.execution_id in self.refused for e in events):
            raise StoreRejected("the store refuses this event (test)")
        return await super().apply_events(events)


def event(job_id: str, status: ExecutionStatus, attempt: int = 1) -> StatusEvent:
    return StatusEvent(
        execution_id=execution_id(job_id, T0),
        job_id=job_id,
        owner="alice",
        partition=1,
        task_id="noop",
        status=status,
        attempt=attempt,
        at=at(attempt),
        scheduled_for=T0,
        finished_at=at(attempt) if status in (S.SUCCEEDED, S.FAILED) else None,
    )


@dataclass
class RecorderRig:
    bus: FakeBus
    store: CuedStore
    clock: FakeClock
    recorder: Recorder
    task: asyncio.Task[None]

    def deliver(self, *items: StatusEvent | bytes) -> list[FakeDelivery]:
        out = []
        for item in items:
            data = item if isinstance(item, bytes) else msgspec.json.encode(item)
            out.append(FakeDelivery(data, subject="status.alice"))
        for d in out:  # one batch: put them all before the recorder's fetch returns
            self.bus.status_consumer.ready.append(d)
        self.bus.status_consumer.wake()
        return out

    async def settled(self, *deliveries: FakeDelivery) -> list[str | None]:
        async with asyncio.timeout(5):
            for d in deliveries:
                await d.done.wait()
        return [d.settled for d in deliveries]

    async def status_of(self, job_id: str) -> ExecutionStatus | None:
        found = await self.store.get_execution(execution_id(job_id, T0))
        return None if found is None else found.status


@asynccontextmanager
async def recorder_rig(tmp_path: Path, **options: Any) -> AsyncIterator[RecorderRig]:
    store = CuedStore(tmp_path / "jobs.db")
    await store.open()
    bus, clock = FakeBus(), FakeClock(T0)
    recorder = Recorder(bus, store, clock=clock, timer=clock, **options)
    task = asyncio.create_task(recorder.run(), name="recorder under test")
    rig = RecorderRig(bus, store, clock, recorder, task)
    try:
        async with asyncio.timeout(5):
            await recorder.ready.wait()
        yield rig
    finally:
        recorder.stop()
        bus.wake()
        try:
            async with asyncio.timeout(5):
                await task
        finally:
            await store.close()


async def test_events_are_written_then_acked(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        ds = rig.deliver(event("a", S.RUNNING), event("b", S.SUCCEEDED))

        assert await rig.settled(*ds) == ["ack", "ack"]
        assert await rig.status_of("a") == S.RUNNING
        assert await rig.status_of("b") == S.SUCCEEDED
        assert rig.recorder.recorded == 2


async def test_events_arriving_within_the_linger_share_one_store_write(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path, linger_seconds=0.005) as rig:
        [first] = rig.deliver(event("a", S.RUNNING))
        await rig.clock.until_asleep(1)  # the fetch returned one event: lingering for more
        assert first.settled is None and rig.store.writes == 0

        [second] = rig.deliver(event("b", S.RUNNING))
        await rig.clock.advance(0.005)

        assert await rig.settled(first, second) == ["ack", "ack"]
        assert rig.store.writes == 1
        assert await rig.status_of("b") == S.RUNNING


async def test_finished_runs_are_announced_once_per_batch(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        ds = rig.deliver(
            event("b", S.SUCCEEDED),
            event("a", S.FAILED),
            event("c", S.RUNNING),
            event("a", S.FAILED, 2),
        )

        await rig.settled(*ds)
        assert rig.bus.finished == [["a", "b"]]


async def test_a_lost_finished_notice_does_not_hold_the_events_back(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        rig.bus.fail("publish_finished")
        [d] = rig.deliver(event("a", S.SUCCEEDED))

        assert await rig.settled(d) == ["ack"]
        assert rig.bus.finished == []


async def test_events_the_scheduler_wrote_are_acked_without_a_write(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        ds = rig.deliver(event("a", S.QUEUED, 0), event("b", S.SKIPPED, 0))

        assert await rig.settled(*ds) == ["ack", "ack"]
        assert rig.store.writes == 0
        assert rig.recorder.recorded == 0


async def test_a_store_outage_keeps_the_batch_with_growing_pauses(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        rig.store.outages = 3
        [d] = rig.deliver(event("a", S.RUNNING))

        assert await waits(rig.clock, 2) == [0.2, 0.4]
        assert d.settled is None
        assert await waits(rig.clock, 1) == [0.8]
        assert await rig.settled(d) == ["ack"]
        assert d.in_progress_count == 3  # kept from redelivery at every failure
        assert await rig.status_of("a") == S.RUNNING


async def test_the_pauses_stay_within_a_third_of_the_ack_wait(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path, ack_wait_seconds=1.5) as rig:
        rig.store.outages = 4
        [d] = rig.deliver(event("a", S.RUNNING))

        assert await waits(rig.clock, 4) == [0.2, 0.4, 0.5, 0.5]
        assert await rig.settled(d) == ["ack"]


async def test_a_stop_during_a_store_outage_leaves_the_batch_unacked(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        rig.store.outages = 100
        [d] = rig.deliver(event("a", S.RUNNING))
        await rig.clock.until_asleep(1)

        rig.recorder.stop()
        async with asyncio.timeout(5):
            await rig.task

        assert d.settled is None  # redelivered to the next recorder
        assert await rig.status_of("a") is None


async def test_an_undecodable_message_is_set_aside_and_the_rest_recorded(
    tmp_path: Path,
) -> None:
    async with recorder_rig(tmp_path) as rig:
        ds = rig.deliver(event("a", S.RUNNING), b"\xffnot json", event("b", S.RUNNING))

        assert await rig.settled(*ds) == ["ack", "ack", "ack"]
        [letter] = await rig.store.dead_letters(limit=10)
        assert (letter.reason, letter.data, letter.id) == (
            "undecodable",
            b"\xffnot json",
            ds[1].stored_id,
        )
        assert await rig.status_of("a") == await rig.status_of("b") == S.RUNNING


async def test_an_event_the_store_refuses_is_set_aside_alone(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path, batch=16) as rig:
        events = [event(f"j{i}", S.RUNNING) for i in range(8)]
        rig.store.refused = {events[5].execution_id}
        ds = rig.deliver(*events)

        assert await rig.settled(*ds) == ["ack"] * 8
        [letter] = await rig.store.dead_letters(limit=10)
        assert (letter.reason, letter.execution_id) == ("rejected", events[5].execution_id)
        for i in range(8):
            assert await rig.status_of(f"j{i}") == (None if i == 5 else S.RUNNING)
        assert rig.store.writes == 1 + 2 * 3  # halving: 1 + 2·log2(8) store calls


async def test_a_fetch_outage_is_retried_every_second(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        rig.bus.status_consumer.failures = 1
        rig.bus.status_consumer.wake()
        await rig.clock.until_asleep(1)
        assert rig.clock.deadlines() == [rig.clock.now() + timedelta(seconds=1)]
        [d] = rig.deliver(event("a", S.RUNNING))

        await rig.clock.advance(1)
        assert await rig.settled(d) == ["ack"]


async def test_a_deleted_consumer_is_re_created(tmp_path: Path) -> None:
    async with recorder_rig(tmp_path) as rig:
        rig.bus.status_consumer.missing = True
        rig.bus.status_consumer.wake()
        [d] = rig.deliver(event("a", S.RUNNING))

        assert await rig.settled(d) == ["ack"]
