"""The bus's side of the dashboard's Cluster page, read-only: the lease bucket's and the
workers' presence bucket's keys with their last write times (:mod:`bus.leases`,
:mod:`bus.presence`), and the work consumers' counts (:class:`core.cluster.ClusterSource`).

Reads only (the gateway's NATS user has no other right on these): ``STREAM.INFO`` of the lease
bucket's stream with a subject filter lists its keys (JetStream API, ADR-8 key-value buckets:
one subject ``$KV.<bucket>.<key>`` per key), one last-message-by-subject get per key gives its
value and its write time (``DIRECT.GET`` when the stream allows direct gets, else
``STREAM.MSG.GET``), and ``CONSUMER.INFO`` of each queue's work consumer gives its counts. A
lease key expires ``ttl`` after its last write (the bucket's ``max_age``, :mod:`bus.leases`), a
presence key :data:`core.cluster.PRESENCE_TTL_SECONDS` after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec
import nats.js.errors

from bus.leases import LeaseValue
from bus.nats import Bus, translated
from bus.presence import bucket_name as presence_bucket_name
from core.cluster import (
    PRESENCE_TTL_SECONDS,
    BusView,
    Lease,
    Member,
    QueueInfo,
    WorkerHeartbeat,
    WorkerPresence,
)

_decode_lease = msgspec.json.Decoder(LeaseValue).decode
_decode_heartbeat = msgspec.json.Decoder(WorkerHeartbeat).decode
DELETED = frozenset({"DEL", "PURGE"})
"""``KV-Operation`` header values of a removed key."""


class ClusterReader:
    """Reads the cluster's state from NATS.

    Args:
        bus: the gateway's connected NATS adapter.
        lease_ttl_seconds: the leases' TTL (``JOBSCHED_LEASE_TTL_SECONDS``, seconds).
        partitions: ``JOBSCHED_PARTITIONS``.
        queues: the work queues to report (``JOBSCHED_QUEUES``).
    """

    def __init__(
        self, bus: Bus, *, lease_ttl_seconds: float, partitions: int, queues: Sequence[str]
    ) -> None:
        self.bus = bus
        self.ttl = timedelta(seconds=lease_ttl_seconds)
        self.partitions = partitions
        self.queues = tuple(queues)
        self.bucket = f"{bus.config.prefix}_leases"
        self.presence_bucket = presence_bucket_name(bus.config.prefix)

    async def bus_view(self) -> BusView:
        """See :meth:`core.cluster.ClusterSource.bus_view`."""
        entries, presence, queues = await asyncio.gather(
            self._entries(self.bucket),
            self._entries(self.presence_bucket),
            asyncio.gather(*(self._queue(q) for q in self.queues)),
        )
        leases, members = [], []
        for key, (data, at, revision) in sorted(entries.items()):
            try:
                owner = _decode_lease(data).owner
            except msgspec.DecodeError:
                owner = "?"
            expires = at + self.ttl if at is not None else None
            if key.startswith("p.") and key[2:].isdigit():
                leases.append(Lease(partition=int(key[2:]), owner=owner, renewed_at=at,
                                    expires_at=expires, revision=revision))  # fmt: skip
            elif key.startswith("m."):
                members.append(Member(scheduler=key[2:], heartbeat_at=at, expires_at=expires,
                                      partitions=[]))  # fmt: skip
        leases.sort(key=lambda lease: lease.partition)
        held: dict[str, list[int]] = {}
        for lease in leases:
            held.setdefault(lease.owner, []).append(lease.partition)
        known = {m.scheduler for m in members}
        members = [
            msgspec.structs.replace(m, partitions=held.get(m.scheduler, [])) for m in members
        ]
        members += [Member(scheduler=o, heartbeat_at=None, expires_at=None, partitions=p)
                    for o, p in sorted(held.items()) if o not in known]  # fmt: skip
        return BusView(
            lease_ttl_seconds=self.ttl.total_seconds(),
            partitions=self.partitions,
            leases=leases,
            members=members,
            queues=list(queues),
            workers=_workers(presence),
        )

    async def _entries(self, bucket: str) -> dict[str, tuple[bytes, datetime | None, int]]:
        """Each live key of ``bucket``: (value, last write, revision); none when no scheduler
        created the bucket yet."""
        prefix, stream = f"$KV.{bucket}.", f"KV_{bucket}"
        with translated(f"{bucket} bucket info"):
            try:
                info = await self.bus.js.stream_info(stream, subjects_filter=f"{prefix}>")
            except nats.js.errors.NotFoundError:
                return {}
        subjects = sorted((info.state.subjects or {}).keys())
        direct = bool(info.config.allow_direct)
        out: dict[str, tuple[bytes, datetime | None, int]] = {}
        for subject in subjects:
            with translated(f"{bucket} entry"):
                try:
                    msg = await self.bus.js.get_last_msg(stream, subject, direct=direct)
                except nats.js.errors.NotFoundError:
                    continue  # expired between the listing and the get
            if (msg.headers or {}).get("KV-Operation") in DELETED or not msg.data:
                continue
            out[subject.removeprefix(prefix)] = (msg.data, msg.time, int(msg.seq or 0))
        return out

    async def _queue(self, queue: str) -> QueueInfo:
        config = self.bus.config
        with translated(f"consumer info of queue {queue}"):
            try:
                info = await self.bus.js.consumer_info(
                    config.work_stream, config.work_consumer(queue)
                )
            except nats.js.errors.NotFoundError:
                return QueueInfo(queue=queue, exists=False)
        return QueueInfo(
            queue=queue,
            pending=int(info.num_pending or 0),
            in_flight=int(info.num_ack_pending or 0),
            waiting_pulls=int(info.num_waiting or 0),
        )


def _workers(entries: dict[str, tuple[bytes, datetime | None, int]]) -> list[WorkerPresence]:
    """The presence keys' heartbeats by worker id (an undecodable value is left out)."""
    ttl = timedelta(seconds=PRESENCE_TTL_SECONDS)
    out = []
    for data, at, _ in entries.values():
        try:
            heartbeat = _decode_heartbeat(data)
        except msgspec.DecodeError:
            continue
        expires = at + ttl if at is not None else None
        out.append(WorkerPresence(heartbeat=heartbeat, heartbeat_at=at, expires_at=expires))
    return sorted(out, key=lambda p: p.heartbeat.worker_id)
