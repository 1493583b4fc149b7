"""The Cluster page's data (admins): schedulers and the partitions they lease, queues and their
depth, workers and their in-flight runs — what the lease bucket, the work consumers and the
store say now. The bus adapter (:class:`bus.cluster.ClusterReader`) implements
:class:`ClusterSource`; the gateway adds the store's runs (:func:`cluster_view`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from core.model import Instant, Model


class Lease(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One taken partition: its owner and when the lease expires unless renewed (aware UTC)."""

    partition: int
    owner: str
    renewed_at: Instant | None
    expires_at: Instant | None
    revision: int


class Member(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A live scheduler (its heartbeat key) and the partitions it leases, ascending."""

    scheduler: str
    heartbeat_at: Instant | None
    expires_at: Instant | None
    partitions: list[int]


class QueueInfo(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A work queue as its JetStream consumer reports it.

    Attributes:
        pending: runs not yet delivered to a worker.
        in_flight: runs delivered and not yet acknowledged (running, or lost until ack wait).
        waiting_pulls: pull requests of workers waiting for work (idle worker fetches).
        exists: False when no worker created the consumer yet (every other field 0).
    """

    queue: str
    pending: int = 0
    in_flight: int = 0
    waiting_pulls: int = 0
    exists: bool = True


class BusView(Model, kw_only=True, omit_defaults=False, frozen=True):
    """What the bus says: every lease, the members, the queues."""

    lease_ttl_seconds: float
    partitions: int
    leases: list[Lease]
    members: list[Member]
    queues: list[QueueInfo]


class InFlightRun(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A RUNNING run as the store records it."""

    execution_id: str
    job_id: str
    owner: str
    task_id: str
    queue: str
    attempt: int
    started_at: Instant | None


class Worker(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A worker with runs in flight (a worker with none is not known to the store)."""

    worker_id: str
    runs: list[InFlightRun]


class ClusterView(Model, kw_only=True, omit_defaults=False, frozen=True):
    """The answer of ``GET /cluster``: ``bus`` (None when the gateway runs without NATS),
    ``unleased``: partitions no scheduler holds now, ``workers`` from the store's RUNNING runs
    (at most ``limit``; ``truncated`` when there were more)."""

    at: Instant
    bus: BusView | None
    unleased: list[int]
    workers: list[Worker]
    truncated: bool = False


class ClusterSource(Protocol):
    """The bus's side of the Cluster page (:class:`bus.cluster.ClusterReader`)."""

    async def bus_view(self) -> BusView:
        """Leases, members, queues now.

        Raises:
            BusUnavailable: NATS did not answer.
        """
        ...


def cluster_view(
    at: datetime,
    bus: BusView | None,
    runs: Sequence[tuple[str, InFlightRun]],
    *,
    truncated: bool = False,
) -> ClusterView:
    """The page's data from the bus's view and the store's RUNNING runs ``(worker id, run)``."""
    workers: dict[str, list[InFlightRun]] = {}
    for worker_id, run in runs:
        workers.setdefault(worker_id, []).append(run)
    unleased: list[int] = []
    if bus is not None:
        taken = {lease.partition for lease in bus.leases}
        unleased = [p for p in range(bus.partitions) if p not in taken]
    return ClusterView(
        at=at,
        bus=bus,
        unleased=unleased,
        workers=[Worker(worker_id=w, runs=r) for w, r in sorted(workers.items())],
        truncated=truncated,
    )
