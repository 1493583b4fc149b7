"""Settings: one frozen struct of sections, loaded once from ``JOBSCHED_*`` environment variables.

Each section is the configuration of the component that receives it, as is: the scheduler gets
``settings.scheduler`` (:class:`SchedulerConfig`), the pruner ``settings.retention``, a worker
``settings.worker``, the gateway ``settings.gateway``; the NATS connections are built from
``settings.nats``, the store from ``settings.store``.

The environment variables are flat (``JOBSCHED_ACK_WAIT_SECONDS``); :data:`ENV` maps each to the
section field(s) it sets. A value that several components need (the partition count, the ack
wait, the quotas, ...) is one variable that sets the field of each of their sections; the
sections must then agree (:class:`Settings` refuses copies that differ). Only ``jobsched.cli``
reads the environment; everything else receives a :class:`Settings` or a section explicitly.
Durations are in seconds, and their names end in ``_seconds``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from core.egress import EgressPolicy
from core.errors import ConfigError
from core.history import Retention
from core.quotas import Quotas

log = logging.getLogger(__name__)

PREFIX = "JOBSCHED_"
Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Partitions = Annotated[int, msgspec.Meta(ge=1, le=4096)]
AckWait = Positive
MaxDeliver = Annotated[int, msgspec.Meta(ge=1, le=1000)]
SyncInterval = Annotated[str, msgspec.Meta(pattern=r"^(always|[1-9][0-9]*(ms|s|m|h))$")]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]


def member_id() -> str:
    """``<hostname>-<pid>``: the default id of a scheduler or worker."""
    return _member_id(os.getpid())


@functools.cache
def _member_id(pid: int) -> str:
    return f"{os.uname().nodename}-{pid}"


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the settings and their sections: frozen, keyword-only, no unknown fields."""


class NatsConfig(Section, frozen=True, kw_only=True):
    """The NATS connections, streams and consumers (``settings.nats``).

    Attributes:
        url: ``JOBSCHED_NATS_URL``; comma-separated server URLs of the NATS cluster.
        subject_prefix: ``JOBSCHED_SUBJECT_PREFIX``; first token of every NATS subject and the
            prefix of stream and bucket names, so deployments (and tests) can share a server.
        ack_wait_seconds: ``JOBSCHED_ACK_WAIT_SECONDS``; JetStream ack wait of the work consumers
            (seconds).
        recorder_ack_wait_seconds: ``JOBSCHED_RECORDER_ACK_WAIT_SECONDS``; JetStream ack wait of
            the recorders' consumer of the status stream (seconds, 1 to 3600): how long a batch
            of status events may stay unacknowledged (being written to the store) before
            JetStream delivers it again, to any recorder. A recorder waiting for an unavailable
            store keeps its batch with in-progress acks; a longer store call than this
            (``JOBSCHED_STORE_TIMEOUT_SECONDS`` and a slow write) makes the batch be recorded
            twice (harmless, the writes are idempotent), and a dead recorder's batch waits this
            long before another recorder takes it.
        max_deliver: ``JOBSCHED_MAX_DELIVER``; JetStream max deliveries of the work consumers;
            caps jobs' ``maxAttempts``.
        duplicate_window_seconds: ``JOBSCHED_DUPLICATE_WINDOW_SECONDS``; JetStream
            de-duplication window of the work stream (seconds).
        status_retention_seconds: ``JOBSCHED_STATUS_RETENTION_SECONDS``; how long the status
            stream keeps events (replay for live clients; seconds).
        stream_replicas: ``JOBSCHED_STREAM_REPLICAS``; JetStream replicas of the work and status
            streams and the buckets (3 in a cluster).
        credentials_file: ``JOBSCHED_NATS_CREDENTIALS_FILE``; the NATS user of this process: a
            JSON file ``{"user": ..., "password": ...}`` (mode 0600, e.g. a container secret),
            used by every NATS connection of the process.
        credentials_dir: ``JOBSCHED_NATS_CREDENTIALS_DIR``; instead of one file, a directory
            holding one such file per NATS connection, ``nats-<connection>.json``
            (``scheduler``, ``recorder``, ``worker``, ``gateway``, ``live``; as
            :func:`bus.auth.generate_users` writes them): each connection authenticates as its
            own role, with that role's permissions only (README "Security model"). A process
            needs only the files of the connections it opens. Neither set: connect without
            authentication (refused by a server that requires it); both: a ConfigError.
        callout_issuer_seed_file: ``JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE``; a gateway with it
            also runs the NATS auth callout service (:mod:`bus.callout`, NATS ADR-26): the file
            (mode 0600, e.g. a container secret) holds the seed of the account nkey named as
            ``auth_callout { issuer }`` in the servers' config, which signs the per-user
            permissions of NATS-API clients. Empty: no callout (API clients then need a static
            NATS user). README "Security model".
        tls_ca_file: ``JOBSCHED_NATS_TLS_CA_FILE``; PEM bundle of the CAs that sign the NATS
            servers' certificates. Set (or with ``tls://`` URLs, against the system's trust
            store): every connection is TLS 1.2+ with the server's certificate and hostname (or
            IP address) verified, and a server that does not require TLS is refused, before
            anything is sent (README "Security model", "TLS to NATS").
        tls_cert_file / tls_key_file: ``JOBSCHED_NATS_TLS_CERT_FILE`` / ``_KEY_FILE``; this
            process's client certificate (chain) and its unencrypted private key, PEM, for
            servers that verify clients (``verify: true``): both or neither. A file that cannot
            be read or used is a :class:`ConfigError` at start-up.
        sync_interval: ``JOBSCHED_NATS_SYNC_INTERVAL``; fsync policy of the nats-server that
            ``jobsched dev`` starts: ``always`` (before every PubAck) or a duration (``100ms``,
            ``1s``, ``2m``), as nats-server's ``jetstream.sync_interval``. A deployment's own
            servers are set in their config files (deploy/nats/common.conf).
    """

    url: str = "nats://127.0.0.1:4222"
    subject_prefix: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,32}$")] = "jobsched"
    ack_wait_seconds: AckWait = 30.0
    recorder_ack_wait_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0
    max_deliver: MaxDeliver = 20
    duplicate_window_seconds: Positive = 120.0
    status_retention_seconds: Positive = 86400.0
    stream_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    credentials_file: str = ""
    credentials_dir: str = ""
    callout_issuer_seed_file: str = ""
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    sync_interval: SyncInterval = "1s"

    @property
    def servers(self) -> list[str]:
        """The server URLs of :attr:`url`."""
        return [s.strip() for s in self.url.split(",") if s.strip()]


