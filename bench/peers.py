"""The two peer workloads, measured in this run on this machine for each peer and for jobsched:

* burst — ``--jobs`` (5,000) once no-op jobs due at one instant: seconds until all started;
* steady — ``--rate`` (500) jobs/s due for ``--duration`` (10) s, once jobs spread evenly and
  all submitted before the first is due: schedule-to-start p50/p99/max;

medians of ``--runs`` (3) runs, each on a fresh deployment. The peers (``--peers``, all by
default; ``none`` for jobsched alone): APScheduler 4 in memory and on SQLite, Celery + Redis
(ETA), arq, taskiq + taskiq-nats (:mod:`bench.peer_systems`), each with a private redis-server or
nats-server on a free port; their versions and configuration are printed first. A peer whose
library (the ``peers`` extra) or redis-server is missing is skipped with the reason. jobsched
runs in layout ``--layout`` (``one``: every role in one process) and is measured from its store.

    .venv/bin/python -m bench.peers [--runs 3] [--layout one|split] [--peers celery,arq]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.burst import run_burst
from bench.common import Layout, Summary, fmt_seconds, save_results, table, verdict
from bench.peer_systems import PEERS, Peer
from bench.sustained import parse_common, run_one

TARGET_BURST_SECONDS = 1.0
TARGET_STEADY_P99_SECONDS = 0.005
WARMUP_DUE = -1.0
"""The due time the warm-up job carries, so its record is told apart."""


@dataclass(frozen=True)
class Workload:
    name: str
    dues: Callable[[float], list[float]]
    """The due instants (epoch s) of the jobs for a first due instant t0."""
    size: int


def workloads(args: argparse.Namespace) -> tuple[Workload, Workload]:
    n_steady = round(args.rate * args.duration)
    burst = Workload("burst", lambda t0: [t0] * args.jobs, args.jobs)
    steady = Workload("steady", lambda t0: [t0 + i / args.rate for i in range(n_steady)], n_steady)
    return burst, steady


def read_records(path: Path) -> list[tuple[float, float]]:
    """(due, started) of every job the peer ran (:func:`bench.peer_tasks.record`)."""
    if not path.exists():
        return []
    out = []
    for ln in path.read_text().splitlines():
        due, _, started = ln.partition(" ")
        if started:
            out.append((float(due), float(started)))
    return out


async def wait_records(
    path: Path, n: int, deadline: float, peer: Peer
) -> list[tuple[float, float]]:
    """Until ``path`` holds ``n`` records or the monotonic ``deadline`` passes."""
    while True:
        recs = read_records(path)
        if len(recs) >= n or time.monotonic() > deadline:
            return recs
        peer.check_alive()
        await asyncio.sleep(0.1)


def lateness(records: Sequence[tuple[float, float]], jobs: int) -> list[float]:
    """Seconds from due to started of each of ``jobs`` jobs, inf for each that never started;
    the warm-up job's record is left out."""
    late = [s - d for d, s in records if d != WARMUP_DUE]
    return late + [math.inf] * (jobs - len(late))


