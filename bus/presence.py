"""Workers' presence in a JetStream key-value bucket: who is alive, what it consumes, how busy.

Bucket ``<prefix>_workers`` (history 1, memory storage, ``max_age``
:data:`core.cluster.PRESENCE_TTL_SECONDS`): key :func:`presence_key` of the worker id → the
JSON of a :class:`core.cluster.WorkerHeartbeat`. A worker rewrites its key every
:data:`core.cluster.PRESENCE_HEARTBEAT_SECONDS` and deletes it (a ``KV-Operation: DEL``
marker) on a clean stop; a worker that died is gone once ``max_age`` passes its last write. The
bucket-wide ``max_age`` works on every supported nats-server (2.12 and later) without per-message
TTLs (``allow_msg_ttl``, ADR-43), which the bucket therefore does not need.

The scheduler creates the bucket (:mod:`bus.auth`: the only role that creates buckets). A
worker only publishes to ``$KV.<bucket>.>`` — plain JetStream publishes, no JetStream API call —
so its NATS user needs nothing else of the bucket; the gateway reads it
(:class:`bus.cluster.ClusterReader`).
"""

from __future__ import annotations

import base64
import re

import msgspec
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType

from bus.nats import Bus, translated
from core.cluster import PRESENCE_TTL_SECONDS, WorkerHeartbeat

_encode = msgspec.json.Encoder().encode
_PLAIN_ID = re.compile(r"[-_=A-Za-z0-9]{1,200}")


def bucket_name(prefix: str) -> str:
    """The presence bucket of deployment ``prefix``: ``<prefix>_workers``."""
    return f"{prefix}_workers"


def presence_key(worker_id: str) -> str:
    """The key of ``worker_id``: ``w.<id>`` when the id is a plain KV key token (letters,
    digits, ``-_=``), else ``b.<unpadded base32 of its UTF-8>`` (a valid key for any id)."""
    if _PLAIN_ID.fullmatch(worker_id):
        return f"w.{worker_id}"
    return "b." + base64.b32encode(worker_id.encode()).decode().rstrip("=")


class PresenceBucket:
    """The presence bucket of one deployment (:class:`core.ports.WorkerPresenceBoard`).

    Args:
        bus: connected NATS adapter.
        replicas: JetStream replicas of the bucket (:meth:`create`).
    """

    def __init__(self, bus: Bus, *, replicas: int = 1) -> None:
        self.bus = bus
        self.replicas = replicas
        self.name = bucket_name(bus.config.prefix)
        self.stream = f"KV_{self.name}"

    async def create(self) -> None:
        """Create the bucket, or bind to it when it exists (a scheduler's; idempotent).

        Raises:
            BusUnavailable: NATS did not answer.
        """
        with translated(f"open presence bucket {self.name}"):
            try:
                await self.bus.js.key_value(self.name)
                return
            except nats.js.errors.BucketNotFoundError:
                pass
        with translated(f"create presence bucket {self.name}"):
            await self.bus.js.create_key_value(
                KeyValueConfig(
                    bucket=self.name,
                    history=1,
                    ttl=PRESENCE_TTL_SECONDS,
                    storage=StorageType.MEMORY,
                    replicas=self.replicas,
                )
            )

    async def announce(self, heartbeat: WorkerHeartbeat) -> None:
        """Write ``heartbeat`` as its worker's presence (stored once JetStream acknowledged it).

        Raises:
            BusUnavailable: not stored (NATS did not answer, or no scheduler created the bucket).
        """
        subject = f"$KV.{self.name}.{presence_key(heartbeat.worker_id)}"
        with translated("worker heartbeat"):
            await self.bus.js.publish(subject, _encode(heartbeat), stream=self.stream)

    async def withdraw(self, worker_id: str) -> None:
        """Delete ``worker_id``'s presence (idempotent).

        Raises:
            BusUnavailable: not stored.
        """
        subject = f"$KV.{self.name}.{presence_key(worker_id)}"
        with translated("worker presence delete"):
            await self.bus.js.publish(
                subject, b"", stream=self.stream, headers={"KV-Operation": "DEL"}
            )
