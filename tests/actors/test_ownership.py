"""Partition leases on a real nats-server: convergence, fencing, release, reclaim."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from actors.metrics import Metrics
from actors.ownership import VALIDITY, LeaseOwnership
from bus.leases import LeaseBucket
from bus.nats import Bus, BusConfig
from jobsched.natsserver import NatsServer


@asynccontextmanager
async def member(
    url: str,
    prefix: str,
    name: str,
    *,
    ttl_s: float = 2.0,
    partitions: int = 16,
    metrics: Metrics | None = None,
) -> AsyncIterator[LeaseOwnership]:
    bus = Bus(BusConfig(servers=[url], prefix=prefix))
    await bus.connect()
    ownership = LeaseOwnership(
        LeaseBucket(bus, ttl_s=ttl_s), name, partitions, ttl_s=ttl_s, round_s=0.2, metrics=metrics
    )
    task = asyncio.create_task(ownership.run(lambda _p: None, lambda _p: None))
    try:
        yield ownership
    finally:
        ownership.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await bus.close()


async def until(predicate: Callable[[], bool], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_two_members_split_the_partitions(nats_server: NatsServer, prefix: str) -> None:
    async with member(nats_server.url, prefix, "a") as a, member(nats_server.url, prefix, "b") as b:
        await until(lambda: len(a.owned) == 8 and len(b.owned) == 8, timeout_s=15)
        assert not (a.owned & b.owned)
        assert a.owned | b.owned == frozenset(range(16))


async def test_a_clean_stop_hands_partitions_over_without_waiting_for_the_ttl(
    nats_server: NatsServer, prefix: str
) -> None:
    async with member(nats_server.url, prefix, "a", ttl_s=30.0) as a:
        async with member(nats_server.url, prefix, "b", ttl_s=30.0) as b:
            await until(lambda: len(a.owned) == 8 and len(b.owned) == 8, timeout_s=15)
        stopped = time.monotonic()
        await until(lambda: len(a.owned) == 16, timeout_s=10)
        assert time.monotonic() - stopped < 10, "took over long before the 30 s TTL"


async def test_a_member_that_cannot_renew_stops_owning_before_the_lease_expires(
    own_nats: NatsServer, prefix: str
) -> None:
    ttl = 2.0
    metrics = Metrics()

    def losses(reason: str) -> float | None:
        return metrics.registry.get_sample_value("jobsched_lease_losses_total", {"reason": reason})

    async with member(own_nats.url, prefix, "a", ttl_s=ttl, metrics=metrics) as a:
        await until(lambda: len(a.owned) == 16, timeout_s=10)
        assert losses("expired") == 0
        own_nats.kill()
        killed = time.monotonic()
        await until(lambda: not a.owned, timeout_s=ttl)
        assert time.monotonic() - killed <= VALIDITY * ttl + 0.1
        await until(lambda: losses("expired") == 16, timeout_s=30)
    assert losses("taken") == 0


async def test_a_restarted_member_reclaims_its_own_leases_at_once(
    own_nats: NatsServer, prefix: str
) -> None:
    ttl = 30.0
    bus = Bus(BusConfig(servers=[own_nats.url], prefix=prefix))
    await bus.connect()
    try:
        bucket = LeaseBucket(bus, ttl_s=ttl)
        await bucket.open()
        assert await bucket.acquire(3, "a") is not None
        assert await bucket.acquire(3, "b") is None, (
            "another owner is refused while the lease lives"
        )
        assert await bucket.acquire(3, "a") is not None, "the same owner takes it back"
    finally:
        await bus.close()
