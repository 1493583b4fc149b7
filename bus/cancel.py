"""Cancellation markers in a JetStream key-value bucket, watched by every worker.

Bucket ``<prefix>_cancel`` (history 1, ``max_age`` 24 h): ``j.<job id>`` means "no run of this
job may start or continue" (job cancelled or deleted); ``r.<run key>`` means "this run must
stop" (``overlapPolicy: replace``). Workers watch the bucket (initial values, then updates), so
a run that is already executing is cancelled cooperatively, and a queued run whose message
arrives later — at any worker, even one started after the marker — is not started.
Checked against nats-server 2.9 (KV watch = an ordered push consumer on the bucket's stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from bus.nats import Bus, translated
from core.errors import BusUnavailable
from core.ids import run_key
from core.retry import raise_if_cancelling

log = logging.getLogger(__name__)

MARKER_TTL_SECONDS = 86_400.0


class CancelMarkers:
    """Write and watch cancellation markers.

    Args:
        bus: connected NATS adapter.
        replicas: JetStream replicas of the bucket.
    """

    def __init__(self, bus: Bus, *, replicas: int = 1, create: bool = False) -> None:
        self.bus = bus
        self.create = create
        self.replicas = replicas
        self.name = f"{bus.config.prefix}_cancel"
        self._kv: KeyValue | None = None
        self.jobs: set[str] = set()
        self.runs: set[str] = set()
        self.ready = asyncio.Event()

    async def open(self) -> KeyValue:
        """The bucket: bound if it exists; else created when ``create`` (a scheduler's
        markers: the only role allowed to, :mod:`bus.auth`).

        Raises:
            BusUnavailable: NATS did not answer, or the bucket does not exist and this is not
                a scheduler's (one creates it at start-up).
        """
        if self._kv is None:
            self._kv = await self.bus.key_value(
                self.name,
                what="cancel bucket",
                ttl_seconds=MARKER_TTL_SECONDS,
                replicas=self.replicas,
                create=self.create,
            )
        return self._kv

    async def cancel_job(self, job_id: str) -> None:
        """Mark every run of ``job_id`` as cancelled (idempotent)."""
        kv = await self.open()
        with translated("mark job cancelled"):
            await kv.put(f"j.{job_id}", b"1")

    async def cancel_run(self, execution_id: str) -> None:
        """Mark one run as cancelled (idempotent)."""
        kv = await self.open()
        with translated("mark run cancelled"):
            await kv.put(f"r.{run_key(execution_id)}", b"1")

    def is_cancelled(self, job_id: str, execution_id: str) -> bool:
        return job_id in self.jobs or run_key(execution_id) in self.runs

    async def watch(self, on_marker: Callable[[str | None, str | None], None]) -> None:
        """Follow the bucket until cancelled; ``on_marker(job_id, run_key)`` for each new marker.

        Reconnects the watch after NATS outages; sets :attr:`ready` once the markers that
        existed at start are loaded.
        """
        while True:
            raise_if_cancelling()
            try:
                kv = await self.open()
                with translated("watch cancel markers"):
                    watcher = await kv.watchall(ignore_deletes=True)
                try:
                    await self._follow(watcher, on_marker)
                finally:
                    with contextlib.suppress(nats.errors.Error, BusUnavailable):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except (BusUnavailable, nats.errors.Error, TimeoutError) as e:
                log.warning("cancel-marker watch interrupted (%s); resuming", e)
                await asyncio.sleep(1.0)

    async def _follow(
        self, watcher: KeyValue.KeyWatcher, on_marker: Callable[[str | None, str | None], None]
    ) -> None:
        while True:
            raise_if_cancelling()
            try:
                entry = await watcher.updates(timeout=5.0)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                continue
            if entry is None:
                self.ready.set()
                continue
            key = entry.key
            if key.startswith("j."):
                self.jobs.add(key[2:])
                on_marker(key[2:], None)
            elif key.startswith("r."):
                self.runs.add(key[2:])
                on_marker(None, key[2:])
