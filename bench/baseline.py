"""Raw JetStream rates with nats-py on this machine: the ceiling the other figures compare to.

A private nats-server (same binary, free port, temp storage) and a WorkQueue stream with file
storage, like jobsched's work stream. Messages are ``--size`` bytes (400, about a run message)
with a ``Nats-Msg-Id`` header each (de-duplication on, as jobsched publishes). Three phases:

* publish — ``publish_async`` pipelined (at most ``--pending`` un-acked), until every PubAck;
* consume — a durable pull consumer, ``fetch(--batch)``, explicit ``ack`` of each message;
* pipeline — publishing and consuming at the same time on two connections of one process
  (the shape of one jobsched process: messages published, pulled, acked).

Other benchmarks call :func:`measure_raw_nats` with ``--baseline`` to print "x % of raw NATS".

    .venv/bin/python -m bench.baseline [--messages 50000] [--size 400]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from bench.common import add_common_args, save_results, table
from jobsched.natsserver import NatsServer, find_nats_server


async def _publish(js: Any, subject: str, n: int, payload: bytes, pending: int, tag: str) -> float:
    t0 = time.perf_counter()
    futs: list[asyncio.Future[Any]] = []
    for i in range(n):
        futs.append(
            await js.publish_async(
                subject, payload, headers={"Nats-Msg-Id": f"{tag}-{i}"}, wait_stall=10.0
            )
        )
        if len(futs) >= pending:
            await asyncio.gather(*futs)
            futs.clear()
    await asyncio.gather(*futs)
    return time.perf_counter() - t0


async def _consume(js: Any, subject: str, durable: str, n: int, batch: int) -> float:
    psub = await js.pull_subscribe(
        subject,
        durable=durable,
        stream="RAW",
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=20_000),
    )
    got = 0
    t0 = time.perf_counter()
    while got < n:
        try:
            msgs = await psub.fetch(batch, timeout=2)
        except nats.errors.TimeoutError:
            continue
        for m in msgs:
            await m.ack()
        got += len(msgs)
    await js._nc.flush()
    return time.perf_counter() - t0


async def measure_raw_nats(
    messages: int = 50_000, size: int = 400, pending: int = 4_000, batch: int = 256
) -> dict[str, float]:
    """Publish, consume+ack, and concurrent pipeline rates (messages/s) on a private server."""
    root = Path(tempfile.mkdtemp(prefix="jobsched-baseline-"))
    server = NatsServer(find_nats_server(os.environ), root / "nats", log_file=root / "nats.log")
    url = server.start()
    payload = os.urandom(size // 2).hex().encode()[:size]
    try:
        pub_nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
        sub_nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
        pjs = pub_nc.jetstream(timeout=10)
        sjs = sub_nc.jetstream(timeout=10)
        await pjs.add_stream(
            StreamConfig(
                name="RAW",
                subjects=["raw.>"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=120.0,
            )
        )
        pub_s = await _publish(pjs, "raw.a", messages, payload, pending, "a")
        con_s = await _consume(sjs, "raw.a", "ca", messages, batch)
        consumer = asyncio.create_task(_consume(sjs, "raw.b", "cb", messages, batch))
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        await _publish(pjs, "raw.b", messages, payload, pending, "b")
        await consumer
        pipe_s = time.perf_counter() - t0
        await pub_nc.close()
        await sub_nc.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "messages": messages,
        "size": size,
        "publish_per_s": messages / pub_s,
        "consume_ack_per_s": messages / con_s,
        "pipeline_per_s": messages / pipe_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--size", type=int, default=400)
    p.add_argument("--pending", type=int, default=4_000, help="max un-acked async publishes")
    p.add_argument("--batch", type=int, default=256, help="pull fetch batch")
    add_common_args(p)
    args = p.parse_args()
    r = asyncio.run(measure_raw_nats(args.messages, args.size, args.pending, args.batch))
    print(
        f"\nraw JetStream (nats-py), {args.messages:,} messages of {args.size} B, "
        "WorkQueue stream, file storage, Nats-Msg-Id on every message"
    )
    print(
        table(
            ["phase", "messages/s"],
            [
                ["publish_async pipelined, all PubAcks", f"{r['publish_per_s']:,.0f}"],
                ["pull fetch + explicit ack", f"{r['consume_ack_per_s']:,.0f}"],
                ["publish and consume+ack at once (one process)", f"{r['pipeline_per_s']:,.0f}"],
            ],
        )
    )
    if not args.no_save:
        print(f"results: {save_results('baseline', {'args': vars(args), **r}, args.json)}")


if __name__ == "__main__":
    main()