class StoreConfig(Section, frozen=True, kw_only=True):
    """The job store (``settings.store``).

    Attributes:
        url: ``JOBSCHED_STORE_URL``; ``sqlite:///path/to/file.db`` (or a plain path) or
            ``mongodb://…``. Empty means ``<data_dir>/jobsched.db``
            (:attr:`Settings.resolved_store_url`).
        timeout_seconds: ``JOBSCHED_STORE_TIMEOUT_SECONDS``; how long a store call waits (SQLite
            lock, MongoDB server selection) before failing with "store unavailable" (seconds).
    """

    url: str = ""
    timeout_seconds: Positive = 5.0


class HttpConfig(Section, frozen=True, kw_only=True):
    """Where a process listens for HTTP (``settings.http``).

    Attributes:
        host / port: ``JOBSCHED_HTTP_HOST`` / ``_PORT``; the gateway's listen address (the host
            is also the metrics server's, :class:`MetricsConfig`).
    """

    host: str = "127.0.0.1"
    port: Port = 8080


class MetricsConfig(Section, frozen=True, kw_only=True):
    """Metrics of the processes (``settings.metrics``).

    Attributes:
        port: ``JOBSCHED_METRICS_PORT``; port of the server of a scheduler or worker process for
            Prometheus (``GET /metrics``) and probes (``GET /healthz``, ``/readyz``), on
            ``JOBSCHED_HTTP_HOST``; 0 = none. A process that runs the gateway serves them on the
            gateway's port instead (``jobsched dev``).
        queue_depth_interval_seconds: ``JOBSCHED_QUEUE_DEPTH_INTERVAL_SECONDS``; how often
            scheduler and worker processes refresh the ``jobsched_queue_depth`` gauge of their
            queues (``JOBSCHED_QUEUES``) from JetStream (seconds).
    """

    port: Port = 0
    queue_depth_interval_seconds: Positive = 5.0


