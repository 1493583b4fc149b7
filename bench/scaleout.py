"""Scale-out: the sustained benchmark on separate OS processes with 1 and 2 schedulers and 1 and
2 workers (one gateway), to show how throughput grows with processes.

Schedulers split the partitions between them through partition leases (JetStream KV, since
commit 0b061c0); before leases every scheduler owned every partition and two of them duplicated
the work. The script only starts processes, so it measures whichever the code does. Every
scheduler process also runs a status recorder (they share one durable consumer).

    .venv/bin/python -m bench.scaleout [--rate 3000] [--duration 15] [--workload interval]
    .venv/bin/python -m bench.scaleout --shapes 1x1,1x2,2x1,2x2 --rate 2000,4000
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.common import Layout, save_results
from bench.sustained import parse_common, print_table, raw_baseline, run_one, settings_overrides


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings_overrides(args)  # a bad --set fails here, before anything starts
    raw = await raw_baseline() if args.baseline else None
    results = []
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
    )
    print_table(results, raw)
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    return {"args": vars(args), "raw_nats": raw, "results": clean}


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
    parse_common(p)
    p.set_defaults(duration=15.0)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('scaleout', result, args.json)}")


if __name__ == "__main__":
    main()
