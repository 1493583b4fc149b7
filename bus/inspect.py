"""Read-only looks at the bus for ``GET /jobs/{id}/explain`` (:mod:`core.explain`).

- A queue's state: JetStream consumer info (``$JS.API.CONSUMER.INFO.<P>_WORK.workers-<queue>``)
  of the durable consumer every worker of the queue shares; a missing consumer means no worker of
  the queue has ever started.
- A concurrency key's slots: its entry in the slot bucket (:meth:`bus.slots.SlotBucket.explain`).
- A partition's lease: the last message of ``$KV.<p>_leases.p.<partition>`` in the lease bucket's
  stream (``$JS.API.STREAM.MSG.GET``, NATS ADR-8 KV on JetStream) and the bucket's ``max_age``
  (``$JS.API.STREAM.INFO``): a lease expires ``max_age`` after its last write. A delete or purge
  marker, or no message, means nobody holds it.

The gateway's NATS user may do exactly these reads and no write to the bucket (:mod:`bus.auth`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import nats.js.errors

from bus.leases import LeaseValue
from bus.nats import Bus, translated
from bus.slots import SlotBucket
from core.concurrency import ConcurrencyWait
from core.explain import LeaseView, QueueState
from core.timeutil import to_utc_ms

_lease = msgspec.json.Decoder(LeaseValue)
KV_OPERATION = "KV-Operation"


class BusInspector:
    """Implements :class:`core.ports.RunInspector` on a connected :class:`bus.nats.Bus`."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.lease_bucket = f"{bus.config.prefix}_leases"
        self.slots = SlotBucket(bus)  # never creates the bucket; only reads are made of it

    async def queue_state(self, queue: str) -> QueueState:
        """See :meth:`core.ports.QueueInspector.queue_state`."""
        c = self.bus.config
        with translated(f"consumer info of {c.work_consumer(queue)}"):
            try:
                info = await self.bus.js.consumer_info(c.work_stream, c.work_consumer(queue))
            except nats.js.errors.NotFoundError:
                return QueueState(queue=queue, consumer_exists=False)
        return QueueState(
            queue=queue,
            consumer_exists=True,
            pending=int(info.num_pending or 0),
            in_progress=int(info.num_ack_pending or 0),
            waiting_pulls=int(info.num_waiting or 0),
        )

    async def concurrency_wait(
        self, owner: str, key: str, max_concurrent: int, execution_id: str | None, now_ms: int
    ) -> ConcurrencyWait:
        """See :meth:`core.ports.SlotInspector.concurrency_wait`."""
        return await self.slots.explain(owner, key, max_concurrent, execution_id, now_ms)

    async def partition_lease(self, partition: int) -> LeaseView:
        """See :meth:`core.ports.LeaseInspector.partition_lease`."""
        stream = f"KV_{self.lease_bucket}"
        subject = f"$KV.{self.lease_bucket}.p.{partition}"
        with translated(f"read lease of partition {partition}"):
            try:
                info = await self.bus.js.stream_info(stream)
                msg = await self.bus.js.get_msg(stream, subject=subject)
            except nats.js.errors.NotFoundError:  # no bucket (no scheduler yet), or no lease
                return LeaseView(partition=partition, owner=None)
        if (msg.headers or {}).get(KV_OPERATION) in ("DEL", "PURGE") or not msg.data:
            return LeaseView(partition=partition, owner=None)
        try:
            owner = _lease.decode(msg.data).owner
        except msgspec.DecodeError:
            return LeaseView(partition=partition, owner=None)
        expires_at = _expiry(msg.time, info.config.max_age)
        return LeaseView(partition=partition, owner=owner, expires_at=expires_at)


def _expiry(written: datetime | None, max_age_seconds: float | None) -> datetime | None:
    if written is None or not max_age_seconds:
        return None
    return to_utc_ms(written + timedelta(seconds=max_age_seconds))