class SchedulerConfig(Section, frozen=True, kw_only=True):
    """The scheduler (``settings.scheduler``): what :class:`actors.scheduler.Scheduler` and its
    partition leases run on.

    Attributes:
        partitions: ``JOBSCHED_PARTITIONS``; number of partitions of the job space (N). Fixed for
            the life of a deployment: it decides which partition owns each stored job.
        scan_interval_seconds: ``JOBSCHED_SCAN_INTERVAL_SECONDS``; period of the safety scan of
            the store (seconds).
        lookahead_seconds: ``JOBSCHED_LOOKAHEAD_SECONDS``; how far ahead jobs are loaded into the
            heap (seconds).
        prepare_ahead_seconds: ``JOBSCHED_PREPARE_AHEAD_SECONDS``; runs are recorded (job
            advanced, execution QUEUED) up to this long before they are due, and published at
            their due time, so that the store write is off the critical path (seconds, 0 to 10;
            0 = record at the due time). The scheduler wakes when the earliest job is half this
            far off and then records every job due within all of it, so under load one store
            transaction covers ~half a lead of runs.
        redispatch_after_seconds: ``JOBSCHED_REDISPATCH_AFTER_SECONDS``; an unfinished run
            untouched this long is re-published if its message is gone from the work stream
            (seconds); 0 = two ack waits. The scheduler uses
            :attr:`resolved_redispatch_after_seconds`.
        ack_wait_seconds: ``JOBSCHED_ACK_WAIT_SECONDS`` (as ``settings.nats``): the work
            consumers' ack wait, the base of the default redispatch delay (seconds).
        duplicate_window_seconds: ``JOBSCHED_DUPLICATE_WINDOW_SECONDS`` (as ``settings.nats``):
            the work stream's de-duplication window (seconds). On taking a partition over, its
            QUEUED runs recorded within half of it are published again under their execution
            id, which JetStream drops if the first publish happened.
        lease_ttl_seconds: ``JOBSCHED_LEASE_TTL_SECONDS``; TTL of partition leases (seconds);
            renewed every third of it. A dead scheduler's partitions are taken over within about
            this long. At least 15 against a clustered NATS (see
            :data:`actors.ownership.CLUSTER_MIN_TTL_SECONDS`).
        scheduler_id: ``JOBSCHED_SCHEDULER_ID``; this scheduler's lease owner id; empty =
            ``<hostname>-<pid>`` (:attr:`resolved_scheduler_id`). Must be unique among live
            schedulers.
        quotas: ``JOBSCHED_QUOTA_*`` (as ``settings.gateway.quotas``): the per-user limits; the
            scheduler enforces ``runs_per_minute``.
        batch: most runs dispatched per store call (no variable).
        heap_limit: most jobs loaded into the heap by one scan (no variable).
        drain_seconds: on :meth:`Scheduler.stop`, how long the runs already prepared may take to
            be published at their due times before the partitions are handed back anyway
            (seconds, beyond ``prepare_ahead_seconds``; no variable); the successor publishes
            what is left.
    """

    partitions: Partitions = 64
    scan_interval_seconds: Positive = 5.0
    lookahead_seconds: Positive = 30.0
    prepare_ahead_seconds: Annotated[float, msgspec.Meta(ge=0, le=10)] = 1.0
    redispatch_after_seconds: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    ack_wait_seconds: AckWait = 30.0
    duplicate_window_seconds: Positive = 120.0
    lease_ttl_seconds: Annotated[float, msgspec.Meta(ge=1)] = 3.0
    scheduler_id: str = ""
    quotas: Quotas = msgspec.field(default_factory=Quotas)
    batch: PositiveInt = 500
    heap_limit: PositiveInt = 100_000
    drain_seconds: Annotated[float, msgspec.Meta(ge=0)] = 5.0

    @property
    def resolved_redispatch_after_seconds(self) -> float:
        """``redispatch_after_seconds``, or two ack waits when it is 0 (seconds)."""
        return self.redispatch_after_seconds or 2 * self.ack_wait_seconds

    @property
    def resolved_scheduler_id(self) -> str:
        """``scheduler_id``, or ``<hostname>-<pid>`` when it is empty."""
        return self.scheduler_id or member_id()


