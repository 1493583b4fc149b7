"""Per-user fairness: a small user's schedule-to-start delay, alone and beside a user with 10x
the runs in the same queue (issue 17).

One process per role (layout ``split``, ``--layout``), SQLite, one nats-server, one worker of
``--concurrency`` (4) execution slots. The workload: user ``small`` has ``--small-rate`` (2) runs
due per second for ``--duration`` (20) seconds, user ``big`` ``--ratio`` (10) times as many; every
run is the ``sleep`` task of ``--sleep-seconds`` (0.25 s), so together they ask more than the
worker can do (a backlog of ``big``'s runs grows through the window). All runs are ``once`` jobs
POSTed before the window, their ``executeAt`` spread evenly over it.

Scenarios, each on a fresh deployment:

- ``alone``: only ``small``'s runs (the reference);
- ``together``: both users, the worker's fairness on: ``--prefetch`` (500) messages fetched ahead
  and started round-robin across users, at most ``--user-concurrency`` (3) runs of one user at
  once (``JOBSCHED_WORKER_PREFETCH``, ``JOBSCHED_WORKER_USER_CONCURRENCY``);
- ``together-fifo``: both users, fairness off (prefetch 0, no cap): stream order, for contrast.

Per scenario: ``small``'s schedule-to-start (scheduledFor -> startedAt, from the store) p50 / p99
/ max over every run due in the window (one that never started counts as infinitely late), the
same for ``big``, and the load average of the machine (shared) before and after. The target:
``small``'s p99 together <= 2x alone.

    .venv/bin/python -m bench.fairness                 # ~2.5 min
    .venv/bin/python -m bench.fairness --duration 10 --small-rate 1
    .venv/bin/python -m bench.fairness --repeat 5      # each round printed, then the medians
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from bench.common import (
    Deployment,
    Layout,
    StoreReader,
    Summary,
    add_common_args,
    delays,
    fmt_num,
    fmt_seconds,
    iso_ms,
    machine_info,
    post_jobs,
    save_results,
    table,
    wait_until_wall,
)
from gateway.auth import mint_token

SCENARIOS = ("alone", "together", "together-fifo")


def sleep_body(at: datetime, seconds: float) -> bytes:
    return msgspec.json.encode(
        {
            "taskId": "sleep",
            "parameters": {"seconds": seconds},
            "schedule": {"type": "once", "executeAt": iso_ms(at)},
        }
    )


def spread(rate: float, duration: float, t0: float, seconds: float) -> list[bytes]:
    n = max(1, round(rate * duration))
    return [
        sleep_body(datetime.fromtimestamp(t0 + i * duration / n, UTC), seconds) for i in range(n)
    ]


async def scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    fair = name != "together-fifo"
    env = {
        "JOBSCHED_WORKER_CONCURRENCY": str(args.concurrency),
        "JOBSCHED_WORKER_PREFETCH": str(args.prefetch if fair else 0),
        "JOBSCHED_WORKER_USER_CONCURRENCY": str(args.user_concurrency if fair else 0),
    }
    load_before = os.getloadavg()
    layout = Layout.parse(args.layout)
    async with Deployment(layout, env=env, keep=args.keep, name="fairness") as d:
        tokens = {u: mint_token(d.secret, u, ttl=timedelta(hours=1)) for u in ("small", "big")}
        n_big = round(args.small_rate * args.ratio * args.duration) if name != "alone" else 0
        lead = args.lead_seconds + (n_big + args.small_rate * args.duration) / 150
        t0 = time.time() + lead
        small = spread(args.small_rate, args.duration, t0, args.sleep_seconds)
        big = (
            spread(args.small_rate * args.ratio, args.duration, t0, args.sleep_seconds)
            if n_big
            else []
        )
        print(
            f"[{name}] posting {len(small)} + {len(big)} jobs; window starts in {lead:.1f} s",
            file=sys.stderr,
        )
        posted = await asyncio.gather(
            post_jobs(d.url, tokens["small"], small, concurrency=10),
            *([post_jobs(d.url, tokens["big"], big, concurrency=40)] if big else []),
        )
        if time.time() > t0:
            print(f"[{name}] warning: submission ran into the window", file=sys.stderr)
        ids = [[i for i in p.ids if i] for p in posted]
        await wait_until_wall(t0 + args.duration)
        reader = StoreReader(d.store_path)
        try:
            deadline = time.time() + args.drain_seconds
            while True:
                small_runs = reader.runs_of(ids[0])
                big_runs = reader.runs_of(ids[1]) if len(ids) > 1 else {}
                runs = [*small_runs.values(), *big_runs.values()]
                started = sum(r.started_at is not None for r in runs)
                if started == sum(len(i) for i in ids) or time.time() > deadline:
                    break
                await asyncio.sleep(0.5)
        finally:
            reader.close()
    load_after = os.getloadavg()
    s = Summary.of(delays(small_runs.values(), "scheduled_for", "started_at"))
    s_pub = Summary.of(delays(small_runs.values(), "scheduled_for", "published_at"))
    s_take = Summary.of(delays(small_runs.values(), "published_at", "started_at"))
    b = Summary.of(delays(big_runs.values(), "scheduled_for", "started_at")) if big_runs else None
    return {
        "scenario": name,
        "small": s,
        "small_publish": s_pub,
        "small_pickup": s_take,
        "big": b,
        "small_runs": len(ids[0]),
        "big_runs": len(ids[1]) if len(ids) > 1 else 0,
        "load_before": load_before,
        "load_after": load_after,
    }


HEADER = [
    "scenario",
    "runs small/big",
    "small p50",
    "small p99",
    "small max",
    "small p99: due->published + published->started",
    "big p50",
    "big p99",
    "load before (1/5/15 min)",
    "load after",
]


def row(r: dict[str, Any]) -> list[str]:
    s, b = r["small"], r["big"]
    return [
        r["scenario"],
        f"{r['small_runs']} / {r['big_runs']}",
        fmt_seconds(s.p50),
        fmt_seconds(s.p99),
        fmt_seconds(s.max),
        f"{fmt_seconds(r['small_publish'].p99)} + {fmt_seconds(r['small_pickup'].p99)}",
        "-" if b is None else fmt_seconds(b.p50),
        "-" if b is None else fmt_seconds(b.p99),
        " ".join(fmt_num(x, 2) for x in r["load_before"]),
        " ".join(fmt_num(x, 2) for x in r["load_after"]),
    ]


def ratio_of(results: list[dict[str, Any]]) -> float | None:
    """``small``'s p99 together / alone in one round (None without both scenarios)."""
    by = {r["scenario"]: r for r in results}
    if "alone" not in by or "together" not in by:
        return None
    alone, together = by["alone"]["small"].p99, by["together"]["small"].p99
    return together / alone if alone > 0 else float("inf")


