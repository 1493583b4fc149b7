"""Wiring: build stores, buses and actors from :class:`Settings` and run them until stopped.

The CLI is the only caller; it reads the environment, configures logging, installs signal
handlers and passes a ``stop`` event in. Every role shuts down in two phases: stop intake and
drain in-flight work up to the drain timeout, then cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec
from aiohttp import web

from actors.health import Check, started
from actors.metrics import Metrics, MetricsServer, QueueDepthMonitor
from actors.notifier import Notifier
from actors.ownership import CLUSTER_MIN_TTL_SECONDS, LeaseOwnership
from actors.recorder import LINGER_SECONDS, Recorder
from actors.retention import Pruner
from actors.scheduler import Scheduler
from actors.worker import Worker
from bus.auth import Credentials, credentials_file_name, read_credentials
from bus.callout import AuthCallout, Authenticate, Grant, Issuer, read_issuer
from bus.cancel import CancelMarkers
from bus.cluster import ClusterReader
from bus.inspect import BusInspector
from bus.leases import LeaseBucket
from bus.micro import MicroHost
from bus.nats import Bus, BusConfig
from bus.notifier import NotifierStream
from bus.presence import PresenceBucket
from bus.slots import SlotBucket
from bus.status import LiveStream
from bus.tls import client_context
from core.clock import Clock, SystemClock
from core.errors import ConfigError
from core.ports import JobStore
from core.settings import NatsConfig, Settings
from core.tasks import TaskCatalog
from gateway.app import RUNS, SERVICE, GatewayDeps, create_app
from gateway.auth import principal_and_expiry
from gateway.natsapi import NatsApi
from gateway.server import GatewayRunner
from jobsched.datadir import write_private
from jobsched.webhooks import AiohttpSender
from store import create_store

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_SECRET_BYTES = 32


class Actor(Protocol):
    name: str
    ready: asyncio.Event

    async def run(self) -> None: ...

    def stop(self) -> None: ...


def load_catalog(ref: str) -> TaskCatalog:
    """Call the ``module:callable`` named by the ``tasks`` setting.

    Raises:
        ConfigError: when it cannot be imported or does not return a TaskCatalog.
    """
    module_name, _, attr = ref.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"JOBSCHED_TASKS={ref}: cannot load it ({e})") from None
    catalog = factory()
    if not isinstance(catalog, TaskCatalog):
        raise ConfigError(
            f"JOBSCHED_TASKS={ref} returned {type(catalog).__name__}, not a TaskCatalog"
        )
    return catalog


def auth_secret(settings: Settings, *, create_in: Path | None = None) -> str:
    """The token-signing key: ``JOBSCHED_AUTH_SECRET``, or (dev only) one kept in the data dir.

    Raises:
        ConfigError: when unset outside dev, or shorter than 32 bytes (RFC 7518 §3.2).
    """
    secret = settings.gateway.auth_secret
    if not secret and create_in is not None:
        path = create_in / "auth-secret"
        if not path.exists():
            create_in.mkdir(parents=True, exist_ok=True)
            write_private(path, secrets.token_hex(32))
        secret = path.read_text().strip()
    if not secret:
        raise ConfigError("JOBSCHED_AUTH_SECRET is not set; set it to a random string of 32+ bytes")
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ConfigError(f"JOBSCHED_AUTH_SECRET must be at least {MIN_SECRET_BYTES} bytes long")
    return secret


def nats_credentials(nats: NatsConfig, connection: str) -> Credentials | None:
    """The NATS user of ``connection`` (a :class:`Connection` name): its file in
    ``JOBSCHED_NATS_CREDENTIALS_DIR``, else ``JOBSCHED_NATS_CREDENTIALS_FILE``, else None.

    Raises:
        ConfigError: both settings are set, the connection's file is missing, or a file is not
            a readable credentials file (the message names it, never its content).
    """
    directory, file = nats.credentials_dir, nats.credentials_file
    if directory and file:
        raise ConfigError(
            "set JOBSCHED_NATS_CREDENTIALS_DIR (a file per connection) or "
            "JOBSCHED_NATS_CREDENTIALS_FILE (one for all), not both"
        )
    if directory:
        path = Path(directory) / credentials_file_name(connection)
        if not path.exists():
            raise ConfigError(
                f"JOBSCHED_NATS_CREDENTIALS_DIR={directory} has no {path.name}, the NATS user "
                f"of this process's {connection} connection"
            )
        return read_credentials(path)
    return read_credentials(file) if file else None


def bus_config(
    nats: NatsConfig, servers: str | None = None, connection: str = "scheduler"
) -> BusConfig:
    """The :class:`BusConfig` of the NATS connection ``connection`` of a process with the
    settings ``nats`` (``servers``: other URLs than ``nats.url``): its user
    (:func:`nats_credentials`) and TLS context.

    Raises:
        ConfigError: its credentials (:func:`nats_credentials`) or TLS files
            (:func:`bus.tls.client_context`).
    """
    return BusConfig(
        servers=(msgspec.structs.replace(nats, url=servers) if servers else nats).servers,
        prefix=nats.subject_prefix,
        ack_wait_seconds=nats.ack_wait_seconds,
        recorder_ack_wait_seconds=nats.recorder_ack_wait_seconds,
        max_deliver=nats.max_deliver,
        duplicate_window_seconds=nats.duplicate_window_seconds,
        status_retention_seconds=nats.status_retention_seconds,
        replicas=nats.stream_replicas,
        credentials=nats_credentials(nats, connection),
        tls=client_context(
            ca_file=nats.tls_ca_file, cert_file=nats.tls_cert_file, key_file=nats.tls_key_file
        ),
    )


@asynccontextmanager
async def opened_store(settings: Settings) -> AsyncIterator[JobStore]:
    url, timeout_seconds = settings.resolved_store_url, settings.store.timeout_seconds
    store = create_store(url, timeout_seconds=timeout_seconds)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


class Connection(StrEnum):
    """The NATS connections of a process: one per role it runs.

    Each is a client of its own on the server, named ``jobsched-<connection>``, so that no
    role's traffic can delay another's or get its connection cut (nats-server cuts a connection
    whose outbound buffer passes ``max_pending`` as a slow consumer, and with it everything that
    used it), and so that each role can authenticate as itself.
    """

    GATEWAY = "gateway"
    """The HTTP and NATS API: job notices, manual runs, job-cancel markers, readiness."""
    LIVE = "live"
    """The gateway's ``GET /ws``: the status feed and the replays of its WebSocket clients."""
    SCHEDULER = "scheduler"
    """Dispatch, partition leases, run-cancel markers, queue depth."""
    RECORDER = "recorder"
    """The status stream's ``recorder`` consumer and finished-run notices."""
    WORKER = "worker"
    """The work consumers, status reports, the cancel-marker watch, queue depth."""
    NOTIFIER = "notifier"
    """The status stream's ``notifier`` consumer (:mod:`actors.notifier`)."""
    CALLOUT = "callout"
    """The gateway's NATS auth callout service (:mod:`bus.callout`), when
    ``JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE`` is set: the server's authorization requests."""