class RetentionConfig(Section, frozen=True, kw_only=True):
    """The pruner of finished runs (``settings.retention``, :class:`actors.retention.Pruner`).

    Attributes:
        partitions: ``JOBSCHED_PARTITIONS`` (as ``settings.scheduler``): to tell which notices
            are about owned jobs.
        history_limit: ``JOBSCHED_HISTORY_LIMIT``; the most recently finished runs (executions)
            each job keeps, unless the job sets its own ``historyLimit``; older finished runs are
            deleted in the background. 0 = no count limit.
        history_max_age_seconds: ``JOBSCHED_HISTORY_MAX_AGE_SECONDS``; a finished run is deleted
            this long after it finished, unless its job sets its own ``historyMaxAgeSeconds``
            (seconds); 0 = no age limit. Whichever rule comes first deletes a run; unfinished
            runs and each job's latest run are kept.
        sweep_interval_seconds: ``JOBSCHED_HISTORY_SWEEP_INTERVAL_SECONDS``; how often a
            scheduler walks every job of its partitions to apply the retention rules (seconds):
            the age rule for jobs without new runs, and whatever a lost notice missed. Jobs with
            newly finished runs are pruned at once.
        batch: most runs one store call deletes (no variable).
        jobs_per_step: most jobs one store call visits (marked ones, or a sweep page; no
            variable).
        max_marked: most jobs marked at once; further marks are dropped (the sweep finds them;
            no variable).
        ownership_check_seconds: how often the pruner looks for partitions it gained (seconds;
            no variable).
    """

    partitions: Partitions = 64
    history_limit: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 1000
    history_max_age_seconds: Annotated[float, msgspec.Meta(ge=0, le=10 * 366 * 86400)] = (
        30 * 86400.0
    )
    sweep_interval_seconds: Annotated[float, msgspec.Meta(ge=1)] = 3600.0
    batch: PositiveInt = 500
    jobs_per_step: PositiveInt = 100
    max_marked: PositiveInt = 10_000
    ownership_check_seconds: Positive = 30.0

    @property
    def default(self) -> Retention:
        """The deployment's retention for jobs without their own (0 = no limit)."""
        return Retention.of_settings(self.history_limit, self.history_max_age_seconds)


class WorkerConfig(Section, frozen=True, kw_only=True):
    """A worker (``settings.worker``, :class:`actors.worker.Worker`).

    Attributes:
        worker_id: ``JOBSCHED_WORKER_ID``; name of this worker in execution records; empty =
            ``<hostname>-<pid>`` (:attr:`resolved_worker_id`).
        queues: ``JOBSCHED_QUEUES``; comma-separated in the variable: the work queues a worker
            consumes (and whose depth scheduler and worker processes report).
        concurrency: ``JOBSCHED_WORKER_CONCURRENCY``; runs executed at once (io tasks; cpu tasks
            also wait for a pool slot).
        cpu_slots: ``JOBSCHED_WORKER_CPU_SLOTS``; processes of the pool for ``cpu`` tasks; 0 =
            one per core.
        ack_wait_seconds: ``JOBSCHED_ACK_WAIT_SECONDS`` (as ``settings.nats``): the consumer's
            ack wait; in-progress acks go out every third of it (seconds).
        retry_backoff_seconds / retry_backoff_max_seconds: ``JOBSCHED_RETRY_BACKOFF_SECONDS`` /
            ``_MAX_SECONDS``; first and largest delay between attempts (seconds).
        data_dir: ``JOBSCHED_DATA_DIR`` (as ``settings.data_dir``): passed to tasks, as
            :attr:`resolved_data_dir`.
        drain_timeout_seconds: ``JOBSCHED_DRAIN_TIMEOUT_SECONDS``; on stop (SIGTERM), how long
            in-flight runs may finish before they are handed back (seconds).
        secrets_dir: ``JOBSCHED_SECRETS_DIR``; the worker's directory of secrets, one file per
            secret named as the secret (a Docker or Kubernetes secret mount): what tasks read with
            ``ctx.secret(name)`` and the ``http`` task puts into headers. Never in a job, so the
            API never shows them. Empty: no secrets.
        running_grace_seconds: ``JOBSCHED_WORKER_RUNNING_GRACE_SECONDS``; an attempt reports
            RUNNING only once it has run this long (seconds, at most 60; default 0.5); one that
            ends sooner reports only its outcome, which carries its ``startedAt``: live clients
            and the store see QUEUED → outcome, and the run costs four NATS messages and one
            store write less. A worker lost within the grace leaves the run QUEUED until its
            message is redelivered (the ack wait), as it would leave it RUNNING otherwise. 0:
            every attempt reports RUNNING as it starts.
        http_allowed_networks: ``JOBSCHED_HTTP_ALLOWED_NETWORKS``; comma-separated CIDR networks
            that outbound calls of tasks (the ``http`` task) and the notifier's webhooks
            (:mod:`actors.notifier`) may reach although they are not
            globally reachable: loopback, private, link-local and the other ranges
            :mod:`core.egress` refuses by default against server-side request forgery. Empty:
            public addresses only.
        prefetch: ``JOBSCHED_WORKER_PREFETCH``; messages fetched beyond ``concurrency`` and held
            (in-progress acked) so that runs start round-robin across users
            (:mod:`core.fairness`): one user's backlog of up to this many runs cannot delay
            another user's. 0: stream order.
        user_concurrency: ``JOBSCHED_WORKER_USER_CONCURRENCY``; most runs of one owner in flight
            on this worker at once, so that the others find a free slot at once; 0 (default): no
            cap (round-robin only, :mod:`core.fairness`).
        slot_lease_seconds: ``JOBSCHED_WORKER_SLOT_LEASE_SECONDS``; how long a concurrency slot
            (or a place in its line) outlives the last renewal by its worker, renewed every
            third of it (seconds): a worker that dies holding a slot frees it after at most this
            long (:mod:`core.concurrency`).
    """

    worker_id: str = ""
    queues: tuple[str, ...] = ("default",)
    concurrency: PositiveInt = 64
    cpu_slots: Annotated[int, msgspec.Meta(ge=0)] = 0
    ack_wait_seconds: AckWait = 30.0
    retry_backoff_seconds: Positive = 1.0
    retry_backoff_max_seconds: Positive = 300.0
    data_dir: str = "./data"
    drain_timeout_seconds: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    secrets_dir: str = ""
    http_allowed_networks: tuple[str, ...] = ()
    running_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.5
    prefetch: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 64
    user_concurrency: Annotated[int, msgspec.Meta(ge=0)] = 0
    slot_lease_seconds: Annotated[float, msgspec.Meta(ge=1, le=1200)] = 30.0

    def __post_init__(self) -> None:
        try:
            self.egress  # noqa: B018
        except ConfigError as e:  # msgspec names the section; the message names the field
            raise ValueError(f"http_allowed_networks: {e.message}") from None

    @property
    def egress(self) -> EgressPolicy:
        """What tasks' outbound calls may reach (:mod:`core.egress`).

        Raises:
            ConfigError: ``http_allowed_networks`` holds something that is not a network.
        """
        return EgressPolicy.parse(self.http_allowed_networks)

    @property
    def resolved_secrets_dir(self) -> str:
        """``secrets_dir`` as an absolute path ("" when unset)."""
        return str(Path(self.secrets_dir).resolve()) if self.secrets_dir else ""

    @property
    def resolved_worker_id(self) -> str:
        """``worker_id``, or ``<hostname>-<pid>`` when it is empty."""
        return self.worker_id or member_id()

    @property
    def resolved_data_dir(self) -> str:
        """``data_dir`` as an absolute path."""
        return str(Path(self.data_dir).resolve())


