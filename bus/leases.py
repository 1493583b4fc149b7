"""Partition leases and scheduler membership in a JetStream key-value bucket.

Bucket ``<prefix>_leases`` (history 1, file storage) whose ``max_age`` is the lease TTL: a key not
rewritten within the TTL disappears, which is how a dead scheduler's leases and heartbeat expire.

- ``p.<partition>`` → owner id: taken with ``create`` (fails if the key exists), renewed with a
  revision-checked ``update`` (fails if someone else wrote it), released with a revision-checked
  delete. The revision is the lease's fencing token.
- ``m.<scheduler id>`` → heartbeat of a live scheduler, rewritten every renewal round.

Relies on KV buckets, ``Nats-Expected-Last-Subject-Sequence`` and stream ``max_age`` expiry,
all in every supported nats-server (2.12+). In a cluster the bucket is replicated; while its
stream elects a new leader (4 to 7 s measured: README "High availability") nothing can be written,
and the new leader expires at once every key older than the TTL.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from bus.nats import Bus, translated
from core.errors import BusUnavailable, LeaseLost
from core.ports import LeaseSnapshot

log = logging.getLogger(__name__)


class LeaseValue(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    owner: str


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(LeaseValue).decode


def _owner(value: bytes) -> str | None:
    """The owner a lease value names; None for a value that is not a lease (written by hand
    or by another version): not ours, and no reason to stop the ownership loop over it."""
    try:
        return _decode(value).owner
    except msgspec.DecodeError:
        log.warning("lease value %r is not a lease; treating it as someone else's", value[:100])
        return None


async def live_keys(kv: KeyValue, *, timeout_seconds: float) -> list[str]:
    """The keys of ``kv`` that hold a value now (deleted and purged ones left out).

    nats-py's ``KeyValue.keys`` waits without a bound for its watcher's end-of-values marker,
    which never comes if the last pending keys expire (``max_age``) between the watcher's
    creation and their delivery; when cancelled it also leaves its subscription behind. This
    listing gives up after ``timeout_seconds`` and always stops its watcher. Its ephemeral
    consumer is removed by the server ``max(timeout_seconds, 1)`` seconds after the watcher
    stops (nats-py's default ``inactive_threshold`` would keep each one for 5 minutes: some 300
    per scheduler listing once a round).

    Raises:
        nats.errors.TimeoutError: the listing did not finish within ``timeout_seconds``.
        nats.errors.Error: NATS refused the watcher.
    """
    watcher = await kv.watchall(
        ignore_deletes=True, meta_only=True, inactive_threshold=max(timeout_seconds, 1.0)
    )
    keys: list[str] = []
    try:
        async with asyncio.timeout(timeout_seconds):
            while (entry := await watcher.updates(timeout_seconds)) is not None:  # type: ignore[no-untyped-call]
                keys.append(entry.key)
    except TimeoutError as e:
        raise nats.errors.TimeoutError from e
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return keys


class LeaseBucket:
    """The lease bucket of one deployment.

    Args:
        bus: connected NATS adapter.
        ttl_seconds: lease TTL (seconds): the bucket's ``max_age``.
        replicas: JetStream replicas of the bucket.
    """

    def __init__(self, bus: Bus, *, ttl_seconds: float, replicas: int = 1) -> None:
        self.bus = bus
        self.ttl_seconds = ttl_seconds
        self.replicas = replicas
        self.name = f"{bus.config.prefix}_leases"
        self._kv: KeyValue | None = None

    async def open(self) -> None:
        """Create the bucket if missing (idempotent; its ``max_age`` is the lease TTL, so a
        bucket of another TTL is an error rather than bound)."""
        self._kv = await self.bus.key_value(
            self.name,
            what="lease bucket",
            ttl_seconds=self.ttl_seconds,
            replicas=self.replicas,
            create=True,
            bind_first=False,
        )

    @property
    def kv(self) -> KeyValue:
        if self._kv is None:
            raise BusUnavailable("the lease bucket is not open")
        return self._kv

    async def acquire(self, partition: int, owner: str) -> int | None:
        """Take ``partition`` for ``owner``; its revision, or None if another owner holds it.

        A lease that already names ``owner`` (a restart of the same scheduler, or a renewal that
        timed out but reached the server) is taken back with a revision-checked update.
        """
        key = f"p.{partition}"
        value = _encode(LeaseValue(owner=owner))
        with translated("acquire lease"):
            try:
                return int(await self.kv.create(key, value))
            except nats.js.errors.KeyWrongLastSequenceError:
                pass
            try:
                entry = await self.kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return None
            if entry.value is None or _owner(entry.value) != owner or entry.revision is None:
                return None
            try:
                return int(await self.kv.update(key, value, last=entry.revision))
            except nats.js.errors.KeyWrongLastSequenceError:
                return None

    async def renew(self, partition: int, owner: str, revision: int) -> int:
        """Extend the lease; the new revision.

        A renewal that timed out may still have reached the server: then the key has moved past
        ``revision`` but still names ``owner``, and the lease is renewed at its new revision.

        Raises:
            LeaseLost: the key is gone or names another owner (expired, taken over).
            BusUnavailable: NATS did not answer (the lease may still be valid: retry).
        """
        key = f"p.{partition}"
        value = _encode(LeaseValue(owner=owner))
        with translated("renew lease"):
            try:
                return int(await self.kv.update(key, value, last=revision))
            except nats.js.errors.KeyWrongLastSequenceError:
                pass
            try:
                entry = await self.kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                raise LeaseLost(f"lease of partition {partition} expired") from None
            if entry.value is None or entry.revision is None or _owner(entry.value) != owner:
                raise LeaseLost(f"lease of partition {partition} was taken over") from None
            try:
                return int(await self.kv.update(key, value, last=entry.revision))
            except nats.js.errors.KeyWrongLastSequenceError:
                raise LeaseLost(f"lease of partition {partition} was lost") from None

    async def release(self, partition: int, revision: int) -> None:
        """Give the lease up (only if it is still ours at ``revision``)."""
        with translated("release lease"):
            try:
                await self.kv.delete(f"p.{partition}", last=revision)
            except nats.js.errors.APIError as e:
                log.debug("lease of partition %d was not ours any more: %s", partition, e)

    async def heartbeat(self, member: str) -> None:
        with translated("heartbeat"):
            await self.kv.put(f"m.{member}", _encode(LeaseValue(owner=member)))

    async def leave(self, member: str) -> None:
        with translated("leave"):
            await self.kv.delete(f"m.{member}")

    async def snapshot(self) -> LeaseSnapshot:
        """Current members and taken partitions (one listing of the bucket)."""
        with translated("list leases"):
            try:
                # a third of the TTL: a round stuck that long still renews its leases in time
                keys = await live_keys(self.kv, timeout_seconds=self.ttl_seconds / 3)
            except nats.errors.TimeoutError as e:
                raise BusUnavailable(
                    f"NATS: list leases timed out after {self.ttl_seconds / 3:g} s"
                ) from e
        members = frozenset(k[2:] for k in keys if k.startswith("m."))
        taken = frozenset(int(k[2:]) for k in keys if k.startswith("p.") and k[2:].isdigit())
        return LeaseSnapshot(members, taken)
