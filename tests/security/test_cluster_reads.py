"""The gateway's read of the lease and presence buckets for ``GET /cluster`` (real nats-server,
real users): it lists the leases with their expiry, the live workers and the queues' counts —
and can write nothing of it; a worker writes its presence and no other bucket's key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import nats.errors
import pytest

from bus.cluster import ClusterReader
from bus.leases import LeaseBucket
from bus.presence import PresenceBucket
from core.cluster import PRESENCE_TTL_SECONDS, WorkerHeartbeat
from jobsched.natsserver import NatsServer
from tests.security.test_bus_security import PREFIX, attacker, refused, role_bus, secured

__all__ = ["secured"]  # the fixture


async def test_the_gateway_reads_the_leases_and_queues_and_writes_none(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    server, files = secured
    scheduler = role_bus(server.url, files["scheduler"], "jobsched-scheduler")
    gateway = role_bus(server.url, files["gateway"], "jobsched-gateway")
    worker = role_bus(server.url, files["worker"], "jobsched-worker")
    await scheduler.connect()
    await gateway.connect()
    await worker.connect()
    try:
        await scheduler.ensure_streams()
        leases = LeaseBucket(scheduler, ttl_seconds=30)
        await leases.open()
        before = datetime.now(UTC) - timedelta(seconds=1)
        assert await leases.acquire(3, "s1") is not None
        assert await leases.acquire(5, "s1") is not None
        await leases.heartbeat("s1")
        await worker.ensure_work_consumer("default")
        reader = ClusterReader(
            gateway, lease_ttl_seconds=30, partitions=8, queues=["default", "bulk"]
        )

        view = await reader.bus_view()
        assert [(lease.partition, lease.owner) for lease in view.leases] == [(3, "s1"), (5, "s1")]
        lease = view.leases[0]
        assert lease.renewed_at is not None and lease.expires_at is not None
        assert before <= lease.renewed_at and lease.expires_at - lease.renewed_at == timedelta(
            seconds=30
        )
        assert [(m.scheduler, m.partitions) for m in view.members] == [("s1", [3, 5])]
        assert [(q.queue, q.exists, q.pending) for q in view.queues] == [
            ("default", True, 0), ("bulk", False, 0)
        ]  # fmt: skip

        await leases.release(3, lease.revision)
        assert [x.partition for x in (await reader.bus_view()).leases] == [5]

        async with attacker(server.url, files["gateway"]) as (nc, errors):
            await nc.publish(f"$KV.{PREFIX}_leases.p.0", b'{"owner": "gateway"}')
            await refused(errors, f'Publish to "$KV.{PREFIX}_leases.p.0"')
            js = nc.jetstream(timeout=1)
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.delete_stream(f"KV_{PREFIX}_leases")
            await refused(errors, f"$JS.API.STREAM.DELETE.KV_{PREFIX}_leases")
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.purge_stream(f"KV_{PREFIX}_leases")
            await refused(errors, f"$JS.API.STREAM.PURGE.KV_{PREFIX}_leases")
        assert (await leases.snapshot()).taken == frozenset({5})
    finally:
        await worker.close()
        await gateway.close()
        await scheduler.close()


async def test_a_worker_writes_only_its_presence_and_the_gateway_only_reads_it(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    server, files = secured
    scheduler = role_bus(server.url, files["scheduler"], "jobsched-scheduler")
    gateway = role_bus(server.url, files["gateway"], "jobsched-gateway")
    worker = role_bus(server.url, files["worker"], "jobsched-worker")
    await scheduler.connect()
    await gateway.connect()
    await worker.connect()
    try:
        await PresenceBucket(scheduler).create()
        board = PresenceBucket(worker)
        started = datetime.now(UTC).replace(microsecond=0)
        beat = WorkerHeartbeat(worker_id="host-1", queues=["default"], concurrency=8,
                               in_flight=2, started_at=started, version="0.1.0")  # fmt: skip
        await board.announce(beat)
        await board.announce(msgspec.structs.replace(beat, worker_id="odd id/ü", in_flight=0))
        reader = ClusterReader(gateway, lease_ttl_seconds=30, partitions=8, queues=[])

        view = await reader.bus_view()
        assert [p.heartbeat for p in view.workers] == [
            beat, msgspec.structs.replace(beat, worker_id="odd id/ü", in_flight=0)
        ]  # fmt: skip
        first = view.workers[0]
        assert first.heartbeat_at is not None and first.expires_at is not None
        assert first.expires_at - first.heartbeat_at == timedelta(seconds=PRESENCE_TTL_SECONDS)

        await board.withdraw("host-1")
        await board.withdraw("host-1")  # idempotent
        assert [p.heartbeat.worker_id for p in (await reader.bus_view()).workers] == ["odd id/ü"]

        presence = f"{PREFIX}_workers"
        async with attacker(server.url, files["worker"]) as (nc, errors):
            for subject in (f"$KV.{PREFIX}_leases.p.0", f"$KV.{PREFIX}_cancel.job-1"):
                await nc.publish(subject, b'{"owner": "worker"}')
                await refused(errors, f'Publish to "{subject}"')
            js = nc.jetstream(timeout=1)
            for verb, call in (("PURGE", js.purge_stream), ("DELETE", js.delete_stream)):
                with pytest.raises((nats.errors.Error, TimeoutError)):
                    await call(f"KV_{presence}")
                await refused(errors, f"$JS.API.STREAM.{verb}.KV_{presence}")
        async with attacker(server.url, files["gateway"]) as (nc, errors):
            await nc.publish(f"$KV.{presence}.w.forged", b"{}")
            await refused(errors, f'Publish to "$KV.{presence}.w.forged"')
        assert [p.heartbeat.worker_id for p in (await reader.bus_view()).workers] == ["odd id/ü"]
    finally:
        await worker.close()
        await gateway.close()
        await scheduler.close()
