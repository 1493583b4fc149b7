"""A noisy neighbour: a steady workload with and without stalled replaying WebSocket clients.

Every role in one process (layout ``one``, as ``jobsched dev``), SQLite, one nats-server. The
workload: ``--rate`` (50) due runs per second from ``rate x period`` interval ``noop`` jobs of
user ``bench`` inserted into the store with evenly spread phases. The noise: ``--events``
(20,000) job events of another user, ``noisy``, published to the status stream before the
window, then ``--clients`` (400) WebSocket clients of ``noisy`` opened ``--clients-at`` seconds
into the window that subscribe with ``lastEventId: 0`` and never read (4 KiB receive buffers).

Two runs, each on a fresh deployment: ``quiet`` (no noise) and ``noisy``. Per run, over every run
due in the window (one that never started counts as infinitely late): schedule-to-start
(scheduledFor -> startedAt, from the store) p50/p99/max, occurrences recorded SKIPPED, partition
leases lost (``jobsched_lease_losses_total``), NATS connections lost by the jobsched process
(``jobsched_nats_disconnects_total``, by connection), connections nats-server cut as slow
consumers (its ``/varz`` ``slow_consumers``), and WebSocket clients closed with 4008
(``jobsched_ws_slow_consumer_closes_total``). Metrics a version does not have print ``-``.

    .venv/bin/python -m bench.noisy                      # ~2 min
    .venv/bin/python -m bench.noisy --clients 400 --events 20000 --rate 50 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import math
import socket
import sys
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    CpuMeter,
    Deployment,
    Layout,
    StoreReader,
    Summary,
    add_common_args,
    delays,
    fmt_num,
    fmt_seconds,
    interval_jobs,
    save_results,
    seed_jobs,
    table,
    wait_until_wall,
)
from bench.sustained import PARTITIONS, expected_interval_runs, settings_overrides
from gateway.auth import mint_token
from tests.support import seed_events, stalled_ws

NOISY_USER = "noisy"


async def scrape(url: str) -> dict[str, dict[str, float]]:
    """``/metrics`` as {metric: {labels as text: value}} (jobsched_* only)."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("jobsched_"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out.setdefault(s.name, {})[labels] = s.value
    return out


