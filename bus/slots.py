"""Concurrency slots in a JetStream key-value bucket, shared by every worker.

Bucket ``<prefix>_slots`` (history 1, file storage, ``max_age`` :data:`SLOT_BUCKET_TTL_SECONDS`):
key :func:`core.concurrency.slot_id` of (owner, rendered concurrency key) → the JSON of a
:class:`core.concurrency.SlotState`. Every change is a read, a pure decision of
:mod:`core.concurrency`, and a revision-checked ``create`` / ``update`` (compare-and-set, NATS
ADR-8 ``Nats-Expected-Last-Subject-Sequence``); a writer that lost the race reads again. The
holders' leases are in the value, so no TTL per key is needed: a dead worker's slot is free once
its ``expiresAtMs`` passes (the bucket's ``max_age`` only collects keys nobody uses any more:
a key in use is rewritten at least every third of a lease).

A worker follows the whole bucket with one KV watch (an ordered push consumer): a waiting run
sleeps on the entry of its key and wakes when any writer changes it, or at the decision's
``wake_at_ms`` — never a poll loop. The scheduler creates the bucket (:mod:`bus.auth`: the only
role that may); workers read and write it; gateways read it (``explain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from bus.nats import Bus, translated
from core.concurrency import (
    ConcurrencyWait,
    Outcome,
    SlotDecision,
    SlotRequest,
    SlotState,
    acquire,
    explain_wait,
    release,
    renew,
    slot_id,
)
from core.errors import BusUnavailable
from core.retry import raise_if_cancelling

log = logging.getLogger(__name__)

SLOT_BUCKET_TTL_SECONDS = 3600.0
"""``max_age`` of the slot bucket (seconds): a key not written for that long is dropped. At least
three times the longest slot lease (``JOBSCHED_WORKER_SLOT_LEASE_SECONDS`` is at most 1200 s)."""
CAS_ATTEMPTS = 50
"""Compare-and-set rounds before a contended write gives up (BusUnavailable: the run retries)."""

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(SlotState).decode


def bucket_name(prefix: str) -> str:
    return f"{prefix}_slots"


class SlotBucket:
    """The slot bucket of one deployment (:class:`core.ports.ConcurrencySlots`).

    Args:
        bus: connected NATS adapter.
        lease_seconds: how long a slot or a place in line lasts without renewal (seconds).
        create: create the bucket if missing (a scheduler's; others bind to it).
        replicas: JetStream replicas of the bucket.
    """

    def __init__(
        self, bus: Bus, *, lease_seconds: float = 30.0, create: bool = False, replicas: int = 1
    ) -> None:
        self.bus = bus
        self.lease_seconds = lease_seconds
        self.create = create
        self.replicas = replicas
        self.name = bucket_name(bus.config.prefix)
        self._kv: KeyValue | None = None
        self._latest: dict[str, tuple[int, SlotState | None]] = {}
        self._written: dict[str, int] = {}
        self._changed: dict[str, set[asyncio.Event]] = {}
        self.ready = asyncio.Event()

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    async def open(self) -> KeyValue:
        """The bucket (created when ``create``).

        Raises:
            BusUnavailable: NATS did not answer, or the bucket does not exist yet.
        """
        if self._kv is None:
            self._kv = await self.bus.key_value(
                self.name,
                what="slot bucket",
                ttl_seconds=SLOT_BUCKET_TTL_SECONDS,
                replicas=self.replicas,
                create=self.create,
            )
        return self._kv

    async def read(self, owner: str, key: str) -> SlotState | None:
        """The slots of (owner, key) as stored (None: never used or collected)."""
        state, _ = await self._get(slot_id(owner, key))
        return state

    async def explain(
        self, owner: str, key: str, max_concurrent: int, execution_id: str | None, now_ms: int
    ) -> ConcurrencyWait:
        """What the slots of (owner, key) say about ``execution_id`` at ``now_ms`` (epoch ms):
        :func:`core.concurrency.explain_wait` of the stored entry, for ``explain``.

        Raises:
            BusUnavailable: NATS did not answer, or the bucket does not exist yet.
        """
        state = await self.read(owner, key)
        return explain_wait(state, key, max_concurrent, execution_id, now_ms)

    async def _get(self, sid: str) -> tuple[SlotState | None, int | None]:
        kv = await self.open()
        with translated("read slot"):
            try:
                entry = await kv.get(sid)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return None, None
        if not entry.value:
            return None, entry.revision
        try:
            return _decode(entry.value), entry.revision
        except msgspec.DecodeError:
            log.warning("slot %s holds no slot state; overwriting it", sid)
            return None, entry.revision

    async def _put(self, sid: str, state: SlotState, revision: int | None) -> int | None:
        """Write at ``revision`` (None: create): the new revision, or None when another writer
        came first."""
        kv = await self.open()
        with translated("write slot"):
            try:
                if revision is None:
                    return int(await kv.create(sid, _encode(state)))
                return int(await kv.update(sid, _encode(state), last=revision))
            except nats.js.errors.KeyWrongLastSequenceError:
                return None

    async def acquire(self, request: SlotRequest, now_ms: int) -> SlotDecision:
        """Apply :func:`core.concurrency.acquire` to the stored slots by compare-and-set.

        Raises:
            BusUnavailable: NATS did not answer, or :data:`CAS_ATTEMPTS` writes lost the race.
        """
        sid = slot_id(request.owner, request.key)
        for _ in range(CAS_ATTEMPTS):
            state, revision = await self._get(sid)
            decision = acquire(state, request, now_ms, self.lease_ms)
            written = revision if decision.state == state else None
            if written is None and decision.state != state:
                written = await self._put(sid, decision.state, revision)
                if written is None:
                    continue
            if decision.outcome == Outcome.WAITING:
                # a write after this one must wake the waiter, even one the watch delivers
                # before the waiter calls changed()
                self._written[sid] = written or 0
            else:
                self._forget(sid)
            return decision
        raise BusUnavailable(f"slot {sid}: {CAS_ATTEMPTS} compare-and-set rounds lost")

    async def renew(self, request: SlotRequest, now_ms: int) -> None:
        """Re-lease the slot ``request`` holds (:func:`core.concurrency.renew`).

        Raises:
            BusUnavailable: as :meth:`acquire`.
        """
        sid = slot_id(request.owner, request.key)
        for _ in range(CAS_ATTEMPTS):
            state, revision = await self._get(sid)
            renewed = renew(state, request, now_ms, self.lease_ms)
            if await self._put(sid, renewed, revision) is not None:
                return
        raise BusUnavailable(f"slot {sid}: {CAS_ATTEMPTS} compare-and-set rounds lost")

    async def release(self, owner: str, key: str, execution_id: str, now_ms: int) -> None:
        """Give up the slot (or the place in line) of ``execution_id``; idempotent.

        Raises:
            BusUnavailable: as :meth:`acquire` (the slot then frees when its lease expires).
        """
        sid = slot_id(owner, key)
        for _ in range(CAS_ATTEMPTS):
            state, revision = await self._get(sid)
            after = release(state, execution_id, now_ms)
            if after is None or await self._put(sid, after, revision) is not None:
                self._forget(sid)
                return
        raise BusUnavailable(f"slot {sid}: {CAS_ATTEMPTS} compare-and-set rounds lost")

    def _forget(self, sid: str) -> None:
        """No run of this process waits on ``sid`` any more (unless one still sleeps on it)."""
        self._written.pop(sid, None)
        if sid not in self._changed:
            self._latest.pop(sid, None)

    async def changed(
        self, owner: str, key: str, timeout_seconds: float
    ) -> tuple[bool, SlotState | None]:
        """Wait until the entry of (owner, key) changes or ``timeout_seconds`` pass: ``(True,
        the state written)`` or ``(False, None)``. Needs :meth:`watch` running (without it,
        every wait times out, which is correct, only slower)."""
        sid = slot_id(owner, key)
        latest = self._latest.get(sid)
        if latest is not None and latest[0] > self._written.get(sid, 0):
            self._written[sid] = latest[0]
            return True, latest[1]
        event = asyncio.Event()
        waiters = self._changed.setdefault(sid, set())
        waiters.add(event)
        seen: SlotState | None = None
        try:
            async with asyncio.timeout(max(0.0, timeout_seconds)):
                await event.wait()
        except TimeoutError:
            return False, None
        finally:
            entry = self._latest.get(sid)
            if entry is not None:
                seen = entry[1]
                self._written[sid] = max(self._written.get(sid, 0), entry[0])
            waiters.discard(event)
            if not waiters and sid not in self._written:
                self._changed.pop(sid, None)
                self._latest.pop(sid, None)
        return True, seen

    async def watch(self) -> None:
        """Follow the bucket until cancelled, waking :meth:`changed` waiters; reconnects after
        NATS outages (every waiter then decides again: a missed change costs nothing but a
        read)."""
        while True:
            raise_if_cancelling()
            try:
                kv = await self.open()
                with translated("watch slots"):
                    watcher = await kv.watchall()
                try:
                    await self._follow(watcher)
                finally:
                    with contextlib.suppress(nats.errors.Error, BusUnavailable):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except (BusUnavailable, nats.errors.Error, TimeoutError) as e:
                log.warning("slot watch interrupted (%s); resuming", e)
                for events in self._changed.values():
                    for event in events:
                        event.set()
                await asyncio.sleep(1.0)

    async def _follow(self, watcher: KeyValue.KeyWatcher) -> None:
        while True:
            raise_if_cancelling()
            try:
                entry = await watcher.updates(timeout=5.0)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                continue
            if entry is None:
                self.ready.set()
                continue
            events = self._changed.get(entry.key)
            if not events and entry.key not in self._written:
                continue
            state = None
            if entry.value:
                with contextlib.suppress(msgspec.DecodeError):
                    state = _decode(entry.value)
            self._latest[entry.key] = (int(entry.revision or 0), state)
            for event in events or ():
                event.set()
