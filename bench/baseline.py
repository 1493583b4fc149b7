"""Raw JetStream rates with nats-py on this machine: the ceiling the other figures compare to.

A private nats-server (same binary, free port, temp storage) and a WorkQueue stream with file
storage, like jobsched's work stream. Messages are ``--size`` bytes (400, about a run message)
with a ``Nats-Msg-Id`` header each (de-duplication on, as jobsched publishes). Three phases:

* publish — ``publish_async`` pipelined (at most ``--pending`` un-acked), until every PubAck;
* consume — a durable pull consumer, ``fetch(--batch)``, explicit ``ack`` of each message;
* pipeline — publishing and consuming at the same time on two connections of one process
  (the shape of one jobsched process: messages published, pulled, acked);
* one at a time — ``--serial`` publishes, each awaiting its PubAck (the latency of one write,
  where an fsync policy shows most).

Each fsync policy named by ``--sync-interval`` (default ``always,2m``: jobsched's embedded policy
and nats-server's own default) gets a server of its own and all four phases, so the cost of the
fsync is printed side by side.

Other benchmarks call :func:`measure_raw_nats` with ``--baseline`` to print "x % of raw NATS".

    .venv/bin/python -m bench.baseline [--messages 50000] [--size 400] [--sync-interval always,2m]
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

from bench.common import MessageMeter, add_common_args, save_results, table
from jobsched.natsserver import SYNC_INTERVAL, NatsServer, find_nats_server


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


async def _serial(js: Any, subject: str, n: int, payload: bytes) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        await js.publish(subject, payload, headers={"Nats-Msg-Id": f"s-{i}"})
    return time.perf_counter() - t0


async def measure_raw_nats(
    messages: int = 50_000,
    size: int = 400,
    pending: int = 4_000,
    batch: int = 256,
    *,
    sync_interval: str = SYNC_INTERVAL,
    serial: int = 2_000,
) -> dict[str, Any]:
    """Publish, consume+ack, and concurrent pipeline rates (messages/s) on a private server
    whose JetStream fsync policy is ``sync_interval``; with ``serial`` > 0 also the rate of
    one-at-a-time publishes."""
    root = Path(tempfile.mkdtemp(prefix="jobsched-baseline-"))
    server = NatsServer(
        find_nats_server(os.environ),
        root / "nats",
        log_file=root / "nats.log",
        sync_interval=sync_interval,
        monitor=True,
    )
    url = server.start()
    messages_meter = MessageMeter(server.monitor_url)
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
        pub_seconds = await _publish(pjs, "raw.a", messages, payload, pending, "a")
        con_seconds = await _consume(sjs, "raw.a", "ca", messages, batch)
        consumer = asyncio.create_task(_consume(sjs, "raw.b", "cb", messages, batch))
        await asyncio.sleep(0.2)
        await messages_meter.start()
        t0 = time.perf_counter()
        await _publish(pjs, "raw.b", messages, payload, pending, "b")
        await consumer
        pipe_seconds = time.perf_counter() - t0
        pipe_in, pipe_out = await messages_meter.stop()
        serial_seconds = await _serial(pjs, "raw.c", serial, payload) if serial else 0.0
        await pub_nc.close()
        await sub_nc.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "messages": messages,
        "size": size,
        "sync_interval": sync_interval,
        "publish_per_second": messages / pub_seconds,
        "consume_ack_per_second": messages / con_seconds,
        "pipeline_per_second": messages / pipe_seconds,
        "pipeline_msgs_per_message": (pipe_in + pipe_out) / messages,
        "serial_per_second": serial / serial_seconds if serial else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--size", type=int, default=400)
    p.add_argument("--pending", type=int, default=4_000, help="max un-acked async publishes")
    p.add_argument("--batch", type=int, default=256, help="pull fetch batch")
    p.add_argument("--serial", type=int, default=2_000, help="one-at-a-time publishes (0: none)")
    p.add_argument(
        "--sync-interval",
        default=f"{SYNC_INTERVAL},2m",
        help="comma-separated fsync policies to compare (nats-server's jetstream.sync_interval)",
    )
    add_common_args(p)
    args = p.parse_args()
    runs = [
        asyncio.run(
            measure_raw_nats(
                args.messages,
                args.size,
                args.pending,
                args.batch,
                sync_interval=policy,
                serial=args.serial,
            )
        )
        for policy in args.sync_interval.split(",")
    ]
    print(
        f"\nraw JetStream (nats-py), {args.messages:,} messages of {args.size} B, "
        "WorkQueue stream, file storage, Nats-Msg-Id on every message; messages/s by "
        "sync_interval"
    )
    rows = [
        ("publish_async pipelined, all PubAcks", "publish_per_second"),
        ("pull fetch + explicit ack", "consume_ack_per_second"),
        ("publish and consume+ack at once (one process)", "pipeline_per_second"),
        (f"publish one at a time, {args.serial:,} (each awaits its PubAck)", "serial_per_second"),
    ]
    print(
        table(
            ["phase", *(r["sync_interval"] for r in runs)],
            [[label, *(f"{r[key] or 0:,.0f}" for r in runs)] for label, key in rows],
        )
    )
    print(
        "NATS messages per message in the pipeline phase (nats-server /varz in_msgs + out_msgs: "
        "publish, PubAck, delivery, ack, pull requests): "
        + ", ".join(f"{r['sync_interval']} {r['pipeline_msgs_per_message']:.2f}" for r in runs)
    )
    if not args.no_save:
        saved = save_results("baseline", {"args": vars(args), "runs": runs}, args.json)
        print(f"results: {saved}")


if __name__ == "__main__":
    main()
