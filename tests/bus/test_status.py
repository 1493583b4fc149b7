"""``bus.status``: the live-status feed and replay reads against a real nats-server."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from bus.nats import Bus, BusConfig
from bus.status import StatusFeed, StatusReader
from core.errors import BusUnavailable
from core.ids import owner_key
from core.live import StoredEvent
from core.model import JobEvent, JobStatus
from jobsched.natsserver import NatsServer


@pytest.fixture
async def bus(nats_server: NatsServer, prefix: str) -> AsyncIterator[Bus]:
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    await bus.ensure_streams()
    try:
        yield bus
    finally:
        await bus.close()


async def publish(bus: Bus, owners_and_jobs: list[tuple[str, str]]) -> None:
    at = datetime.now(UTC)
    events = [
        JobEvent(
            job_id=job,
            owner=owner,
            partition=0,
            event="changed",
            status=JobStatus.SCHEDULED,
            at=at + timedelta(milliseconds=i),
        )
        for i, (owner, job) in enumerate(owners_and_jobs)
    ]
    assert await bus.publish_events(events) == len(events)


async def read_all(reader: StatusReader, subject_filter: str, batch: int) -> list[StoredEvent]:
    got: list[StoredEvent] = []
    start = 1
    while True:
        result = await reader.read(subject_filter, start, batch=batch, max_bytes=1 << 20)
        assert len(result.events) <= batch
        got += result.events
        if not result.more:
            return got
        start = result.events[-1].seq + 1


async def test_replay_reads_come_in_bounded_batches_of_one_users_events(bus: Bus) -> None:
    layout = [("alice" if i % 3 else "bob", f"{i % 2:032x}") for i in range(100)]
    await publish(bus, layout)
    reader = StatusReader(bus)
    alice = await read_all(reader, bus.config.status_filter("alice"), batch=7)
    assert [e.seq for e in alice] == [i + 1 for i, (o, _) in enumerate(layout) if o == "alice"]
    assert {e.owner_key for e in alice} == {owner_key("alice")}
    one_job = await read_all(reader, bus.config.status_filter("alice", f"{1:032x}"), batch=50)
    assert [e.seq for e in one_job] == [
        i + 1 for i, (o, j) in enumerate(layout) if o == "alice" and j == f"{1:032x}"
    ]
    assert all(e.job_id == f"{1:032x}" for e in one_job)
    first = await reader.read(bus.config.status_filter("alice"), 1, batch=1000, max_bytes=2000)
    assert 1 <= len(first.events) < len(alice) and first.more, "max_bytes ends a batch early"


async def test_a_replay_past_the_end_is_empty_and_the_leader_confirms_it(bus: Bus) -> None:
    await publish(bus, [("alice", "a" * 32), ("bob", "b" * 32)])
    reader = StatusReader(bus)
    alice = bus.config.status_filter("alice")
    past = await reader.read(alice, 2, batch=10, max_bytes=1 << 20)
    assert past.events == [] and not past.more
    assert await reader.next_on_leader(alice, 2) is None
    first = await reader.next_on_leader(alice, 1)
    assert first is not None and first.seq == 1 and first.job_id == "a" * 32


async def test_a_stream_without_direct_gets_fails_the_read_clearly(bus: Bus) -> None:
    info = await bus.js.stream_info(bus.config.status_stream)
    info.config.allow_direct = False
    await bus.js.update_stream(info.config)
    reader = StatusReader(bus, timeout_seconds=2)
    with pytest.raises(BusUnavailable):
        await reader.read(bus.config.status_filter("alice"), 1, batch=10, max_bytes=1 << 20)


async def test_the_feed_delivers_every_event_in_order_across_a_lost_consumer(bus: Bus) -> None:
    await publish(bus, [("alice", "a" * 32)] * 5)
    feed = StatusFeed(bus, 3, batch=4)
    got: list[int] = []
    try:
        async with asyncio.timeout(20):
            while len(got) < 3:
                got += [e.seq for e in await feed.next_batch(1.0)]
            assert got == [3, 4, 5]
            await publish(bus, [("bob", "b" * 32)] * 3)
            while len(got) < 6:
                got += [e.seq for e in await feed.next_batch(1.0)]
            # the server loses the consumer (deleted, or expired while this gateway was away)
            consumers = await bus.js.consumers_info(bus.config.status_stream)
            for c in consumers:
                if c.name.startswith("live-"):
                    await bus.js.delete_consumer(bus.config.status_stream, c.name)
            await publish(bus, [("alice", "a" * 32)] * 10)
            while len(got) < 16:
                got += [e.seq for e in await feed.next_batch(1.0)]
    finally:
        await feed.close()
    assert got == list(range(3, 19))
    consumers = await bus.js.consumers_info(bus.config.status_stream)
    assert not [c for c in consumers if c.name.startswith("live-")], "close deletes it"


def test_stored_events_are_not_tracked_by_the_garbage_collector() -> None:
    """Replays make hundreds of thousands of them: tracked, they set off full collections
    (measured: 130 ms pauses of the whole process with 400 replaying clients)."""
    assert not gc.is_tracked(StoredEvent(1, "t.status.a.j", b"{}"))
