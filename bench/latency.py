"""End-to-end latency of single runs on an idle full stack.

1. ``--jobs`` (100) immediate ``noop`` jobs, one after another: from sending POST /jobs until the
   stored execution's ``finishedAt`` (the worker's clock), and until GET /jobs/{id} shows
   SUCCEEDED (polled every ``--poll-ms``, 5 ms); plus the POST round trip itself.
2. ``--once-jobs`` (100) ``once`` jobs with ``executeAt`` spread evenly 2-12 s ahead
   (``--once-spread``, 10 s): delay from ``executeAt`` (= ``scheduledFor``) to ``publishedAt`` and
   to ``startedAt``.

Layout ``one`` (default): every role in one child process, like ``jobsched dev``; ``inproc`` runs
them in this process's event loop (the polling client then shares it); ``split`` one per role.

    .venv/bin/python -m bench.latency [--layout one|inproc|split] [--jobs 100] [--once-jobs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import msgspec

from bench.common import (
    Deployment,
    JobId,
    JobStatusOnly,
    Layout,
    StoreReader,
    Summary,
    add_common_args,
    delays,
    fmt_seconds,
    once_body,
    post_jobs,
    save_results,
    table,
)

IMMEDIATE = b'{"taskId":"noop"}'


async def sequential_immediate(d: Deployment, n: int, poll_seconds: float) -> dict[str, Any]:
    id_dec = msgspec.json.Decoder(JobId)
    st_dec = msgspec.json.Decoder(JobStatusOnly)
    sent_wall: dict[str, float] = {}
    post_rt: list[float] = []
    until_api: list[float] = []
    async with aiohttp.ClientSession(headers=d.headers) as s:
        for _ in range(n):
            w0 = time.time()
            t0 = time.perf_counter()
            async with s.post(d.url + "/jobs", data=IMMEDIATE) as r:
                body = await r.read()
                if r.status != 201:
                    raise RuntimeError(f"POST answered {r.status}: {body[:200]!r}")
            post_rt.append(time.perf_counter() - t0)
            job_id = id_dec.decode(body).id
            sent_wall[job_id] = w0
            deadline = t0 + 30
            while True:
                async with s.get(f"{d.url}/jobs/{job_id}") as r:
                    status = st_dec.decode(await r.read()).status
                if status == "SUCCEEDED":
                    until_api.append(time.perf_counter() - t0)
                    break
                if status == "FAILED" or time.perf_counter() > deadline:
                    raise RuntimeError(f"job {job_id} is {status}")
                await asyncio.sleep(poll_seconds)
    reader = StoreReader(d.store_path)
    try:
        runs = reader.runs_of(list(sent_wall))
    finally:
        reader.close()

    def since_post(field: str) -> list[float]:
        out = []
        for job_id, w0 in sent_wall.items():
            v = getattr(runs[job_id], field) if job_id in runs else None
            out.append(float("inf") if v is None else v / 1000.0 - w0)
        return out

    return {
        "post_round_trip": Summary.of(post_rt),
        "post_to_published": Summary.of(since_post("published_at")),
        "post_to_started": Summary.of(since_post("started_at")),
        "post_to_finished": Summary.of(since_post("finished_at")),
        "post_to_api_succeeded": Summary.of(until_api),
    }


async def once_jobs(d: Deployment, n: int, span_seconds: float) -> dict[str, Any]:
    now = datetime.now(UTC)
    ats = [now + timedelta(seconds=2 + (span_seconds * i / max(1, n - 1))) for i in range(n)]
    res = await post_jobs(d.url, d.token, [once_body(a) for a in ats], concurrency=20)
    if res.errors:
        raise RuntimeError(f"{len(res.errors)} POST errors, e.g. {res.errors[0]}")
    ids = [i for i in res.ids if i is not None]
    last = ats[-1].timestamp()
    await asyncio.sleep(max(0.0, last - time.time() + 0.5))
    reader = StoreReader(d.store_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            runs = reader.runs_of(ids)
            if sum(1 for r in runs.values() if r.finished_at) >= len(ids):
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        reader.close()
    missing = len(ids) - len(runs)
    all_runs = list(runs.values())
    pad = [float("inf")] * missing
    return {
        "execute_at_to_published": Summary.of(
            delays(all_runs, "scheduled_for", "published_at") + pad
        ),
        "execute_at_to_started": Summary.of(delays(all_runs, "scheduled_for", "started_at") + pad),
        "execute_at_to_finished": Summary.of(
            delays(all_runs, "scheduled_for", "finished_at") + pad
        ),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.parse(args.layout)
    async with Deployment(layout, keep=args.keep, name="latency") as d:
        seq = await sequential_immediate(d, args.jobs, args.poll_ms / 1000.0)
        once = await once_jobs(d, args.once_jobs, args.once_spread)
    rows = []
    labels = {
        "post_round_trip": "POST /jobs round trip",
        "post_to_published": "POST sent -> publishedAt (store)",
        "post_to_started": "POST sent -> startedAt (store)",
        "post_to_finished": "POST sent -> finishedAt (store)",
        "post_to_api_succeeded": f"POST sent -> API shows SUCCEEDED (poll {args.poll_ms:g} ms)",
        "execute_at_to_published": "once: executeAt -> publishedAt",
        "execute_at_to_started": "once: executeAt -> startedAt",
        "execute_at_to_finished": "once: executeAt -> finishedAt",
    }
    for key, s in [*seq.items(), *once.items()]:
        rows.append([labels[key], s.n, fmt_seconds(s.p50), fmt_seconds(s.p90), fmt_seconds(s.max)])
    print(
        f"\nlatency — layout {layout.label}; {args.jobs} sequential immediate noop jobs, "
        f"{args.once_jobs} once jobs due 2-{2 + args.once_spread:g} s ahead"
    )
    print(table(["figure", "n", "median", "p90", "max"], rows))
    return {
        "layout": layout.label,
        "sequential_immediate": {k: v.as_dict() for k, v in seq.items()},
        "once": {k: v.as_dict() for k, v in once.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layout", default="one", choices=["one", "inproc", "split"])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--once-jobs", type=int, default=100)
    p.add_argument("--poll-ms", type=float, default=5.0)
    p.add_argument(
        "--once-spread", type=float, default=10.0, help="once jobs due over this many s, from 2 s"
    )
    add_common_args(p)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if not args.no_save:
        print(f"results: {save_results('latency', result, args.json)}")


if __name__ == "__main__":
    main()