def median_row(name: str, rounds: list[dict[str, Any]]) -> list[str]:
    """The medians over rounds of one scenario's figures (the load columns: the last round's)."""

    def med(get: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(get(r) for r in rounds)

    big = [r for r in rounds if r["big"] is not None]
    return [
        f"{name} (median of {len(rounds)})",
        f"{rounds[0]['small_runs']} / {rounds[0]['big_runs']}",
        fmt_seconds(med(lambda r: r["small"].p50)),
        fmt_seconds(med(lambda r: r["small"].p99)),
        fmt_seconds(med(lambda r: r["small"].max)),
        f"{fmt_seconds(med(lambda r: r['small_publish'].p99))} + "
        f"{fmt_seconds(med(lambda r: r['small_pickup'].p99))}",
        "-" if not big else fmt_seconds(statistics.median(r["big"].p50 for r in big)),
        "-" if not big else fmt_seconds(statistics.median(r["big"].p99 for r in big)),
        " ".join(fmt_num(x, 2) for x in rounds[0]["load_before"]),
        " ".join(fmt_num(x, 2) for x in rounds[-1]["load_after"]),
    ]


async def main(args: argparse.Namespace) -> int:
    rounds: list[list[dict[str, Any]]] = []
    for n in range(args.repeat):
        results = [await scenario(name, args) for name in args.scenarios]
        rounds.append(results)
        if args.repeat > 1:
            print(f"round {n + 1} of {args.repeat}")
        print(table(HEADER, [row(r) for r in results]))
        ratio = ratio_of(results)
        if ratio is not None:
            verdict = "meets" if ratio <= 2 else "misses"
            print(f"small p99 together / alone = {ratio:.2f} ({verdict} the target of <= 2)")
    ratios = [x for x in (ratio_of(r) for r in rounds) if x is not None]
    if args.repeat > 1:
        print(f"medians of {args.repeat} rounds")
        print(
            table(
                HEADER,
                [
                    median_row(name, [r for rs in rounds for r in rs if r["scenario"] == name])
                    for name in args.scenarios
                ],
            )
        )
        if ratios:
            med = statistics.median(ratios)
            met = sum(x <= 2 for x in ratios)
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"small p99 together / alone: median {med:.2f} ({each}); "
                f"{met} of {len(ratios)} rounds meet the target of <= 2"
            )
    if not args.no_save:
        payload = {
            "machine": machine_info(),
            "args": vars(args),
            "ratios": ratios,
            "rounds": [
                [
                    {
                        **r,
                        "small": r["small"].as_dict(),
                        "small_publish": r["small_publish"].as_dict(),
                        "small_pickup": r["small_pickup"].as_dict(),
                        "big": None if r["big"] is None else r["big"].as_dict(),
                    }
                    for r in results
                ]
                for results in rounds
            ],
        }
        print(f"results: {save_results('fairness', payload, args.json)}", file=sys.stderr)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--layout",
        default="split",
        help="split (default: the worker in its own process), one or inproc",
    )
    p.add_argument("--small-rate", type=float, default=2.0, help="small's runs due per second")
    p.add_argument("--ratio", type=float, default=10.0, help="big's runs per small's run")
    p.add_argument("--duration", type=float, default=20.0, help="window (seconds)")
    p.add_argument("--sleep-seconds", type=float, default=0.25, help="each run's task (seconds)")
    p.add_argument("--concurrency", type=int, default=4, help="worker execution slots")
    p.add_argument("--prefetch", type=int, default=500, help="look-ahead when fair")
    p.add_argument("--user-concurrency", type=int, default=3, help="per-user cap when fair")
    p.add_argument("--lead-seconds", type=float, default=4.0, help="margin before the window")
    p.add_argument("--drain-seconds", type=float, default=90.0, help="wait for late starts")
    p.add_argument(
        "--scenarios",
        type=lambda t: [s for s in t.split(",") if s],
        default=list(SCENARIOS),
        help=f"comma-separated, of {', '.join(SCENARIOS)}",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every scenario (each printed; then the medians and every ratio)",
    )
    add_common_args(p)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
