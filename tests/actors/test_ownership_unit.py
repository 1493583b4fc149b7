"""Lease ownership on fakes: the in-memory lease bucket and a fake clock for both the rounds
and the lease deadlines (``monotonic``).

Fencing: a lease not renewed within ``0.75 · TTL`` of its last renewal stops counting as owned,
whatever the renewal loop is doing; a renewal that succeeds afterwards makes it owned again; a
lease taken over is dropped. The real-NATS behaviour is in ``test_ownership.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from actors.ownership import LeaseOwnership
from core.clock import FakeClock
from tests.actors.harness import T0
from tests.fakes import FakeLeases

TTL_SECONDS = 3.0  # renewals every 1 s, leases valid for 2.25 s after each


@dataclass
class Changes:
    gained: list[frozenset[int]] = field(default_factory=list)
    lost: list[frozenset[int]] = field(default_factory=list)


@dataclass
class OwnershipRig:
    leases: FakeLeases
    clock: FakeClock
    ownership: LeaseOwnership
    changes: Changes
    task: asyncio.Task[None]

    async def round(self) -> None:
        """Let one round run: move the clock to the next round and wait for it to end."""
        [deadline] = self.clock.deadlines()
        await self.clock.set(deadline)
        await self.clock.until_asleep(1)


@asynccontextmanager
async def ownership_rig(
    partitions: int = 4, leases: FakeLeases | None = None
) -> AsyncIterator[OwnershipRig]:
    leases = leases or FakeLeases()
    clock = FakeClock(T0)

    def monotonic() -> float:
        return (clock.now() - T0).total_seconds()

    ownership = LeaseOwnership(
        leases,
        "a",
        partitions,
        ttl_seconds=TTL_SECONDS,
        round_seconds=1.0,
        clock=clock,
        monotonic=monotonic,
    )
    changes = Changes()
    task = asyncio.create_task(
        ownership.run(changes.gained.append, changes.lost.append), name="ownership under test"
    )
    rig = OwnershipRig(leases, clock, ownership, changes, task)
    try:
        await clock.until_asleep(1)
        yield rig
    finally:
        ownership.stop()
        async with asyncio.timeout(5):
            await task


async def test_a_lone_member_takes_every_free_partition() -> None:
    async with ownership_rig() as rig:
        assert rig.ownership.owned == {0, 1, 2, 3}
        assert rig.changes.gained == [frozenset({0, 1, 2, 3})]
        assert {k.owner for k in rig.leases.keys.values()} == {"a"}
        assert rig.leases.members == {"a"}


async def test_a_partition_another_member_holds_is_left_alone() -> None:
    leases = FakeLeases()
    leases.steal(2, "b")
    leases.members.add("b")
    async with ownership_rig(leases=leases) as rig:
        assert 2 not in rig.ownership.owned
        assert rig.leases.keys[2].owner == "b"


async def test_leases_are_renewed_every_third_of_the_ttl() -> None:
    async with ownership_rig() as rig:
        first = {p: k.revision for p, k in rig.leases.keys.items()}

        for _ in range(5):
            await rig.round()

        assert all(rig.leases.keys[p].revision > r for p, r in first.items())
        assert rig.ownership.owned == {0, 1, 2, 3}
        assert rig.changes.lost == []


async def test_a_lease_that_cannot_be_renewed_is_fenced_before_it_expires() -> None:
    async with ownership_rig() as rig:
        rig.leases.failures = 1_000  # NATS unreachable

        await rig.clock.advance(2.2)
        assert rig.ownership.owned == {0, 1, 2, 3}  # still within 0.75 · TTL
        await rig.clock.advance(0.05)  # 2.25 s: fenced, read-time, whatever the loop does
        assert rig.ownership.owned == frozenset()

        await rig.clock.until_asleep(1)
        await rig.round()
        assert rig.changes.lost == [frozenset({0, 1, 2, 3})]


async def test_a_fenced_lease_renewed_after_the_outage_is_owned_again() -> None:
    async with ownership_rig() as rig:
        rig.leases.failures = 1_000
        for _ in range(3):
            await rig.round()
        assert rig.ownership.owned == frozenset()

        rig.leases.failures = 0
        await rig.round()

        assert rig.ownership.owned == {0, 1, 2, 3}
        assert rig.changes.gained[-1] == frozenset({0, 1, 2, 3})


async def test_a_lease_taken_over_is_dropped_at_the_next_renewal() -> None:
    async with ownership_rig() as rig:
        rig.leases.steal(1, "b")

        await rig.round()

        assert 1 not in rig.ownership.owned
        assert frozenset({1}) in rig.changes.lost
        assert rig.leases.keys[1].owner == "b"


async def test_an_expired_lease_is_lost_and_taken_again_if_free() -> None:
    async with ownership_rig() as rig:
        rig.leases.expire(3)

        await rig.round()  # the renewal finds it gone: lost; the same round takes it again

        assert frozenset({3}) in rig.changes.lost
        assert rig.ownership.owned == {0, 1, 2, 3}


async def test_a_member_joining_gets_its_share_handed_back() -> None:
    async with ownership_rig() as rig:
        rig.leases.members.add("b")

        await rig.round()

        assert len(rig.ownership.owned) == 2
        assert len(rig.leases.keys) == 2  # the other two were released for b
        assert len(rig.changes.lost[-1]) == 2


async def test_a_stop_releases_every_lease_and_leaves() -> None:
    async with ownership_rig() as rig:
        rig.ownership.stop()
        async with asyncio.timeout(5):
            await rig.task

        assert rig.leases.keys == {}
        assert rig.leases.members == set()
        assert rig.changes.lost[-1] == frozenset({0, 1, 2, 3})
