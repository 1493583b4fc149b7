"""Recorder actor: writes status events from the status stream into the store.

Events are fetched in batches from the durable consumer ``recorder`` (shared by every recorder
in the deployment), applied in one store call, and acked only after the store committed them.
While the store is unavailable nothing is acked, so the events wait in JetStream and are
recorded when it is back. Transitions are conditional in the store, so redelivered or
out-of-order events never move a run backwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from actors.metrics import Metrics
from bus.nats import Bus, ConsumerMissing, Delivery, raise_if_cancelling, status_decoder
from core.errors import BusUnavailable, StoreUnavailable
from core.model import TERMINAL_EXECUTION_STATUSES, ExecutionStatus, StatusEvent
from core.ports import JobStore

log = logging.getLogger(__name__)

UNRECORDED = frozenset({ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED})
"""Run events the store holds already (the scheduler wrote them): published for live clients."""


class Recorder:
    """Records status events (see module docstring).

    Args:
        bus: connected NATS adapter.
        store: the job store.
        batch: most events applied per store call.
        ack_wait_s: the ack wait of the recorders' consumer (seconds); while the store is
            unavailable, in-progress acks keep the batch at least every third of it.
        metrics: where it counts recorded events and failed store writes; default: a registry
            of its own.
    """

    def __init__(
        self,
        bus: Bus,
        store: JobStore,
        *,
        batch: int = 512,
        ack_wait_s: float = 30.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.batch = batch
        self._max_pause_s = min(5.0, ack_wait_s / 3)
        self.name = "recorder"
        self.ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self.recorded = 0
        self.metrics = metrics or Metrics()

    def stop(self) -> None:
        """Stop after the batch in hand (idempotent)."""
        self._stopping.set()

    async def run(self) -> None:
        consumer = await self.bus.recorder_consumer()
        self.ready.set()
        try:
            while not self._stopping.is_set():
                raise_if_cancelling()
                try:
                    deliveries = await consumer.fetch(self.batch, timeout_s=1.0)
                except ConsumerMissing as e:
                    log.warning("recorder: %s; re-creating it", e)
                    with contextlib.suppress(BusUnavailable):
                        await self.bus.ensure_streams()
                        await self.bus.ensure_recorder_consumer()
                    continue
                except BusUnavailable as e:
                    log.warning("recorder: %s", e)
                    await self._pause(1.0)
                    continue
                if deliveries:
                    await self._record(deliveries)
        finally:
            for d in consumer.take_unprocessed():
                with contextlib.suppress(BusUnavailable):
                    await d.nak()
            await consumer.close()

    async def _record(self, deliveries: list[Delivery]) -> None:
        events: list[StatusEvent] = []
        good: list[Delivery] = []
        for d in deliveries:
            try:
                event = status_decoder.decode(d.data)
                good.append(d)
                if isinstance(event, StatusEvent) and event.status not in UNRECORDED:
                    events.append(event)
            except msgspec.DecodeError as e:
                log.error("terminating undecodable status event: %s", e)
                with contextlib.suppress(BusUnavailable):
                    await d.term()
        deliveries = good
        delay = min(0.2, self._max_pause_s)
        while True:
            raise_if_cancelling()
            try:
                await self.store.apply_events(events)
                break
            except StoreUnavailable as e:
                self.metrics.store_write_failures.inc()
                if self._stopping.is_set():
                    return
                log.warning("recorder: store unavailable (%s); retrying in %.1f s", e, delay)
                for d in deliveries:
                    with contextlib.suppress(BusUnavailable):
                        await d.in_progress()
                await self._pause(delay)
                delay = min(delay * 2, self._max_pause_s)
        self.recorded += len(events)
        self.metrics.events_recorded.inc(len(events))
        finished = sorted({e.job_id for e in events if e.status in TERMINAL_EXECUTION_STATUSES})
        if finished:
            with contextlib.suppress(BusUnavailable):
                await self.bus.publish_finished(finished)
        for d in deliveries:
            with contextlib.suppress(BusUnavailable):
                await d.ack()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
