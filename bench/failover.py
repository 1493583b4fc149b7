"""Failover, measured: the start delay of every run due after a crash.

    .venv/bin/python -m bench.failover [--runs 5] [--jobs 300] [--spread 15]
        [--scenario scheduler,nats-leader] [--lease-ttl SECONDS]

Each run starts its own NATS, SQLite store, gateway (in this process), two scheduler processes
and one worker process; creates ``--jobs`` once jobs due evenly over ``--spread`` seconds; half-way
through, it crashes one part:

* ``scheduler`` — SIGKILL of scheduler s1, against one nats-server, with the default settings
  (lease TTL :attr:`core.settings.Settings.lease_ttl_seconds`);
* ``nats-leader`` — SIGKILL of the nats-server node that leads the lease bucket and the work
  stream of a 3-node cluster (R3), forcing JetStream leader elections, with the lease TTL at
  the cluster minimum (:data:`actors.ownership.CLUSTER_MIN_TTL_SECONDS`).

It waits until every job succeeded and prints, per run and over all runs, the delay
(``scheduledFor`` → ``startedAt``) of every run due after the crash (p50/p99/max), the failover
time (last run the dead scheduler published → first run of its partitions published after the
kill), leases lost or fenced, duplicate and lost runs.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from actors.ownership import CLUSTER_MIN_TTL_SECONDS
from bench.common import NO_QUOTAS, percentile, tail
from core.settings import Settings, load_settings
from jobsched.natsserver import NatsServer, find_nats_server
from tests.faults.cluster import Cluster, cluster, failover_seconds, lost_and_duplicates, now
from tests.faults.natscluster import NatsCluster, nats_cluster

SCENARIOS = ("scheduler", "nats-leader")


@asynccontextmanager
async def nats_for(scenario: str, tmp: Path) -> AsyncIterator[NatsServer | NatsCluster]:
    binary = find_nats_server({})
    if scenario == "nats-leader":
        async with nats_cluster(binary, tmp / "nats") as c:
            yield c
        return
    server = NatsServer(binary, tmp / "nats", log_file=tmp / "nats.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def settings_for(scenario: str, tmp: Path, url: str, args: argparse.Namespace) -> Settings:
    extra: dict[str, Any] = {}
    if scenario == "nats-leader":
        extra = {"stream_replicas": 3, "lease_ttl_seconds": CLUSTER_MIN_TTL_SECONDS}
    if args.lease_ttl:
        extra["lease_ttl_seconds"] = args.lease_ttl
    return load_settings(
        {},
        data_dir=str(tmp / "data"),
        nats_url=url,
        subject_prefix=f"f{uuid.uuid4().hex[:8]}",
        auth_secret="bench-secret-0123456789abcdef0123456789",
        http_port=0,
        log_level="INFO",
        **{k.removeprefix("JOBSCHED_").lower(): v for k, v in NO_QUOTAS.items()},
        **extra,
    )


async def crash(scenario: str, c: Cluster, nats: NatsServer | NatsCluster) -> Any:
    if scenario == "scheduler":
        return c.kill("s1")
    assert isinstance(nats, NatsCluster)
    prefix = c.settings.nats.subject_prefix
    leader = await nats.leader_of(f"KV_{prefix}_leases")
    await nats.move_leader(f"{prefix.upper()}_WORK", leader)
    killed_at = now()
    nats.nodes[leader].kill()
    return killed_at


async def one_run(scenario: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    async with nats_for(scenario, tmp) as nats:
        settings = settings_for(scenario, tmp, nats.url, args)
        async with cluster(settings, tmp) as c:
            try:
                c.start("scheduler", "s1")
                c.start("scheduler", "s2")
                c.start("worker", "w1")
                ttl = settings.scheduler.lease_ttl_seconds
                await c.wait_balanced({"s1", "s2"}, timeout_seconds=4 * ttl + 30)
                start = now() + timedelta(seconds=3)
                jobs = await c.create_once_jobs(args.jobs, start, spread_seconds=args.spread)
                half = start + timedelta(seconds=args.spread / 2)
                await asyncio.sleep(max(0.0, (half - now()).total_seconds()))
                killed_at = await crash(scenario, c, nats)
                runs = await c.wait_succeeded(jobs, timeout_seconds=args.spread + 6 * ttl + 60)
                logs = "".join(child.output() for child in c.children.values())
            except Exception:
                for name, child in c.children.items():
                    print(f"--- {name} log ---\n{tail(child.log)}", file=sys.stderr)
                raise
    lost, duplicates = lost_and_duplicates(jobs, runs)
    delays = [
        (r.started_at - r.scheduled_for).total_seconds()
        for r in runs
        if r.started_at and r.scheduled_for >= killed_at and r.status == "SUCCEEDED"
    ]
    published = [
        (r.published_at - r.scheduled_for).total_seconds()
        for r in runs
        if r.published_at and r.scheduled_for >= killed_at and r.status == "SUCCEEDED"
    ]
    return {
        "ttl": settings.scheduler.lease_ttl_seconds,
        "delays": delays,
        "published": published,
        "failover": _failover(runs, killed_at) if scenario == "scheduler" else None,
        "leases_lost": logs.count("lease(s) to another scheduler"),
        "fenced": logs.count("could not renew"),
        "duplicates": duplicates,
        "lost": lost,
    }


def _failover(runs: list[Any], killed_at: Any) -> float:
    """The failover time, NaN when no run of the dead scheduler's partitions came due after the
    crash (too few jobs or too short a spread to see one)."""
    try:
        return failover_seconds(runs, "s1", killed_at)
    except ValueError:
        return float("nan")


def _row(name: str, r: dict[str, Any]) -> str:
    d = sorted(r["delays"])
    failover = "" if r["failover"] is None else f"{r['failover']:.2f}"
    return (
        f"{name:>12} {len(d):>5} {percentile(d, 50):>7.2f} {percentile(d, 99):>7.2f} "
        f"{max(d, default=math.nan):>7.2f} {max(r['published'], default=math.nan):>7.2f} "
        f"{failover:>9} "
        f"{r['leases_lost']:>6} {r['fenced']:>6} "
        f"{r['duplicates']:>5} {r['lost']:>5}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument(
        "--spread", type=float, default=15.0, help="seconds over which jobs come due"
    )
    parser.add_argument("--scenario", default=",".join(SCENARIOS), help=", ".join(SCENARIOS))
    parser.add_argument(
        "--lease-ttl", type=float, default=0.0, help="seconds; 0 = the scenario's default"
    )
    args = parser.parse_args()
    header = (
        f"{'run':>12} {'due':>5} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'pub max':>7} "
        f"{'failover':>9} {'lost':>6} {'fenced':>6} {'dup':>5} {'lost':>5}\n"
        f"{'':>12} {'after':>5} {'delay (scheduledFor → startedAt)':^23} {'s':>7} {'s':>9} "
        f"{'leases':>6} {'leases':>6} {'runs':>5} {'runs':>5}"
    )
    summary = []
    for scenario in args.scenario.split(","):
        print(
            f"\n{scenario}: SIGKILL half-way through {args.jobs} once jobs over {args.spread:g} s"
        )
        print(header)
        results = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="jobsched-failover-") as tmp:
                r = await one_run(scenario, args, Path(tmp))
            results.append(r)
            print(_row(str(i + 1), r), flush=True)
        total = {
            "ttl": results[0]["ttl"],
            "delays": [x for r in results for x in r["delays"]],
            "published": [x for r in results for x in r["published"]],
            "failover": max(r["failover"] for r in results) if scenario == "scheduler" else None,
            **{k: sum(r[k] for r in results) for k in ("leases_lost", "fenced", "duplicates")},
            "lost": sum(r["lost"] for r in results),
        }
        print(_row("all", total))
        summary.append((scenario, total))
    print("\nlease TTL, delay of every run due after the crash over all runs:")
    for scenario, t in summary:
        d = sorted(t["delays"])
        print(
            f"  {scenario}: TTL {t['ttl']:g} s; {len(d)} runs; p50 {percentile(d, 50):.2f} s, "
            f"p99 {percentile(d, 99):.2f} s, max {max(d, default=math.nan):.2f} s "
            f"(= {max(d, default=math.nan) / t['ttl']:.2f} x TTL); leases lost {t['leases_lost']}, "
            f"duplicates {t['duplicates']}, lost {t['lost']}"
        )


if __name__ == "__main__":
    asyncio.run(main())
