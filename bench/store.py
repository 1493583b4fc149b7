"""The SQLite store's CPU per run, in one process, no NATS: what the scheduler process pays for
each run's two writes, and for its safety scan.

* **writes** — ``--runs`` (5,000) once ``noop`` jobs are created; each run is then recorded as
  the scheduler does it (``store.dispatch``: the job advanced, the execution inserted QUEUED) and
  finished as the recorder does it (``store.apply_events`` of a SUCCEEDED event), ``--batches``
  runs per store call: a few at a low rate (the recorder's batch at 500 runs/s holds one to a
  few runs), hundreds at a high rate or in a burst. Each batch size is measured with every
  index, then without each group of secondary indexes (:data:`INDEX_GROUPS`: what each group
  costs the writes, not a proposal to drop it — they serve the run listings and the dashboard).
* **scan** — ``--scan-jobs`` (100,000, the heap limit) interval jobs due within the lookahead:
  the CPU of one ``store.due_jobs`` over 64 partitions (the median of 3), what every scheduler
  does every ``scan_interval_seconds`` (5 s).

CPU is the process's (``time.process_time``: every thread, aiosqlite's included, user and
system time, so the fsync of each commit counts), per run; the store is on a temp dir's file
with the product's settings (WAL, ``synchronous=FULL``).

    .venv/bin/python -m bench.store                       # ~1.5 min
    .venv/bin/python -m bench.store --runs 500 --batches 4,250 --scan-jobs 2000   # a few s
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    add_common_args,
    fmt_num,
    interval_jobs,
    noop_job,
    save_results,
    seed_jobs,
    table,
)
from core.model import ExecutionStatus, Job, OnceSchedule, RunTrigger
from core.ports import Dispatch
from core.runs import queued_run, run_event
from store.sqlite import SqliteStore

PARTITIONS = 64

INDEX_GROUPS: dict[str, list[str]] = {
    "every index": [],
    "without the run listings' 4": [
        "executions_owner_status_scheduled",
        "executions_owner_status_task_scheduled",
        "executions_status_scheduled_id",
        "executions_status_task_scheduled",
    ],
    "without the run statistics' 5": [
        "executions_stats_owner_finished",
        "executions_stats_finished",
        "executions_stats_owner_started_on_time",
        "executions_stats_started_on_time",
        "executions_stats_open",
    ],
    "without the upcoming runs' 2": ["jobs_stats_owner_next", "jobs_stats_next"],
}
"""Groups of secondary indexes whose write cost the benchmark shows (store/sqlite/runs.py,
store/sqlite/stats.py): the run listings by status (and task), the Overview's statistics, the
Upcoming page's jobs by next run (an expression index on the spec's schedule)."""

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def once_jobs(n: int) -> list[Job]:
    """``n`` once noop jobs due at :data:`T0`, spread over the partitions."""
    schedule, created = OnceSchedule(execute_at=T0), T0 - timedelta(hours=1)
    return [
        noop_job(schedule, created_at=created, next_run_at=T0, partitions=PARTITIONS)
        for _ in range(n)
    ]


async def measure_writes(root: Path, runs: int, batch: int, drop: Sequence[str]) -> dict[str, Any]:
    """CPU µs per run of ``dispatch`` and of ``apply_events`` at ``batch`` runs per call."""
    path = root / f"writes-{batch}-{len(drop)}-{time.monotonic_ns()}.db"
    jobs = once_jobs(runs)
    seed_jobs(path, jobs)
    store = SqliteStore(path)
    await store.open()
    try:
        for index in drop:
            await store._w.execute(f"DROP INDEX IF EXISTS {index}")
        dispatches = [
            Dispatch(
                queued_run(j, T0, T0, "bench", RunTrigger.SCHEDULE),
                expected_next_run_at=T0,
                next_run_at=None,
            )
            for j in jobs
        ]
        finished = T0 + timedelta(milliseconds=5)
        events = [
            run_event(
                d.execution,
                ExecutionStatus.SUCCEEDED,
                attempt=1,
                at=finished,
                started_at=T0,
                finished_at=finished,
                worker_id="bench",
            )
            for d in dispatches
        ]
        c0 = time.process_time()
        for i in range(0, runs, batch):
            await store.dispatch(dispatches[i : i + batch])
        c1 = time.process_time()
        for i in range(0, runs, batch):
            await store.apply_events(events[i : i + batch])
        c2 = time.process_time()
    finally:
        await store.close()
    return {
        "batch": batch,
        "dropped": list(drop),
        "dispatch_us_per_run": (c1 - c0) / runs * 1e6,
        "finish_us_per_run": (c2 - c1) / runs * 1e6,
    }


async def measure_scan(root: Path, jobs: int) -> dict[str, Any]:
    """CPU of one ``due_jobs`` over every partition with ``jobs`` due (median of 3)."""
    path = root / "scan.db"
    first = time.time() + 3600
    seed_jobs(path, interval_jobs(jobs, 30.0, first, PARTITIONS))
    store = SqliteStore(path)
    await store.open()
    until = datetime.fromtimestamp(first + 31, UTC)
    cpu: list[float] = []
    found = 0
    try:
        for _ in range(3):
            c0 = time.process_time()
            found = len(await store.due_jobs(frozenset(range(PARTITIONS)), until, limit=jobs))
            cpu.append(time.process_time() - c0)
    finally:
        await store.close()
    return {"jobs": jobs, "found": found, "cpu_seconds": statistics.median(cpu)}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="jobsched-bench-store-"))
    try:
        writes = []
        for batch in args.batches:
            for name, drop in INDEX_GROUPS.items():
                print(f"  writes: {batch} per call, {name}", file=sys.stderr)
                writes.append(
                    {"indexes": name, **await measure_writes(root, args.runs, batch, drop)}
                )
        print(f"  scan: {args.scan_jobs:,} due jobs", file=sys.stderr)
        scan = await measure_scan(root, args.scan_jobs)
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return {"runs": args.runs, "writes": writes, "scan": scan}


def report(result: dict[str, Any]) -> str:
    rows = [
        [
            w["batch"],
            w["indexes"],
            fmt_num(w["dispatch_us_per_run"]),
            fmt_num(w["finish_us_per_run"]),
            fmt_num(w["dispatch_us_per_run"] + w["finish_us_per_run"]),
        ]
        for w in result["writes"]
    ]
    headers = ["runs/call", "indexes", "dispatch µs/run", "finish µs/run", "both µs/run"]
    scan = result["scan"]
    return "\n".join(
        [
            f"store — SQLite CPU per run ({result['runs']:,} runs per row; process CPU, "
            "fsync included)",
            table(headers, rows),
            f"scan: due_jobs of {scan['found']:,} due jobs over {PARTITIONS} partitions: "
            f"{scan['cpu_seconds'] * 1000:,.0f} ms CPU (median of 3; every scheduler, every "
            "scan interval)",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5000, help="runs per row (5,000)")
    parser.add_argument(
        "--batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2, 4, 32, 250],
        help="runs per store call, a comma list (2,4,32,250)",
    )
    parser.add_argument("--scan-jobs", type=int, default=100_000, help="due jobs to scan")
    add_common_args(parser)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(report(result))
    if not args.no_save:
        print(f"results: {save_results('store', result, args.json)}")


if __name__ == "__main__":
    main()
