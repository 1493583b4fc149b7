"""The decisions of ``bench.peers`` without running a peer: what it reads, skips and rejects."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from bench.peer_systems import APSchedulerMemory, Peer
from bench.peers import (
    WARMUP_DUE,
    lateness,
    read_records,
    runs_of,
    selected_peers,
    target_checks,
    workloads,
)


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


def _row(key: str, name: str, burst: float, p99: float, max_seconds: float) -> dict[str, object]:
    return {
        "key": key,
        "name": name,
        "burst_all_started_seconds": burst,
        "steady_p99_seconds": p99,
        "steady_max_seconds": max_seconds,
    }


def _full_size() -> argparse.Namespace:
    return argparse.Namespace(workloads={"burst", "steady"}, jobs=5000, rate=500.0, duration=10.0)


def test_jobsched_targets_are_relative_to_the_peers_of_the_same_run() -> None:
    rows = [
        _row("apscheduler-memory", "APScheduler 4 in memory", 0.6, 0.001, 0.002),
        _row("celery", "Celery + Redis (ETA)", 30.0, 0.002, 0.004),
        _row("jobsched-split", "jobsched (split, SQLite)", 0.5, 0.010, 0.020),
        _row("jobsched-one", "jobsched (one, SQLite)", 1.2, 0.0015, 0.008),
    ]
    checks = {
        c["target"]: (c["system"], c["limit"], c["verdict"])
        for c in target_checks(rows, _full_size())
    }
    assert checks == {
        "burst 5,000 (split): all started <= APScheduler 4 in memory": (
            "jobsched (split, SQLite)",
            0.6,
            "PASS",
        ),
        "burst 5,000 (one process): all started <= 1 s": ("jobsched (one, SQLite)", 1.0, "MISS"),
        "steady 500/s (one process): p99 <= Celery + Redis (ETA)": (
            "jobsched (one, SQLite)",
            0.002,
            "PASS",
        ),
        "steady 500/s (one process): max <= 10 ms": ("jobsched (one, SQLite)", 0.010, "PASS"),
    }


def test_a_relative_target_whose_peer_was_not_measured_is_a_miss_and_other_sizes_get_none() -> None:
    rows = [_row("jobsched-split", "jobsched (split, SQLite)", 0.5, 0.01, 0.02)]
    (check,) = target_checks(rows, _full_size())
    assert math.isnan(check["limit"])
    assert check["verdict"] == "MISS"
    small = argparse.Namespace(workloads={"burst", "steady"}, jobs=10, rate=500.0, duration=10.0)
    assert target_checks(rows, small) == []


def test_runs_of_takes_known_keys_and_positive_counts() -> None:
    assert runs_of("apscheduler-sqlite=1, jobsched-one=2") == {
        "apscheduler-sqlite": 1,
        "jobsched-one": 2,
    }
    for bad in ("bogus=1", "celery=0", "celery", "celery=x"):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=N"):
            runs_of(bad)
