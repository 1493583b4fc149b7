"""Sustained load: R due runs per second for D seconds through the full stack (SQLite, one
nats-server, gateway, scheduler + recorder, worker, ``noop`` task).

Workloads:

* ``once`` — RxD once jobs with ``executeAt`` spread evenly over the window, all submitted through
  the HTTP API (concurrently) before the window starts, so submission is not what is measured.
  The window starts after the submission time estimated from a calibration burst.
* ``interval`` — Rxk interval jobs of period k seconds (``--period``, 5), inserted into the store
  before start-up with evenly spread phases (``--interval-seed store``, the default) or submitted
  through the API (``api``); the window starts once all exist, so R runs per second are due in it.

Per configuration it prints: throughput (runs SUCCEEDED per second with ``finishedAt`` in the
window), the delays scheduledFor→publishedAt and scheduledFor→startedAt (p50/p99/max over every
run due in the window; a run that never started counts as infinitely late), and CPU seconds per
1,000 runs of each process (jobsched processes and nats-server), from /proc.

Layouts: ``one`` (all roles in one process) and ``split`` (gateway, scheduler, worker processes).

    .venv/bin/python -m bench.sustained       # 2000/s, both workloads, both layouts
    .venv/bin/python -m bench.sustained --rate 500,1000,2000,5000 --duration 60
    .venv/bin/python -m bench.sustained --workload once --layout split --baseline
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
    MessageMeter,
    Profiler,
    StoreReader,
    Summary,
    WorkObserver,
    add_common_args,
    calibrate_submit_rate,
    delays,
    fmt_num,
    fmt_seconds,
    interval_body,
    interval_jobs,
    once_body,
    post_jobs,
    save_results,
    seed_jobs,
    table,
    verdict,
    wait_until_wall,
)
from core.errors import ConfigError
from core.settings import Settings, load_settings

PARTITIONS = 64  # the product default; the deployments do not change it
TARGET_RATE = targets.SUSTAINED_RATE
LATE_SHARE = 0.05
"""A row whose meters started later than this share of its window after the window began (a
submission that overran its lead) gets no CPU or NATS figures: they would miss its start."""
TARGET_P99_SECONDS = targets.SUSTAINED_P99_SECONDS
TARGET_MAX_SECONDS = targets.SUSTAINED_MAX_SECONDS


def expected_interval_runs(
    created_ms: list[int], period_ms: int, a_ms: int, b_ms: int
) -> tuple[int, list[int]]:
    """Occurrences c + m*period (m >= 1) of jobs created at ``created_ms`` inside [a, b): the
    total and the count due in each second of the window (how even the load is)."""
    total = 0
    per_seconds = [0] * max(1, math.ceil((b_ms - a_ms) / 1000))
    for c in created_ms:
        first = max(1, math.ceil((a_ms - c) / period_ms))
        last = (b_ms - 1 - c) // period_ms
        for m in range(first, last + 1):
            total += 1
            per_seconds[(c + m * period_ms - a_ms) // 1000] += 1
    return total, per_seconds


async def submit_workload(
    d: Deployment, workload: str, rate: float, duration_seconds: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Submit the jobs; returns the window start ``t0`` (epoch s) and submission figures."""
    calib = await calibrate_submit_rate(d, concurrency=args.concurrency)
    if workload == "once":
        n = int(rate * duration_seconds)
        lead = n / (0.85 * calib) + 3.0
        t0 = math.ceil(time.time() + lead)
        bodies = [once_body(datetime.fromtimestamp(t0 + i / rate, UTC)) for i in range(n)]
        meter = CpuMeter(d.pids())
        meter.start()
        res = await post_jobs(d.url, d.token, bodies, concurrency=args.concurrency)
        submit_cpu = meter.stop()
    else:
        # Interval jobs run at creation + m*k: pace the creations evenly over `laps` periods so
        # their phases spread evenly over the period (R due per second), at a pace the gateway
        # sustains.
        n = int(rate * args.period)
        laps = max(1, math.ceil(rate / (0.5 * calib)))
        res = await post_jobs(
            d.url,
            d.token,
            [interval_body(float(args.period))] * n,
            concurrency=args.concurrency,
            spacing_seconds=laps / rate,
        )
        t0 = math.ceil(time.time() + 1.0)
        submit_cpu = {}
    overrun = res.ended_wall - t0
    if res.errors:
        print(f"  {len(res.errors)} submission error(s), e.g. {res.errors[0]}", file=sys.stderr)
    if overrun > 0:
        print(
            f"  WARNING: submission ended {overrun:.1f} s after the window started; "
            "the first runs compete with submissions",
            file=sys.stderr,
        )
    return {
        "t0": t0,
        "jobs": n,
        "submit_seconds": res.elapsed_seconds,
        "submitted": res.ok,
        "submit_errors": len(res.errors),
        "submit_rate_per_second": res.rate,
        "calibration_rate_per_second": calib,
        "submit_overrun_seconds": overrun,
        "submit_cpu_ms_per_job": {
            name: 1000 * c / res.ok if res.ok else math.nan for name, c in submit_cpu.items()
        },
    }


