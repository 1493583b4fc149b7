"""Scale-out plan from measured per-process costs: the processes and cores each role needs for a
rate of runs, from the CPU ms per run a sustained or scaleout run measured (``/proc``, over the
window and its drain: ``cpu_ms_per_run_drained``).

Assumptions (printed with the table):

* a jobsched process (scheduler with its recorder, worker, gateway) is one event loop and one
  GIL, so it gets one core and is planned at most ``--busy`` (70 %) busy; nats-server is
  multi-threaded: its cores are planned at the same share, ``--nats-cores`` (4) per server;
* CPU per run stays what it was at the measured rate (it falls with rate while batches fill,
  and grows past a process's ceiling, so measure at a rate every run started);
* the schedulers split ``--partitions`` (64, ``JOBSCHED_PARTITIONS``) by lease, so there can be
  at most that many; the gateway's cost is its CPU per job POSTed (once jobs submitted in the
  measured run) times ``--posts-per-run`` (1: every run its own POSTed job; 0: recurring jobs);
* the store is outside the plan: SQLite's writer thread is inside the scheduler's figure, and
  one SQLite file takes one host's schedulers; beyond, a store that takes the write rate
  (MongoDB), not measured here.

    .venv/bin/python -m bench.capacity [RESULTS.json] [--rates 1000,10000,50000]

Without a file it reads the newest ``bench/results/scaleout-*.json`` or ``sustained-*.json``;
``bench.scaleout`` prints the same table after its measured rows.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, fmt_num, table

RATES = (1000.0, 10_000.0, 50_000.0)
BUSY = 0.70
NATS_CORES_PER_SERVER = 4
PARTITIONS = 64
ROLES = ("scheduler", "worker", "nats-server", "gateway")


def role_of(process: str) -> str:
    """The role of a measured process name: ``scheduler2`` -> ``scheduler``."""
    return re.sub(r"\d+$", "", process)


def costs_by_role(cpu_ms_per_run: dict[str, float]) -> dict[str, float]:
    """CPU ms per run of each role, summed over its processes (two schedulers' shares add up)."""
    out: dict[str, float] = {}
    for process, ms in cpu_ms_per_run.items():
        if not math.isnan(ms):
            out[role_of(process)] = out.get(role_of(process), 0.0) + ms
    return out


@dataclass(frozen=True)
class Cost:
    """Measured costs: CPU ms per run by role and the gateway's CPU ms per job POSTed."""

    ms_per_run: dict[str, float]
    gateway_ms_per_post: float
    source: str
    """Where the figures come from (layout, workload, rate, file)."""


@dataclass(frozen=True)
class RolePlan:
    role: str
    ms_per_run: float
    cores: int
    processes: int


def plan(
    cost: Cost,
    rate: float,
    *,
    busy: float = BUSY,
    nats_cores: int = NATS_CORES_PER_SERVER,
    posts_per_run: float = 1.0,
) -> list[RolePlan]:
    """Cores and processes per role for ``rate`` runs/s (see the module's assumptions).

    Raises:
        ValueError: ``busy`` is not in (0, 1] or ``nats_cores`` < 1.
    """
    if not 0 < busy <= 1 or nats_cores < 1:
        raise ValueError("busy must be in (0, 1] and nats_cores at least 1")
    out = []
    for role in ROLES:
        if role == "gateway":
            ms = cost.gateway_ms_per_post * posts_per_run
        else:
            ms = cost.ms_per_run.get(role, math.nan)
        if math.isnan(ms):
            out.append(RolePlan(role, ms, 0, 0))
            continue
        cores = max(1, math.ceil(rate * ms / 1000 / busy - 1e-9)) if ms > 0 else 0
        processes = math.ceil(cores / nats_cores) if role == "nats-server" else cores
        out.append(RolePlan(role, ms, cores, processes))
    return out


def cost_from_result(row: dict[str, Any], source: str) -> Cost:
    """The costs of one row of a sustained/scaleout results file."""
    per_job = row.get("submission", {}).get("submit_cpu_ms_per_job", {})
    return Cost(
        ms_per_run=costs_by_role(row.get("cpu_ms_per_run_drained", {})),
        gateway_ms_per_post=per_job.get("gateway", math.nan),
        source=source,
    )


def kept_up(row: dict[str, Any]) -> bool:
    return bool(row.get("expected_runs")) and row.get("started_runs") == row.get("expected_runs")


def measured(row: dict[str, Any]) -> bool:
    """Whether the row has CPU figures (a row whose meters started after its window began has
    none: ``bench.sustained``'s ``LATE_SHARE``)."""
    return bool(costs_by_role(row.get("cpu_ms_per_run_drained", {})))


def choose_row(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The row whose costs the plan uses: a split row with CPU figures (:func:`measured`), with
    one scheduler and one worker if any (else any such split row), at the highest rate where
    every run started (else the highest rate); and whether every run started in it.

    Raises:
        ValueError: no split row with CPU figures.
    """
    split = [
        r
        for r in rows
        if str(r.get("layout", "")).startswith(("split", "1 sched / 1 work")) and measured(r)
    ]
    single = [r for r in split if r.get("layout") in ("split", "1 sched / 1 work")] or split
    if not single:
        raise ValueError(
            "no split-layout row with CPU figures: run bench.sustained --layout split or "
            "bench.scaleout"
        )
    good = [r for r in single if kept_up(r)]
    best = max(good or single, key=lambda r: float(r["rate"]))
    return best, bool(good)


def describe(row: dict[str, Any], kept: bool, path: str) -> str:
    return (
        f"{row['layout']}, {row['workload']}, {fmt_num(float(row['rate']))} due runs/s"
        + (", every run started" if kept else ", NOT every run started: costs past the ceiling")
        + (f" ({path})" if path else "")
    )


def print_plan(
    cost: Cost,
    rates: Sequence[float] = RATES,
    *,
    busy: float = BUSY,
    nats_cores: int = NATS_CORES_PER_SERVER,
    partitions: int = PARTITIONS,
    posts_per_run: float = 1.0,
) -> list[dict[str, Any]]:
    """Prints the plan table for each rate; returns its rows (for a results file)."""
    measured = ", ".join(f"{r} {ms:.3f}" for r, ms in cost.ms_per_run.items() if r != "gateway")
    print(f"\ncapacity — from CPU ms per run measured on {cost.source}: {measured}")
    print(
        f"  gateway: {cost.gateway_ms_per_post:.3f} CPU ms per job POSTed x {posts_per_run:g} "
        "POSTs per run"
        if not math.isnan(cost.gateway_ms_per_post)
        else "  gateway: no POST cost in the measured row (its jobs were not POSTed): not planned"
    )
    rows, out = [], []
    for rate in rates:
        roles = plan(cost, rate, busy=busy, nats_cores=nats_cores, posts_per_run=posts_per_run)
        by = {p.role: p for p in roles}
        sched = by["scheduler"].processes
        per_sched = f"{partitions / sched:.1f}" if sched else "-"
        if sched > partitions:
            per_sched = f"needs > {partitions} partitions"
        cells = [fmt_num(rate)]
        for p in roles:
            cells.append(
                f"{p.processes} ({p.cores} core{'s' * (p.cores != 1)})" if p.cores else "-"
            )
        total = sum(p.cores for p in roles)
        cells += [str(total), per_sched]
        rows.append(cells)
        out.append(
            {
                "rate": rate,
                "roles": {p.role: {"processes": p.processes, "cores": p.cores} for p in roles},
                "total_cores": total,
            }
        )
    print(
        table(
            [
                "runs/s",
                "schedulers",
                "workers",
                "nats-servers",
                "gateways",
                "total cores",
                "partitions per scheduler",
            ],
            rows,
        )
    )
    print(
        f"assumptions: a core per jobsched process at <= {busy:.0%} busy (one event loop, one "
        f"GIL); nats-server {nats_cores} cores per server at the same share; CPU per run as "
        f"measured (it falls while batches fill and grows past a process's ceiling); "
        f"{partitions} partitions split by lease (at most {partitions} schedulers); the store "
        "(SQLite's writer inside the scheduler's figure; beyond one host MongoDB) not planned."
    )
    return out


def newest_results() -> Path:
    files = sorted(
        [*RESULTS_DIR.glob("scaleout-*.json"), *RESULTS_DIR.glob("sustained-*.json")],
        key=lambda f: f.name.rsplit("-", 1)[-1],
    )
    if not files:
        raise SystemExit(
            f"no scaleout-*.json or sustained-*.json in {RESULTS_DIR}: run bench.sustained first"
        )
    return files[-1]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("results", nargs="?", help="a sustained or scaleout results file")
    p.add_argument("--rates", default="1000,10000,50000", help="runs/s to plan for")
    p.add_argument("--busy", type=float, default=BUSY, help="planned busy share of a core (0.7)")
    p.add_argument("--nats-cores", type=int, default=NATS_CORES_PER_SERVER)
    p.add_argument("--partitions", type=int, default=PARTITIONS)
    p.add_argument("--posts-per-run", type=float, default=1.0)
    args = p.parse_args()
    if not 0 < args.busy <= 1 or args.nats_cores < 1 or args.partitions < 1:
        p.error("--busy must be in (0, 1], --nats-cores and --partitions at least 1")
    path = Path(args.results) if args.results else newest_results()
    data = json.loads(path.read_text())
    try:
        row, kept = (
            (data["cost_row"], kept_up(data["cost_row"]))
            if data.get("cost_row")
            else choose_row(data.get("results", []))
        )
    except ValueError as e:
        raise SystemExit(f"{path}: {e}") from None
    cost = cost_from_result(row, describe(row, kept, str(path)))
    print_plan(
        cost,
        [float(x) for x in args.rates.split(",")],
        busy=args.busy,
        nats_cores=args.nats_cores,
        partitions=args.partitions,
        posts_per_run=args.posts_per_run,
    )


if __name__ == "__main__":
    main()
