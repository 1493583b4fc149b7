"""Recorder actor: writes status events from the status stream into the store.

Events are fetched in batches from the durable consumer ``recorder`` (shared by every recorder
in the deployment), applied in one store call, and acked only after the store committed them.
While the store is unavailable nothing is acked, so the events wait in JetStream and are
recorded when it is back. Transitions are conditional in the store, so redelivered or
out-of-order events never move a run backwards — which also makes any split of a batch safe.

The poison-message rule (what JetStream's max-deliver is for runs): one event that can never be
recorded must not hold back the events behind it, in this recorder or, redelivered, in the
next. A message that is not a status event, and an event the store refuses for good
(:class:`core.errors.StoreRejected`, found by halving the batch until it stands alone), is set
aside as a dead letter: stored with its reason and its bytes in the store's ``dead_letters``
(the store is where an operator already looks, it outlives the status stream's retention, and
the write is acked like any other), counted in ``jobsched_dead_letters_total{reason}``, logged
once, and acked. A store *outage* never dead-letters anything: it is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Literal

import msgspec

from actors.metrics import Metrics
from core.clock import Clock, SystemClock
from core.codecs import status_decoder
from core.errors import BusUnavailable, ConsumerMissing, StoreRejected, StoreUnavailable
from core.model import (
    DEAD_LETTER_MAX_BYTES,
    TERMINAL_EXECUTION_STATUSES,
    DeadLetter,
    ExecutionStatus,
    StatusEvent,
)
from core.ports import Consumer, Delivery, JobStore, RecorderBus
from core.retry import Backoff, RetryPolicy, raise_if_cancelling
from core.values import MAX_ERROR_CHARS, storable_text

log = logging.getLogger(__name__)

UNRECORDED = frozenset({ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED})
"""Run events the store holds already (the scheduler wrote them): published for live clients.
A SKIPPED event from a worker (``workerId`` set: ``concurrencyPolicy: skip``) is recorded."""

Entry = tuple[Delivery, StatusEvent]

FETCH_RETRY = RetryPolicy(first_seconds=1.0, max_seconds=1.0)
"""A failed fetch (NATS unreachable) is tried again every second."""

LINGER_SECONDS = 0.005
"""How long a recorder in a deployment waits, once a fetch handed it fewer events than a full
batch, for more before it writes (``jobsched.runtime``). Each store call costs a write
transaction (a thread hand-off, an fsync, the index pages of the rows it touches: ~0.2 ms of
CPU measured) whatever its size, so at a few hundred runs per second, when a fetch holds one
or two events, this makes the store calls several times fewer; a run's status reaches the
store at most this much later. The runs themselves are not delayed."""


class _Stopping(Exception):
    """Stop was requested while the store was unavailable: leave the batch unacked."""


class Recorder:
    """Records status events (see module docstring).

    Args:
        bus: the status stream and finished-run notices (NATS: :class:`bus.nats.Bus`).
        store: the job store.
        batch: most events applied per store call.
        ack_wait_seconds: the ack wait of the recorders' consumer (seconds); while the store is
            unavailable, in-progress acks keep the batch at least every third of it.
        metrics: where it counts recorded events, failed store writes and dead letters;
            default: a registry of its own.
        clock: wall clock (the time a dead letter was set aside).
        timer: what retry pauses and the linger are measured on; default: real time, whatever
            ``clock`` is (unit tests pass their fake clock).
        linger_seconds: once a fetch returned fewer events than ``batch``, wait this long
            (seconds) for more and write them together (see :data:`LINGER_SECONDS`); 0: write
            at once.
    """

    def __init__(
        self,
        bus: RecorderBus,
        store: JobStore,
        *,
        batch: int = 512,
        ack_wait_seconds: float = 30.0,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        timer: Clock | None = None,
        linger_seconds: float = 0.0,
    ) -> None:
        self.timer = timer or SystemClock()
        self.linger = timedelta(seconds=linger_seconds)
        self.bus = bus
        self.store = store
        self.batch = batch
        max_pause_seconds = min(5.0, ack_wait_seconds / 3)
        self._store_retry = RetryPolicy(
            first_seconds=min(0.2, max_pause_seconds), max_seconds=max_pause_seconds
        )
        self.name = "recorder"
        self.ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self.recorded = 0
        self.dead_lettered = 0
        self.metrics = metrics or Metrics()
        self.clock = clock or SystemClock()

    def stop(self) -> None:
        """Stop after the batch in hand (idempotent)."""
        self._stopping.set()

    async def run(self) -> None:
        if not await self.bus.wait_for_streams(self._stopping):
            return
        consumer = await self.bus.recorder_consumer()
        self.ready.set()
        backoff = Backoff(FETCH_RETRY, self.timer, stop=self._stopping, log=log)
        try:
            while not self._stopping.is_set():
                raise_if_cancelling()
                try:
                    deliveries = await consumer.fetch(self.batch, timeout_seconds=1.0)
                except ConsumerMissing as e:
                    log.warning("recorder: %s; re-creating it", e)
                    with contextlib.suppress(BusUnavailable):
                        await self.bus.ensure_recorder_consumer()  # the stream: a scheduler's
                    continue
                except BusUnavailable as e:
                    await backoff.wait("recorder", e)
                    continue
                backoff.reset()
                if deliveries:
                    await self._record([*deliveries, *await self._lingered(consumer, deliveries)])
        finally:
            for d in consumer.take_unprocessed():
                with contextlib.suppress(BusUnavailable):
                    await d.nak()
            await consumer.close()

    async def _lingered(self, consumer: Consumer, first: Sequence[Delivery]) -> Sequence[Delivery]:
        """The events that arrived within the linger after a partial batch ``first``; none
        without a linger, after a full batch, or when the fetch fails (the next one retries)."""
        room = self.batch - len(first)
        if not self.linger or room <= 0:
            return []
        await self.timer.sleep_until(self.timer.now() + self.linger, self._stopping)
        try:
            return await consumer.fetch(room, timeout_seconds=0.0)
        except (ConsumerMissing, BusUnavailable):
            return []

    async def _record(self, deliveries: Sequence[Delivery]) -> None:
        entries: list[Entry] = []
        letters: list[tuple[Delivery, DeadLetter]] = []
        for d in deliveries:
            try:
                event = status_decoder.decode(d.data)
            except msgspec.DecodeError as e:
                letters.append((d, self._letter(d, "undecodable", f"not a status event: {e}")))
                continue
            if isinstance(event, StatusEvent) and (
                event.status not in UNRECORDED or event.worker_id is not None
            ):
                entries.append((d, event))
        try:
            rejected = await self._apply(entries, deliveries)
            rejected_ids = {id(ev) for _, ev, _ in rejected}
            letters += [(d, self._letter(d, "rejected", why, ev)) for d, ev, why in rejected]
            refused = await self._set_aside(letters, deliveries)
        except _Stopping:
            return
        events = [ev for _, ev in entries if id(ev) not in rejected_ids]
        self.recorded += len(events)
        self.metrics.events_recorded.inc(len(events))
        finished = sorted({e.job_id for e in events if e.status in TERMINAL_EXECUTION_STATUSES})
        if finished:
            with contextlib.suppress(BusUnavailable):
                await self.bus.publish_finished(finished)
        for d in deliveries:
            with contextlib.suppress(BusUnavailable):
                await (d.term() if d in refused else d.ack())

    async def _apply(
        self, entries: list[Entry], deliveries: Sequence[Delivery]
    ) -> list[tuple[Delivery, StatusEvent, str]]:
        """Apply ``entries``; return those the store refuses for good, each with the reason.

        A refused batch is halved until every refused event stands alone (about 2·log2(batch)
        store calls per poisoned event); the halves that go through are recorded as they are.
        """
        if not entries:
            return []
        try:
            await self._retrying(
                lambda: self.store.apply_events([ev for _, ev in entries]), deliveries
            )
            return []
        except StoreRejected as e:
            if len(entries) == 1:
                d, ev = entries[0]
                return [(d, ev, e.message)]
        mid = len(entries) // 2
        return await self._apply(entries[:mid], deliveries) + await self._apply(
            entries[mid:], deliveries
        )

    async def _set_aside(
        self, letters: list[tuple[Delivery, DeadLetter]], deliveries: Sequence[Delivery]
    ) -> set[Delivery]:
        """Store ``letters``, count and log each once; the deliveries whose letter even the
        dead-letter store refuses, which are terminated instead (they stay in the status stream
        until its retention)."""
        if not letters:
            return set()
        refused: set[Delivery] = set()
        try:
            await self._retrying(
                lambda: self.store.dead_letter([x for _, x in letters]), deliveries
            )
        except StoreRejected:
            for d, x in letters:  # every letter is storable by construction; find the one
                try:
                    await self._retrying(functools.partial(self.store.dead_letter, [x]), deliveries)
                except StoreRejected as e:
                    log.critical(
                        "recorder: cannot store dead letter %s (%s); terminating the message, "
                        "which stays in the status stream until its retention",
                        x.id,
                        e,
                    )
                    refused.add(d)
        for _, x in letters:
            self.dead_lettered += 1
            self.metrics.dead_letters.labels(reason=x.reason).inc()
            log.error(
                "recorder: status event %s set aside as a dead letter (%s: %s); the events "
                "behind it are recorded",
                x.id,
                x.reason,
                x.error,
                extra={"execution_id": x.execution_id, "job_id": x.job_id},
            )
        return refused

    async def _retrying(
        self, write: Callable[[], Awaitable[object]], deliveries: Sequence[Delivery]
    ) -> None:
        """``write()`` until it is not :class:`StoreUnavailable`, with backoff, keeping
        ``deliveries`` from being redelivered meanwhile.

        Raises:
            StoreRejected: from ``write``.
            _Stopping: the recorder is stopping while the store is unavailable.
        """
        backoff = Backoff(self._store_retry, self.timer, stop=self._stopping, log=log)
        while True:
            raise_if_cancelling()
            try:
                await write()
                return
            except StoreUnavailable as e:
                self.metrics.store_write_failures.inc()
                if self._stopping.is_set():
                    raise _Stopping from None
                for d in deliveries:
                    with contextlib.suppress(BusUnavailable):
                        await d.in_progress()
                await backoff.wait("recorder: store unavailable", e)

    def _letter(
        self,
        d: Delivery,
        reason: Literal["undecodable", "rejected"],
        error: str,
        event: StatusEvent | None = None,
    ) -> DeadLetter:
        return DeadLetter(
            id=d.stored_id,
            source=self.name,
            reason=reason,
            error=storable_text(error, MAX_ERROR_CHARS),
            subject=storable_text(d.subject),
            data=d.data[:DEAD_LETTER_MAX_BYTES],
            size=len(d.data),
            at=self.clock.now(),
            execution_id=None if event is None else storable_text(event.execution_id),
            job_id=None if event is None else storable_text(event.job_id),
            owner=None if event is None else storable_text(event.owner),
        )
