"""A worker's status reports, published together: one round trip for the reports of every run
that ended meanwhile instead of one per report.

A report goes out as soon as no batch is in flight: alone when the worker is quiet (no timer,
so no added latency), together with those that came while the previous batch awaited its
PubAck when it is busy. Each caller still waits until its own report is acknowledged by
JetStream, so the worker acks a run's message only after its outcome is stored (at-least-once
is unchanged); a report the bus refused is the caller's to retry, alone.
"""

from __future__ import annotations

import asyncio
import logging

from core.errors import BusUnavailable
from core.model import StatusEvent
from core.ports import StatusReports

log = logging.getLogger(__name__)

REPORT_BATCH_MAX = 256
"""Most reports in one :meth:`core.ports.StatusReports.publish_statuses` call."""


class ReportBatcher:
    """Publishes concurrent status reports in batches (see module docstring).

    Args:
        bus: the status stream.
        name: for the log and the task name.
        max_batch: most reports per batch.
    """

    def __init__(self, bus: StatusReports, name: str, *, max_batch: int = REPORT_BATCH_MAX) -> None:
        self.bus = bus
        self.name = name
        self.max_batch = max_batch
        self._pending: list[tuple[StatusEvent, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._running = False

    async def publish(self, event: StatusEvent) -> None:
        """Store ``event``: with the batch that goes out next, or straight away if :meth:`run`
        is not running.

        Raises:
            BusUnavailable: not acknowledged (the caller retries).
        """
        if not self._running:
            await self.bus.publish_status(event)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((event, fut))
        self._wake.set()
        await fut

    async def run(self) -> None:
        """Publish batches until cancelled; then fail what it still holds (its callers retry,
        straight to the bus)."""
        self._running = True
        in_flight: list[tuple[StatusEvent, asyncio.Future[None]]] = []
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending:
                    in_flight = [(e, f) for e, f in self._pending[: self.max_batch] if not f.done()]
                    del self._pending[: self.max_batch]
                    if not in_flight:
                        continue
                    results = await self.bus.publish_statuses([e for e, _ in in_flight])
                    for (_, fut), error in zip(in_flight, results, strict=True):
                        if fut.done():
                            continue
                        if error is None:
                            fut.set_result(None)
                        else:
                            fut.set_exception(error)
                    in_flight = []
        finally:
            self._running = False
            stopped = BusUnavailable(f"{self.name}: stopped before the report was published")
            for _, fut in in_flight + self._pending:
                if not fut.done():
                    fut.set_exception(stopped)
            self._pending.clear()
