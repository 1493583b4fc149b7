"""Scale-out: the sustained benchmark on separate OS processes with 1 and 2 schedulers and 1 and
2 workers (one gateway), to show how throughput grows with processes.

Schedulers split the partitions between them through partition leases (JetStream KV, since
commit 0b061c0); before leases every scheduler owned every partition and two of them duplicated
the work. The script only starts processes, so it measures whichever the code does. Every
scheduler process also runs a status recorder (they share one durable consumer).

First a cost row: one scheduler and one worker at ``--cost-rate`` (2,000) once runs/s, POSTed
through the gateway, whose CPU ms per run of each process (and the gateway's per POST) give the
capacity plan printed after the measured rows (:mod:`bench.capacity`): processes and cores per
role for ``--plan-rates`` (1,000 / 10,000 / 50,000 runs/s). ``--cost-rate 0`` plans from the
1x1 shape row instead.

    .venv/bin/python -m bench.scaleout [--rate 3000] [--duration 15] [--workload interval]
    .venv/bin/python -m bench.scaleout --shapes 1x1,1x2,2x1,2x2 --rate 2000,4000
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench import capacity
from bench.common import Layout, save_results
from bench.sustained import parse_common, print_table, raw_baseline, run_one, settings_overrides


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings_overrides(args)  # a bad --set fails here, before anything starts
    raw = await raw_baseline() if args.baseline else None
    results = []
    cost_row = None
    if args.cost_rate:
        cost_row = await run_one(Layout(kind="split"), "once", args.cost_rate, args)
        cost_row["layout"] = "1 sched / 1 work"
        results.append(cost_row)
    for shape in args.shapes.split(","):
        s, w = (int(x) for x in shape.lower().split("x"))
        for rate in [float(x) for x in args.rate.split(",")]:
            layout = Layout(kind="split", schedulers=s, workers=w)
            r = await run_one(layout, args.workload, rate, args)
            r["layout"] = f"{s} sched / {w} work"
            results.append(r)
    print(
        f"\nscaleout — {args.workload} workload, {args.duration:g} s window, separate processes "
        "(1 gateway); schedulers split the partitions by lease"
        + (
            f"; the first row is the cost row (once, {args.cost_rate:g}/s POSTed)"
            if cost_row is not None
            else ""
        )
    )
    print_table(results, raw)
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    cost_clean = clean[0] if cost_row is not None else None
    try:
        source, kept = (
            (cost_clean, capacity.kept_up(cost_clean))
            if cost_clean and capacity.measured(cost_clean)
            else capacity.choose_row(clean)
        )
    except ValueError:
        source, kept = clean[0], False
    plan = capacity.print_plan(
        capacity.cost_from_result(source, capacity.describe(source, kept, "")),
        [float(x) for x in args.plan_rates.split(",")],
    )
    return {
        "args": vars(args),
        "raw_nats": raw,
        "results": clean,
        "cost_row": cost_clean,
        "capacity": plan,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shapes", default="1x1,1x2,2x1,2x2", help="SCHEDULERSxWORKERS list")
    p.add_argument(
        "--rate",
        default="3000",
        help="due runs per second (3000: above what one process sustains, so growth shows)",
    )
    p.add_argument("--workload", default="interval", choices=["once", "interval"])
    p.add_argument(
        "--cost-rate",
        type=float,
        default=2000.0,
        help="once runs/s of the cost row the capacity plan uses (2000; 0: none, plan from the "
        "1x1 row)",
    )
    p.add_argument(
        "--plan-rates", default="1000,10000,50000", help="runs/s the capacity plan is for"
    )
    parse_common(p)
    p.set_defaults(duration=15.0)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('scaleout', result, args.json)}")


if __name__ == "__main__":
    main()
