"""The two peer workloads, measured in this run on this machine for each peer and for jobsched:

* burst — ``--jobs`` (5,000) once no-op jobs due at one instant: seconds until all started;
* steady — ``--rate`` (500) jobs/s due for ``--duration`` (10) s, once jobs spread evenly and
  all submitted before the first is due: schedule-to-start p50/p99/max;

medians of ``--runs`` (3) runs, each on a fresh deployment. First the raw-NATS baseline
(:func:`bench.baseline.measure_raw_nats`, ``--no-baseline`` to leave it out), then the peers
(``--peers``, all by default; ``none`` for jobsched alone): APScheduler 4 in memory and on
SQLite, Celery + Redis (ETA), arq, taskiq + taskiq-nats (:mod:`bench.peer_systems`), each with a
private redis-server or nats-server on a free port; their versions and configuration are printed
first. A peer whose library (the ``peers`` extra) or redis-server is missing is skipped with the
reason. Then jobsched in each layout of ``--layout`` (``split,one``), measured from its store.
At the issue's sizes jobsched's rows get issue 14's targets, two of them relative to the peers
of this run (split burst vs APScheduler in memory, one-process steady p99 vs Celery).

    .venv/bin/python -m bench.peers [--runs 3] [--layout split,one] [--peers celery,arq]
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

from bench import targets
from bench.burst import run_burst
from bench.common import Layout, Summary, fmt_seconds, machine_info, save_results, table, verdict
from bench.peer_systems import PEERS, Peer
from bench.sustained import parse_common, run_one

BASELINE_PEER = {"burst": "apscheduler-memory", "steady": "celery"}
"""The peer whose figure in the same run is the target of jobsched's burst (split) and steady
p99 (one process)."""
DEFAULT_RUNS_OF = {"apscheduler-sqlite": 1}
"""APScheduler + SQLite runs once by default: each of its runs takes about 2.5 min (its 5,000
submissions at ~200/s, then its starts at ~60/s until ``--timeout``), its figures are tens of
seconds, and no target is relative to them; so the whole sitting fits in about 16 minutes."""
WARMUP_DUE = -1.0
"""The due time the warm-up jobs carry, so their records are told apart."""
WARMUP_JOBS = 50
"""Jobs due at once before each run: they prove the peer works and time its submission, from
which the lead (submission start to first due instant) is chosen on this machine."""


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
            s0 = time.perf_counter()
            await peer.submit([WARMUP_DUE] * WARMUP_JOBS)
            warm_rate = WARMUP_JOBS / (time.perf_counter() - s0)
            warm = await wait_records(log, WARMUP_JOBS, time.monotonic() + 60, peer)
            if len(warm) < WARMUP_JOBS:
                raise RuntimeError(
                    f"{peer.name}: {len(warm)} of {WARMUP_JOBS} warm-up jobs ran within 60 s"
                )
            lead = args.lead or 2.0 + 1.25 * w.size / warm_rate
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
                log,
                WARMUP_JOBS + len(dues),
                time.monotonic() + max(dues) - time.time() + args.timeout,
                peer,
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
        "lead_seconds": lead,
        "_start": Summary.of(late),
    }


async def measure_peer(cls: type[Peer], args: argparse.Namespace) -> dict[str, Any] | None:
    peer = cls(Path(), Path())
    why = peer.missing()
    if why:
        print(f"\n{peer.name}: SKIPPED — {why}")
        return None
    print(f"\n{peer.name}: {peer.versions()}\n  {peer.config()}", flush=True)
    started = time.monotonic()
    burst, steady = workloads(args)
    bursts, steadies = [], []
    runs = args.runs_of.get(key_of(cls), args.runs)
    for i in range(runs if "burst" in args.workloads else 0):
        print(f"== {peer.name}: burst run {i + 1}/{runs}", file=sys.stderr)
        bursts.append(await run_peer(cls, burst, args))
    for i in range(runs if "steady" in args.workloads else 0):
        print(f"== {peer.name}: steady run {i + 1}/{runs}", file=sys.stderr)
        steadies.append(await run_peer(cls, steady, args))
    r = summarize(peer.name, peer.durable, bursts, steadies, peer.versions(), peer.config())
    return {"key": key_of(cls), "wall_seconds": time.monotonic() - started, **r}


def key_of(cls: type[Peer]) -> str:
    return next(k for k, c in PEERS.items() if c is cls)


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
        "burst_started_fewest": min((b["started"] for b in bursts), default=0),
        "runs": max(len(bursts), len(steadies)),
        "steady_p50_seconds": median([s["_start"].p50 for s in steadies]),
        "steady_p99_seconds": median([s["_start"].p99 for s in steadies]),
        "steady_max_seconds": median([s["_start"].max for s in steadies]),
        "burst_runs_seconds": [b["all_started_seconds"] for b in bursts],
        "steady_p99_runs_seconds": [s["_start"].p99 for s in steadies],
    }


async def measure_jobsched(layout_name: str, args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.parse(layout_name)
    name = f"jobsched ({layout.label}, SQLite)"
    info = machine_info()
    versions = f"jobsched {info['source']}, {info['nats_server']}, Python {info['python']}"
    config = f"layout {layout.label}" + (
        f", settings {' '.join(args.set)}" if args.set else ", default settings"
    )
    print(f"\n{name}: {versions}\n  {config}", flush=True)
    started = time.monotonic()
    bursts, steadies = [], []
    runs = args.runs_of.get(f"jobsched-{layout.kind}", args.runs)
    for i in range(runs if "burst" in args.workloads else 0):
        print(f"== jobsched: burst run {i + 1}/{runs}", file=sys.stderr)
        bursts.append(await run_burst(layout, args.jobs, args))
    for i in range(runs if "steady" in args.workloads else 0):
        print(f"== jobsched: steady run {i + 1}/{runs}", file=sys.stderr)
        steadies.append(await run_one(layout, "once", args.rate, args))
    r = summarize(name, "yes", bursts, steadies, versions, config)
    return {
        "key": f"jobsched-{layout.kind}",
        "layout": layout.kind,
        "wall_seconds": time.monotonic() - started,
        **r,
    }


def target_checks(
    results: Sequence[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Issue 14's targets of the peer workloads against this run's rows, at the issue's sizes
    only: ``[{"target", "system", "value", "limit", "verdict"}]`` (seconds; ``limit`` NaN and
    verdict MISS where the peer it is relative to was not measured)."""
    rows = {r["key"]: r for r in results}
    burst_size = "burst" in args.workloads and args.jobs == targets.PEER_BURST_JOBS
    steady_size = (
        "steady" in args.workloads
        and args.rate == targets.PEER_STEADY_RATE
        and args.duration == targets.PEER_STEADY_SECONDS
    )

    def peer_figure(key: str, field: str) -> tuple[str, float]:
        peer = rows.get(key)
        name = PEERS[key].name
        return name, (peer[field] if peer else math.nan)

    checks = []
    split, one = rows.get("jobsched-split"), rows.get("jobsched-one")
    if burst_size and split:
        name, limit = peer_figure(BASELINE_PEER["burst"], "burst_all_started_seconds")
        checks.append(
            (
                "burst 5,000 (split): all started <= " + name,
                split,
                "burst_all_started_seconds",
                limit,
            )
        )
    if burst_size and one:
        checks.append(
            (
                f"burst 5,000 (one process): all started <= {targets.BURST_ONE_SECONDS:g} s",
                one,
                "burst_all_started_seconds",
                targets.BURST_ONE_SECONDS,
            )
        )
    if steady_size and one:
        name, limit = peer_figure(BASELINE_PEER["steady"], "steady_p99_seconds")
        checks.append(
            ("steady 500/s (one process): p99 <= " + name, one, "steady_p99_seconds", limit)
        )
        checks.append(
            (
                f"steady 500/s (one process): max <= {targets.STEADY_MAX_SECONDS * 1000:g} ms",
                one,
                "steady_max_seconds",
                targets.STEADY_MAX_SECONDS,
            )
        )
    return [
        {
            "target": label,
            "system": row["name"],
            "value": row[field],
            "limit": limit,
            "verdict": "MISS" if math.isnan(limit) else verdict(row[field], limit),
        }
        for label, row, field, limit in checks
    ]


