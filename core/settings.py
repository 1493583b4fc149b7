"""Settings: one frozen struct, loaded once from ``JOBSCHED_*`` environment variables.

Each field ``foo_bar`` is read from ``JOBSCHED_FOO_BAR``. Only ``jobsched.cli`` reads the
environment; everything else receives a :class:`Settings` explicitly.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from core.errors import ConfigError
from core.quotas import Quotas

log = logging.getLogger(__name__)

PREFIX = "JOBSCHED_"
Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
SyncInterval = Annotated[str, msgspec.Meta(pattern=r"^(always|[1-9][0-9]*(ms|s|m|h))$")]


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every setting, with its environment variable and default.

    Attributes:
        nats_url: ``JOBSCHED_NATS_URL``; comma-separated server URLs of the NATS cluster.
        store_url: ``JOBSCHED_STORE_URL``; ``sqlite:///path/to/file.db`` (or a plain path) or
            ``mongodb://…``. Empty means ``<data_dir>/jobsched.db``.
        data_dir: ``JOBSCHED_DATA_DIR``; SQLite file, dev nats-server storage, report files.
        auth_secret: ``JOBSCHED_AUTH_SECRET``; HS256 key that signs bearer tokens (RFC 7519).
        partitions: ``JOBSCHED_PARTITIONS``; number of partitions of the job space. Fixed for
            the life of a deployment: it decides which partition owns each stored job.
        subject_prefix: ``JOBSCHED_SUBJECT_PREFIX``; first token of every NATS subject and the
            prefix of stream and bucket names, so deployments (and tests) can share a server.
        http_host / http_port: ``JOBSCHED_HTTP_HOST`` / ``_PORT``; the gateway's listen address.
        metrics_port: ``JOBSCHED_METRICS_PORT``; port of the server of a scheduler or worker
            process for Prometheus (``GET /metrics``) and probes (``GET /healthz``, ``/readyz``),
            on ``http_host``; 0 = none. A process that runs the gateway serves them on the
            gateway's port instead (``jobsched dev``).
        queue_depth_interval_seconds: how often scheduler and worker processes refresh the
            ``jobsched_queue_depth`` gauge of their queues from JetStream (seconds).
        queues: ``JOBSCHED_QUEUES``; comma-separated work queues a worker consumes.
        ack_wait_seconds: JetStream ack wait of the work consumers (seconds).
        recorder_ack_wait_seconds: JetStream ack wait of the recorders' consumer of the status
            stream (seconds, 1 to 3600): how long a batch of status events may stay unacknowledged
            (being written to the store) before JetStream delivers it again, to any recorder. A
            recorder waiting for an unavailable store keeps its batch with in-progress acks; a
            longer store call than this (``store_timeout_seconds`` and a slow write) makes the
            batch be recorded twice (harmless, the writes are idempotent), and a dead recorder's
            batch waits this long before another recorder takes it.
        max_deliver: JetStream max deliveries of the work consumers; caps jobs' ``maxAttempts``.
        worker_concurrency: runs of ``io`` tasks a worker process executes at once.
        worker_cpu_slots: processes in a worker's pool for ``cpu`` tasks; 0 = one per core.
        worker_running_grace_seconds: an attempt reports RUNNING only once it has run this
            long (seconds, at most 60); one that ends sooner reports only its outcome, which
            carries its ``startedAt``: live clients and the store see QUEUED → outcome, and the
            run costs four NATS messages less. 0 (the default): every attempt reports RUNNING.
        scan_interval_seconds: period of the scheduler's safety scan of the store.
        lookahead_seconds: how far ahead the scheduler loads jobs into its heap.
        prepare_ahead_seconds: how long before its due time a run is recorded (execution
            QUEUED, job advanced); it is published at its due time. 0 records at the due time.
            The scheduler prepares in batches: when the earliest job is half this far off.
        redispatch_after_seconds: a QUEUED run not started after this long is re-published;
            0 = two ack waits.
        retry_backoff_seconds / retry_backoff_max_seconds: first and largest delay between attempts.
        duplicate_window_seconds: JetStream de-duplication window of the work stream.
        status_retention_seconds: how long the status stream keeps events (replay for live clients).
        history_limit: the most recently finished runs (executions) each job keeps, unless the
            job sets its own ``historyLimit``; older finished runs are deleted in the background.
            0 = no count limit.
        history_max_age_seconds: a finished run is deleted this long after it finished, unless
            its job sets its own ``historyMaxAgeSeconds`` (seconds); 0 = no age limit. Whichever
            rule comes first deletes a run; unfinished runs and each job's latest run are kept.
        history_sweep_interval_seconds: how often a scheduler walks every job of its partitions
            to apply the retention rules (seconds): the age rule for jobs without new runs, and
            whatever a lost notice missed. Jobs with newly finished runs are pruned at once.
        stream_replicas: JetStream replicas of the work and status streams (3 in a cluster).
        lease_ttl_seconds: TTL of partition leases (seconds); renewed every third of it. A dead
            scheduler's partitions are taken over within about this long. At least 15 against
            a clustered NATS (see :data:`actors.ownership.CLUSTER_MIN_TTL_S`).
        scheduler_id: this scheduler's lease owner id; empty = ``<hostname>-<pid>``. Must be
            unique among live schedulers.
        store_timeout_seconds: how long a store call waits (SQLite lock, MongoDB server
            selection) before failing with "store unavailable".
        ws_buffer_events: events the gateway holds in memory for one WebSocket client; a client
            that falls further behind catches up from the status stream at its own pace.
        ws_stall_seconds: a WebSocket client that takes no event for this many seconds while
            events wait for it is disconnected as a slow consumer (close code 4008).
        ws_replay_concurrency: replay reads of the status stream a gateway has in flight at once
            (each at most 128 events and 256 KiB), shared by all its WebSocket clients that
            resume from a ``lastEventId`` or fell behind; the others wait their turn.
        ws_replay_events_per_second: events per second a gateway reads from the status stream
            for all those clients together (a token bucket; 0 = no limit): what bounds the CPU
            that replays take from the roles sharing the process.
        max_body_bytes: largest accepted HTTP request body.
        drain_timeout_seconds: on SIGTERM, how long in-flight runs may finish before hand-back.
        tasks: ``module:callable`` returning the :class:`core.tasks.TaskCatalog` of this deployment.
        worker_id: name of this worker in execution records; empty = ``<hostname>-<pid>``.
        log_format / log_level: ``text`` or ``json``; a ``logging`` level name.
        event_loop: ``JOBSCHED_EVENT_LOOP``; the event loop of the service processes
            (:mod:`jobsched.eventloop`): ``auto`` (uvloop when installed, else asyncio's),
            ``uvloop`` (an error at start-up when it is not installed) or ``asyncio``.
        nats_credentials_file: ``JOBSCHED_NATS_CREDENTIALS_FILE``; the NATS user of this
            process: a JSON file ``{"user": ..., "password": ...}`` (mode 0600, e.g. a
            container secret), used by every NATS connection of the process.
        nats_credentials_dir: ``JOBSCHED_NATS_CREDENTIALS_DIR``; instead of one file, a
            directory holding one such file per NATS connection, ``nats-<connection>.json``
            (``scheduler``, ``recorder``, ``worker``, ``gateway``, ``live``; as
            :func:`bus.auth.generate_users` writes them): each connection authenticates as its
            own role, with that role's permissions only (README "Security model"). A process
            needs only the files of the connections it opens. Neither set: connect without
            authentication (refused by a server that requires it); both: a ConfigError.
        nats_callout_issuer_seed_file: ``JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE``; a gateway
            with it also runs the NATS auth callout service (:mod:`bus.callout`, NATS ADR-26):
            the file (mode 0600, e.g. a container secret) holds the seed of the account nkey
            named as ``auth_callout { issuer }`` in the servers' config, which signs the
            per-user permissions of NATS-API clients. Empty: no callout (API clients then need
            a static NATS user). README "Security model".
        nats_tls_ca_file: ``JOBSCHED_NATS_TLS_CA_FILE``; PEM bundle of the CAs that sign the
            NATS servers' certificates. Set (or with ``tls://`` URLs, against the system's trust
            store): every connection is TLS 1.2+ with the server's certificate and hostname (or
            IP address) verified, and a server that does not require TLS is refused, before
            anything is sent (README "Security model", "TLS to NATS").
        nats_tls_cert_file / nats_tls_key_file: ``JOBSCHED_NATS_TLS_CERT_FILE`` /
            ``_KEY_FILE``; this process's client certificate (chain) and its unencrypted private
            key, PEM, for servers that verify clients (``verify: true``): both or neither.
            A file that cannot be read or used is a :class:`ConfigError` at start-up.
        nats_sync_interval: fsync policy of the nats-server that ``jobsched dev`` starts:
            ``always`` (before every PubAck) or a duration (``100ms``, ``1s``, ``2m``), as
            nats-server's ``jetstream.sync_interval``. A deployment's own servers are set in
            their config files (deploy/nats/common.conf).
        quota_active_jobs: most active (SCHEDULED, RUNNING, PAUSED) jobs per user; 0 = no limit.
        quota_min_interval_seconds: smallest interval between two runs of a job (an interval's
            ``everySeconds``, a cron expression's smallest gap); 0 = the schema's 1 ms.
        quota_creates_per_second / quota_creates_burst: job creations per user and second,
            sustained and at once (token bucket); a rate of 0 = no limit.
        quota_runs_per_minute: runs started per user and minute (scheduled, catch-up and manual
            runs; retries are not new runs); 0 = no limit. A run over it is held back, not
            dropped (README "Security model").
    """

    nats_url: str = "nats://127.0.0.1:4222"
    store_url: str = ""
    data_dir: str = "./data"
    auth_secret: str = ""
    partitions: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    subject_prefix: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,32}$")] = "jobsched"
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    queue_depth_interval_seconds: Positive = 5.0
    queues: str = "default"
    ack_wait_seconds: Positive = 30.0
    recorder_ack_wait_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0
    max_deliver: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 20
    worker_concurrency: PositiveInt = 64
    worker_cpu_slots: Annotated[int, msgspec.Meta(ge=0)] = 0
    worker_running_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.0
    scan_interval_seconds: Positive = 5.0
    lookahead_seconds: Positive = 30.0
    prepare_ahead_seconds: Annotated[float, msgspec.Meta(ge=0, le=10)] = 1.0
    redispatch_after_seconds: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    retry_backoff_seconds: Positive = 1.0
    retry_backoff_max_seconds: Positive = 300.0
    duplicate_window_seconds: Positive = 120.0
    status_retention_seconds: Positive = 86400.0
    history_limit: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 1000
    history_max_age_seconds: Annotated[float, msgspec.Meta(ge=0, le=10 * 366 * 86400)] = (
        30 * 86400.0
    )
    history_sweep_interval_seconds: Annotated[float, msgspec.Meta(ge=1)] = 3600.0
    stream_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    lease_ttl_seconds: Annotated[float, msgspec.Meta(ge=1)] = 3.0
    scheduler_id: str = ""
    store_timeout_seconds: Positive = 5.0
    ws_buffer_events: PositiveInt = 1000
    ws_stall_seconds: Positive = 5.0
    ws_replay_concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 4
    ws_replay_events_per_second: Annotated[float, msgspec.Meta(ge=0)] = 5000.0
    max_body_bytes: PositiveInt = 64 * 1024
    drain_timeout_seconds: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    tasks: str = "jobsched.tasks:builtin_catalog"
    worker_id: str = ""
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    nats_credentials_file: str = ""
    nats_credentials_dir: str = ""
    nats_callout_issuer_seed_file: str = ""
    nats_tls_ca_file: str = ""
    nats_tls_cert_file: str = ""
    nats_tls_key_file: str = ""
    nats_sync_interval: SyncInterval = "1s"
    quota_active_jobs: Annotated[int, msgspec.Meta(ge=0)] = 10_000
    quota_min_interval_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 1.0
    quota_creates_per_second: Annotated[float, msgspec.Meta(ge=0)] = 50.0
    quota_creates_burst: PositiveInt = 100
    quota_runs_per_minute: Annotated[int, msgspec.Meta(ge=0)] = 6_000

    @property
    def quotas(self) -> Quotas:
        """The per-user limits of this deployment."""
        return Quotas(
            active_jobs=self.quota_active_jobs,
            min_interval_s=self.quota_min_interval_seconds,
            creates_per_second=self.quota_creates_per_second,
            creates_burst=self.quota_creates_burst,
            runs_per_minute=self.quota_runs_per_minute,
        )

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{Path(self.data_dir).resolve() / 'jobsched.db'}"

    @property
    def queue_names(self) -> list[str]:
        return [q.strip() for q in self.queues.split(",") if q.strip()]

    @property
    def resolved_redispatch_after_seconds(self) -> float:
        """``redispatch_after_seconds``, or two ack waits when it is 0 (seconds)."""
        return self.redispatch_after_seconds or 2 * self.ack_wait_seconds

    @property
    def resolved_worker_id(self) -> str:
        return self.worker_id or f"{os.uname().nodename}-{os.getpid()}"

    @property
    def resolved_scheduler_id(self) -> str:
        return self.scheduler_id or f"{os.uname().nodename}-{os.getpid()}"

    @classmethod
    def env_names(cls) -> frozenset[str]:
        """Every environment variable the settings read."""
        return frozenset(PREFIX + f.upper() for f in cls.__struct_fields__)


def load_settings(env: Mapping[str, str], **overrides: object) -> Settings:
    """Build :class:`Settings` from ``JOBSCHED_*`` entries of ``env`` plus explicit overrides.

    Unknown ``JOBSCHED_*`` variables are logged as warnings (``JOBSCHED_TEST_*`` is reserved for
    the test suite and ignored) so a typo does not pass silently.

    Raises:
        ConfigError: naming the variable and the reason when a value has the wrong type or range.
    """
    known = Settings.__struct_fields__
    raw: dict[str, object] = {}
    for name, value in env.items():
        if not name.startswith(PREFIX) or name.startswith(PREFIX + "TEST_"):
            continue
        key = name[len(PREFIX) :].lower()
        if key in known:
            raw[key] = value
        else:
            log.warning("ignoring unknown setting %s", name)
    raw.update(overrides)
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid setting: {_name_in(str(e))}") from None


def _name_in(message: str) -> str:
    head, sep, path = message.partition(" - at `$.")
    if not sep:
        return message
    return f"{PREFIX}{path.rstrip('`').upper()}: {head}"
