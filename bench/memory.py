"""Scheduler memory with a large store: resident memory (RSS) of a scheduler process holding
``--jobs`` (1,000,000) scheduled jobs, after its first scans.

The jobs are inserted straight into a fresh SQLite store with raw ``executemany`` on the store's
schema (``store.sqlite.schema.SCHEMA``; indexes built after the load), every one a ``once``
``noop`` job: ``--near`` of them (10,000) due within ``--near-window`` seconds (600) from the
start, the rest 1 hour to 30 days ahead. Then ``python -m jobsched scheduler`` (with its
recorder) starts on that store with its own nats-server, and its RSS is sampled for ``--watch``
seconds (30: six safety scans). The same is measured first on an empty store for comparison.

    .venv/bin/python -m bench.memory [--jobs 1000000] [--near 10000] [--watch 30]
    .venv/bin/python -m bench.memory --near 200000 --near-window 25   # heap at its 100k limit
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import sys
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import targets
from bench.common import (
    Deployment,
    Layout,
    add_common_args,
    cpu_seconds,
    rss_bytes,
    save_results,
    table,
    verdict,
)
from core.model import Job, JobStatus, OnceSchedule
from store.sqlite import JOB_COLUMNS, JOB_INSERT, SCHEMA, job_row

TARGET_RSS = targets.MEMORY_RSS_BYTES
PARTITIONS = 64
SENTINEL = datetime(2001, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)


def spec_template() -> tuple[bytes, bytes]:
    """The stored spec of a once noop job, and the encoded sentinel time inside it."""
    job = Job(
        id="x",
        owner="bench",
        task_id="noop",
        schedule=OnceSchedule(execute_at=SENTINEL),
        status=JobStatus.SCHEDULED,
        created_at=SENTINEL,
        updated_at=SENTINEL,
        next_run_at=SENTINEL,
    )
    spec = job_row(job)[[c.strip() for c in JOB_COLUMNS.split(",")].index("spec")]
    marker = b"2001-02-03T04:05:06.789"
    assert marker in spec, spec
    end = spec.index(marker) + len(marker)
    while spec[end : end + 1] not in (b'"',):
        end += 1
    return spec, spec[spec.index(marker) : end]


def build_store(
    path: Path, jobs: int, near: int, near_window_seconds: float, start_ms: int
) -> float:
    """Insert the jobs; returns seconds taken."""
    t0 = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    statements = [s.strip() for s in SCHEMA.split(";") if s.strip()]
    tables = [s for s in statements if s.startswith("CREATE TABLE")]
    indexes = [s for s in statements if not s.startswith("CREATE TABLE")]
    for s in tables:
        conn.execute(s)
    spec, marker = spec_template()
    head, tail = spec.split(marker)
    rnd = random.Random(42)
    sql = JOB_INSERT
    hour_ms, month_ms = 3_600_000, 30 * 86_400_000

    def rows(lo: int, hi: int) -> Any:
        for i in range(lo, hi):
            jid = os.urandom(16).hex()
            if i < near:
                at = start_ms + 2000 + int(rnd.random() * near_window_seconds * 1000)
            else:
                at = start_ms + hour_ms + int(rnd.random() * (month_ms - hour_ms))
            iso = datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:23]
            yield (
                jid,
                "bench",
                zlib.crc32(jid.encode()) % PARTITIONS,
                "SCHEDULED",
                at,
                start_ms,
                start_ms,
                None,
                None,
                None,
                None,
                None,
                0,
                head + iso.encode() + tail,
                None,  # idempotency_key
                None,  # last_dispatched_for
                None,  # request_hash
            )

    chunk = 50_000
    for lo in range(0, jobs, chunk):
        conn.execute("BEGIN")
        conn.executemany(sql, rows(lo, min(jobs, lo + chunk)))
        conn.execute("COMMIT")
    for s in indexes:
        conn.execute(s)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - t0


async def measure(args: argparse.Namespace, jobs: int) -> dict[str, Any]:
    d = Deployment(
        Layout(kind="split"),
        keep=args.keep,
        warmup=False,
        name="memory",
        env={"JOBSCHED_PARTITIONS": str(PARTITIONS)},
    )
    try:
        d.start_nats()
        start_ms = int(time.time() * 1000)
        build_seconds = (
            build_store(d.store_path, jobs, min(args.near, jobs), args.near_window, start_ms)
            if jobs
            else 0.0
        )
        if jobs:
            print(
                f"  inserted {jobs:,} jobs in {build_seconds:.1f} s "
                f"({d.store_path.stat().st_size / 2**20:.0f} MiB)",
                file=sys.stderr,
            )
        proc = d.spawn("scheduler", ["-m", "jobsched", "scheduler"])
        samples: list[tuple[float, int]] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.watch:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"the scheduler exited: {proc.log.read_text()[-2000:]}")
            rss, _ = rss_bytes(proc.pid)
            samples.append((time.monotonic() - t0, rss))
            await asyncio.sleep(0.25)
        rss, hwm = rss_bytes(proc.pid)
        cpu = cpu_seconds(proc.pid)
        return {
            "jobs": jobs,
            "near": min(args.near, jobs),
            "build_seconds": build_seconds,
            "rss_final": rss,
            "rss_peak": hwm,
            "rss_at_5s": next((r for t, r in samples if t >= 5), rss),
            "cpu_seconds": cpu,
            "samples": samples[::4],
        }
    finally:
        await d.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for n in ([0] if not args.skip_empty else []) + [args.jobs]:
        print(f"== scheduler with {n:,} jobs", file=sys.stderr)
        results.append(await measure(args, n))
    mib = 2**20
    rows = [
        [
            f"{r['jobs']:,}",
            f"{r['near']:,}",
            f"{r['rss_at_5s'] / mib:,.0f} MiB",
            f"{r['rss_final'] / mib:,.0f} MiB",
            f"{r['rss_peak'] / mib:,.0f} MiB",
            f"{r['cpu_seconds']:.1f}",
            verdict(r["rss_peak"], TARGET_RSS) if r["jobs"] else "-",
        ]
        for r in results
    ]
    print(
        f"\nmemory — scheduler process (with recorder), {args.watch:g} s after start, "
        f"{args.near:,} jobs due within {args.near_window:g} s, the rest 1 h - 30 days ahead"
    )
    print(
        table(
            [
                "jobs in store",
                "due soon",
                "RSS at 5 s",
                "RSS at end",
                "peak RSS (VmHWM)",
                "CPU s",
                "target < 1 GiB",
            ],
            rows,
        )
    )
    return {"args": vars(args), "results": results}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--near", type=int, default=10_000)
    p.add_argument("--near-window", type=float, default=600.0)
    p.add_argument("--watch", type=float, default=30.0)
    p.add_argument("--skip-empty", action="store_true")
    add_common_args(p)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('memory', result, args.json)}")


if __name__ == "__main__":
    main()
