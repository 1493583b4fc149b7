"""Every benchmark entry point runs at a tiny size, so none can break unnoticed (issue 14).

Each case runs ``python -m bench.<name> <tiny options> --no-save`` in a subprocess, as a user
would, and checks that it exits 0 and prints its table's header. Nothing here checks a speed:
the figures of a run this small mean nothing, and the machine is shared. The cases all start
at once (each has its own nats-server, ports and temp dir, and mostly waits for due times), so
the test takes about as long as its longest case (~55 s at a load average of 9). The cases in
``WRITES_RESULTS`` write their results file, which ``bench.capacity`` and ``bench.report`` then
read, as after a sitting.
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
        ["--rate", "20", "--duration", "1", "--workload", "once", "--layout", "split"],
        "start p99",
    ),
    ("api", ["--duration", "0.5", "--modes", "post", "--layout", "one"], "POST /jobs"),
    (
        "scaleout",
        [
            *("--shapes", "1x1", "--rate", "20", "--cost-rate", "0"),
            *("--duration", "1", "--startup", "3", "--period", "1"),
        ],
        "1 sched / 1 work",
    ),
    ("memory", ["--jobs", "200", "--near", "20", "--near-window", "5", "--watch", "1"], "peak RSS"),
    (
        "retention",
        ["--every", "0.2", "--duration", "1", "--limit", "3", "--sample", "0.5"],
        "records",
    ),
    ("store", ["--runs", "20", "--batches", "2,10", "--scan-jobs", "50"], "dispatch µs/run"),
    (
        "dashboard",
        ["--jobs", "60", "--other-jobs", "10", "--runs", "600", "--repeat", "2", "--warmup", "1"],
        "page data",
    ),
    (
        "fairness",
        [
            *("--duration", "1", "--small-rate", "2", "--lead-seconds", "1"),
            *("--drain-seconds", "20", "--layout", "one", "--scenarios", "alone,together"),
            *("--repeat", "2"),
        ],
        "small p99 together / alone: median",
    ),
]

PEERS_OPTIONS = ["--runs", "1", "--jobs", "10", "--workloads", "burst", "--lead", "1"]
"""bench.peers, the burst workload alone: each run starts a peer afresh, and a peer's steady path
is the same code with other due times (jobsched's, bench.sustained's, runs in peers-jobsched-one)."""
STAMP = "20260101T000000Z"
"""The time in the name of the results files the cases write (``bench.report`` reads it)."""

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


NO_RESULTS_FILE = {"profile_report", "capacity", "report"}
"""Entry points that write no results file, so take no ``--no-save``."""
WRITES_RESULTS = {"sustained", "scaleout", "peers-jobsched-split"}
"""Cases that write their results file to ``<out>/results/<module>-<STAMP>.json``."""
TIMEOUT_SECONDS = 300

# bench.failover is not here: its two schedulers often fail to balance the leases within its
# wait (tests/faults/cluster.py wait_balanced) on a loaded machine, a flake to fix first.


COMMANDS: dict[str, tuple[str, list[str]]] = {
    **{m: (m, o) for m, o, _ in CASES + SLOW_CASES},
    **{
        f"peers-{k}": ("peers", [*PEERS_OPTIONS, "--peers", k, "--no-jobsched", "--no-baseline"])
        for k in PEERS
    },
    "peers-jobsched-split": (
        "peers",
        [*PEERS_OPTIONS, "--peers", "none", "--layout", "split", "--baseline-messages", "200"],
    ),
    "peers-jobsched-one": (
        "peers",
        [
            *PEERS_OPTIONS,
            *("--peers", "none", "--layout", "one", "--no-baseline"),
            # jobsched's steady path too: bench.sustained's run_one, which once crashed here
            # (issue 14: the Namespace had no `set`)
            *("--workloads", "burst,steady", "--rate", "10", "--duration", "1"),
        ],
    ),
}
"""Every case: its key -> module and options; bench.peers runs as one process per peer and per
jobsched layout, so they run side by side."""


class Runs:
    """The benchmark processes of this module, started together; :meth:`stdout` awaits one."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.procs: dict[str, tuple[list[str], subprocess.Popen[bytes]]] = {}

    def start(self, case: str, module: str, options: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSCHED_")}
        cmd = [sys.executable, "-m", f"bench.{module}", *options]
        if case in WRITES_RESULTS:
            cmd += ["--json", str(self.results_file(module))]
        elif module not in NO_RESULTS_FILE:
            cmd.append("--no-save")
        with (
            (self.out_dir / f"{case}.out").open("wb") as out,
            (self.out_dir / f"{case}.err").open("wb") as err,
        ):
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        self.procs[case] = (cmd, proc)

    def results_file(self, module: str) -> Path:
        return self.out_dir / "results" / f"{module}-{STAMP}.json"

    def stdout(self, case: str) -> str:
        """Its stdout once it exited; fails the test on a non-zero exit or after TIMEOUT_SECONDS."""
        cmd, proc = self.procs[case]
        rc = proc.wait(TIMEOUT_SECONDS)
        err = (self.out_dir / f"{case}.err").read_text(errors="replace")
        assert rc == 0, f"{' '.join(cmd)} exited {rc}:\n{err[-3000:]}"
        return (self.out_dir / f"{case}.out").read_text(errors="replace")

    def stop(self) -> None:
        for _, proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def peer_problem(key: str, out: str, tmp_path: Path) -> str | None:
    """A peer whose libraries and redis-server are here gets a row in which every job started;
    otherwise it says why it was skipped."""
    peer = PEERS[key](tmp_path, tmp_path / "log")
    if peer.missing() is not None:
        return None if f"{peer.name}: SKIPPED" in out else "no SKIPPED line"
    rows = [ln for ln in out.splitlines() if ln.startswith(peer.name + "  ")]
    if len(rows) != 1:
        return f"no row for {peer.name}"
    return "not every job started" if "never" in rows[0] else None


def jobsched_peer_problem(layout: str, out: str) -> str | None:
    """Split and one process run as two cases side by side (``--layout split,one`` in a sitting);
    the split case measures the raw-NATS baseline too."""
    if not any(ln.startswith(f"jobsched ({layout}, SQLite)  ") for ln in out.splitlines()):
        return f"no jobsched ({layout}) row"
    if ("raw NATS in this run" in out) != (layout == "split"):
        return "the raw-NATS line is missing or extra"
    return None


def case_problem(case: str, out: str, tmp_path: Path) -> str | None:
    """What is wrong with a case's output, or None."""
    headers = {c[0]: c[2] for c in CASES + SLOW_CASES}
    if case.startswith("peers-jobsched-"):
        return jobsched_peer_problem(case.removeprefix("peers-jobsched-"), out)
    if case.startswith("peers-"):
        return peer_problem(case.removeprefix("peers-"), out, tmp_path)
    if headers[case] not in out:
        return f"no {headers[case]!r}"
    if case == "scaleout" and "partitions per scheduler" not in out:
        return "no capacity plan"  # from its 1x1 row (--cost-rate 0: a deployment fewer)
    return None


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_SECONDS + 60)
def test_every_benchmark_entry_point_runs_and_prints_its_table(tmp_path: Path) -> None:
    """One test, so that pytest-xdist runs it on one worker: every case starts at once, then
    bench.capacity and bench.report read the results files the sustained, scaleout and peers
    cases wrote. (As parametrized tests around a module fixture, two workers each started every
    case: a worker's session holds every item, not the ones it runs.)"""
    runs = Runs(tmp_path)
    problems: dict[str, str] = {}
    waiting_for_report = {"sustained", "scaleout", "peers-jobsched-split"}

    def output(case: str) -> str | None:
        try:
            return runs.stdout(case)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            problems[case] = str(e)
            return None

    try:
        for case, command in COMMANDS.items():
            runs.start(case, *command)
        for case in COMMANDS:
            out = output(case)
            if out is None:
                continue
            why = case_problem(case, out, tmp_path)
            if why:
                problems[case] = f"{why}:\n{out[-3000:]}"
            # each reader starts as soon as the files it reads are written
            if case == "sustained":
                runs.start("capacity", "capacity", [str(runs.results_file("sustained"))])
            waiting_for_report.discard(case)
            if not waiting_for_report and "report" not in runs.procs:
                runs.start("report", "report", ["--dir", str(runs.results_file("peers").parent)])
        expected = {
            # the gateway's cost comes from the once jobs' submission
            "capacity": ["partitions per scheduler", "CPU ms per job POSTed", "50,000"],
            # the memory, api and burst figures are not in these files
            "report": ["issue 14 targets", "not measured"],
        }
        for case, needles in expected.items():
            out = output(case)
            missing = [n for n in needles if out is not None and n not in out]
            if missing:
                problems[case] = f"no {missing}:\n{out}"
    finally:
        runs.stop()
    assert not problems, "\n\n".join(f"== {case}: {why}" for case, why in problems.items())


def test_profile_report_summarises_a_py_spy_file(tmp_path: Path) -> None:
    (tmp_path / "one-stack.txt").write_text(
        "process 1;thread (0x1);run (jobsched/runtime.py:10);dispatch (actors/scheduler.py:42) 3\n"
        "process 1;thread (0x1);run (jobsched/runtime.py:10) 1\n"
    )
    r = Runs(tmp_path)
    r.start("profile_report", "profile_report", [str(tmp_path)])
    out = r.stdout("profile_report")
    assert "one-stack.txt: 4 samples" in out
    assert "dispatch (actors/scheduler.py:42)" in out