def print_table(
    results: Sequence[dict[str, Any]],
    args: argparse.Namespace,
    raw: dict[str, Any] | None,
    checks: Sequence[dict[str, Any]],
    wall_seconds: float,
) -> None:
    print(
        f"\npeers — medians of the runs (column runs) in this sitting; burst = {args.jobs:,} "
        "once jobs due at one instant, time until all started; "
        f"steady = {args.rate:g} jobs/s due for {args.duration:g} s, schedule-to-start"
    )
    rows = [
        [
            r["name"],
            r["durable"],
            fmt_seconds(r["burst_all_started_seconds"]),
            f"{r['burst_started_fewest']:,}/{args.jobs:,}" if r["burst_runs_seconds"] else "-",
            fmt_seconds(r["steady_p50_seconds"]),
            fmt_seconds(r["steady_p99_seconds"]),
            fmt_seconds(r["steady_max_seconds"]),
            f"{r['submits_per_second']:,.0f}",
            r["runs"],
            f"{r['wall_seconds'] / 60:.1f}",
        ]
        for r in results
    ]
    headers = [
        "system",
        "durable?",
        "burst: all started",
        "started (fewest)",
        "steady p50",
        "steady p99",
        "steady max",
        "submits/s",
        "runs",
        "wall min",
    ]
    print(table(headers, rows))
    if raw:
        print(
            f"raw NATS in this run (nats-py, {raw['messages']:,} messages of {raw['size']} B, "
            f"sync_interval {raw['sync_interval']}): publish_async {raw['publish_per_second']:,.0f}"
            f"/s, fetch+ack {raw['consume_ack_per_second']:,.0f}/s, both at once end to end "
            f"{raw['pipeline_per_second']:,.0f}/s, one at a time "
            f"{raw['serial_per_second'] or 0:,.0f}/s"
        )
    if checks:
        print(
            table(
                ["target (issue 14)", "measured", "limit", "verdict"],
                [
                    [c["target"], fmt_seconds(c["value"]), fmt_seconds(c["limit"]), c["verdict"]]
                    for c in checks
                ],
            )
        )
    else:
        print("targets: only at the issue's sizes (--jobs 5000, --rate 500 --duration 10)")
    print(f"wall time of this run: {wall_seconds / 60:.1f} min")
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


