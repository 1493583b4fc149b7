"""Prometheus metrics of a jobsched process, and the two small actors that serve and feed them.

Every metric lives on the :class:`prometheus_client.CollectorRegistry` of one :class:`Metrics`
object, built by the wiring (:func:`jobsched.runtime.serve`) once per process and passed to the
actors; nothing is registered at import time and the client's global registry is never used.
Names carry the ``jobsched_`` prefix and their unit (seconds), labels are bounded: ``task`` (the
task catalog), ``queue`` (the queues a worker consumes), ``status`` and ``reason`` (fixed sets).
Job and execution ids never become labels.

The gateway serves the registry at ``GET /metrics`` (:func:`metrics_handler`); scheduler and
worker processes serve it on ``JOBSCHED_METRICS_PORT`` (:class:`MetricsServer`), together with
``/healthz`` and ``/readyz`` (:mod:`actors.health`). The list of metrics, with their meaning, is
in ``docs/metrics.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from actors.health import Check, healthz, readyz_handler
from core.errors import BusUnavailable
from core.ports import QueueDepth
from core.retry import raise_if_cancelling

log = logging.getLogger(__name__)

SCHEDULING_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Buckets of scheduling delays (seconds): 1 ms to 60 s."""

DURATION_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
"""Buckets of run durations (seconds): 1 ms to 1 h."""

SKIP_REASONS = ("misfire", "overlap", "orphan")
"""Values of the ``reason`` label of ``jobsched_skipped_runs_total`` (``other`` for the rest)."""

LEASE_LOSS_REASONS = ("fenced", "taken")
"""Values of the ``reason`` label of ``jobsched_lease_losses_total``."""
DEAD_LETTER_REASONS = ("undecodable", "rejected")
"""Values of the ``reason`` label of ``jobsched_dead_letters_total``."""

HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Buckets of HTTP request durations (seconds): 1 ms to 10 s."""

ROLE_METRICS: dict[str, tuple[str, ...]] = {
    "scheduler": (
        "schedule_to_publish",
        "dispatched_runs",
        "redispatched_runs",
        "skipped_runs",
        "held_runs",
        "heap_size",
        "owned_partitions",
        "lease_losses",
        "queue_depth",
        "pruned_runs",
        "prune_backlog",
    ),
    "recorder": ("events_recorded", "store_write_failures", "dead_letters"),
    "notifier": ("notification_attempts",),
    "worker": (
        "schedule_to_start",
        "run_duration",
        "runs",
        "retries",
        "redeliveries",
        "queue_depth",
    ),
    "gateway": (
        "ws_connections",
        "ws_catching_up",
        "ws_replayed_events",
        "ws_slow_consumers",
        "http_request_duration",
        "http_active_requests",
    ),
}
"""Which :class:`Metrics` attributes a process exports, by the roles it runs (the pruner runs
with the scheduler). Every process also exports ``jobsched_nats_disconnects_total`` and the
client library's ``process_*`` and ``python_*`` collectors. A metric of a role the process does
not run exists (its actor may still observe into it) but is not exported, so that an alert on,
say, ``jobsched_owned_partitions == 0`` never fires on a worker."""

UNKNOWN_TASK = "unknown"
"""``task`` label of runs whose task is not in the worker's catalog (or undecodable messages)."""


@dataclass(frozen=True, slots=True)
class TaskMetrics:
    """The per-task series, bound once per task so a run observes without a label lookup."""

    schedule_to_start: Histogram
    duration: Histogram
    retries: Counter
    succeeded: Counter
    failed: Counter
    cancelled: Counter