class GatewayConfig(Section, frozen=True, kw_only=True):
    """The HTTP and NATS API (``settings.gateway``, :func:`gateway.app.create_app` and
    :class:`gateway.service.JobService`).

    Attributes:
        auth_secret: ``JOBSCHED_AUTH_SECRET``; HS256 key that signs bearer tokens (RFC 7519);
            :func:`jobsched.runtime.auth_secret` checks it (or, in dev, keeps one in the data
            dir) before the gateway receives it.
        partitions: ``JOBSCHED_PARTITIONS`` (as ``settings.scheduler``): to assign a new job its
            partition.
        max_body_bytes: ``JOBSCHED_MAX_BODY_BYTES``; largest accepted HTTP request body.
        max_deliver: ``JOBSCHED_MAX_DELIVER`` (as ``settings.nats``): the work consumers' max
            deliveries; a job's ``maxAttempts`` may not exceed it.
        ws_buffer_events: ``JOBSCHED_WS_BUFFER_EVENTS``; events the gateway holds in memory for
            one WebSocket client; a client that falls further behind catches up from the status
            stream at its own pace.
        ws_stall_seconds: ``JOBSCHED_WS_STALL_SECONDS``; a WebSocket client that takes no event
            for this many seconds while events wait for it is disconnected as a slow consumer
            (close code 4008).
        ws_replay_concurrency: ``JOBSCHED_WS_REPLAY_CONCURRENCY``; replay reads of the status
            stream a gateway has in flight at once (each at most 128 events and 256 KiB), shared
            by all its WebSocket clients that resume from a ``lastEventId`` or fell behind; the
            others wait their turn.
        ws_replay_events_per_second: ``JOBSCHED_WS_REPLAY_EVENTS_PER_SECOND``; events per second
            a gateway reads from the status stream for all those clients together (a token
            bucket; 0 = no limit): what bounds the CPU that replays take from the roles sharing
            the process.
        quotas: ``JOBSCHED_QUOTA_*`` (:class:`core.quotas.Quotas`): ``JOBSCHED_QUOTA_ACTIVE_JOBS``
            (most active jobs per user), ``_MIN_INTERVAL_SECONDS`` (smallest interval between
            two runs of a job; 0 = the schema's 1 ms), ``_CREATES_PER_SECOND`` and
            ``_CREATES_BURST`` (job creations per user, a token bucket; a rate of 0 = no limit),
            ``_RUNS_PER_MINUTE`` (runs started per user and minute, scheduled, catch-up and
            manual; a run over it is held back, not dropped). 0 = no limit. README "Security
            model".
        cors_allowed_origins: ``JOBSCHED_CORS_ALLOWED_ORIGINS``; comma-separated origins
            (``https://app.example.com``; ``*`` for any) whose pages may call the API from a
            browser (CORS, :mod:`gateway.cors`). Empty (the default): none.
        cors_allowed_methods / cors_allowed_headers: ``JOBSCHED_CORS_ALLOWED_METHODS`` /
            ``_HEADERS``; what their requests may use (comma-separated).
    """

    auth_secret: str = ""
    partitions: Partitions = 64
    max_body_bytes: PositiveInt = 64 * 1024
    max_deliver: MaxDeliver = 20
    ws_buffer_events: PositiveInt = 1000
    ws_stall_seconds: Positive = 5.0
    ws_replay_concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 4
    ws_replay_events_per_second: Annotated[float, msgspec.Meta(ge=0)] = 5000.0
    quotas: Quotas = msgspec.field(default_factory=Quotas)
    cors_allowed_origins: tuple[str, ...] = ()
    cors_allowed_methods: tuple[str, ...] = ("GET", "POST", "PATCH", "DELETE")
    cors_allowed_headers: tuple[str, ...] = ("Authorization", "Content-Type", "Idempotency-Key")


