"""Which partitions a scheduler owns: all of them (single scheduler), or by leases.

:class:`LeaseOwnership` keeps a lease in the NATS KV bucket (see :mod:`bus.leases`) for each
partition it owns, renews them every third of the TTL, heartbeats its membership, and moves
toward its quota of ``partitions / live schedulers`` (see :func:`core.partitions.quota`): taking
free ones, handing extra ones back when a scheduler joins.

Fencing: a lease counts as owned only until ``renewed_at + 0.75 * TTL`` on this process's
monotonic clock (renewed_at = when the renewal was *sent*), so a scheduler that cannot renew
stops dispatching the partition well before the server expires the lease and another scheduler
can take it. :attr:`owned` is computed from those deadlines on every read, so fencing holds even
if the renewal loop is stalled.

A JetStream outage (the bucket's stream electing a new leader, NATS unreachable) fences leases
without losing them: a fenced lease is still renewed every round, and once a revision-checked
renewal succeeds — proof that nobody took it meanwhile — the partition is owned again at once.
Only the server's answer that the key is gone or someone else's (:class:`core.errors.LeaseLost`)
drops it. So an outage shorter than about 2/3 of the TTL (the lease's age when it started can be
up to a third) costs no lease; a longer one lets the server expire them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from actors.metrics import Metrics
from core.clock import Clock, SystemClock
from core.errors import BusUnavailable, LeaseLost
from core.partitions import rebalance
from core.ports import Leases
from core.retry import raise_if_cancelling

log = logging.getLogger(__name__)

VALIDITY = 0.75

CLUSTER_MIN_TTL_SECONDS = 15.0
"""Shortest lease TTL against a clustered NATS (seconds).

