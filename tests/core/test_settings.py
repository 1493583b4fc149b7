"""core.settings: defaults, JOBSCHED_* parsing into the sections, errors that name the variable."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from core.errors import ConfigError
from core.history import Retention
from core.quotas import Quotas
from core.settings import SchedulerConfig, Settings, WorkerConfig, load_settings


def test_no_variables_give_the_documented_defaults() -> None:
    s = load_settings({})

    assert s == Settings()
    assert (s.nats.url, s.nats.subject_prefix) == ("nats://127.0.0.1:4222", "jobsched")
    assert (s.scheduler.partitions, s.retention.partitions, s.gateway.partitions) == (64, 64, 64)
    assert (s.http.host, s.http.port, s.worker.queues) == ("127.0.0.1", 8080, ("default",))
    assert (s.nats.ack_wait_seconds, s.nats.max_deliver, s.log_format) == (30.0, 20, "text")
    assert (s.retention.history_limit, s.retention.history_max_age_seconds) == (1000, 30 * 86400.0)
    assert s.retention.sweep_interval_seconds == 3600.0


def test_values_are_parsed_from_strings() -> None:
    s = load_settings(
        {
            "JOBSCHED_PARTITIONS": "128",
            "JOBSCHED_HTTP_PORT": "0",
            "JOBSCHED_ACK_WAIT_SECONDS": "2.5",
            "JOBSCHED_RETRY_BACKOFF_SECONDS": "1",
            "JOBSCHED_QUEUES": "default, reports ,,cpu",
            "JOBSCHED_LOG_FORMAT": "json",
            "JOBSCHED_NATS_URL": "nats://a:4222,nats://b:4222",
            "JOBSCHED_RECORDER_ACK_WAIT_SECONDS": "90",
        }
    )

    assert (s.scheduler.partitions, s.http.port) == (128, 0)
    assert isinstance(s.scheduler.partitions, int)
    assert (s.worker.ack_wait_seconds, s.worker.retry_backoff_seconds) == (2.5, 1.0)
    assert isinstance(s.worker.retry_backoff_seconds, float)
    assert s.worker.queues == ("default", "reports", "cpu")
    assert (s.log_format, s.nats.url) == ("json", "nats://a:4222,nats://b:4222")
    assert s.nats.servers == ["nats://a:4222", "nats://b:4222"]
    assert s.nats.recorder_ack_wait_seconds == 90.0


def test_other_variables_are_ignored() -> None:
    s = load_settings({"PATH": "/bin", "PARTITIONS": "3", "jobsched_partitions": "3"})

    assert s == Settings()


def test_overrides_win_over_the_environment() -> None:
    s = load_settings({"JOBSCHED_PARTITIONS": "128"}, partitions=8, data_dir="/tmp/x")

    assert (s.scheduler.partitions, s.data_dir, s.worker.data_dir) == (8, "/tmp/x", "/tmp/x")


def test_an_override_that_names_no_variable_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="JOBSCHED_PARTITONS"):
        load_settings({}, partitons=8)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("JOBSCHED_PARTITIONS", "lots"),
        ("JOBSCHED_PARTITIONS", "0"),
        ("JOBSCHED_PARTITIONS", "2.5"),
        ("JOBSCHED_HTTP_PORT", "65536"),
        ("JOBSCHED_ACK_WAIT_SECONDS", "-1"),
        ("JOBSCHED_ACK_WAIT_SECONDS", "soon"),
        ("JOBSCHED_LOG_FORMAT", "xml"),
        ("JOBSCHED_SUBJECT_PREFIX", "a.b"),
        ("JOBSCHED_MAX_DELIVER", ""),
        ("JOBSCHED_RECORDER_ACK_WAIT_SECONDS", "0.5"),
        ("JOBSCHED_RECORDER_ACK_WAIT_SECONDS", "3601"),
        ("JOBSCHED_HISTORY_LIMIT", "-1"),
        ("JOBSCHED_HISTORY_LIMIT", "many"),
        ("JOBSCHED_HISTORY_MAX_AGE_SECONDS", "-5"),
        ("JOBSCHED_HISTORY_SWEEP_INTERVAL_SECONDS", "0"),
        ("JOBSCHED_QUOTA_ACTIVE_JOBS", "-1"),
        ("JOBSCHED_QUOTA_CREATES_BURST", "0"),
        ("JOBSCHED_WS_STALL_SECONDS", "0"),
        ("JOBSCHED_STORE_TIMEOUT_SECONDS", "0"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"JOBSCHED_PARTITIONS": "16", name: value})

    assert name in str(caught.value)
    assert caught.value.code == "config_error"


def test_an_unknown_variable_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="core.settings"):
        s = load_settings({"JOBSCHED_PARTITONS": "8"})

    assert s.scheduler.partitions == 64
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "JOBSCHED_PARTITONS" in caplog.records[0].getMessage()


def test_test_suite_variables_are_ignored_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="core.settings"):
        s = load_settings({"JOBSCHED_TEST_MONGODB_URL": "mongodb://x", "JOBSCHED_TEST_X": "1"})

    assert s == Settings()
    assert caplog.records == []


ENV_FIELDS: dict[str, tuple[str, tuple[str, ...], Any]] = {
    # variable: (a value to set, every settings field it must land in, that field's value)
    "JOBSCHED_NATS_URL": ("nats://a:1,nats://b:2", ("nats.url",), "nats://a:1,nats://b:2"),
    "JOBSCHED_STORE_URL": ("mongodb://m/x", ("store.url",), "mongodb://m/x"),
    "JOBSCHED_DATA_DIR": ("/var/x", ("data_dir", "worker.data_dir"), "/var/x"),
    "JOBSCHED_AUTH_SECRET": ("k" * 32, ("gateway.auth_secret",), "k" * 32),
    "JOBSCHED_PARTITIONS": (
        "16",
        ("scheduler.partitions", "retention.partitions", "gateway.partitions"),
        16,
    ),
    "JOBSCHED_SUBJECT_PREFIX": ("p1", ("nats.subject_prefix",), "p1"),
    "JOBSCHED_HTTP_HOST": ("0.0.0.0", ("http.host",), "0.0.0.0"),
    "JOBSCHED_HTTP_PORT": ("9000", ("http.port",), 9000),
    "JOBSCHED_METRICS_PORT": ("9100", ("metrics.port",), 9100),
    "JOBSCHED_QUEUE_DEPTH_INTERVAL_SECONDS": (
        "2.5",
        ("metrics.queue_depth_interval_seconds",),
        2.5,
    ),
    "JOBSCHED_QUEUES": ("a, b", ("worker.queues",), ("a", "b")),
    "JOBSCHED_ACK_WAIT_SECONDS": (
        "12",
        ("nats.ack_wait_seconds", "scheduler.ack_wait_seconds", "worker.ack_wait_seconds"),
        12.0,
    ),
    "JOBSCHED_RECORDER_ACK_WAIT_SECONDS": ("45", ("nats.recorder_ack_wait_seconds",), 45.0),
    "JOBSCHED_MAX_DELIVER": ("7", ("nats.max_deliver", "gateway.max_deliver"), 7),
    "JOBSCHED_WORKER_CONCURRENCY": ("3", ("worker.concurrency",), 3),
    "JOBSCHED_WORKER_CPU_SLOTS": ("2", ("worker.cpu_slots",), 2),
    "JOBSCHED_SCAN_INTERVAL_SECONDS": ("1.5", ("scheduler.scan_interval_seconds",), 1.5),
    "JOBSCHED_LOOKAHEAD_SECONDS": ("9", ("scheduler.lookahead_seconds",), 9.0),
    "JOBSCHED_PREPARE_AHEAD_SECONDS": ("0.5", ("scheduler.prepare_ahead_seconds",), 0.5),
    "JOBSCHED_REDISPATCH_AFTER_SECONDS": ("99", ("scheduler.redispatch_after_seconds",), 99.0),
    "JOBSCHED_RETRY_BACKOFF_SECONDS": ("0.2", ("worker.retry_backoff_seconds",), 0.2),
    "JOBSCHED_RETRY_BACKOFF_MAX_SECONDS": ("8", ("worker.retry_backoff_max_seconds",), 8.0),
    "JOBSCHED_DUPLICATE_WINDOW_SECONDS": (
        "60",
        ("nats.duplicate_window_seconds", "scheduler.duplicate_window_seconds"),
        60.0,
    ),
    "JOBSCHED_STATUS_RETENTION_SECONDS": ("600", ("nats.status_retention_seconds",), 600.0),
    "JOBSCHED_HISTORY_LIMIT": ("5", ("retention.history_limit",), 5),
    "JOBSCHED_HISTORY_MAX_AGE_SECONDS": ("7200", ("retention.history_max_age_seconds",), 7200.0),
    "JOBSCHED_HISTORY_SWEEP_INTERVAL_SECONDS": (
        "120",
        ("retention.sweep_interval_seconds",),
        120.0,
    ),
    "JOBSCHED_STREAM_REPLICAS": ("3", ("nats.stream_replicas",), 3),
    "JOBSCHED_LEASE_TTL_SECONDS": ("15", ("scheduler.lease_ttl_seconds",), 15.0),
    "JOBSCHED_SCHEDULER_ID": ("s-1", ("scheduler.scheduler_id",), "s-1"),
    "JOBSCHED_STORE_TIMEOUT_SECONDS": ("0.5", ("store.timeout_seconds",), 0.5),
    "JOBSCHED_WS_BUFFER_EVENTS": ("10", ("gateway.ws_buffer_events",), 10),
    "JOBSCHED_WS_STALL_SECONDS": ("2", ("gateway.ws_stall_seconds",), 2.0),
    "JOBSCHED_WS_REPLAY_CONCURRENCY": ("8", ("gateway.ws_replay_concurrency",), 8),
    "JOBSCHED_WS_REPLAY_EVENTS_PER_SECOND": (
        "0",
        ("gateway.ws_replay_events_per_second",),
        0.0,
    ),
    "JOBSCHED_MAX_BODY_BYTES": ("1024", ("gateway.max_body_bytes",), 1024),
    "JOBSCHED_DRAIN_TIMEOUT_SECONDS": ("4", ("worker.drain_timeout_seconds",), 4.0),
    "JOBSCHED_TASKS": ("mod:fn", ("tasks",), "mod:fn"),
    "JOBSCHED_WORKER_ID": ("w-1", ("worker.worker_id",), "w-1"),
    "JOBSCHED_CORS_ALLOWED_ORIGINS": (
        "https://a.example,https://b.example",
        ("gateway.cors_allowed_origins",),
        ("https://a.example", "https://b.example"),
    ),
    "JOBSCHED_CORS_ALLOWED_METHODS": ("GET", ("gateway.cors_allowed_methods",), ("GET",)),
    "JOBSCHED_CORS_ALLOWED_HEADERS": ("X-A", ("gateway.cors_allowed_headers",), ("X-A",)),
    "JOBSCHED_WORKER_RUNNING_GRACE_SECONDS": ("0.05", ("worker.running_grace_seconds",), 0.05),
    "JOBSCHED_WORKER_PREFETCH": ("32", ("worker.prefetch",), 32),
    "JOBSCHED_WORKER_USER_CONCURRENCY": ("3", ("worker.user_concurrency",), 3),
    "JOBSCHED_WORKER_SLOT_LEASE_SECONDS": ("12.5", ("worker.slot_lease_seconds",), 12.5),
    "JOBSCHED_EVENT_LOOP": ("asyncio", ("event_loop",), "asyncio"),
    "JOBSCHED_SECRETS_DIR": ("/run/secrets", ("worker.secrets_dir",), "/run/secrets"),
    "JOBSCHED_HTTP_ALLOWED_NETWORKS": (
        "10.0.0.0/8, 127.0.0.2/32",
        ("worker.http_allowed_networks",),
        ("10.0.0.0/8", "127.0.0.2/32"),
    ),
    "JOBSCHED_LOG_FORMAT": ("json", ("log_format",), "json"),
    "JOBSCHED_LOG_LEVEL": ("DEBUG", ("log_level",), "DEBUG"),
    "JOBSCHED_NATS_CREDENTIALS_FILE": ("/c.json", ("nats.credentials_file",), "/c.json"),
    "JOBSCHED_NATS_CREDENTIALS_DIR": ("/creds", ("nats.credentials_dir",), "/creds"),
    "JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE": (
        "/seed.nk",
        ("nats.callout_issuer_seed_file",),
        "/seed.nk",
    ),
    "JOBSCHED_NATS_TLS_CA_FILE": ("/ca.pem", ("nats.tls_ca_file",), "/ca.pem"),
    "JOBSCHED_NATS_TLS_CERT_FILE": ("/c.pem", ("nats.tls_cert_file",), "/c.pem"),
    "JOBSCHED_NATS_TLS_KEY_FILE": ("/k.pem", ("nats.tls_key_file",), "/k.pem"),
    "JOBSCHED_NATS_SYNC_INTERVAL": ("always", ("nats.sync_interval",), "always"),
    "JOBSCHED_QUOTA_ACTIVE_JOBS": (
        "3",
        ("gateway.quotas.active_jobs", "scheduler.quotas.active_jobs"),
        3,
    ),
    "JOBSCHED_QUOTA_MIN_INTERVAL_SECONDS": (
        "0.25",
        ("gateway.quotas.min_interval_seconds", "scheduler.quotas.min_interval_seconds"),
        0.25,
    ),
    "JOBSCHED_QUOTA_CREATES_PER_SECOND": (
        "2",
        ("gateway.quotas.creates_per_second", "scheduler.quotas.creates_per_second"),
        2.0,
    ),
    "JOBSCHED_QUOTA_CREATES_BURST": (
        "4",
        ("gateway.quotas.creates_burst", "scheduler.quotas.creates_burst"),
        4,
    ),
    "JOBSCHED_QUOTA_RUNS_PER_MINUTE": (
        "30",
        ("gateway.quotas.runs_per_minute", "scheduler.quotas.runs_per_minute"),
        30,
    ),
}
"""Every variable of the flat settings that came before the sections (their public names: the
README, compose.yaml, deploy/kubernetes), written out here rather than read from ENV, so that a
variable that stops loading into its field fails."""


def fields_of(settings: object, prefix: str = "") -> dict[str, Any]:
    """Every leaf field of ``settings``, by dotted path."""
    out: dict[str, Any] = {}
    for name in getattr(settings, "__struct_fields__", ()):
        value = getattr(settings, name)
        if hasattr(value, "__struct_fields__"):
            out |= fields_of(value, f"{prefix}{name}.")
        else:
            out[prefix + name] = value
    return out


def test_every_variable_is_one_of_the_documented_ones() -> None:
    assert Settings.env_names() == set(ENV_FIELDS)


@pytest.mark.parametrize("name", sorted(ENV_FIELDS))
def test_each_variable_loads_into_its_fields_and_nothing_else(name: str) -> None:
    text, paths, value = ENV_FIELDS[name]

    loaded = fields_of(load_settings({name: text}))

    for path in paths:
        assert loaded[path] == value, path
        assert type(loaded[path]) is type(value), path
    defaults = fields_of(Settings())
    assert {p: v for p, v in loaded.items() if p not in paths} == {
        p: v for p, v in defaults.items() if p not in paths
    }


def test_every_variable_set_at_once_reads_back_from_the_settings_env() -> None:
    env = {name: text for name, (text, _, _) in ENV_FIELDS.items()}

    s = load_settings(env)

    assert load_settings(s.env()) == s
    assert s.env()["JOBSCHED_QUEUES"] == "a,b"
    assert s.changed(partitions=4).gateway.partitions == 4
    assert s.changed(partitions=4).nats == s.nats


def test_sections_set_by_one_variable_must_agree() -> None:
    with pytest.raises(ValueError, match="JOBSCHED_PARTITIONS"):
        Settings(scheduler=SchedulerConfig(partitions=8))
    with pytest.raises(ValueError, match="JOBSCHED_ACK_WAIT_SECONDS"):
        Settings(worker=WorkerConfig(ack_wait_seconds=1.0))


def test_the_derived_values_are_the_sections_properties() -> None:
    s = load_settings(
        {
            "JOBSCHED_ACK_WAIT_SECONDS": "7",
            "JOBSCHED_HISTORY_LIMIT": "0",
            "JOBSCHED_HISTORY_MAX_AGE_SECONDS": "60",
            "JOBSCHED_DATA_DIR": "/var/jobs",
        }
    )

    assert s.scheduler.resolved_redispatch_after_seconds == 14.0
    explicit = s.changed(redispatch_after_seconds=3)
    assert explicit.scheduler.resolved_redispatch_after_seconds == 3.0
    assert s.retention.default == Retention(keep_last=None, max_age_seconds=60.0)
    assert s.resolved_store_url == "sqlite:////var/jobs/jobsched.db"
    assert s.worker.resolved_data_dir == "/var/jobs"
    assert s.worker.resolved_worker_id == s.scheduler.resolved_scheduler_id != ""
    assert s.changed(worker_id="w").worker.resolved_worker_id == "w"
    assert s.gateway.quotas == s.scheduler.quotas == Quotas()


def test_every_env_name_is_read_by_the_loader(caplog: pytest.LogCaptureFixture) -> None:
    defaults = Settings()
    env = defaults.env()
    assert set(env) == Settings.env_names()

    with caplog.at_level(logging.WARNING, logger="core.settings"):
        assert load_settings(env) == defaults
    assert caplog.records == []


def test_a_bad_allowed_network_is_refused_at_load_naming_the_variable() -> None:
    with pytest.raises(
        ConfigError, match=r"^invalid setting: JOBSCHED_HTTP_ALLOWED_NETWORKS: allowed network"
    ):
        load_settings({"JOBSCHED_HTTP_ALLOWED_NETWORKS": "10.0.0.0/33"})