async def run_peer(cls: type[Peer], w: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """One run of workload ``w`` on a fresh ``cls``: submission figures and start delays."""
    root = Path(tempfile.mkdtemp(prefix="jobsched-peers-"))
    log = root / "started.log"
    peer = cls(root, log)
    failed = True
    try:
        async with AsyncExitStack() as stack:
            await peer.start(stack)
            await peer.submit([WARMUP_DUE])
            warm = await wait_records(log, 1, time.monotonic() + 60, peer)
            if not warm:
                raise RuntimeError(f"{peer.name}: the warm-up job did not run within 60 s")
            lead = args.lead or 2.0 + w.size / peer.submits_per_second
            t0 = math.ceil(time.time() + lead)
            dues = w.dues(t0)
            s0 = time.perf_counter()
            await peer.submit(dues)
            submit_seconds = time.perf_counter() - s0
            overrun = time.time() - t0
            if overrun > 0:
                print(
                    f"  WARNING: submission ended {overrun:.1f} s after the first job was due "
                    "(raise --lead)",
                    file=sys.stderr,
                )
            recs = await wait_records(
                log, 1 + len(dues), time.monotonic() + max(dues) - time.time() + args.timeout, peer
            )
        failed = False
    finally:
        if failed or args.keep:
            print(f"(kept {root})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    late = lateness(recs, len(dues))
    return {
        "submit_seconds": submit_seconds,
        "submit_rate_per_second": len(dues) / submit_seconds if submit_seconds else math.nan,
        "submit_overrun_seconds": max(0.0, overrun),
        "jobs": len(dues),
        "started": sum(1 for x in late if x != math.inf),
        "all_started_seconds": max(late, default=math.nan),
        "_start": Summary.of(late),
    }


async def measure_peer(cls: type[Peer], args: argparse.Namespace) -> dict[str, Any] | None:
    peer = cls(Path(), Path())
    why = peer.missing()
    if why:
        print(f"\n{peer.name}: SKIPPED — {why}")
        return None
    print(f"\n{peer.name}: {peer.versions()}\n  {peer.config()}")
    burst, steady = workloads(args)
    bursts, steadies = [], []
    for i in range(args.runs if "burst" in args.workloads else 0):
        print(f"== {peer.name}: burst run {i + 1}/{args.runs}", file=sys.stderr)
        bursts.append(await run_peer(cls, burst, args))
    for i in range(args.runs if "steady" in args.workloads else 0):
        print(f"== {peer.name}: steady run {i + 1}/{args.runs}", file=sys.stderr)
        steadies.append(await run_peer(cls, steady, args))
    return summarize(peer.name, peer.durable, bursts, steadies, peer.versions(), peer.config())


def median(xs: Sequence[float]) -> float:
    """The median; NaN for none (a workload not run, shown as ``-``)."""
    return statistics.median(xs) if xs else math.nan


def summarize(
    name: str,
    durable: str,
    bursts: Sequence[dict[str, Any]],
    steadies: Sequence[dict[str, Any]],
    versions: str,
    config: str,
) -> dict[str, Any]:
    return {
        "name": name,
        "durable": durable,
        "versions": versions,
        "config": config,
        "submits_per_second": median(
            [
                r["submission"]["submit_rate_per_second"]
                if "submission" in r
                else r["submit_rate_per_second"]
                for r in [*bursts, *steadies]
            ]
        ),
        "burst_all_started_seconds": median([b["all_started_seconds"] for b in bursts]),
        "steady_p50_seconds": median([s["_start"].p50 for s in steadies]),
        "steady_p99_seconds": median([s["_start"].p99 for s in steadies]),
        "steady_max_seconds": median([s["_start"].max for s in steadies]),
        "burst_runs_seconds": [b["all_started_seconds"] for b in bursts],
        "steady_p99_runs_seconds": [s["_start"].p99 for s in steadies],
    }


async def measure_jobsched(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.parse(args.layout)
    bursts, steadies = [], []
    for i in range(args.runs if "burst" in args.workloads else 0):
        print(f"== jobsched: burst run {i + 1}/{args.runs}", file=sys.stderr)
        bursts.append(await run_burst(layout, args.jobs, args))
    for i in range(args.runs if "steady" in args.workloads else 0):
        print(f"== jobsched: steady run {i + 1}/{args.runs}", file=sys.stderr)
        steadies.append(await run_one(layout, "once", args.rate, args))
    name = f"jobsched ({layout.label}, SQLite)"
    return summarize(name, "yes", bursts, steadies, "this checkout", f"layout {layout.label}")


def is_ours(r: dict[str, Any], full_size: bool) -> bool:
    """Whether a row gets a target verdict: jobsched's, at the issue's sizes (no other)."""
    return full_size and r["name"].startswith("jobsched")


def print_table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\npeers — medians of {args.runs} run(s) in this sitting; burst = {args.jobs:,} once jobs "
        f"due at one instant, time until all started; steady = {args.rate:g} jobs/s due for "
        f"{args.duration:g} s, schedule-to-start"
    )
    burst_target = "burst" in args.workloads and args.jobs == 5000
    steady_target = "steady" in args.workloads and args.rate == 500 and args.duration == 10
    rows = [
        [
            r["name"],
            r["durable"],
            f"{r['submits_per_second']:,.0f}",
            fmt_seconds(r["burst_all_started_seconds"]),
            verdict(r["burst_all_started_seconds"], TARGET_BURST_SECONDS)
            if is_ours(r, burst_target)
            else "",
            fmt_seconds(r["steady_p50_seconds"]),
            fmt_seconds(r["steady_p99_seconds"]),
            fmt_seconds(r["steady_max_seconds"]),
            verdict(r["steady_p99_seconds"], TARGET_STEADY_P99_SECONDS)
            if is_ours(r, steady_target)
            else "",
        ]
        for r in results
    ]
    headers = [
        "system",
        "durable?",
        "submits/s",
        "burst: all started",
        f"<= {TARGET_BURST_SECONDS:g} s",
        "steady p50",
        "steady p99",
        "steady max",
        f"p99 <= {TARGET_STEADY_P99_SECONDS * 1000:g} ms",
    ]
    print(table(headers, rows))
    for r in results:
        print(
            f"  {r['name']}: "
            + "; ".join(
                f"{label} " + ", ".join(fmt_seconds(x) for x in r[key])
                for label, key in (
                    ("burst runs", "burst_runs_seconds"),
                    ("steady p99 runs", "steady_p99_runs_seconds"),
                )
                if r[key]
            )
        )


def selected_peers(text: str) -> list[type[Peer]]:
    if text == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise SystemExit(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)}, none)")
    return [PEERS[n] for n in names]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for cls in selected_peers(args.peers):
        r = await measure_peer(cls, args)
        if r is not None:
            results.append(r)
    if args.jobsched:
        results.append(await measure_jobsched(args))
    print_table(results, args)
    return {"args": {**vars(args), "workloads": sorted(args.workloads)}, "results": results}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--jobs", type=int, default=5000, help="burst size (5,000)")
    p.add_argument("--rate", type=float, default=500.0, help="steady: jobs due per second (500)")
    p.add_argument(
        "--workloads",
        type=lambda t: set(t.split(",")) - {""},
        default={"burst", "steady"},
        help="burst,steady (both)",
    )
    p.add_argument("--peers", default=",".join(PEERS), help=f"{','.join(PEERS)} or none")
    p.add_argument(
        "--jobsched",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure jobsched after the peers (default)",
    )
    p.add_argument("--layout", default="one", choices=["one", "split", "inproc"])
    p.add_argument("--timeout", type=float, default=60.0, help="max wait after the last due, s")
    p.add_argument(
        "--lead",
        type=float,
        default=0.0,
        help="s from submitting to the first due instant (0: from each peer's usual submit rate)",
    )
    p.add_argument("--profile-seconds", type=float, default=10.0)
    parse_common(p)
    p.set_defaults(duration=10.0, drain=20.0)
    args = p.parse_args()
    selected_peers(args.peers)  # a bad --peers fails before anything starts
    if not args.workloads or args.workloads - {"burst", "steady"}:
        p.error("--workloads: burst, steady or burst,steady")
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('peers', result, args.json)}")


if __name__ == "__main__":
    main()
