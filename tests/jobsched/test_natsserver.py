"""Which nats-server jobsched runs, and the JetStream settings it gives the embedded one."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import load_settings
from jobsched.natsserver import MIN_VERSION, NatsServer, find_nats_server, server_version


def _fake_server(path: Path, version: str) -> str:
    path.write_text(f"#!/bin/sh\necho 'nats-server: v{version}'\n")
    path.chmod(0o755)
    return str(path)


def test_the_default_binary_is_supported(nats_binary: str) -> None:
    version = server_version(nats_binary)
    assert version is not None and version >= MIN_VERSION


def test_an_explicit_binary_older_than_the_minimum_is_refused_naming_both_versions(
    tmp_path: Path,
) -> None:
    old = _fake_server(tmp_path / "nats-server", "2.9.10")
    with pytest.raises(ConfigError, match=r"is nats-server 2\.9\.10; jobsched needs 2\.12\.0"):
        find_nats_server({"JOBSCHED_NATS_SERVER": old})


def test_an_explicit_binary_that_is_not_a_nats_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a nats-server executable"):
        find_nats_server({"JOBSCHED_NATS_SERVER": str(tmp_path / "missing")})


def test_an_old_server_on_path_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_server(tmp_path / "nats-server", "2.9.10")
    monkeypatch.setenv("PATH", str(tmp_path))
    found = find_nats_server({})
    assert found != str(tmp_path / "nats-server")
    assert (server_version(found) or (0,)) >= MIN_VERSION


def test_an_explicit_supported_binary_is_taken_as_it_is(tmp_path: Path) -> None:
    new = _fake_server(tmp_path / "nats-server", "2.12.0")
    assert find_nats_server({"JOBSCHED_NATS_SERVER": new}) == new


@pytest.mark.parametrize(("policy", "always"), [("always", True), ("2m", False)])
def test_the_embedded_server_runs_with_the_fsync_policy_asked_for(
    nats_binary: str, tmp_path: Path, policy: str, always: bool
) -> None:
    server = NatsServer(nats_binary, tmp_path / "nats", sync_interval=policy, monitor=True)
    server.start()
    try:
        with urllib.request.urlopen(f"{server.monitor_url}/varz", timeout=5) as r:
            config = json.load(r)["jetstream"]["config"]
    finally:
        server.stop()
    assert bool(config.get("sync_always")) is always
    assert config["store_dir"].startswith(str(tmp_path / "nats"))


def test_the_default_fsync_policy_syncs_every_second(nats_binary: str, tmp_path: Path) -> None:
    server = NatsServer(nats_binary, tmp_path / "nats", monitor=True)
    server.start()
    try:
        with urllib.request.urlopen(f"{server.monitor_url}/varz", timeout=5) as r:
            config = json.load(r)["jetstream"]["config"]
    finally:
        server.stop()
    assert not config.get("sync_always")
    assert config["sync_interval"] == 1_000_000_000  # nanoseconds


@pytest.mark.parametrize("value", ["", "sometimes", "0s", "1d", "-1s"])
def test_a_bad_sync_interval_setting_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ConfigError, match="JOBSCHED_NATS_SYNC_INTERVAL"):
        load_settings({"JOBSCHED_NATS_SYNC_INTERVAL": value})


def test_an_orphaned_server_of_the_same_storage_is_stopped_before_a_start(
    nats_binary: str, tmp_path: Path
) -> None:
    orphan = NatsServer(nats_binary, tmp_path / "nats")
    orphan.start()
    orphan_proc = orphan._proc
    assert orphan_proc is not None
    successor = NatsServer(nats_binary, tmp_path / "nats")
    try:
        successor.start()
        assert orphan_proc.wait(10) is not None
    finally:
        successor.stop()
        orphan.stop()


def test_a_stale_pid_file_never_stops_the_server_of_another_storage(
    nats_binary: str, tmp_path: Path
) -> None:
    """A pid file can outlive its server, and its pid be reused (by a nats-server too)."""
    other = NatsServer(nats_binary, tmp_path / "other")
    other.start()
    try:
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "nats-server.pid").write_text(str(other.pid))
        mine = NatsServer(nats_binary, tmp_path / "mine")
        mine.start()
        mine.stop()
        assert other._proc is not None and other._proc.poll() is None, "another's server stopped"
    finally:
        other.stop()
