"""The Cluster page's data (admins): schedulers and the partitions they lease, queues and their
depth, workers and their in-flight runs — what the lease bucket, the workers' presence bucket,
the work consumers and the store say now. The bus adapter (:class:`bus.cluster.ClusterReader`)
implements :class:`ClusterSource`; the gateway adds the store's runs (:func:`cluster_view`).

A worker announces itself with a :class:`WorkerHeartbeat` every
:data:`PRESENCE_HEARTBEAT_SECONDS` (:mod:`bus.presence`); a worker that stopped writing is gone
from the bucket :data:`PRESENCE_TTL_SECONDS` after its last heartbeat, one that stopped cleanly
at once.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import msgspec

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
    """What the bus says: every lease, the members, the queues, the live workers (by id)."""

    lease_ttl_seconds: float
    partitions: int
    leases: list[Lease]
    members: list[Member]
    queues: list[QueueInfo]
    workers: list[WorkerPresence] = msgspec.field(default_factory=list)


PRESENCE_TTL_SECONDS = 15.0
"""A worker's presence key expires this long after its last heartbeat (seconds; the presence
bucket's ``max_age``)."""
PRESENCE_HEARTBEAT_SECONDS = PRESENCE_TTL_SECONDS / 3
"""How often a worker rewrites its presence key (seconds): two heartbeats may be lost before it
is taken for gone."""


def release() -> str:
    """The installed jobsched release (``"unknown"`` when run from a tree not installed)."""
    try:
        return importlib.metadata.version("jobsched")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class WorkerHeartbeat(Model, kw_only=True, omit_defaults=False, frozen=True):
    """What a live worker says of itself (the value of its presence key).

    Attributes:
        worker_id: ``JOBSCHED_WORKER_ID`` (default ``<hostname>-<pid>``).
        queues: the work queues it consumes.
        concurrency: runs it executes at once at most.
        in_flight: runs it executes now (waiting for a concurrency slot included).
        started_at: when it started consuming (aware UTC).
        version: the jobsched release it runs.
    """

    worker_id: str
    queues: list[str]
    concurrency: int
    in_flight: int
    started_at: Instant
    version: str


class WorkerPresence(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A live worker's last heartbeat, when it was written and when it expires unless renewed."""

    heartbeat: WorkerHeartbeat
    heartbeat_at: Instant | None
    expires_at: Instant | None


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
    """A worker: live (``presence``, from its heartbeat) and/or with RUNNING runs in the store
    (``presence`` None: the store names it on a run but it sends no heartbeat — gone without
    its runs being settled yet, or a release without heartbeats)."""

    worker_id: str
    presence: WorkerPresence | None
    runs: list[InFlightRun]


class ClusterView(Model, kw_only=True, omit_defaults=False, frozen=True):
    """The answer of ``GET /cluster``: ``bus`` (None when the gateway runs without NATS),
    ``unleased``: partitions no scheduler holds now, ``workers``: every live worker (its
    heartbeat) and every worker the store's RUNNING runs name (at most ``limit`` runs;
    ``truncated`` when there were more), by worker id."""

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
    """The page's data from the bus's view and the store's RUNNING runs ``(worker id, run)``:
    one :class:`Worker` per live worker and per worker a run names, by worker id."""
    workers: dict[str, list[InFlightRun]] = {}
    for worker_id, run in runs:
        workers.setdefault(worker_id, []).append(run)
    unleased: list[int] = []
    live: dict[str, WorkerPresence] = {}
    if bus is not None:
        taken = {lease.partition for lease in bus.leases}
        unleased = [p for p in range(bus.partitions) if p not in taken]
        live = {p.heartbeat.worker_id: p for p in bus.workers}
    ids = sorted(workers.keys() | live.keys())
    return ClusterView(
        at=at,
        bus=bus,
        unleased=unleased,
        workers=[Worker(worker_id=w, presence=live.get(w), runs=workers.get(w, [])) for w in ids],
        truncated=truncated,
    )