ENV: dict[str, tuple[str, ...]] = {
    "NATS_URL": ("nats.url",),
    "SUBJECT_PREFIX": ("nats.subject_prefix",),
    "ACK_WAIT_SECONDS": (
        "nats.ack_wait_seconds",
        "scheduler.ack_wait_seconds",
        "worker.ack_wait_seconds",
    ),
    "RECORDER_ACK_WAIT_SECONDS": ("nats.recorder_ack_wait_seconds",),
    "MAX_DELIVER": ("nats.max_deliver", "gateway.max_deliver"),
    "DUPLICATE_WINDOW_SECONDS": (
        "nats.duplicate_window_seconds",
        "scheduler.duplicate_window_seconds",
    ),
    "STATUS_RETENTION_SECONDS": ("nats.status_retention_seconds",),
    "STREAM_REPLICAS": ("nats.stream_replicas",),
    "NATS_CREDENTIALS_FILE": ("nats.credentials_file",),
    "NATS_CREDENTIALS_DIR": ("nats.credentials_dir",),
    "NATS_CALLOUT_ISSUER_SEED_FILE": ("nats.callout_issuer_seed_file",),
    "NATS_TLS_CA_FILE": ("nats.tls_ca_file",),
    "NATS_TLS_CERT_FILE": ("nats.tls_cert_file",),
    "NATS_TLS_KEY_FILE": ("nats.tls_key_file",),
    "NATS_SYNC_INTERVAL": ("nats.sync_interval",),
    "STORE_URL": ("store.url",),
    "STORE_TIMEOUT_SECONDS": ("store.timeout_seconds",),
    "DATA_DIR": ("data_dir", "worker.data_dir"),
    "HTTP_HOST": ("http.host",),
    "HTTP_PORT": ("http.port",),
    "METRICS_PORT": ("metrics.port",),
    "QUEUE_DEPTH_INTERVAL_SECONDS": ("metrics.queue_depth_interval_seconds",),
    "PARTITIONS": ("scheduler.partitions", "retention.partitions", "gateway.partitions"),
    "SCAN_INTERVAL_SECONDS": ("scheduler.scan_interval_seconds",),
    "LOOKAHEAD_SECONDS": ("scheduler.lookahead_seconds",),
    "PREPARE_AHEAD_SECONDS": ("scheduler.prepare_ahead_seconds",),
    "REDISPATCH_AFTER_SECONDS": ("scheduler.redispatch_after_seconds",),
    "LEASE_TTL_SECONDS": ("scheduler.lease_ttl_seconds",),
    "SCHEDULER_ID": ("scheduler.scheduler_id",),
    "HISTORY_LIMIT": ("retention.history_limit",),
    "HISTORY_MAX_AGE_SECONDS": ("retention.history_max_age_seconds",),
    "HISTORY_SWEEP_INTERVAL_SECONDS": ("retention.sweep_interval_seconds",),
    "WORKER_ID": ("worker.worker_id",),
    "SECRETS_DIR": ("worker.secrets_dir",),
    "WORKER_RUNNING_GRACE_SECONDS": ("worker.running_grace_seconds",),
    "WORKER_PREFETCH": ("worker.prefetch",),
    "WORKER_USER_CONCURRENCY": ("worker.user_concurrency",),
    "WORKER_SLOT_LEASE_SECONDS": ("worker.slot_lease_seconds",),
    "EVENT_LOOP": ("event_loop",),
    "HTTP_ALLOWED_NETWORKS": ("worker.http_allowed_networks",),
    "QUEUES": ("worker.queues",),
    "WORKER_CONCURRENCY": ("worker.concurrency",),
    "WORKER_CPU_SLOTS": ("worker.cpu_slots",),
    "RETRY_BACKOFF_SECONDS": ("worker.retry_backoff_seconds",),
    "RETRY_BACKOFF_MAX_SECONDS": ("worker.retry_backoff_max_seconds",),
    "DRAIN_TIMEOUT_SECONDS": ("worker.drain_timeout_seconds",),
    "AUTH_SECRET": ("gateway.auth_secret",),
    "MAX_BODY_BYTES": ("gateway.max_body_bytes",),
    "WS_BUFFER_EVENTS": ("gateway.ws_buffer_events",),
    "WS_STALL_SECONDS": ("gateway.ws_stall_seconds",),
    "WS_REPLAY_CONCURRENCY": ("gateway.ws_replay_concurrency",),
    "WS_REPLAY_EVENTS_PER_SECOND": ("gateway.ws_replay_events_per_second",),
    "CORS_ALLOWED_ORIGINS": ("gateway.cors_allowed_origins",),
    "CORS_ALLOWED_METHODS": ("gateway.cors_allowed_methods",),
    "CORS_ALLOWED_HEADERS": ("gateway.cors_allowed_headers",),
    "QUOTA_ACTIVE_JOBS": ("gateway.quotas.active_jobs", "scheduler.quotas.active_jobs"),
    "QUOTA_MIN_INTERVAL_SECONDS": (
        "gateway.quotas.min_interval_seconds",
        "scheduler.quotas.min_interval_seconds",
    ),
    "QUOTA_CREATES_PER_SECOND": (
        "gateway.quotas.creates_per_second",
        "scheduler.quotas.creates_per_second",
    ),
    "QUOTA_CREATES_BURST": ("gateway.quotas.creates_burst", "scheduler.quotas.creates_burst"),
    "QUOTA_RUNS_PER_MINUTE": (
        "gateway.quotas.runs_per_minute",
        "scheduler.quotas.runs_per_minute",
    ),
    "TASKS": ("tasks",),
    "LOG_FORMAT": ("log_format",),
    "LOG_LEVEL": ("log_level",),
}
"""Every ``JOBSCHED_<NAME>`` variable (keyed by ``<NAME>``) and the settings fields it sets, as
dotted paths from :class:`Settings`. A variable of several fields sets each to its value."""

