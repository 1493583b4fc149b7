"""Scheduler failover, measured: kill -9 one of two schedulers while once jobs come due.

    .venv/bin/python -m bench.failover [--runs 5] [--jobs 300] [--spread 15] [--lease-ttl 10]

Each run starts its own nats-server, SQLite store, gateway (in this process), two scheduler
processes and one worker process; creates ``--jobs`` once jobs due evenly over ``--spread``
seconds; SIGKILLs scheduler s1 half-way; waits until every job succeeded. Prints, per run and
as p50/max: failover time (last run published by the dead scheduler → first run of its
partitions published by the survivor), duplicate runs, lost runs. Default lease TTL = the
product default (10 s).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

from core.settings import load_settings
from jobsched.natsserver import NatsServer, find_nats_server
from tests.faults.cluster import cluster, failover_seconds, lost_and_duplicates, now


async def one_run(args: argparse.Namespace, tmp: Path, url: str) -> tuple[float, int, int]:
    settings = load_settings(
        {},
        data_dir=str(tmp / "data"),
        nats_url=url,
        subject_prefix=f"f{uuid.uuid4().hex[:8]}",
        auth_secret="bench-secret-0123456789abcdef0123456789",
        http_port=0,
        lease_ttl_seconds=args.lease_ttl,
        log_level="WARNING",
    )
    async with cluster(settings, tmp) as c:
        c.start("scheduler", "s1")
        c.start("scheduler", "s2")
        c.start("worker", "w1")
        await c.wait_balanced({"s1", "s2"}, timeout_s=4 * args.lease_ttl + 10)
        start = now() + timedelta(seconds=3)
        jobs = await c.create_once_jobs(args.jobs, start, spread_s=args.spread)
        await asyncio.sleep(
            max(0.0, (start + timedelta(seconds=args.spread / 2) - now()).total_seconds())
        )
        killed_at = c.kill("s1")
        runs = await c.wait_succeeded(jobs, timeout_s=args.spread + 6 * args.lease_ttl + 30)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    return failover_seconds(runs, "s1", killed_at), duplicates, lost


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument(
        "--spread", type=float, default=15.0, help="seconds over which jobs come due"
    )
    parser.add_argument("--lease-ttl", type=float, default=10.0, help="seconds")
    args = parser.parse_args()
    results = []
    print(f"{'run':>4} {'failover s':>11} {'duplicates':>11} {'lost':>5}")
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="jobsched-failover-") as d:
            tmp = Path(d)
            server = NatsServer(find_nats_server({}), tmp / "nats", log_file=tmp / "nats.log")
            url = server.start()
            try:
                failover, duplicates, lost = await one_run(args, tmp, url)
            finally:
                server.stop()
        results.append((failover, duplicates, lost))
        print(f"{i + 1:>4} {failover:>11.2f} {duplicates:>11} {lost:>5}", flush=True)
    failovers = [r[0] for r in results]
    print(
        f"\nlease TTL {args.lease_ttl:g} s, {args.jobs} jobs over {args.spread:g} s, "
        f"{args.runs} runs: "
        f"failover p50 {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s; "
        f"duplicates {sum(r[1] for r in results)}; lost {sum(r[2] for r in results)}"
    )


if __name__ == "__main__":
    asyncio.run(main())