async def drain(
    reader: StoreReader, a_ms: int, b_ms: int, expected: int, limit_seconds: float
) -> None:
    """Wait until every run due in [a, b) is recorded finished, no progress for 10 s, or
    ``limit_seconds`` passed."""
    deadline = time.monotonic() + limit_seconds
    last, still = -1, time.monotonic()
    while time.monotonic() < deadline:
        done = reader.count(
            "scheduled_for >= ? AND scheduled_for < ? AND finished_at IS NOT NULL", (a_ms, b_ms)
        )
        if done >= expected:
            return
        if done != last:
            last, still = done, time.monotonic()
        elif time.monotonic() - still > 10:
            return
        await asyncio.sleep(0.5)


async def measure_window(
    d: Deployment,
    workload: str,
    rate: float,
    duration_seconds: float,
    t0: float,
    args: argparse.Namespace,
    label: str,
) -> dict[str, Any]:
    pids = d.pids()
    meter = CpuMeter(pids)
    prof = Profiler(
        args.py_spy, args.profile, label, idle=args.profile_idle, native=args.profile_native
    )
    messages = MessageMeter(d.nats.monitor_url)
    async with WorkObserver(d.nats_url) as obs:
        await wait_until_wall(t0)
        late = time.time() - t0
        meter.start()
        await messages.start()
        observed0 = len(obs.seen)
        prof.start(d.python_pids(), duration_seconds)
        await wait_until_wall(t0 + duration_seconds)
        cpu = meter.stop()
        wall = meter.wall
        received, sent = await messages.stop()
        sent -= len(obs.seen) - observed0  # the run messages forwarded to this benchmark
        a_ms, b_ms = int(t0 * 1000), int((t0 + duration_seconds) * 1000)
        reader = StoreReader(d.store_path)
        try:
            if workload == "once":
                expected = int(rate * duration_seconds)
                due_per_second = [int(rate)]
            else:
                created = reader.jobs_created("CAST(spec AS TEXT) LIKE '%\"interval\"%'")
                expected, due_per_second = expected_interval_runs(
                    created, int(args.period * 1000), a_ms, b_ms
                )
            await drain(reader, a_ms, b_ms, expected, args.drain)
            # the work of the window, however long it took: CPU and messages until the drain
            # ended, per run due in the window that finished (robust on a loaded machine,
            # where a window's runs may finish after it)
            # where runs keep coming after the window (interval jobs), the window's figures
            cpu_drained, drained_in, drained_out = cpu, received, sent
            finished = reader.count(
                "status = 'SUCCEEDED' AND finished_at >= ? AND finished_at < ?", (a_ms, b_ms)
            )
            if workload == "once":
                cpu_drained = meter.stop()
                drained_in, drained_out = await messages.stop()
                drained_out -= len(obs.seen) - observed0
                finished = reader.count(
                    "scheduled_for >= ? AND scheduled_for < ? AND finished_at IS NOT NULL",
                    (a_ms, b_ms),
                )
            runs = reader.runs("scheduled_for >= ? AND scheduled_for < ?", (a_ms, b_ms))
            skipped = reader.skipped_occurrences(
                "scheduled_for >= ? AND scheduled_for < ?", (a_ms, b_ms)
            )
            succeeded_in_window = reader.count(
                "status = 'SUCCEEDED' AND finished_at >= ? AND finished_at < ?", (a_ms, b_ms)
            )
        finally:
            reader.close()
    arrivals = obs.arrivals_ms()
    await prof.wait()
    pad = [float("inf")] * max(0, expected - len(runs))
    pub = Summary.of(delays(runs, "scheduled_for", "published_at") + pad)
    in_stream = Summary.of(
        [
            (arrivals[r.id] - r.scheduled_for) / 1000.0 if r.id in arrivals else float("inf")
            for r in runs
        ]
        + pad
    )
    start = Summary.of(delays(runs, "scheduled_for", "started_at") + pad)
    fin = Summary.of(delays(runs, "scheduled_for", "finished_at") + pad)
    measured = _metered_in_time(late, duration_seconds)
    per_run = succeeded_in_window if measured else 0
    per_finished = finished if measured else 0
    cpu_per_k = {n: (1000 * c / per_run if per_run else float("nan")) for n, c in cpu.items()}
    return {
        "expected_runs": expected,
        "due_per_s_min": min(due_per_second),
        "due_per_s_max": max(due_per_second),
        "dispatched_runs": len(runs),
        "started_runs": sum(1 for r in runs if r.started_at is not None),
        "succeeded_runs": sum(1 for r in runs if r.status == "SUCCEEDED"),
        "skipped_runs": skipped,
        "succeeded_in_window": succeeded_in_window,
        "throughput_per_second": succeeded_in_window / duration_seconds,
        "sched_to_publish": pub.as_dict(),
        "sched_to_stream": in_stream.as_dict(),
        "sched_to_start": start.as_dict(),
        "sched_to_finish": fin.as_dict(),
        "cpu_seconds": cpu,
        "cpu_s_per_1000_runs": cpu_per_k,
        "cpu_util": {n: c / wall for n, c in cpu.items()},
        "nats_msgs_in": received,
        "nats_msgs_out": sent,
        "window_late_seconds": late,
        "nats_msgs_per_run_window": (received + sent) / (per_run or float("nan")),
        "finished_runs": finished,
        "cpu_ms_per_run_drained": {
            n: 1000 * c / per_finished if per_finished else float("nan")
            for n, c in cpu_drained.items()
        },
        "nats_msgs_per_run": (drained_in + drained_out) / (per_finished or float("nan")),
        "nats_msgs_in_per_run": drained_in / (per_finished or float("nan")),
        "nats_msgs_out_per_run": drained_out / (per_finished or float("nan")),
        "_pub": pub,
        "_stream": in_stream,
        "_start": start,
    }


