"""Every benchmark entry point runs at a tiny size, so none can break unnoticed (issue 14).

Each case runs ``python -m bench.<name> <tiny options> --no-save`` in a subprocess, as a user
would, and checks that it exits 0 and prints its table's header. Nothing here checks a speed:
the figures of a run this small mean nothing, and the machine is shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peer_systems import PEERS

ROOT = Path(__file__).resolve().parents[1]

# (module, options, a header line the table must print); the sizes keep each case to seconds
CASES = [
    (
        "latency",
        ["--jobs", "3", "--once-jobs", "3", "--once-spread", "1"],
        "once: executeAt -> startedAt",
    ),
    ("burst", ["--jobs", "20", "--timeout", "20"], "all started"),
    (
        "baseline",
        ["--messages", "200", "--serial", "20", "--sync-interval", "1s"],
        "publish_async pipelined",
    ),
    (
        "sustained",
        ["--rate", "20", "--duration", "1", "--workload", "once", "--layout", "one"],
        "start p99",
    ),
    ("api", ["--duration", "0.5", "--modes", "post", "--layout", "one"], "POST /jobs"),
    (
        "scaleout",
        ["--shapes", "1x1", "--rate", "20", "--duration", "1", "--startup", "3", "--period", "1"],
        "1 sched / 1 work",
    ),
    ("memory", ["--jobs", "200", "--near", "20", "--near-window", "5", "--watch", "1"], "peak RSS"),
    (
        "retention",
        ["--every", "0.2", "--duration", "1", "--limit", "3", "--sample", "0.5"],
        "records",
    ),
]

SLOW_CASES = [
    (
        "noisy",
        [
            *("--rate", "10", "--period", "1", "--duration", "2", "--clients", "3"),
            *("--events", "20", "--clients-at", "0.5", "--startup", "3", "--drain", "5"),
        ],
        "noisy/quiet schedule-to-start p99",
    ),
]


NO_RESULTS_FILE = {"profile_report"}
"""Entry points that write no results file, so take no ``--no-save``."""


# bench.failover is not here: at any size its two schedulers often fail to balance the leases
# within its wait (tests/faults/cluster.py wait_balanced), a flake to fix before it can guard.


def run_bench(module: str, options: list[str], timeout_s: float = 120) -> str:
    """Stdout of ``python -m bench.<module> <options>``; fails the test on a non-zero exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSCHED_")}
    cmd = [sys.executable, "-m", f"bench.{module}", *options]
    if module not in NO_RESULTS_FILE:
        cmd.append("--no-save")
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize(("module", "options", "header"), CASES, ids=[c[0] for c in CASES])
def test_benchmark_runs_and_prints_its_table(module: str, options: list[str], header: str) -> None:
    assert header in run_bench(module, options)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "options", "header"), SLOW_CASES, ids=[c[0] for c in SLOW_CASES]
)
def test_slower_benchmark_runs_and_prints_its_table(
    module: str, options: list[str], header: str
) -> None:
    assert header in run_bench(module, options)


def test_profile_report_summarises_a_py_spy_file(tmp_path: Path) -> None:
    (tmp_path / "one-stack.txt").write_text(
        "process 1;thread (0x1);run (jobsched/runtime.py:10);dispatch (actors/scheduler.py:42) 3\n"
        "process 1;thread (0x1);run (jobsched/runtime.py:10) 1\n"
    )
    out = run_bench("profile_report", [str(tmp_path)])
    assert "one-stack.txt: 4 samples" in out
    assert "dispatch (actors/scheduler.py:42)" in out


@pytest.mark.slow
def test_peers_run_each_peer_or_say_why_not(tmp_path: Path) -> None:
    """Every peer whose libraries and redis-server are here gets a row; the others say why not.

    The burst workload alone: each run starts the peer afresh, and its steady path is the same
    code with other due times (jobsched's steady path is the sustained case above).
    """
    out = run_bench(
        "peers",
        [*("--runs", "1", "--jobs", "10", "--workloads", "burst", "--lead", "1")],
        timeout_s=300,
    )
    assert "burst: all started" in out
    for cls in PEERS.values():
        peer = cls(tmp_path, tmp_path / "log")
        rows = [ln for ln in out.splitlines() if ln.startswith(peer.name + "  ")]
        if peer.missing() is None:
            assert len(rows) == 1, f"no row for {peer.name}:\n{out}"
            assert "never" not in rows[0], f"{peer.name} did not run every job:\n{out}"
        else:
            assert f"{peer.name}: SKIPPED" in out
    assert any(ln.startswith("jobsched (one, SQLite)  ") for ln in out.splitlines())