def connections_of(roles: Roles, *, callout: bool = False) -> list[Connection]:
    """The NATS connections a process of ``roles`` opens, in opening order; ``callout``: the
    gateway runs the auth callout service."""
    wanted = {
        Connection.GATEWAY: roles.gateway,
        Connection.LIVE: roles.gateway,
        Connection.SCHEDULER: roles.scheduler,
        Connection.RECORDER: roles.runs_recorder,
        Connection.WORKER: roles.worker,
        Connection.NOTIFIER: roles.notifier,
        Connection.CALLOUT: roles.gateway and callout,
    }
    return [c for c in Connection if wanted[c]]


@asynccontextmanager
async def connected_bus(
    settings: Settings,
    connection: Connection,
    servers: str | None = None,
    metrics: Metrics | None = None,
) -> AsyncIterator[Bus]:
    """The connection ``connection``, open for the block (drained and closed after it).

    Raises:
        BusUnavailable: NATS did not answer within 10 s.
        ConfigError: its credentials (:func:`nats_credentials`).
    """
    on_disconnect = metrics.nats_disconnected(connection) if metrics is not None else None
    bus = Bus(
        bus_config(settings.nats, servers, connection),
        name=f"jobsched-{connection}",
        on_disconnect=on_disconnect,
    )
    await bus.connect()
    try:
        yield bus
    finally:
        await bus.close()