Killing the node that leads the lease bucket's stream left it unwritable for 4.2 to 7.0 s in 10
elections (nats-server 2.15.1, 3 nodes on loopback; bench/README.md), and the new leader then
expires every lease older than the TTL. A lease is up to a third of the TTL old when an outage
starts, so it survives an outage shorter than 2/3 of the TTL: 10 s at 15 s. A lone server has no
elections; there the default TTL (3 s) applies.
"""


class Ownership(Protocol):
    """The partitions a scheduler may dispatch right now."""

    @property
    def owned(self) -> frozenset[int]: ...

    async def run(
        self, on_gained: Callable[[frozenset[int]], None], on_lost: Callable[[frozenset[int]], None]
    ) -> None:
        """Maintain ownership until :meth:`stop`; report changes through the callbacks."""
        ...

    def stop(self) -> None: ...


class StaticOwnership:
    """Owns a fixed set of partitions (all of them for a lone scheduler)."""

    def __init__(self, partitions: frozenset[int]) -> None:
        self._owned = partitions
        self._stop = asyncio.Event()

    @property
    def owned(self) -> frozenset[int]:
        return self._owned

    async def run(
        self, on_gained: Callable[[frozenset[int]], None], on_lost: Callable[[frozenset[int]], None]
    ) -> None:
        on_gained(self._owned)
        await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()


@dataclass
class _Lease:
    revision: int
    sent_at: float
    valid_until: float
    fenced: bool = False


class LeaseOwnership:
    """Ownership by leases (see module docstring).

    Args:
        bucket: the lease bucket (opened by :meth:`run`).
        member: this scheduler's id (unique per process).
        partitions: number of partitions (N).
        ttl_seconds: lease TTL (seconds); renewals every ``ttl_seconds / 3``.
        round_seconds: how often free partitions are looked for (seconds).
        metrics: where fenced and lost leases are counted (``jobsched_lease_losses_total``);
            default: a registry of its own.
        clock: what the pause between rounds is measured on (a fake one in tests).
        monotonic: seconds on a clock that never goes backwards, for the lease deadlines
            (default ``time.monotonic``; a fake clock's in tests).
    """

    def __init__(
        self,
        bucket: Leases,
        member: str,
        partitions: int,
        *,
        ttl_seconds: float,
        round_seconds: float = 1.0,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock or SystemClock()
        self._monotonic = monotonic
        self.bucket = bucket
        self.member = member
        self.partitions = partitions
        self.ttl_seconds = ttl_seconds
        self.round_seconds = min(round_seconds, ttl_seconds / 3)
        self._leases: dict[int, _Lease] = {}
        self._stop = asyncio.Event()
        self.members = 1
        self.metrics = metrics or Metrics()

    @property
    def owned(self) -> frozenset[int]:
        now = self._monotonic()
        return frozenset(p for p, lease in self._leases.items() if lease.valid_until > now)

    def stop(self) -> None:
        self._stop.set()

    async def run(
        self, on_gained: Callable[[frozenset[int]], None], on_lost: Callable[[frozenset[int]], None]
    ) -> None:
        await self.bucket.open()
        try:
            while not self._stop.is_set():
                raise_if_cancelling()
                try:
                    await self._round(on_gained, on_lost)
                except BusUnavailable as e:
                    log.warning("leases of %s: %s", self.member, e)
                self._expire(on_lost)
                next_round = self._clock.now() + timedelta(seconds=self.round_seconds)
                await self._clock.sleep_until(next_round, self._stop)
        finally:
            await self._release_all(on_lost)

    async def _round(
        self, on_gained: Callable[[frozenset[int]], None], on_lost: Callable[[frozenset[int]], None]
    ) -> None:
        await self._renew(on_gained, on_lost)
        await self.bucket.heartbeat(self.member)
        snap = await self.bucket.snapshot()
        members = snap.members | {self.member}
        self.members = len(members)
        held = frozenset(self._leases)  # fenced ones too: they are still ours on the server
        plan = rebalance(self.member, held, snap.taken, self.partitions, members)
        if plan.release:
            released = frozenset(plan.release)
            leases = {p: self._leases.pop(p) for p in plan.release if p in self._leases}
            on_lost(released)
            for p, lease in leases.items():
                await self.bucket.release(p, lease.revision)
            log.info(
                "%s handed back %d partition(s) (%d members)",
                self.member,
                len(released),
                self.members,
            )
        gained: set[int] = set()
        for p in plan.acquire:
            sent = self._monotonic()
            revision = await self.bucket.acquire(p, self.member)
            if revision is not None:
                self._leases[p] = _Lease(revision, sent, sent + VALIDITY * self.ttl_seconds)
                gained.add(p)
        if gained:
            log.info(
                "%s took %d partition(s), owns %d (%d members)",
                self.member,
                len(gained),
                len(self._leases),
                self.members,
            )
            on_gained(frozenset(gained))

    async def _renew(
        self, on_gained: Callable[[frozenset[int]], None], on_lost: Callable[[frozenset[int]], None]
    ) -> None:
        """Renew every lease due for it; a fenced one that renews is owned again."""
        now = self._monotonic()
        lost: set[int] = set()
        regained: set[int] = set()
        try:
            for p, lease in list(self._leases.items()):
                if now - lease.sent_at < self.ttl_seconds / 3 and not lease.fenced:
                    continue
                sent = self._monotonic()
                try:
                    revision = await self.bucket.renew(p, self.member, lease.revision)
                except LeaseLost:
                    self._leases.pop(p, None)
                    self.metrics.lease_losses.labels(reason="taken").inc()
                    if not lease.fenced:
                        lost.add(p)
                    continue
                self._leases[p] = _Lease(revision, sent, sent + VALIDITY * self.ttl_seconds)
                if lease.fenced:
                    regained.add(p)
        finally:
            if lost:
                log.warning("%s lost %d lease(s) to another scheduler", self.member, len(lost))
                on_lost(frozenset(lost))
            if regained:
                log.info(
                    "%s renewed %d fenced lease(s): dispatching them again",
                    self.member,
                    len(regained),
                )
                on_gained(frozenset(regained))

    def _expire(self, on_lost: Callable[[frozenset[int]], None]) -> None:
        """Fence the leases not renewed in time (they are kept, and renewal goes on)."""
        now = self._monotonic()
        expired = frozenset(
            p for p, lease in self._leases.items() if lease.valid_until <= now and not lease.fenced
        )
        if expired:
            for p in expired:
                self._leases[p].fenced = True
            log.warning(
                "%s could not renew %d lease(s) in time; stopped dispatching them until a "
                "renewal succeeds",
                self.member,
                len(expired),
            )
            self.metrics.lease_losses.labels(reason="fenced").inc(len(expired))
            on_lost(expired)

    async def _release_all(self, on_lost: Callable[[frozenset[int]], None]) -> None:
        """Clean shutdown: hand every lease back so survivors need not wait for the TTL."""
        leases, self._leases = self._leases, {}
        if leases:
            on_lost(frozenset(leases))
        with contextlib.suppress(BusUnavailable, TimeoutError):
            async with asyncio.timeout(5):
                for p, lease in leases.items():
                    await self.bucket.release(p, lease.revision)
                await self.bucket.leave(self.member)
        if leases:
            log.info("%s released %d lease(s)", self.member, len(leases))