def runs_of(text: str) -> dict[str, int]:
    """``--runs-of``: ``KEY=N`` items, comma-separated, each key a peer or jobsched-<layout>.

    Raises:
        argparse.ArgumentTypeError: an item is not KEY=N with a known key and N >= 1.
    """
    known = [*PEERS, "jobsched-split", "jobsched-one", "jobsched-inproc"]
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, n = item.partition("=")
        if key not in known or not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected KEY=N, N >= 1, KEY one of {', '.join(known)}"
            )
        out[key] = int(n)
    return out


def selected_peers(text: str) -> list[type[Peer]]:
    if text == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise SystemExit(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)}, none)")
    return [PEERS[n] for n in names]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    raw = None
    if args.baseline:
        from bench.baseline import measure_raw_nats  # noqa: PLC0415

        print("== raw NATS baseline", file=sys.stderr)
        raw = await measure_raw_nats(args.baseline_messages, serial=args.baseline_messages // 25)
        print(
            f"\nraw NATS: {raw['pipeline_per_second']:,.0f} msg/s published and consumed "
            "end to end",
            flush=True,
        )
    results = []
    for cls in selected_peers(args.peers):
        r = await measure_peer(cls, args)
        if r is not None:
            results.append(r)
    if args.jobsched:
        for layout_name in args.layout.split(","):
            results.append(await measure_jobsched(layout_name, args))
    checks = target_checks(results, args)
    wall = time.monotonic() - started
    print_table(results, args, raw, checks, wall)
    return {
        "args": {**vars(args), "workloads": sorted(args.workloads)},
        "raw_nats": raw,
        "results": results,
        "targets": checks,
        "wall_seconds": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=3, help="runs per workload and system (3)")
    p.add_argument(
        "--runs-of",
        type=runs_of,
        default=DEFAULT_RUNS_OF,
        metavar="KEY=N[,KEY=N]",
        help="other run counts for some systems (keys of --peers, jobsched-split, jobsched-one; "
        "default apscheduler-sqlite=1; '' for none)",
    )
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
    p.add_argument(
        "--layout",
        default="split,one",
        help="jobsched's layouts, a comma list of one, split, inproc",
    )
    p.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="leave out the raw-NATS baseline (measured first, in the same run, by default)",
    )
    p.add_argument(
        "--baseline-messages", type=int, default=50_000, help="raw NATS: messages (50,000)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="max wait after the last due instant, s (30); jobs not started by then never did",
    )
    p.add_argument(
        "--lead",
        type=float,
        default=0.0,
        help="s from submitting to the first due instant (0: from each peer's usual submit rate)",
    )
    p.add_argument("--profile-seconds", type=float, default=10.0)
    parse_common(p)
    p.set_defaults(duration=10.0, drain=20.0, baseline=True)
    args = p.parse_args()
    selected_peers(args.peers)  # a bad --peers or --layout fails before anything starts
    for layout_name in args.layout.split(","):
        try:
            Layout.parse(layout_name)
        except ValueError as e:
            p.error(f"--layout: {e}")
    if not args.workloads or args.workloads - {"burst", "steady"}:
        p.error("--workloads: burst, steady or burst,steady")
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('peers', result, args.json)}")


if __name__ == "__main__":
    main()
