"""The two peer workloads, our figures beside the peers' (medians of ``--runs`` runs, default 3):

* burst — 5,000 once ``noop`` jobs due at one instant: seconds until all started;
* steady — 500 jobs/s due for 10 s (once jobs spread evenly): schedule-to-start p99;

plus submits/s through our HTTP API (50 concurrent clients). Layout ``one`` (default): every
role in one process, as the peers ran.

    .venv/bin/python -m bench.peers [--runs 3] [--layout one|split]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from typing import Any

from bench.burst import run_burst
from bench.common import Layout, add_common_args, fmt_s, save_results, table, verdict
from bench.sustained import run_one

# name: (submits/s, burst all started s, steady p99 s); None = not reported
PEERS: dict[str, tuple[float | None, float, float]] = {
    "APScheduler 4 + SQLite": (210.0, 50.0, 42.0),
    "APScheduler 4 in memory": (None, 0.90, 0.002),
    "Celery + Redis (ETA)": (None, 3.05, 0.004),
    "taskiq + taskiq-nats": (None, 4.0, 1.06),
    "arq (tuned)": (None, 3.7, 0.052),
}
TARGET_BURST_S = 1.0
TARGET_STEADY_P99_S = 0.005


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.parse(args.layout)
    bursts, steadies = [], []
    for i in range(args.runs):
        print(f"== burst run {i + 1}/{args.runs}", file=sys.stderr)
        bursts.append(await run_burst(layout, 5000, args))
    for i in range(args.runs):
        print(f"== steady run {i + 1}/{args.runs}", file=sys.stderr)
        r = await run_one(layout, "once", 500.0, args)
        steadies.append(r)
    burst_s = statistics.median(b["all_started_s"] for b in bursts)
    steady_p99 = statistics.median(s["_start"].p99 for s in steadies)
    submits = statistics.median(
        [b["submit_rate_per_s"] for b in bursts]
        + [s["submission"]["submit_rate_per_s"] for s in steadies]
    )
    rows = [
        [
            f"jobsched ({layout.label}, SQLite)",
            f"{submits:,.0f}",
            fmt_s(burst_s),
            verdict(burst_s, TARGET_BURST_S),
            fmt_s(steady_p99),
            verdict(steady_p99, TARGET_STEADY_P99_S),
        ]
    ]
    for name, (sub, b, st) in PEERS.items():
        rows.append([name, f"{sub:,.0f}" if sub else "-", fmt_s(b), "", fmt_s(st), ""])
    print(
        f"\npeers — medians of {args.runs} runs; burst = 5,000 once jobs due at one instant, "
        "time until all started; steady = 500 jobs/s due for 10 s, schedule-to-start p99"
    )
    print(
        table(
            [
                "scheduler",
                "submits/s",
                "burst: all started",
                f"<= {TARGET_BURST_S:g} s",
                "steady: p99",
                f"<= {TARGET_STEADY_P99_S * 1000:g} ms",
            ],
            rows,
        )
    )
    print(
        "runs: burst all started "
        + ", ".join(fmt_s(b["all_started_s"]) for b in bursts)
        + "; steady p99 "
        + ", ".join(fmt_s(s["_start"].p99) for s in steadies)
    )
    return {
        "args": vars(args),
        "burst_all_started_s": burst_s,
        "steady_p99_s": steady_p99,
        "submits_per_s": submits,
        "bursts": bursts,
        "steadies": [{k: v for k, v in s.items() if not k.startswith("_")} for s in steadies],
        "peers": PEERS,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--layout", default="one", choices=["one", "split", "inproc"])
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--drain", type=float, default=20.0)
    p.add_argument("--period", type=float, default=5.0)
    p.add_argument("--profile-s", type=float, default=10.0)
    add_common_args(p)
    p.set_defaults(duration=10.0, startup=10.0, interval_seed="store", baseline=False)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('peers', result, args.json)}")


if __name__ == "__main__":
    main()