async def prepare_bus(settings: Settings, buses: dict[Connection, Bus]) -> bool:
    """A scheduler process creates or updates the streams and buckets on its scheduler
    connection (the only role allowed to, :mod:`bus.auth`); the other roles wait for them
    where they need them (a worker or recorder before it is ready; a gateway answers 503 for
    what needs them until then). Returns True once done."""
    scheduler = buses.get(Connection.SCHEDULER)
    if scheduler is not None:
        await scheduler.ensure_streams()
        await CancelMarkers(scheduler, replicas=settings.nats.stream_replicas, create=True).open()
        await SlotBucket(scheduler, replicas=settings.nats.stream_replicas, create=True).open()
        await PresenceBucket(scheduler, replicas=settings.nats.stream_replicas).create()
    return True


async def open_connections(
    settings: Settings,
    roles: Roles,
    stack: AsyncExitStack,
    stop: asyncio.Event,
    servers: str | None,
    metrics: Metrics,
) -> dict[Connection, Bus] | None:
    """Open :func:`connections_of` ``roles`` on ``stack`` (closed with it) and
    :func:`prepare_bus`; None if ``stop`` was set first."""
    buses: dict[Connection, Bus] = {}
    callout = bool(settings.nats.callout_issuer_seed_file)
    for connection in connections_of(roles, callout=callout):
        opening = stack.enter_async_context(connected_bus(settings, connection, servers, metrics))
        bus = await until_stopped(opening, stop)
        if bus is None:
            return None
        buses[connection] = bus
    if not await until_stopped(prepare_bus(settings, buses), stop):
        return None
    return buses


@dataclass
class Gateway:
    """The HTTP server as an actor."""

    app: web.Application
    host: str
    port: int
    name: str = "gateway"

    def __post_init__(self) -> None:
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()
        self.url = ""

    async def run(self) -> None:
        runner = GatewayRunner(self.app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            port = runner.addresses[0][1] if runner.addresses else self.port
            self.url = f"http://{self.host}:{port}"
            self.ready.set()
            log.info("gateway listening on %s", self.url)
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        self._stop.set()


def metrics_actors(
    settings: Settings,
    roles: Roles,
    buses: dict[Connection, Bus],
    metrics: Metrics,
    *,
    store: JobStore | None = None,
    peers: Sequence[Actor] = (),
) -> list[Actor]:
    """The queue-depth monitor of a scheduler or worker process (scheduler processes report
    their ``JOBSCHED_QUEUES`` too, so the gauge exists while no worker runs), on the scheduler's
    connection or else the worker's, and the metrics server of a process without the gateway
    when ``metrics_port`` is set.

    The metrics server's ``/readyz`` passes once every actor of ``peers`` (the process's actor
    list, read at each request) is ready and every NATS connection of the process and, when the
    process has one, the store answer."""
    actors: list[Actor] = []
    bus = buses.get(Connection.SCHEDULER) or buses.get(Connection.WORKER)
    if bus is not None:
        queues, interval = settings.worker.queues, settings.metrics.queue_depth_interval_seconds
        actors.append(QueueDepthMonitor(bus, queues, metrics, interval_seconds=interval))
    if settings.metrics.port and not roles.gateway:
        connections = tuple(buses.values())

        async def ping_nats() -> None:
            for connection in connections:
                await connection.ping()

        checks: dict[str, Check] = {"startup": started(peers), "nats": ping_nats}
        if store is not None:
            checks["store"] = store.ping
        server = MetricsServer(
            metrics.registry, settings.http.host, settings.metrics.port, checks=checks
        )
        actors.append(server)
    return actors


async def run_actors(actors: list[Actor], stop: asyncio.Event) -> None:
    """Run ``actors`` until ``stop`` is set or one of them fails; then stop them all.

    When an actor fails, every actor is asked to :meth:`~Actor.stop` before the task group
    cancels them: on Python 3.11 a cancellation can be lost inside ``asyncio.wait_for`` (used by
    nats-py) when it races with a reply, and an actor that missed it would keep the process
    alive forever; the cooperative stop ends it anyway.
    """

    def stop_all() -> None:
        for a in actors:
            a.stop()

    async def guarded(actor: Actor) -> None:
        try:
            await actor.run()
        except BaseException:
            stop_all()
            raise

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(guarded(a), name=a.name) for a in actors]

        async def stopper() -> None:
            waiter = tg.create_task(stop.wait(), name="stop-signal")
            await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stop_all()

        tg.create_task(stopper(), name="stopper")


