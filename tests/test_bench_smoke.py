"""Every benchmark entry point runs at a tiny size, so none can break unnoticed (issue 14).

Each case runs ``python -m bench.<name> <tiny options> --no-save`` in a subprocess, as a user
would, and checks that it exits 0 and prints its table's header. Nothing here checks a speed:
the figures of a run this small mean nothing, and the machine is shared. The selected cases all
start at once (each has its own nats-server, ports and temp dir, and mostly waits for due
times), so the module takes about as long as its longest case, ``bench.peers``. The cases in
``WRITES_RESULTS`` write their results file, which ``bench.capacity`` and ``bench.report`` then
read, as after a sitting.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
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
        ],
        "small p99",
    ),
]

PEERS_OPTIONS = ["--runs", "1", "--jobs", "10", "--workloads", "burst", "--lead", "1"]
STAMP = "20260101T000000Z"
"""The time in the name of the results files the cases write (``bench.report`` reads it)."""
"""bench.peers, the burst workload alone: each run starts a peer afresh, and the steady path is
the same code with other due times (jobsched's steady path is the sustained case)."""

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
        [*PEERS_OPTIONS, "--peers", "none", "--layout", "one", "--no-baseline"],
    ),
}
"""Every case: its key (a test's ``case`` parameter) -> module and options; bench.peers runs as
one process per peer, so they run side by side."""


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
        if case not in self.procs:  # a case another test needs, not selected itself
            self.start(case, *COMMANDS[case])
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


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runs]:
    """Starts every case selected in this session at once."""
    selected = {
        str(item.callspec.params["case"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and "case" in getattr(getattr(item, "callspec", None), "params", {})
    }
    r = Runs(tmp_path_factory.mktemp("bench-smoke"))
    try:
        for case in sorted(selected):
            r.start(case, *COMMANDS[case])
        yield r
    finally:
        r.stop()


@pytest.mark.parametrize(
    ("case", "header"), [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_benchmark_runs_and_prints_its_table(runs: Runs, case: str, header: str) -> None:
    assert header in runs.stdout(case)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "header"), [(c[0], c[2]) for c in SLOW_CASES], ids=[c[0] for c in SLOW_CASES]
)
def test_slower_benchmark_runs_and_prints_its_table(runs: Runs, case: str, header: str) -> None:
    assert header in runs.stdout(case)


@pytest.mark.slow
@pytest.mark.parametrize(("case", "key"), [(f"peers-{k}", k) for k in PEERS], ids=list(PEERS))
def test_a_peer_runs_or_says_why_not(runs: Runs, case: str, key: str, tmp_path: Path) -> None:
    """A peer whose libraries and redis-server are here gets a row; otherwise it says why not."""
    out = runs.stdout(case)
    assert "burst: all started" in out
    peer = PEERS[key](tmp_path, tmp_path / "log")
    rows = [ln for ln in out.splitlines() if ln.startswith(peer.name + "  ")]
    if peer.missing() is None:
        assert len(rows) == 1, f"no row for {peer.name}:\n{out}"
        assert "never" not in rows[0], f"{peer.name} did not run every job:\n{out}"
    else:
        assert f"{peer.name}: SKIPPED" in out


@pytest.mark.parametrize(
    ("case", "layout"), [("peers-jobsched-split", "split"), ("peers-jobsched-one", "one")]
)
def test_peers_measures_jobsched_in_each_layout(runs: Runs, case: str, layout: str) -> None:
    """Split and one process run as two cases side by side (``--layout split,one`` in a sitting);
    the split case measures the raw-NATS baseline too."""
    out = runs.stdout(case)
    assert any(ln.startswith(f"jobsched ({layout}, SQLite)  ") for ln in out.splitlines()), out
    assert ("raw NATS in this run" in out) == (layout == "split")


@pytest.mark.parametrize("case", ["scaleout"])
def test_scaleout_prints_the_capacity_plan(runs: Runs, case: str) -> None:
    """From its 1x1 row here (``--cost-rate 0``: one deployment fewer; the cost row is a
    sustained once row, which the next test plans from)."""
    assert "partitions per scheduler" in runs.stdout(case)


@pytest.mark.parametrize("case", ["sustained"])
def test_capacity_plans_from_a_sustained_results_file(runs: Runs, case: str) -> None:
    runs.stdout(case)
    runs.start("capacity", "capacity", [str(runs.results_file("sustained"))])
    out = runs.stdout("capacity")
    assert "partitions per scheduler" in out
    assert "CPU ms per job POSTed" in out  # the gateway's cost, from the once jobs' submission
    assert "50,000" in out


@pytest.mark.parametrize("case", ["peers-jobsched-split"])
def test_report_reads_the_results_of_a_sitting(runs: Runs, case: str) -> None:
    for written in (case, "sustained", "scaleout"):
        runs.stdout(written)
    runs.start("report", "report", ["--dir", str(runs.results_file("peers").parent)])
    out = runs.stdout("report")
    assert "issue 14 targets" in out
    assert "not measured" in out  # the memory, api and burst figures are not in these files


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