class Metrics:
    """Every jobsched metric, on a registry of its own (one instance per process).

    Args:
        roles: the roles of the process (keys of :data:`ROLE_METRICS`): only their metrics
            are exported. None: every role (a process running everything, tests).

    Raises:
        ValueError: an unknown role.

    Attributes:
        registry: the registry to expose (``generate_latest(metrics.registry)``): the metrics of
            :attr:`roles`, ``jobsched_nats_disconnects_total``, ``process_*`` and ``python_*``.
        schedule_to_publish: histogram, seconds from a run's scheduled time until JetStream
            acknowledged its message (scheduler).
        dispatched_runs / redispatched_runs: counters of runs published for the first time, and
            of lost runs re-published from the store (scheduler).
        skipped_runs: counter of occurrences that did not run, by ``reason`` (scheduler).
        held_runs: counter of runs held back by their owner's runs-per-minute quota (scheduler).
        heap_size / owned_partitions: gauges of the scheduler's state.
        schedule_to_start / run_duration / runs / retries: per ``task`` (worker).
        redeliveries: counter of deliveries with a delivery count above 1, by ``queue`` (worker).
        queue_depth: gauge of runs waiting or running, by ``queue`` (:class:`QueueDepthMonitor`).
        events_recorded / store_write_failures: counters of the recorder.
        lease_losses: counter of partition leases fenced or lost, by ``reason`` (scheduler).
        nats_disconnects: counter of unexpected losses of a NATS connection, by ``connection``
            (every process; see :meth:`nats_disconnected`).
        ws_connections / ws_catching_up / ws_slow_consumers: WebSocket connections open, those
            reading from the status stream, and those closed as slow consumers (gateway).
        ws_replayed_events: counter of events WebSocket subscriptions read from the stream
            (gateway).
        pruned_runs / prune_backlog: finished runs deleted by retention, and jobs waiting for
            it (the pruner).
        dead_letters: counter of status events the recorder set aside, by ``reason``.
        notification_attempts: counter of webhook delivery attempts, by ``status``
            (``delivered``, ``failed``; the notifier).
        http_request_duration / http_active_requests: the gateway's HTTP server metrics
            (OpenTelemetry semantic conventions, in Prometheus naming).
    """

    def __init__(self, roles: Collection[str] | None = None) -> None:
        unknown = set(roles or ()) - set(ROLE_METRICS)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}; known: {sorted(ROLE_METRICS)}")
        self.roles = frozenset(ROLE_METRICS if roles is None else roles)
        self.registry = CollectorRegistry()
        registry = None  # each family is registered below if a role of this process has it
        self.schedule_to_publish = Histogram(
            "jobsched_schedule_to_publish_seconds",
            "Seconds from a run's scheduled time until JetStream acknowledged its message "
            "(first publication; includes the job's jitter).",
            buckets=SCHEDULING_BUCKETS,
            registry=registry,
        )
        self.dispatched_runs = Counter(
            "jobsched_dispatched_runs_total",
            "Runs published to a work queue for the first time (acknowledged by JetStream).",
            registry=registry,
        )
        self.redispatched_runs = Counter(
            "jobsched_redispatched_runs_total",
            "Runs re-published from the store because their message was lost.",
            registry=registry,
        )
        self.skipped_runs = Counter(
            "jobsched_skipped_runs_total",
            "Occurrences that did not run, by reason (misfire, overlap, orphan).",
            ["reason"],
            registry=registry,
        )
        self.held_runs = Counter(
            "jobsched_quota_held_runs_total",
            "Due runs a scheduler held back because their owner was over the runs-per-minute "
            "quota (each is planned again when the quota allows; counted at every hold).",
            registry=registry,
        )
        self.heap_size = Gauge(
            "jobsched_heap_size",
            "Jobs in the scheduler's heap of next-run times (count).",
            registry=registry,
        )
        self.owned_partitions = Gauge(
            "jobsched_owned_partitions",
            "Partitions this scheduler owns (count).",
            registry=registry,
        )
        self.schedule_to_start = Histogram(
            "jobsched_schedule_to_start_seconds",
            "Seconds from a run's scheduled time until its first attempt started on a worker.",
            ["task"],
            buckets=SCHEDULING_BUCKETS,
            registry=registry,
        )
        self.run_duration = Histogram(
            "jobsched_run_duration_seconds",
            "Seconds an attempt of a run executed its task, whatever its outcome.",
            ["task"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.runs = Counter(
            "jobsched_runs_total",
            "Runs that ended, by task and final status (succeeded, failed, cancelled).",
            ["task", "status"],
            registry=registry,
        )
        self.retries = Counter(
            "jobsched_retries_total",
            "Failed attempts handed back for a retry, by task.",
            ["task"],
            registry=registry,
        )
        self.redeliveries = Counter(
            "jobsched_redeliveries_total",
            "Work deliveries with a delivery count above 1 (retries, ack-wait expiries, "
            "hand-backs), by queue.",
            ["queue"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "jobsched_queue_depth",
            "Runs in a work queue not yet acknowledged: waiting, waiting for a retry, or "
            "running (count).",
            ["queue"],
            registry=registry,
        )
        self.events_recorded = Counter(
            "jobsched_events_recorded_total",
            "Status events the recorder wrote to the store.",
            registry=registry,
        )
        self.store_write_failures = Counter(
            "jobsched_store_write_failures_total",
            "Failed attempts of the recorder to write a batch of status events to the store.",
            registry=registry,
        )
        self.lease_losses = Counter(
            "jobsched_lease_losses_total",
            "Partition leases this scheduler stopped dispatching: not renewed in time (fenced, "
            "until a renewal succeeds) or found gone or another scheduler's at renewal (taken).",
            ["reason"],
            registry=registry,
        )
        self.nats_disconnects = Counter(
            "jobsched_nats_disconnects_total",
            "Unexpected losses of a NATS connection of this process (network, server restart, "
            "cut by the server as a slow consumer), by connection.",
            ["connection"],
            registry=registry,
        )
        self.ws_connections = Gauge(
            "jobsched_ws_connections",
            "WebSocket connections (GET /ws) open on this gateway (count).",
            registry=registry,
        )
        self.ws_catching_up = Gauge(
            "jobsched_ws_catching_up",
            "WebSocket subscriptions reading from the status stream, resuming from a "
            "lastEventId or fallen behind the live feed (count).",
            registry=registry,
        )
        self.ws_replayed_events = Counter(
            "jobsched_ws_replayed_events_total",
            "Events read from the status stream for WebSocket subscriptions that resume from a "
            "lastEventId or fell behind (replay reads, all clients of this gateway).",
            registry=registry,
        )
        self.ws_slow_consumers = Counter(
            "jobsched_ws_slow_consumer_closes_total",
            "WebSocket connections closed with 4008: their client took no event for "
            "JOBSCHED_WS_STALL_SECONDS while events waited for it.",
            registry=registry,
        )
        for reason in LEASE_LOSS_REASONS:
            self.lease_losses.labels(reason=reason)
        self.pruned_runs = Counter(
            "jobsched_pruned_runs_total",
            "Finished runs (executions) deleted by the retention rules (history limit, maximum "
            "age).",
            registry=registry,
        )
        self.prune_backlog = Gauge(
            "jobsched_prune_backlog_jobs",
            "Jobs with newly finished runs waiting to be pruned (count).",
            registry=registry,
        )
        self.dead_letters = Counter(
            "jobsched_dead_letters_total",
            "Status events the recorder set aside as dead letters (stored in the store's "
            "dead_letters), by reason: undecodable (not a status event) or rejected (the store "
            "refuses its write for good).",
            ["reason"],
            registry=registry,
        )
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(reason=reason)
        self.notification_attempts = Counter(
            "jobsched_notification_attempts_total",
            "Webhook delivery attempts of run notifications, by status: delivered (a 2xx "
            "answer) or failed (another status, no answer, or a refused address).",
            ["status"],
            registry=registry,
        )
        for outcome in ("delivered", "failed"):
            self.notification_attempts.labels(status=outcome)
        self._skipped = {r: self.skipped_runs.labels(reason=r) for r in (*SKIP_REASONS, "other")}
        self._tasks: dict[str, TaskMetrics] = {}
        self.http_request_duration = Histogram(
            "http_server_request_duration_seconds",
            "Seconds the gateway took to answer an HTTP request, by method, route template and "
            "status code (OpenTelemetry's http.server.request.duration; /ws until the upgrade).",
            ["http_request_method", "http_route", "http_response_status_code"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )
        self.http_active_requests = Gauge(
            "http_server_active_requests",
            "HTTP requests the gateway is answering now, by method (count; OpenTelemetry's "
            "http.server.active_requests).",
            ["http_request_method"],
            registry=registry,
        )
        exported = {name for role in self.roles for name in ROLE_METRICS[role]}
        for name in sorted(exported):
            self.registry.register(getattr(self, name))
        self.registry.register(self.nats_disconnects)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def task(self, task_id: str) -> TaskMetrics:
        """The series of ``task_id``, created at zero on first use. Call it with catalog task
        names (or :data:`UNKNOWN_TASK`) only: every name becomes a label value."""
        bound = self._tasks.get(task_id)
        if bound is None:
            bound = self._tasks[task_id] = TaskMetrics(
                schedule_to_start=self.schedule_to_start.labels(task=task_id),
                duration=self.run_duration.labels(task=task_id),
                retries=self.retries.labels(task=task_id),
                succeeded=self.runs.labels(task=task_id, status="succeeded"),
                failed=self.runs.labels(task=task_id, status="failed"),
                cancelled=self.runs.labels(task=task_id, status="cancelled"),
            )
        return bound

    def nats_disconnected(self, connection: str) -> Callable[[], None]:
        """The callback that counts losses of the NATS connection ``connection`` (a bounded set
        of names: one per role), created at zero; pass it as ``Bus(on_disconnect=...)``."""
        return self.nats_disconnects.labels(connection=connection).inc

    def skipped(self, reason: str, count: int = 1) -> None:
        """Count ``count`` skipped occurrences; ``reason`` is a run's ``skipReason`` text, whose
        first word (``overlap: previous run … is still RUNNING`` → ``overlap``) is the label."""
        key = reason.partition(":")[0]
        self._skipped.get(key, self._skipped["other"]).inc(count)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """An aiohttp handler answering the Prometheus text exposition of ``registry``.

    Example::

        app.router.add_get("/metrics", metrics_handler(metrics.registry))
    """

    async def handler(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    return handler


class MetricsServer:
    """``GET /metrics``, ``GET /healthz`` and ``GET /readyz`` on their own port, for processes
    without the gateway (an actor). The health endpoints are those of :mod:`actors.health`, so
    a scheduler or worker carries the same Kubernetes probes as the gateway.

    Args:
        registry: what to expose.
        host / port: listen address; port 0 picks a free port (see :attr:`url`).
        checks: the readiness checks of ``/readyz`` by name (none: ready while serving).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        checks: Mapping[str, Check] | None = None,
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.checks: Mapping[str, Check] = checks or {}
        self.name = "metrics-server"
        self.ready = asyncio.Event()
        self.url = ""
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        self._stop.set()

    async def run(self) -> None:
        """Serve until :meth:`stop`.

        Raises:
            OSError: when the port cannot be bound.
        """
        app = web.Application()
        app.router.add_get("/metrics", metrics_handler(self.registry))
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz_handler(self.checks))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
            port = runner.addresses[0][1] if runner.addresses else self.port
            self.url = f"http://{self.host}:{port}/metrics"
            self.ready.set()
            log.info("metrics on %s", self.url)
            await self._stop.wait()
        finally:
            await runner.cleanup()


class QueueDepthMonitor:
    """Refreshes ``jobsched_queue_depth`` of ``queues`` from JetStream every ``interval_seconds``
    seconds (an actor; one per scheduler or worker process).

    The depth of a queue is its durable consumer's pending plus unacknowledged messages
    (:meth:`bus.nats.Bus.queue_depth`); a queue whose consumer does not exist yet (no worker
    ever consumed it) keeps its last value. NATS failures are retried at the next refresh.

    Args:
        bus: the work queues' depth (NATS: :class:`bus.nats.Bus`).
        queues: the queues to watch.
        metrics: where the gauge lives.
        interval_seconds: seconds between refreshes.
    """

    def __init__(
        self,
        bus: QueueDepth,
        queues: Sequence[str],
        metrics: Metrics,
        *,
        interval_seconds: float = 5.0,
    ) -> None:
        self.bus = bus
        self.queues = tuple(queues)
        self.metrics = metrics
        self.interval_seconds = interval_seconds
        self.name = "queue-depth"
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Stop after the refresh in hand (idempotent)."""
        self._stop.set()

    async def run(self) -> None:
        gauges = [(q, self.metrics.queue_depth.labels(queue=q)) for q in self.queues]
        self.ready.set()
        while not self._stop.is_set():
            raise_if_cancelling()
            for queue, gauge in gauges:
                try:
                    gauge.set(await self.bus.queue_depth(queue))
                except BusUnavailable as e:
                    log.debug("depth of queue %s unknown: %s", queue, e)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_seconds):
                    await self._stop.wait()
