"""core.settings: defaults, JOBSCHED_* parsing, errors that name the variable."""

from __future__ import annotations

import logging

import pytest

from core.errors import ConfigError
from core.settings import Settings, load_settings


def test_no_variables_give_the_documented_defaults() -> None:
    s = load_settings({})

    assert s == Settings()
    assert (s.nats_url, s.partitions, s.subject_prefix) == ("nats://127.0.0.1:4222", 64, "jobsched")
    assert (s.http_host, s.http_port, s.queues) == ("127.0.0.1", 8080, "default")
    assert (s.ack_wait_seconds, s.max_deliver, s.log_format) == (30.0, 20, "text")
    assert (s.history_limit, s.history_max_age_seconds) == (1000, 30 * 86400.0)
    assert s.history_sweep_interval_seconds == 3600.0


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

    assert (s.partitions, s.http_port) == (128, 0)
    assert isinstance(s.partitions, int)
    assert (s.ack_wait_seconds, s.retry_backoff_seconds) == (2.5, 1.0)
    assert isinstance(s.retry_backoff_seconds, float)
    assert s.queue_names == ["default", "reports", "cpu"]
    assert (s.log_format, s.nats_url) == ("json", "nats://a:4222,nats://b:4222")
    assert s.recorder_ack_wait_seconds == 90.0


def test_other_variables_are_ignored() -> None:
    s = load_settings({"PATH": "/bin", "PARTITIONS": "3", "jobsched_partitions": "3"})

    assert s.partitions == 64


def test_overrides_win_over_the_environment() -> None:
    s = load_settings({"JOBSCHED_PARTITIONS": "128"}, partitions=8, data_dir="/tmp/x")

    assert (s.partitions, s.data_dir) == (8, "/tmp/x")


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

    assert s.partitions == 64
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "JOBSCHED_PARTITONS" in caplog.records[0].getMessage()


def test_test_suite_variables_are_ignored_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="core.settings"):
        s = load_settings({"JOBSCHED_TEST_MONGODB_URL": "mongodb://x", "JOBSCHED_TEST_X": "1"})

    assert s == Settings()
    assert caplog.records == []


def test_env_names_are_every_variable_that_is_read() -> None:
    names = Settings.env_names()

    assert {"JOBSCHED_NATS_URL", "JOBSCHED_PARTITIONS", "JOBSCHED_LOG_LEVEL"} <= names
    assert len(names) == len(Settings.__struct_fields__)
    for name in names:
        assert name.startswith("JOBSCHED_")
        assert name == name.upper()


def test_every_env_name_is_read_by_the_loader(caplog: pytest.LogCaptureFixture) -> None:
    defaults = Settings()
    env = {
        f"JOBSCHED_{field.upper()}": str(getattr(defaults, field))
        for field in Settings.__struct_fields__
    }
    assert set(env) == Settings.env_names()

    with caplog.at_level(logging.WARNING, logger="core.settings"):
        assert load_settings(env) == defaults
    assert caplog.records == []