async def run_one(
    layout: Layout,
    workload: str,
    rate: float,
    args: argparse.Namespace,
    *,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    seeded = workload == "interval" and args.interval_seed == "store"
    first_at = math.ceil(time.time() + args.startup)
    seed = None
    if seeded:
        jobs = interval_jobs(int(rate * args.period), args.period, first_at, PARTITIONS)

        def seed(d: Deployment) -> None:
            seed_jobs(d.store_path, jobs)

    label = f"{layout.label}-{workload}-{int(rate)}".replace(" ", "_").replace("/", "_")
    print(
        f"== {layout.label} / {workload} / {rate:g} runs/s for {args.duration:g} s", file=sys.stderr
    )
    env = {**settings_overrides(args), **(env or {})}
    async with Deployment(
        layout, keep=args.keep, name="sustained", env=env, seed=seed, nats_monitor=True
    ) as d:
        if seeded:
            sub = {
                "t0": first_at + args.period,
                "jobs": int(rate * args.period),
                "submitted": int(rate * args.period),
                "submit_rate_per_second": float("nan"),
                "seeded_in_store": True,
            }
            if time.time() > first_at:
                print(
                    "  WARNING: start-up ran past the first runs; raise --startup", file=sys.stderr
                )
        else:
            sub = await submit_workload(d, workload, rate, args.duration, args)
        how = "inserted into the store" if seeded else f"at {sub['submit_rate_per_second']:.0f}/s"
        print(
            f"  submitted {sub['submitted']:,} jobs {how}; "
            f"window starts in {sub['t0'] - time.time():.1f} s",
            file=sys.stderr,
        )
        res = await measure_window(d, workload, rate, args.duration, sub["t0"], args, label)
    st = res["_start"]
    if workload == "interval":
        print(
            f"  due per second in the window: {res['due_per_s_min']:,}-{res['due_per_s_max']:,}",
            file=sys.stderr,
        )
    print(
        f"  -> done {res['throughput_per_second']:,.0f}/s, started {res['started_runs']:,}/"
        f"{res['expected_runs']:,}, start p50 {fmt_seconds(st.p50)} p99 {fmt_seconds(st.p99)} "
        f"max {fmt_seconds(st.max)}, NATS msgs/run {_msgs_per_run(res)}, CPU s/1k runs "
        + _per_process(res["cpu_s_per_1000_runs"]),
        file=sys.stderr,
    )
    return {
        "layout": layout.label,
        "workload": workload,
        "rate": rate,
        "duration_seconds": args.duration,
        "submission": sub,
        **res,
    }


def print_table(results: list[dict[str, Any]], raw: dict[str, float] | None = None) -> None:
    rows = []
    for r in results:
        pub, ins, st = r["_pub"], r["_stream"], r["_start"]
        applies = r["rate"] >= TARGET_RATE
        v = "-"
        if applies:
            ok = (
                verdict(r["throughput_per_second"], 0.99 * r["rate"], higher_is_better=True)
                == "PASS"
                and verdict(st.p99, TARGET_P99_SECONDS) == "PASS"
                and verdict(st.max, TARGET_MAX_SECONDS) == "PASS"
            )
            v = "PASS" if ok else "MISS"
        cpu = _per_process(r["cpu_s_per_1000_runs"])
        row = [
            r["layout"],
            r["workload"],
            fmt_num(r["rate"]),
            fmt_num(r["throughput_per_second"]),
            f"{r['started_runs']:,}/{r['expected_runs']:,}",
            f"{r.get('skipped_runs', 0):,}",
            fmt_seconds(pub.p50),
            fmt_seconds(pub.p99),
            fmt_seconds(pub.max),
            fmt_seconds(ins.p99),
            fmt_seconds(ins.max),
            fmt_seconds(st.p50),
            fmt_seconds(st.p99),
            fmt_seconds(st.max),
            v,
            _msgs_per_run(r),
            cpu,
            _per_process(r["cpu_ms_per_run_drained"]),
        ]
        if raw:
            row.insert(4, f"{100 * r['throughput_per_second'] / raw['pipeline_per_second']:.1f} %")
        rows.append(row)
    headers = [
        "layout",
        "workload",
        "due/s",
        "done/s",
        "started/due",
        "skipped",
        "pub p50",
        "pub p99",
        "pub max",
        "stream p99",
        "stream max",
        "start p50",
        "start p99",
        "start max",
        "target",
        "NATS msgs/run (in+out)",
        "CPU s per 1k runs",
        "CPU ms/run (window+drain)",
    ]
    if raw:
        headers.insert(4, "of raw NATS")
    print(table(headers, rows))
    print(
        f"target (rows with due/s >= {TARGET_RATE:g}): done/s >= 99 % of due/s, "
        f"schedule-to-start p99 <= {TARGET_P99_SECONDS * 1000:.0f} ms "
        f"and max <= {TARGET_MAX_SECONDS:g} s. "
        "pub = scheduledFor -> publishedAt (store; taken when the scheduler "
        "begins the batch), stream = scheduledFor -> run message seen on NATS, start = "
        "scheduledFor -> startedAt. skipped = occurrences due in the window recorded SKIPPED "
        "(an interval job a period or more behind: its earlier occurrences, by the overlap "
        "policy; one record may stand for several). NATS msgs/run = messages nats-server "
        "received (in) and sent (out) from the window's start until its runs finished (its "
        "/varz; the run messages forwarded to this benchmark's observer excluded), per run due "
        "in the window that finished; CPU ms/run (window+drain) likewise (the figure to compare "
        "on a loaded machine, where a window's runs finish after it). For the interval "
        "workload, whose jobs keep running after the window, both are the window's, per run "
        "done in it."
    )
    if raw and raw.get("pipeline_msgs_per_message"):
        print(
            f"raw NATS baseline: {raw['pipeline_msgs_per_message']:.1f} NATS messages per "
            "message published, consumed and acked (publish, PubAck, delivery, ack, pull "
            "requests)."
        )


def _metered_in_time(late_seconds: float, duration_seconds: float) -> bool:
    """Whether the meters started within ``LATE_SHARE`` of the window after it began. Where a
    submission overran the window they start later and miss the work of its start, so the
    row's per-run CPU and NATS figures would read low: it gets none (a warning says why)."""
    if late_seconds <= LATE_SHARE * duration_seconds:
        return True
    print(
        f"  WARNING: the window began {late_seconds:.1f} s before its meters started: no CPU "
        "or NATS figures for this row",
        file=sys.stderr,
    )
    return False


def _per_process(figures: dict[str, float]) -> str:
    """``name figure`` per process, or ``-`` where none was measured (NaN)."""
    if all(math.isnan(c) for c in figures.values()):
        return "-"
    return ", ".join(f"{n} {c:.2f}" for n, c in figures.items())


def _msgs_per_run(r: dict[str, Any]) -> str:
    if "nats_msgs_per_run" not in r or math.isnan(r["nats_msgs_per_run"]):
        return "-"
    return (
        f"{r['nats_msgs_per_run']:.1f} "
        f"({r['nats_msgs_in_per_run']:.1f}+{r['nats_msgs_out_per_run']:.1f})"
    )


def parse_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--duration",
        type=float,
        default=15.0,
        help="window length, s (15; the issue's 60 s takes ~6 min for the 4 default rows)",
    )
    p.add_argument("--period", type=float, default=5.0, help="interval workload period k, s (5)")
    p.add_argument(
        "--interval-seed",
        choices=["store", "api"],
        default="store",
        help="interval jobs inserted into the store before start-up (store: exact phases; "
        "default) or POSTed through the API, paced (api; their first runs compete with the "
        "submission)",
    )
    p.add_argument(
        "--startup",
        type=float,
        default=10.0,
        help="with --interval-seed store: seconds from seeding to the first runs (10)",
    )
    p.add_argument("--concurrency", type=int, default=50, help="concurrent POSTs when submitting")
    p.add_argument(
        "--drain",
        type=float,
        default=30.0,
        help="max wait after the window for runs due in it to finish, s (30)",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="also measure raw NATS (bench.baseline) and print throughput as a share of it",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="JOBSCHED_NAME=VALUE",
        help="a setting for every jobsched process (repeatable), to compare tunings, e.g. "
        "--set JOBSCHED_LOOKAHEAD_SECONDS=10",
    )
    add_common_args(p)


