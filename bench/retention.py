"""Bounded history: one fast interval job under a "keep N" rule, its records and the SQLite file
over time.

One interval job (``noop``, every ``--every`` seconds) runs for ``--duration`` seconds on a
deployment whose ``JOBSCHED_HISTORY_LIMIT`` is ``--limit`` (100). Every ``--sample`` seconds it
prints, from the store (SQLite opened read-only): the runs recorded so far (the job's
``runCount``), the execution records stored, how many of those are unfinished (QUEUED, RUNNING,
RETRYING), the database file's size, its write-ahead log's size and its free pages (freed by
pruning, reused by later inserts). With retention the records stay at ``keep`` + the runs in
flight and the file stops growing once the freed pages are being reused; ``--no-retention``
(``JOBSCHED_HISTORY_LIMIT=0``) shows the growth it prevents.

    .venv/bin/python -m bench.retention                          # 1 s interval, 10 minutes
    .venv/bin/python -m bench.retention --every 0.05 --duration 30  # the same 600 runs, faster
    .venv/bin/python -m bench.retention --every 0.05 --duration 30 --no-retention
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench.common import (
    Deployment,
    Layout,
    add_common_args,
    fmt_num,
    interval_body,
    save_results,
    table,
)


@dataclass(frozen=True)
class Sample:
    at_seconds: float
    runs: int
    records: int
    unfinished: int
    db_bytes: int
    wal_bytes: int
    free_pages: int
    page_size: int


def sample(path: Path, job_id: str, at_seconds: float) -> Sample:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        runs = conn.execute("SELECT run_count FROM jobs WHERE id = ?", (job_id,)).fetchone()
        records, unfinished = conn.execute(
            "SELECT count(*), coalesce(sum(state_rank < 1000000), 0) FROM executions "
            "WHERE job_id = ?",
            (job_id,),
        ).fetchone()
        free_pages = conn.execute("PRAGMA freelist_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    wal = path.with_name(path.name + "-wal")
    return Sample(
        at_seconds=at_seconds,
        runs=runs[0] if runs else 0,
        records=records,
        unfinished=unfinished,
        db_bytes=path.stat().st_size,
        wal_bytes=wal.stat().st_size if wal.exists() else 0,
        free_pages=free_pages,
        page_size=page_size,
    )


async def create_job(d: Deployment, every_seconds: float) -> str:
    async with (
        aiohttp.ClientSession(headers=d.headers) as s,
        s.post(d.url + "/jobs", data=interval_body(every_seconds)) as r,
    ):
        body = await r.read()
        if r.status != 201:
            raise RuntimeError(f"POST /jobs answered {r.status}: {body[:300]!r}")
    job_id: str = msgspec.json.decode(body)["id"]
    return job_id


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    keep = 0 if args.no_retention else args.limit
    env = {
        "JOBSCHED_HISTORY_LIMIT": str(keep),
        "JOBSCHED_HISTORY_MAX_AGE_SECONDS": "0",  # the count rule alone
    }
    samples: list[Sample] = []
    layout = Layout.parse(args.layout)
    async with Deployment(layout, env=env, keep=args.keep, name="retention") as d:
        job_id = await create_job(d, args.every)
        start = time.monotonic()
        next_at = 0.0
        while True:
            now = time.monotonic() - start
            if now >= next_at:
                samples.append(sample(d.store_path, job_id, now))
                s = samples[-1]
                print(
                    f"{now:7.1f} s  runs {s.runs:6d}  records {s.records:6d}  "
                    f"unfinished {s.unfinished:3d}  db {s.db_bytes / 1024:8.1f} KiB  "
                    f"wal {s.wal_bytes / 1024:8.1f} KiB  free pages {s.free_pages:5d}",
                    file=sys.stderr,
                )
                next_at += args.sample
            if now >= args.duration:
                break
            await asyncio.sleep(min(0.5, max(0.0, next_at - now)))
    return {
        "every_seconds": args.every,
        "duration_seconds": args.duration,
        "keep": keep,
        "samples": [asdict(s) for s in samples],
    }


def report(result: dict[str, Any]) -> str:
    samples = [Sample(**s) for s in result["samples"]]
    rows = [
        (
            f"{s.at_seconds:.0f}",
            s.runs,
            s.records,
            s.unfinished,
            fmt_num(s.db_bytes / 1024, 1),
            fmt_num(s.wal_bytes / 1024, 1),
            s.free_pages,
        )
        for s in samples
    ]
    keep = result["keep"] or "no limit"
    head = (
        f"one interval job every {result['every_seconds']:g} s "
        f"for {result['duration_seconds']:g} s, "
        f"JOBSCHED_HISTORY_LIMIT={result['keep']} (keep: {keep})"
    )
    headers = ["t (s)", "runs", "records", "unfinished", "db KiB", "wal KiB", "free pages"]
    out = [head, table(headers, rows)]
    half = [s for s in samples if s.at_seconds >= samples[-1].at_seconds / 2]
    if len(half) >= 2:
        grew = half[-1].db_bytes - half[0].db_bytes
        worst = max(s.records - s.unfinished for s in samples)
        out.append(
            f"second half: db file grew {grew / 1024:.1f} KiB "
            f"({half[0].db_bytes / 1024:.1f} -> {half[-1].db_bytes / 1024:.1f} KiB) over "
            f"{half[-1].runs - half[0].runs} runs; most finished records at a sample: {worst}; "
            f"most records: {max(s.records for s in samples)}"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=1.0, help="the job's interval (seconds)")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds to run")
    parser.add_argument("--limit", type=int, default=100, help="JOBSCHED_HISTORY_LIMIT")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--layout", default="one", help="one | split | inproc")
    parser.add_argument("--no-retention", action="store_true", help="JOBSCHED_HISTORY_LIMIT=0")
    add_common_args(parser)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(report(result))
    if not args.no_save:
        print(f"(saved {save_results('retention', result, args.json)})", file=sys.stderr)


if __name__ == "__main__":
    main()
