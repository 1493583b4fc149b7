"""Dashboard page data at size: each page's data request against 10,000 jobs and 100,000 runs.

A gateway (real HTTP on localhost, no NATS: the Cluster page is left out) on a SQLite file filled
in bulk with ``--jobs`` jobs of one user (plus ``--other-jobs`` of another, so scoping is
exercised) and ``--runs`` runs of them spread over the last ``--spread-hours`` hours (the
Overview's last hour then holds ``runs / spread-hours`` of them). Jobs: 70 % cron over 24
expressions in 4 zones, 30 % intervals from 5 minutes to 2 hours; runs: 90 % succeeded, 6 %
failed, 1 % each cancelled, skipped and unfinished. Each request is timed ``--repeat`` times
after ``--warmup`` untimed ones, one at a time, over a kept-alive connection; the table shows
p50 and p95 (milliseconds) against the target (< 100 ms).

    .venv/bin/python -m bench.dashboard                      # 10,000 jobs, 100,000 runs
    .venv/bin/python -m bench.dashboard --jobs 500 --runs 5000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.common import add_common_args, fmt_num, percentile, save_results, table, verdict
from core import heatmap
from core import schedule as schedules
from core.clock import SystemClock
from core.ids import execution_id, partition_of
from core.model import (
    TERMINAL_RANK,
    CronSchedule,
    Execution,
    ExecutionStatus,
    IntervalSchedule,
    Job,
    JobStatus,
    Schedule,
    state_rank,
)
from core.settings import GatewayConfig
from gateway.app import GatewayDeps, create_app
from gateway.auth import mint_token
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from store.sqlite.rows import execution_row, job_row
from store.sqlite.schema import EXECUTION_INSERT, JOB_INSERT

TARGET_MS = 100.0
SECRET = "bench-dashboard-secret-0123456789abcdef"
PARTITIONS = 64
EXPRESSIONS = [
    "0 8 * * 1-5", "30 2 * * *", "*/15 * * * *", "0 * * * *", "5 4 * * *", "0 0 1 * *",
    "*/5 * * * *", "0 12 * * *", "45 6 * * 1", "0 18 * * 1-5", "10 */2 * * *", "0 3 * * 0",
    "20 9 * * *", "0 22 * * *", "*/30 * * * *", "15 1 * * *", "0 6,18 * * *", "50 23 * * *",
    "0 9 1,15 * *", "40 7 * * 2-6", "0 */4 * * *", "25 13 * * *", "0 5 * * 6", "*/10 8-17 * * 1-5",
]  # fmt: skip
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]
TASKS = ["noop", "generate_report", "cleanup_export"]
STATUSES = [
    (ExecutionStatus.SUCCEEDED, 90), (ExecutionStatus.FAILED, 6), (ExecutionStatus.CANCELLED, 1),
    (ExecutionStatus.SKIPPED, 1), (ExecutionStatus.QUEUED, 1), (ExecutionStatus.RUNNING, 1),
]  # fmt: skip


def _schedule(rng: random.Random, now: datetime) -> tuple[Schedule, datetime]:
    if rng.random() < 0.7:
        cron = CronSchedule(expression=rng.choice(EXPRESSIONS), timezone=rng.choice(ZONES))
        nxt = schedules.first_run_at(cron, now)
        assert nxt is not None
        return cron, nxt
    every = rng.choice([300, 600, 900, 1800, 3600, 7200])
    return IntervalSchedule(every_seconds=every), now + timedelta(seconds=rng.randrange(every))


def make_jobs(n: int, owner: str, now: datetime, rng: random.Random) -> list[Job]:
    jobs = []
    for i in range(n):
        schedule, nxt = _schedule(rng, now)
        created = now - timedelta(days=30) + timedelta(seconds=i * 60)
        job_id = f"{owner}-{i:06d}"
        status = JobStatus.PAUSED if i % 50 == 0 else JobStatus.SCHEDULED
        jobs.append(
            Job(
                id=job_id,
                owner=owner,
                task_id=TASKS[i % len(TASKS)],
                schedule=schedule,
                status=status,
                partition=partition_of(job_id, PARTITIONS),
                created_at=created,
                updated_at=created,
                next_run_at=None if status is JobStatus.PAUSED else nxt,
                idempotency_key=f"key-{owner}-{i}" if i % 3 == 0 else None,
            )
        )
    return jobs


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def make_runs(
    jobs: list[Job], n: int, now: datetime, spread_hours: float, rng: random.Random
) -> list[Execution]:
    statuses = [s for s, w in STATUSES for _ in range(w)]
    runs = []
    span_ms = int(spread_hours * 3_600_000)
    for i in range(n):
        job = jobs[i % len(jobs)]
        scheduled = (now - timedelta(milliseconds=rng.randrange(span_ms))).replace(
            microsecond=(i % 1000) * 1000
        )
        status = rng.choice(statuses)
        final = status not in (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING)
        started = (
            None
            if status in (ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED)
            else scheduled + timedelta(milliseconds=rng.choice([3, 8, 15, 40, 120, 900]))
        )
        finished = (
            (started or scheduled) + timedelta(milliseconds=rng.randrange(50, 5000))
            if final
            else None
        )
        runs.append(
            Execution(
                id=execution_id(job.id, scheduled),
                job_id=job.id,
                owner=job.owner,
                task_id=job.task_id,
                partition=job.partition,
                status=status,
                state_rank=TERMINAL_RANK if final else state_rank(status, 1),
                attempt=0 if status is ExecutionStatus.QUEUED else 1,
                scheduled_for=scheduled,
                created_at=scheduled,
                updated_at=finished or started or scheduled,
                published_at=scheduled,
                started_at=started,
                finished_at=finished,
                worker_id=f"worker-{i % 4}" if started else None,
                error="failing on purpose" if status is ExecutionStatus.FAILED else None,
            )
        )
    return runs


async def fill(path: Path, jobs: list[Job], runs: list[Execution]) -> None:
    store = SqliteStore(path)  # creates the schema and every index, as the gateway does
    await store.open()
    await store.close()
    db = sqlite3.connect(path)
    with db:
        db.executemany(JOB_INSERT, [(*job_row(j), None) for j in jobs])
        db.executemany(EXECUTION_INSERT, [execution_row(r) for r in runs])
        last: dict[str, Execution] = {}
        for r in runs:
            if r.finished_at is not None and (
                r.job_id not in last or r.scheduled_for > last[r.job_id].scheduled_for
            ):
                last[r.job_id] = r
        db.executemany(
            "UPDATE jobs SET last_run_status = ?, last_run_at = ?, last_execution_id = ?, "
            "run_count = 10 WHERE id = ?",
            [
                (r.status.value, int((r.started_at or r.scheduled_for).timestamp() * 1000), r.id, j)
                for j, r in last.items()
            ],
        )
    db.execute("ANALYZE")
    db.close()


async def measure(
    session: aiohttp.ClientSession,
    url: str,
    token: str,
    repeat: int,
    warmup: int,
    before: Callable[[], None] = lambda: None,
) -> tuple[list[float], int, int]:
    """``repeat`` timed GETs of ``url`` after ``warmup`` untimed ones (``before`` runs first)."""
    headers = {"Authorization": f"Bearer {token}"}
    times: list[float] = []
    size = status = 0
    for i in range(warmup + repeat):
        before()
        t0 = time.perf_counter()
        async with session.get(url, headers=headers) as resp:
            body = await resp.read()
            status = resp.status
        dt = (time.perf_counter() - t0) * 1000
        if i >= warmup:
            times.append(dt)
        size = len(body)
    return times, size, status


async def main_async(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    now = datetime.now(UTC).replace(microsecond=0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    db = tmp / "dashboard.db"
    t0 = time.perf_counter()
    jobs = make_jobs(args.jobs, "alice", now, rng)
    others = make_jobs(args.other_jobs, "bob", now, rng)
    runs = make_runs(jobs, args.runs, now, args.spread_hours, rng)
    runs += make_runs(others, args.runs // 10, now, args.spread_hours, rng) if others else []
    await fill(db, jobs + others, runs)
    print(
        f"filled {db} with {len(jobs) + len(others)} jobs and {len(runs)} runs "
        f"in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )

    store = SqliteStore(db)
    await store.open()
    config = GatewayConfig(auth_secret=SECRET, partitions=PARTITIONS)
    app = create_app(GatewayDeps(store, None, builtin_catalog(), SystemClock(), config))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    token = mint_token(SECRET, "alice", ttl=timedelta(hours=1))
    job = next(
        j for j in jobs if j.status is JobStatus.SCHEDULED and isinstance(j.schedule, CronSchedule)
    )
    run = next(r for r in runs if r.job_id == job.id)
    requests = [
        ("Jobs", "/jobs?limit=50"),
        ("Jobs ?status=SCHEDULED", "/jobs?status=SCHEDULED&limit=50"),
        ("Jobs ?lastRunStatus=FAILED", "/jobs?lastRunStatus=FAILED&limit=50"),
        ("Jobs ?taskId=noop", "/jobs?taskId=noop&limit=50"),
        (
            "Jobs ?startTime=…",
            f"/jobs?startTime={iso(jobs[len(jobs) // 2].created_at)}&limit=50",
        ),
        ("Job: the job", f"/jobs/{job.id}"),
        ("Job: its runs", f"/jobs/{job.id}/executions?limit=20"),
        ("Job: next 10 fire times", f"/jobs/{job.id}/upcoming?count=10"),
        ("Run", f"/jobs/{job.id}/executions/{run.id}"),
        ("Overview", "/stats/overview"),
        ("Upcoming", "/stats/upcoming?timezone=Europe/Berlin"),
        ("Upcoming, fire times cold", "/stats/upcoming?timezone=Europe/Berlin"),
    ]
    rows, results = [], {}
    try:
        async with aiohttp.ClientSession() as session:
            for name, path in requests:
                clear = heatmap._fires.cache_clear if name.endswith("cold") else lambda: None
                times, size, status = await measure(
                    session, base + path, token, args.repeat, args.warmup, clear
                )
                if status != 200:
                    print(f"{name}: HTTP {status}", file=sys.stderr)
                p50, p95 = percentile(times, 50), percentile(times, 95)
                results[name] = {
                    "path": path,
                    "p50_ms": p50,
                    "p95_ms": p95,
                    "bytes": size,
                    "status": status,
                }
                rows.append(
                    [
                        name,
                        fmt_num(p50, 1),
                        fmt_num(p95, 1),
                        fmt_num(size / 1024, 1),
                        verdict(p95, TARGET_MS),
                    ]
                )
    finally:
        await runner.cleanup()
        await store.close()
    in_window = sum(
        1
        for r in runs
        if r.owner == "alice" and r.finished_at and r.finished_at >= now - timedelta(hours=1)
    )
    print(
        f"{args.jobs} jobs and {args.runs} runs of the user ({in_window} finished in the last "
        f"hour); {args.repeat} timed requests each, target p95 < {TARGET_MS:.0f} ms"
    )
    print(table(["page data", "p50 ms", "p95 ms", "KiB", f"< {TARGET_MS:.0f} ms"], rows))
    if not args.no_save:
        out = save_results("dashboard", {"args": vars(args), "results": results}, args.json)
        print(f"results: {out}", file=sys.stderr)
    if not args.keep:
        shutil.rmtree(tmp)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--other-jobs", type=int, default=1_000)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--spread-hours", type=float, default=24.0)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=15)
    add_common_args(p)
    args = p.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
