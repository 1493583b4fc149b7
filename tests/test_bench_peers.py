"""The decisions of ``bench.peers`` without running a peer: what it reads, skips and rejects."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from bench.peer_systems import APSchedulerMemory, Peer
from bench.peers import WARMUP_DUE, lateness, read_records, selected_peers, workloads


def test_records_are_read_as_due_and_started_and_a_torn_last_line_is_ignored(
    tmp_path: Path,
) -> None:
    log = tmp_path / "started.log"
    log.write_text(f"{WARMUP_DUE!r} 10.5\n100.0 100.25\n100.0 100.5\n101.0")
    assert read_records(log) == [(WARMUP_DUE, 10.5), (100.0, 100.25), (100.0, 100.5)]
    assert read_records(tmp_path / "absent.log") == []


def test_burst_is_every_job_at_one_instant_and_steady_spreads_the_rate_evenly() -> None:
    args = argparse.Namespace(jobs=3, rate=4.0, duration=0.5)
    burst, steady = workloads(args)
    assert burst.dues(1000.0) == [1000.0, 1000.0, 1000.0]
    assert steady.size == 2
    assert steady.dues(1000.0) == [1000.0, 1000.25]


def test_a_peer_whose_library_is_missing_says_which_and_how_to_install_it(
    tmp_path: Path,
) -> None:
    class Absent(Peer):
        name = "absent"
        modules = ("no_such_module_for_bench",)

    why = Absent(tmp_path, tmp_path / "log").missing()
    assert why is not None
    assert "no_such_module_for_bench" in why
    assert ".[peers]" in why


def test_a_peer_needing_redis_is_skipped_without_redis_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NeedsRedis(Peer):
        name = "needs redis"
        needs_redis = True

    monkeypatch.setenv("PATH", str(tmp_path))
    why = NeedsRedis(tmp_path, tmp_path / "log").missing()
    assert why is not None
    assert "redis-server" in why


def test_unknown_peers_are_rejected_naming_the_known_ones() -> None:
    with pytest.raises(SystemExit, match=r"unknown bogus .*apscheduler-memory"):
        selected_peers("arq,bogus")
    assert selected_peers("none") == []
    assert selected_peers("apscheduler-memory") == [APSchedulerMemory]


def test_a_job_that_never_started_counts_as_infinitely_late_and_the_warm_up_not_at_all() -> None:
    late = lateness([(WARMUP_DUE, 5.0), (100.0, 100.25), (100.0, 100.5)], jobs=3)
    assert late == [0.25, 0.5, math.inf]