LISTS = frozenset(
    {
        "QUEUES",
        "HTTP_ALLOWED_NETWORKS",
        "CORS_ALLOWED_ORIGINS",
        "CORS_ALLOWED_METHODS",
        "CORS_ALLOWED_HEADERS",
    }
)
"""Variables holding a comma-separated list (empty items dropped)."""


def _get(obj: object, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


class Settings(Section, frozen=True, kw_only=True):
    """Every setting of a process: a few of its own and a section per component.

    Attributes:
        data_dir: ``JOBSCHED_DATA_DIR``; SQLite file, dev nats-server storage, report files.
        tasks: ``JOBSCHED_TASKS``; ``module:callable`` returning the
            :class:`core.tasks.TaskCatalog` of this deployment.
        log_format / log_level: ``JOBSCHED_LOG_FORMAT`` / ``_LEVEL``; ``text`` or ``json``; a
            ``logging`` level name.
        event_loop: ``JOBSCHED_EVENT_LOOP``; the event loop of the service processes
            (:mod:`jobsched.eventloop`): ``auto`` (uvloop when installed, else asyncio's),
            ``uvloop`` (an error at start-up when it is not installed) or ``asyncio``.
        nats / store / http / metrics / scheduler / retention / worker / gateway: the sections
            (:class:`NatsConfig`, :class:`StoreConfig`, :class:`HttpConfig`,
            :class:`MetricsConfig`, :class:`SchedulerConfig`, :class:`RetentionConfig`,
            :class:`WorkerConfig`, :class:`GatewayConfig`), each documenting its variables.

    Raises:
        ValueError: (on construction) two fields set by the same variable (:data:`ENV`) differ.
    """

    data_dir: str = "./data"
    tasks: str = "jobsched.tasks:builtin_catalog"
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    nats: NatsConfig = msgspec.field(default_factory=NatsConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    retention: RetentionConfig = msgspec.field(default_factory=RetentionConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    gateway: GatewayConfig = msgspec.field(default_factory=GatewayConfig)

    def __post_init__(self) -> None:
        for name, paths in ENV.items():
            values = {path: _get(self, path) for path in paths}
            if len(set(values.values())) > 1:
                raise ValueError(f"{PREFIX}{name} sets {values}, which must be equal")

    @property
    def resolved_store_url(self) -> str:
        """``store.url``, or the SQLite file ``<data_dir>/jobsched.db`` when it is empty."""
        return self.store.url or f"sqlite:///{Path(self.data_dir).resolve() / 'jobsched.db'}"

    @classmethod
    def env_names(cls) -> frozenset[str]:
        """Every environment variable the settings read."""
        return frozenset(PREFIX + name for name in ENV)

    def values(self) -> dict[str, Any]:
        """Each variable's value in these settings, keyed as :func:`load_settings`'s overrides
        (``ack_wait_seconds`` for ``JOBSCHED_ACK_WAIT_SECONDS``)."""
        return {name.lower(): _get(self, paths[0]) for name, paths in ENV.items()}

    def env(self) -> dict[str, str]:
        """These settings as ``JOBSCHED_*`` variables (that :func:`load_settings` reads back)."""
        out = {}
        for name, value in self.values().items():
            text = ",".join(value) if name.upper() in LISTS else str(value)
            out[PREFIX + name.upper()] = text
        return out

    def changed(self, **overrides: object) -> Settings:
        """These settings with ``overrides`` (keyed as :func:`load_settings`'s).

        Raises:
            ConfigError: as :func:`load_settings`.
        """
        return load_settings({}, **{**self.values(), **overrides})


def load_settings(env: Mapping[str, str], **overrides: object) -> Settings:
    """Build :class:`Settings` from ``JOBSCHED_*`` entries of ``env`` plus explicit overrides.

    ``overrides`` are keyed by variable, lower-case and without the prefix
    (``ack_wait_seconds=2.0`` for ``JOBSCHED_ACK_WAIT_SECONDS``), and set what it sets
    (:data:`ENV`). Unknown ``JOBSCHED_*`` variables are logged as warnings (``JOBSCHED_TEST_*``
    is reserved for the test suite and ignored) so a typo does not pass silently.

    Raises:
        ConfigError: naming the variable and the reason when a value has the wrong type or
            range, or an override names no variable.
    """
    flat: dict[str, object] = {}
    for name, text in env.items():
        if not name.startswith(PREFIX) or name.startswith(PREFIX + "TEST_"):
            continue
        key = name[len(PREFIX) :]
        if key in ENV:
            flat[key] = text
        else:
            log.warning("ignoring unknown setting %s", name)
    for key, override in overrides.items():
        if key.upper() not in ENV:
            raise ConfigError(f"no setting {PREFIX}{key.upper()}")
        flat[key.upper()] = override
    raw: dict[str, Any] = {}
    for key, given in flat.items():
        value: object = given
        if key in LISTS and isinstance(given, str):
            value = [item.strip() for item in given.split(",") if item.strip()]
        for path in ENV[key]:
            *sections, field = path.split(".")
            node = raw
            for section in sections:
                node = node.setdefault(section, {})
            node[field] = value
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid setting: {_name_in(str(e))}") from None


def _name_in(message: str) -> str:
    head, sep, path = message.partition(" - at `$.")
    if not sep:
        return message
    path = path.rstrip("`")
    field, colon, reason = head.partition(": ")  # a section's __post_init__: "field: reason"
    if colon and f"{path}.{field}" in _PATHS:
        path, head = f"{path}.{field}", reason
    name = next((n for n, paths in ENV.items() if path in paths), path.upper())
    return f"{PREFIX}{name}: {head}"


_PATHS = frozenset(path for paths in ENV.values() for path in paths)