@dataclass
class Roles:
    """Which roles a process runs. The recorder (status events → store) runs wherever the
    scheduler runs unless ``recorder`` says otherwise."""

    gateway: bool = False
    scheduler: bool = False
    worker: bool = False
    recorder: bool | None = None
    notifier: bool = False

    @property
    def runs_recorder(self) -> bool:
        return self.scheduler if self.recorder is None else self.recorder

    @property
    def names(self) -> frozenset[str]:
        """The roles by name (``gateway``, ``scheduler``, ``recorder``, ``worker``)."""
        on = {
            "gateway": self.gateway,
            "scheduler": self.scheduler,
            "recorder": self.runs_recorder,
            "worker": self.worker,
            "notifier": self.notifier,
        }
        return frozenset(name for name, yes in on.items() if yes)


def make_scheduler(
    settings: Settings,
    store: JobStore,
    bus: Bus,
    clock: Clock,
    markers: CancelMarkers,
    metrics: Metrics,
) -> list[Actor]:
    """A scheduler that shares the partitions with its peers through leases, and the pruner
    that applies the retention rules to the same partitions.

    Raises:
        ConfigError: the lease TTL is below :data:`CLUSTER_MIN_TTL_SECONDS` and NATS is a cluster.
    """
    cluster, config = bus.cluster_name, settings.scheduler
    ttl_seconds = config.lease_ttl_seconds
    if cluster and ttl_seconds < CLUSTER_MIN_TTL_SECONDS:
        raise ConfigError(
            f"JOBSCHED_LEASE_TTL_SECONDS={ttl_seconds:g} is too short for the "
            f"NATS cluster {cluster!r}: a JetStream leader election would let every lease "
            f'expire; set it to at least {CLUSTER_MIN_TTL_SECONDS:g} (README "High availability")'
        )
    member = config.resolved_scheduler_id
    ownership = LeaseOwnership(
        LeaseBucket(bus, ttl_seconds=ttl_seconds, replicas=settings.nats.stream_replicas),
        member,
        config.partitions,
        ttl_seconds=ttl_seconds,
        metrics=metrics,
    )
    pruner = Pruner(store, bus, clock, settings.retention, ownership=ownership, metrics=metrics)
    scheduler = Scheduler(
        store,
        bus,
        clock,
        config,
        ownership=ownership,
        scheduler_id=member,
        markers=markers,
        metrics=metrics,
        on_finished_records=pruner.mark,
    )
    return [scheduler, pruner]