async def server_slow_consumers(monitor_url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(monitor_url + "/varz") as resp:
        return int((await resp.json()).get("slow_consumers", 0))


def total(metrics: dict[str, dict[str, float]], name: str) -> float:
    """Sum of a metric's samples; NaN when this version does not export it."""
    return sum(metrics[name].values()) if name in metrics else float("nan")


async def open_stalled(url: str, token: str, n: int) -> list[socket.socket]:
    socks: list[socket.socket] = []
    for _ in range(n):
        try:
            socks.append(await stalled_ws(url, token))
        except OSError as e:
            print(f"  a stalled client could not connect: {e}", file=sys.stderr)
    return socks


async def run_one(noisy: bool, args: argparse.Namespace) -> dict[str, Any]:
    label = "noisy" if noisy else "quiet"
    print(f"== {label}: {args.rate:g} runs/s for {args.duration:g} s", file=sys.stderr)
    first_at = math.ceil(time.time() + args.startup)
    jobs = interval_jobs(int(args.rate * args.period), args.period, first_at, PARTITIONS)

    def seed(d: Deployment) -> None:
        seed_jobs(d.store_path, jobs)

    env = settings_overrides(args)
    async with Deployment(
        Layout("one"), keep=args.keep, name="noisy", env=env, seed=seed, nats_monitor=True
    ) as d:
        if noisy:
            t = time.monotonic()
            await seed_events(d.nats_url, "bench", NOISY_USER, args.events)
            print(
                f"  {args.events:,} events of {NOISY_USER!r} published in "
                f"{time.monotonic() - t:.1f} s",
                file=sys.stderr,
            )
        t0 = first_at + args.period
        if time.time() > t0:
            print("  WARNING: start-up ran past the window start; raise --startup", file=sys.stderr)
        meter = CpuMeter(d.pids())
        socks: list[socket.socket] = []
        await wait_until_wall(t0)
        meter.start()
        try:
            if noisy:
                await wait_until_wall(t0 + args.clients_at)
                c = time.monotonic()
                token = mint_token(d.secret, NOISY_USER)
                socks = await open_stalled(d.url, token, args.clients)
                print(
                    f"  {len(socks)} stalled clients connected in {time.monotonic() - c:.1f} s",
                    file=sys.stderr,
                )
            await wait_until_wall(t0 + args.duration)
            cpu = meter.stop()
            res = await collect(d, jobs_t0=t0, args=args)
        finally:
            for s in socks:
                s.close()
    st = res["_start"]
    print(
        f"  -> start p50 {fmt_seconds(st.p50)} p99 {fmt_seconds(st.p99)} "
        f"max {fmt_seconds(st.max)}, "
        f"skipped {res['skipped']}, lease losses {fmt_num(res['lease_losses'])}",
        file=sys.stderr,
    )
    return {"run": label, "clients": len(socks), "cpu_seconds": cpu, **res}


async def collect(d: Deployment, *, jobs_t0: float, args: argparse.Namespace) -> dict[str, Any]:
    a_ms, b_ms = int(jobs_t0 * 1000), int((jobs_t0 + args.duration) * 1000)
    metrics = await scrape(d.url)
    slow_cut = await server_slow_consumers(d.nats.monitor_url)
    reader = StoreReader(d.store_path)
    try:
        created = reader.jobs_created("CAST(spec AS TEXT) LIKE '%\"interval\"%'")
        expected, _ = expected_interval_runs(created, int(args.period * 1000), a_ms, b_ms)
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline:
            done = reader.count(
                "scheduled_for >= ? AND scheduled_for < ? AND started_at IS NOT NULL", (a_ms, b_ms)
            )
            if done >= expected:
                break
            await asyncio.sleep(0.5)
        runs = reader.runs(
            "scheduled_for >= ? AND scheduled_for < ? AND status != 'SKIPPED'", (a_ms, b_ms)
        )
        window = "scheduled_for >= ? AND scheduled_for < ?"
        skipped = reader.skipped_occurrences(window, (a_ms, b_ms))
    finally:
        reader.close()
    pad = [float("inf")] * max(0, expected - len(runs) - skipped)
    start = Summary.of(delays(runs, "scheduled_for", "started_at") + pad)
    return {
        "expected_runs": expected,
        "started_runs": sum(1 for r in runs if r.started_at is not None),
        "skipped": skipped,
        "sched_to_start": start.as_dict(),
        "lease_losses": total(metrics, "jobsched_lease_losses_total"),
        "nats_disconnects": metrics.get("jobsched_nats_disconnects_total"),
        "nats_slow_consumer_cuts": slow_cut,
        "ws_4008_closes": total(metrics, "jobsched_ws_slow_consumer_closes_total"),
        "_start": start,
    }


def print_table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rows = []
    for r in results:
        st = r["_start"]
        disconnects = r["nats_disconnects"]
        lost = "-" if disconnects is None else fmt_num(sum(disconnects.values()))
        rows.append(
            [
                r["run"],
                f"{r['clients']:,}",
                f"{r['started_runs']:,}/{r['expected_runs']:,}",
                f"{r['skipped']:,}",
                fmt_seconds(st.p50),
                fmt_seconds(st.p99),
                fmt_seconds(st.max),
                fmt_num(r["lease_losses"]),
                lost,
                f"{r['nats_slow_consumer_cuts']:,}",
                fmt_num(r["ws_4008_closes"]),
                ", ".join(f"{n} {c:.1f}" for n, c in r["cpu_seconds"].items()),
            ]
        )
    headers = [
        "run",
        "stalled clients",
        "started/due",
        "skipped",
        "start p50",
        "start p99",
        "start max",
        "lease losses",
        "NATS conns lost",
        "NATS slow-consumer cuts",
        "WS 4008 closes",
        "CPU s in the window",
    ]
    print(table(headers, rows))
    quiet = next((r for r in results if r["run"] == "quiet"), None)
    noisy = next((r for r in results if r["run"] == "noisy"), None)
    if quiet and noisy and quiet["_start"].p99 > 0:
        ratio = noisy["_start"].p99 / quiet["_start"].p99
        print(f"noisy/quiet schedule-to-start p99: {ratio:.2f}x (target: at most 2x)")
    print(
        f"{args.rate:g} due runs/s of interval noop jobs (period {args.period:g} s) for "
        f"{args.duration:g} s; noisy: {args.events:,} events of another user in the status stream "
        f"and {args.clients} WebSocket clients of that user replaying from lastEventId 0 without "
        f"reading, from {args.clients_at:g} s into the window. start = scheduledFor -> startedAt."
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings_overrides(args)  # a bad --set fails here, before anything starts
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or set(runs) - {"quiet", "noisy"}:
        raise SystemExit(f"--runs {args.runs!r}: quiet, noisy or both")
    results = [await run_one(run == "noisy", args) for run in runs]
    print("\nnoisy neighbour — layout one (every role in one process), SQLite store")
    print_table(results, args)
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    return {"args": vars(args), "results": clean}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", default="quiet,noisy", help="which runs, in order (quiet,noisy)")
    p.add_argument("--rate", type=float, default=50.0, help="due runs per second (50)")
    p.add_argument("--period", type=float, default=5.0, help="interval of the jobs, s (5)")
    p.add_argument("--duration", type=float, default=30.0, help="window length, s (30)")
    p.add_argument("--clients", type=int, default=400, help="stalled WebSocket clients (400)")
    p.add_argument("--events", type=int, default=20_000, help="events each client replays (20,000)")
    p.add_argument(
        "--clients-at", type=float, default=5.0, help="when they connect, s into the window (5)"
    )
    p.add_argument("--startup", type=float, default=10.0, help="s from seeding to the first runs")
    p.add_argument("--drain", type=float, default=30.0, help="max wait for late runs, s (30)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="JOBSCHED_NAME=VALUE",
        help="a setting for the jobsched process (repeatable), e.g. "
        "--set JOBSCHED_WS_REPLAY_EVENTS_PER_SECOND=0",
    )
    add_common_args(p)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('noisy', result, args.json)}")


if __name__ == "__main__":
    main()