def settings_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The ``--set`` options as environment variables, checked as the processes will read them.

    Raises:
        SystemExit: an option is not ``JOBSCHED_NAME=VALUE``, names no setting, or its value is
            invalid (the message is ``core.settings.load_settings``'s).
    """
    out = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("JOBSCHED_"):
            raise SystemExit(f"--set {item!r}: expected JOBSCHED_NAME=VALUE")
        if name not in Settings.env_names():
            raise SystemExit(f"--set {item!r}: {name} is not a setting (see README 'Settings')")
        out[name] = value
    try:
        load_settings(out)
    except ConfigError as e:
        raise SystemExit(f"--set: {e}") from None
    return out


async def raw_baseline() -> dict[str, Any]:
    from bench.baseline import measure_raw_nats  # noqa: PLC0415

    raw = await measure_raw_nats()
    print(f"raw NATS: {raw['pipeline_per_second']:,.0f} msg/s publish+consume+ack", file=sys.stderr)
    return raw


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings_overrides(args)  # a bad --set fails here, before anything starts
    raw = await raw_baseline() if args.baseline else None
    results = []
    for layout_name in args.layout.split(","):
        for workload in args.workload.split(","):
            for rate in [float(x) for x in args.rate.split(",")]:
                results.append(await run_one(Layout.parse(layout_name), workload, rate, args))
    print(f"\nsustained — {args.duration:g} s window per row, noop task, SQLite store")
    print_table(results, raw)
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    return {"args": vars(args), "raw_nats": raw, "results": clean}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rate", default="2000", help="comma-separated due runs per second (2000)")
    p.add_argument("--workload", default="once,interval", help="once,interval")
    p.add_argument("--layout", default="one,split", help="one,split")
    parse_common(p)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('sustained', result, args.json)}")


if __name__ == "__main__":
    main()
