"""Burst: N once jobs due at the same instant.

All N jobs (default 20,000) are submitted through the HTTP API before the due instant T; then
it reports, from T: when the last run was published (store ``publishedAt``, and the run message
seen on NATS), when the last one started (``startedAt``), finished (``finishedAt``), and when the
store (what the API shows) had every run SUCCEEDED — plus CPU seconds per process during the
burst.

    .venv/bin/python -m bench.burst [--jobs 20000] [--layout one|split|inproc]
    .venv/bin/python -m bench.burst --jobs 5000            # the peer comparison size
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any

from bench import targets
from bench.common import (
    CpuMeter,
    Deployment,
    Layout,
    Profiler,
    StoreReader,
    Summary,
    WorkObserver,
    add_common_args,
    calibrate_submit_rate,
    fmt_seconds,
    once_body,
    post_jobs,
    save_results,
    table,
    verdict,
    wait_until_wall,
)

TARGETS_SECONDS = {
    (targets.BIG_BURST_JOBS, "split"): targets.BIG_BURST_SECONDS,
    (targets.PEER_BURST_JOBS, "one"): targets.BURST_ONE_SECONDS,
}
"""Issue 14's all-started targets by (jobs, layout)."""


async def run_burst(layout: Layout, n: int, args: argparse.Namespace) -> dict[str, Any]:
    async with Deployment(layout, keep=args.keep, name="burst") as d:
        calib = await calibrate_submit_rate(d, concurrency=args.concurrency)
        due = math.ceil(time.time() + n / (0.75 * calib) + 3.0)
        due_ms = due * 1000
        body = once_body(datetime.fromtimestamp(due, UTC))
        res = await post_jobs(d.url, d.token, [body] * n, concurrency=args.concurrency)
        overrun = res.ended_wall - due
        print(
            f"  submitted {res.ok:,} jobs at {res.rate:.0f}/s ({len(res.errors)} errors); "
            f"due in {due - time.time():.1f} s",
            file=sys.stderr,
        )
        meter = CpuMeter(d.pids())
        prof = Profiler(
            args.py_spy,
            args.profile,
            f"burst-{n}-{layout.label}",
            idle=args.profile_idle,
            native=args.profile_native,
        )
        all_recorded = float("inf")
        async with WorkObserver(d.nats_url) as obs:
            await wait_until_wall(due)
            meter.start()
            prof.start(d.python_pids(), args.profile_seconds)
            reader = StoreReader(d.store_path)
            try:
                deadline = time.monotonic() + args.timeout
                while time.monotonic() < deadline:
                    done = reader.count("scheduled_for = ? AND status = 'SUCCEEDED'", (due_ms,))
                    if done >= res.ok:
                        all_recorded = time.time() - due
                        break
                    await asyncio.sleep(0.1)
                cpu = meter.stop()
                runs = reader.runs("scheduled_for = ?", (due_ms,))
            finally:
                reader.close()
            await asyncio.sleep(0.5)
        await prof.wait()
        arrivals = obs.arrivals_ms()
    missing = res.ok - len(runs)

    def last(instants_ms: list[int | None]) -> float:
        """Seconds from the due time to the latest of ``instants_ms``; inf if one is missing."""
        known = [t for t in instants_ms if t is not None]
        if missing or not known or len(known) < len(instants_ms):
            return float("inf")
        return (max(known) - due_ms) / 1000.0

    starts = [(r.started_at - due_ms) / 1000.0 if r.started_at else float("inf") for r in runs] + [
        float("inf")
    ] * missing
    return {
        "layout": layout.label,
        "jobs": n,
        "submitted": res.ok,
        "started": sum(1 for r in runs if r.started_at is not None),
        "submit_rate_per_second": res.rate,
        "submit_overrun_seconds": overrun,
        "all_published_seconds": last([r.published_at for r in runs]),
        "all_in_stream_seconds": last([arrivals.get(r.id) for r in runs]),
        "all_started_seconds": last([r.started_at for r in runs]),
        "all_finished_seconds": last([r.finished_at for r in runs]),
        "all_succeeded_in_store_seconds": all_recorded,
        "start_delay": Summary.of(starts).as_dict(),
        "cpu_seconds": cpu,
    }


def print_table(results: list[dict[str, Any]]) -> None:
    rows = []
    for r in results:
        target = TARGETS_SECONDS.get((r["jobs"], r["layout"]))
        v = verdict(r["all_started_seconds"], target) if target else "-"
        rows.append(
            [
                r["layout"],
                f"{r['jobs']:,}",
                f"{r['submit_rate_per_second']:.0f}",
                fmt_seconds(r["all_published_seconds"]),
                fmt_seconds(r["all_in_stream_seconds"]),
                fmt_seconds(
                    r["start_delay"]["p50"] if r["start_delay"]["p50"] is not None else float("nan")
                ),
                fmt_seconds(r["all_started_seconds"]),
                fmt_seconds(r["all_finished_seconds"]),
                fmt_seconds(r["all_succeeded_in_store_seconds"]),
                f"{v} (<= {target:g} s)" if target else "-",
                ", ".join(f"{k} {c:.1f}" for k, c in r["cpu_seconds"].items()),
            ]
        )
    print(
        table(
            [
                "layout",
                "jobs",
                "submits/s",
                "all published",
                "all in stream",
                "start p50",
                "all started",
                "all finished",
                "all SUCCEEDED in store",
                "target (all started)",
                "CPU s during burst",
            ],
            rows,
        )
    )
    print(
        "times from the due instant: published = last publishedAt (store), in stream = last run "
        "message seen on NATS, started/finished = last startedAt/finishedAt, SUCCEEDED in store "
        "= when the store (and API) showed every run SUCCEEDED."
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for layout_name in args.layout.split(","):
        print(f"== burst of {args.jobs:,} on {layout_name}", file=sys.stderr)
        results.append(await run_burst(Layout.parse(layout_name), args.jobs, args))
    print(f"\nburst — {args.jobs:,} once noop jobs due at one instant")
    print_table(results)
    return {"args": vars(args), "results": results}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--layout", default="one", help="one, split, inproc or a comma list")
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--timeout", type=float, default=120.0, help="max wait after the due time, s")
    p.add_argument(
        "--profile-seconds", type=float, default=10.0, help="py-spy duration with --profile"
    )
    add_common_args(p)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('burst', result, args.json)}")


if __name__ == "__main__":
    main()