async def until_stopped(starting: Awaitable[T], stop: asyncio.Event) -> T | None:
    """Await a start-up step unless ``stop`` is set first (then cancel it and return None)."""
    step = asyncio.ensure_future(starting)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({step, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if step.done():
        return step.result()
    step.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await step
    return None


@dataclass(frozen=True)
class Parts:
    """What a process's actors are built from: its settings, NATS connections and store."""

    settings: Settings
    buses: dict[Connection, Bus]
    store: JobStore | None
    catalog: TaskCatalog | None
    clock: Clock
    metrics: Metrics

    def markers(self, connection: Connection) -> CancelMarkers:
        return CancelMarkers(
            self.buses[connection],
            replicas=self.settings.nats.stream_replicas,
            create=connection is Connection.SCHEDULER,
        )

    def scheduler(self) -> list[Actor]:
        """The scheduler and its pruner (:func:`make_scheduler`)."""
        assert self.store is not None
        bus, markers = self.buses[Connection.SCHEDULER], self.markers(Connection.SCHEDULER)
        return make_scheduler(self.settings, self.store, bus, self.clock, markers, self.metrics)

    def worker(self) -> Worker:
        assert self.catalog is not None
        bus, config = self.buses[Connection.WORKER], self.settings.worker
        markers = self.markers(Connection.WORKER)
        slots = SlotBucket(bus, lease_seconds=config.slot_lease_seconds)
        return Worker(
            bus,
            self.catalog,
            self.clock,
            config,
            markers,
            metrics=self.metrics,
            slots=slots,
            presence=PresenceBucket(bus),
        )


async def notifier_actor(parts: Parts, stack: AsyncExitStack) -> Notifier:
    """The notifier on its own connection; its webhook sender (closed with ``stack``) is
    guarded by the workers' egress setting (``JOBSCHED_HTTP_ALLOWED_NETWORKS``)."""
    assert parts.store is not None
    sender = AiohttpSender(parts.settings.worker.egress)
    stack.push_async_callback(sender.close)
    bus = NotifierStream(parts.buses[Connection.NOTIFIER])
    return Notifier(bus, parts.store, sender, clock=parts.clock, metrics=parts.metrics)


def gateway_actors(parts: Parts, secret: str) -> tuple[Gateway, NatsApi]:
    """The HTTP gateway (API on the gateway connection, ``/ws`` on the live one) and the NATS
    API service."""
    assert parts.store is not None and parts.catalog is not None
    settings, api_bus = parts.settings, parts.buses[Connection.GATEWAY]
    deps = GatewayDeps(
        parts.store,
        api_bus,
        parts.catalog,
        parts.clock,
        msgspec.structs.replace(settings.gateway, auth_secret=secret),
        parts.markers(Connection.GATEWAY),
        parts.metrics.registry,
        live_status=LiveStream(parts.buses[Connection.LIVE]),
        metrics=parts.metrics,
        inspector=BusInspector(api_bus),
        cluster=ClusterReader(
            api_bus,
            lease_ttl_seconds=settings.scheduler.lease_ttl_seconds,
            partitions=settings.scheduler.partitions,
            queues=settings.worker.queues,
        ),
    )
    app = create_app(deps)
    return Gateway(app, settings.http.host, settings.http.port), NatsApi(
        MicroHost(api_bus), app[SERVICE], secret, app[RUNS]
    )


def token_authenticator(secret: str) -> Authenticate:
    """The auth callout's check of a bearer token: the gateway's own (:mod:`gateway.auth`)."""

    def authenticate(token: str) -> Grant:
        principal, expires_at = principal_and_expiry(token, secret)
        return Grant(principal.user, expires_at)

    return authenticate


def callout_issuer(settings: Settings, roles: Roles) -> Issuer | None:
    """The auth callout's issuer when this process runs a gateway and
    ``JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE`` is set; else None (no callout). Read before any
    connection opens, so a bad file fails the start.

    Raises:
        ConfigError: the seed file cannot be read or holds no account seed.
    """
    seed_file = settings.nats.callout_issuer_seed_file
    return read_issuer(seed_file) if roles.gateway and seed_file else None


def callout_actors(parts: Parts, secret: str, issuer: Issuer | None) -> list[Actor]:
    """The NATS auth callout service on the callout connection, given an ``issuer``."""
    if issuer is None:
        return []
    return [AuthCallout(parts.buses[Connection.CALLOUT], issuer, token_authenticator(secret))]


def freeze_startup_heap() -> int:
    """Collect garbage, then move every object still alive to the collector's permanent
    generation (:func:`gc.freeze`), which no later collection scans; how many were frozen.

    A service process starts with tens of thousands of objects that live as long as it does
    (modules, the task catalog, connections: ~70,000 in a one-process deployment), and each of
    Python's full collections, every few seconds under load, scanned them all with the event
    loop stopped: 30 to 60 ms, the largest schedule-to-start delays at 500 runs/s
    (bench/README.md, "The night of 2026-12-07/08"). Frozen, one takes 1 to 3 ms.

    Only for a process's entry point, once: an object frozen here that later becomes part of a
    reference cycle is never freed (a bounded, one-time cost: what was alive at readiness), so a
    process that starts many stacks (the test suite) must not call it. The ``gc.collect()``
    first is the one full pass it costs. Objects that become long-lived after it are scanned as
    before: a process whose live heap grows far past its start-up one pays for it again.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def serve(
    settings: Settings,
    roles: Roles,
    stop: asyncio.Event,
    *,
    servers: str | None = None,
    clock: Clock | None = None,
    started: asyncio.Future[dict[str, str]] | None = None,
    secret_dir: Path | None = None,
    freeze_heap: bool = False,
) -> None:
    """Run the given roles in this process until ``stop`` is set.

    ``started`` (if given) receives ``{"url": gateway URL}`` once every actor is ready, plus
    ``{"metrics_url": ...}`` when a metrics server runs. Every role of the process observes into
    one :class:`Metrics` registry, served by the gateway's ``/metrics`` or, in a process without
    the gateway, by a :class:`MetricsServer` on ``settings.metrics.port`` (0: none).
    ``freeze_heap``: once every actor is ready, :func:`freeze_startup_heap` (the service
    commands set it: ``jobsched dev|gateway|scheduler|worker|notifier``; never a process that
    runs ``serve`` more than once).
    """
    clock = clock or SystemClock()
    metrics = Metrics(roles.names)
    catalog = load_catalog(settings.tasks) if roles.gateway or roles.worker else None
    secret = auth_secret(settings, create_in=secret_dir) if roles.gateway else ""
    issuer = callout_issuer(settings, roles)
    async with AsyncExitStack() as stack:
        buses = await open_connections(settings, roles, stack, stop, servers, metrics)
        if buses is None:
            return
        store: JobStore | None = None
        if roles.gateway or roles.scheduler or roles.runs_recorder or roles.notifier:
            store = await until_stopped(stack.enter_async_context(opened_store(settings)), stop)
            if store is None:
                return
        parts = Parts(settings, buses, store, catalog, clock, metrics)
        gateway: Gateway | None = None
        actors: list[Actor] = []
        if roles.gateway:
            gateway, api = gateway_actors(parts, secret)
            actors += [gateway, api, *callout_actors(parts, secret, issuer)]
        if roles.scheduler:
            actors += parts.scheduler()
        if roles.runs_recorder:
            assert store is not None
            ack_wait_seconds = settings.nats.recorder_ack_wait_seconds
            recorder = Recorder(
                buses[Connection.RECORDER],
                store,
                ack_wait_seconds=ack_wait_seconds,
                metrics=metrics,
                linger_seconds=LINGER_SECONDS,
            )
            actors.append(recorder)
        if roles.worker:
            actors.append(parts.worker())
        if roles.notifier:
            actors.append(await notifier_actor(parts, stack))
        actors += metrics_actors(settings, roles, buses, metrics, store=store, peers=actors)
        metrics_server = next((a for a in actors if isinstance(a, MetricsServer)), None)

        async def announce() -> None:
            await asyncio.gather(*(a.ready.wait() for a in actors))
            if freeze_heap:
                log.debug("froze %d start-up objects (gc.freeze)", freeze_startup_heap())
            if started is not None and not started.done():
                info = {"url": gateway.url if gateway else ""}
                if metrics_server is not None:
                    info["metrics_url"] = metrics_server.url
                started.set_result(info)

        async with asyncio.TaskGroup() as tg:
            announcer = tg.create_task(announce(), name="announce-ready")
            try:
                await run_actors(actors, stop)
            finally:
                announcer.cancel()
