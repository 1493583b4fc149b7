"""``bus.slots.SlotBucket`` against a real nats-server: compare-and-set under contention, per-owner
keys, lease expiry (instants passed in, so no test waits for a lease), the watch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bus.nats import Bus, BusConfig
from bus.slots import SlotBucket
from core.concurrency import ConcurrencyPolicy, Outcome, SlotRequest
from core.errors import BusUnavailable
from jobsched.natsserver import NatsServer

T0 = 1_780_000_000_000
LEASE_SECONDS = 10.0


def req(run: str, *, owner: str = "alice", key: str = "k", limit: int = 1) -> SlotRequest:
    return SlotRequest(owner, key, run, "w1", int(run[1:]), limit, ConcurrencyPolicy.QUEUE)


@pytest.fixture
async def bucket(nats_server: NatsServer, prefix: str) -> AsyncIterator[SlotBucket]:
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        slots = SlotBucket(bus, lease_seconds=LEASE_SECONDS, create=True)
        await slots.open()
        yield slots
    finally:
        await bus.close()


async def test_a_worker_cannot_open_a_bucket_no_scheduler_created(
    nats_server: NatsServer, prefix: str
) -> None:
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        with pytest.raises(BusUnavailable, match="does not exist"):
            await SlotBucket(bus).open()
    finally:
        await bus.close()


async def test_concurrent_acquirers_get_exactly_the_limit(bucket: SlotBucket) -> None:
    decisions = await asyncio.gather(
        *(bucket.acquire(req(f"r{i}", limit=3), T0) for i in range(1, 11))
    )
    acquired = sorted(
        int(r.execution_id[1:])
        for r, d in zip([req(f"r{i}") for i in range(1, 11)], decisions, strict=True)
        if d.outcome == Outcome.ACQUIRED
    )
    assert len(acquired) == 3
    state = await bucket.read("alice", "k")
    assert state is not None
    assert len(state.holders) == 3 and len(state.waiters) == 7


async def test_explain_reads_the_place_in_line(bucket: SlotBucket) -> None:
    await bucket.acquire(req("r1"), T0)
    await bucket.acquire(req("r2"), T0)
    wait = await bucket.explain("alice", "k", 1, "r2", T0 + 1)
    assert (wait.running, wait.waiting, wait.position) == (["r1"], ["r2"], 0)
    nothing = await bucket.explain("alice", "unused", 4, None, T0)
    assert (nothing.running, nothing.max_concurrent) == ([], 4)


async def test_the_same_key_text_of_another_user_shares_nothing(bucket: SlotBucket) -> None:
    """A user cannot block (or see) another's runs by naming the same key."""
    assert (await bucket.acquire(req("r1", owner="mallory"), T0)).outcome == Outcome.ACQUIRED
    assert (await bucket.acquire(req("r2", owner="mallory"), T0)).outcome == Outcome.WAITING
    assert (await bucket.acquire(req("r3", owner="alice"), T0)).outcome == Outcome.ACQUIRED
    alice = await bucket.read("alice", "k")
    assert alice is not None and [h.execution_id for h in alice.holders] == ["r3"]


async def test_release_and_expiry_free_the_slot(bucket: SlotBucket) -> None:
    await bucket.acquire(req("r1"), T0)
    assert (await bucket.acquire(req("r2"), T0)).outcome == Outcome.WAITING
    await bucket.release("alice", "k", "r1", T0 + 1)
    await bucket.release("alice", "k", "r1", T0 + 1)  # idempotent
    assert (await bucket.acquire(req("r2"), T0 + 2)).outcome == Outcome.ACQUIRED
    # r2's worker dies: after its lease the slot goes to the next run
    expired = T0 + 2 + int(LEASE_SECONDS * 1000)
    assert (await bucket.acquire(req("r3"), expired - 1)).outcome == Outcome.WAITING
    assert (await bucket.acquire(req("r3"), expired)).outcome == Outcome.ACQUIRED


async def test_a_waiter_wakes_on_a_write_of_its_key(bucket: SlotBucket) -> None:
    watch = asyncio.create_task(bucket.watch())
    try:
        async with asyncio.timeout(5):
            await bucket.ready.wait()
        await bucket.acquire(req("r1"), T0)
        await bucket.acquire(req("r2"), T0)

        async def until_released() -> None:
            while True:  # earlier writes may still be on their way to the watch
                changed, state = await bucket.changed("alice", "k", 30.0)
                assert changed
                if state is not None and state.holders == ():
                    return

        waiter = asyncio.create_task(until_released())
        await asyncio.sleep(0)
        await bucket.release("alice", "k", "r1", T0 + 1)
        async with asyncio.timeout(5):
            await waiter
        assert await bucket.changed("alice", "k", 0.0) == (False, None)
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
