"""HTTP load generator for bench.api, run as its own process (so it does not share the gateway's
CPU accounting or event loop): ``--concurrency`` clients each send one request after another for
``--duration`` seconds (after ``--warmup`` seconds not counted) and it prints one JSON object.

    python -m bench.api_load --url URL --token TOKEN --mode post|list|get [--concurrency 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

import aiohttp
import msgspec

from bench.common import JobId, Summary, once_body


async def _one(
    s: aiohttp.ClientSession,
    args: argparse.Namespace,
    ids: list[str],
    i: int,
    body: bytes,
    decoder: msgspec.json.Decoder[JobId],
) -> tuple[bool, str]:
    """One request of the mode; (succeeded, error key or "")."""
    try:
        if args.mode == "post":
            req, want = s.post(args.url + "/jobs", data=body), 201
        elif args.mode == "list":
            req, want = s.get(args.url + "/jobs?limit=50"), 200
        else:
            req, want = s.get(f"{args.url}/jobs/{ids[i % len(ids)]}"), 200
        async with req as r:
            data = await r.read()
            if r.status != want:
                return False, f"HTTP {r.status}"
            if args.mode == "post":
                decoder.decode(data)
            return True, ""
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        return False, type(e).__name__


async def run(args: argparse.Namespace) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"}
    far = datetime.now(UTC) + timedelta(days=365)
    body = once_body(far)
    ids: list[str] = []
    lat: list[float] = []
    errors: dict[str, int] = {}
    counting = False
    stop = False
    decoder = msgspec.json.Decoder(JobId)
    conn = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(
        connector=conn, headers=headers, timeout=aiohttp.ClientTimeout(total=30)
    ) as s:
        if args.mode == "get":
            async with s.get(args.url + "/jobs?limit=200") as r:
                page = await r.json()
            ids = [j["id"] for j in page["items"]] or ["missing"]

        async def client(k: int) -> None:
            i = k
            while not stop:
                t0 = time.perf_counter()
                ok, err = await _one(s, args, ids, i, body, decoder)
                if err:
                    errors[err] = errors.get(err, 0) + 1
                if counting and ok:
                    lat.append(time.perf_counter() - t0)
                i += args.concurrency

        tasks = [asyncio.create_task(client(k)) for k in range(args.concurrency)]
        await asyncio.sleep(args.warmup)
        counting = True
        t0 = time.perf_counter()
        await asyncio.sleep(args.duration)
        counting = False
        elapsed = time.perf_counter() - t0
        stop = True
        await asyncio.gather(*tasks)
    return {
        "mode": args.mode,
        "concurrency": args.concurrency,
        "duration_seconds": elapsed,
        "requests": len(lat),
        "rate_per_second": len(lat) / elapsed,
        "latency": Summary.of(lat).as_dict(),
        "errors": errors,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--mode", choices=["post", "list", "get"], default="post")
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
