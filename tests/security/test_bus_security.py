"""The bus refuses what a role may not do (issue 12, "The bus"), on a real nats-server whose
users and permissions are :mod:`bus.auth`'s.

Each attack is refused by the server: a permission violation reaches the client (its error
callback), a connection without credentials is refused, and nothing the attacker tried took
effect (the scheduler still sees its streams and no forged run).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from bus.auth import generate_users, read_credentials
from bus.inspect import BusInspector
from bus.leases import LeaseBucket
from bus.nats import Bus, BusConfig
from bus.notifier import NotifierStream
from core.model import ExecutionStatus, RunMessage, StatusEvent
from jobsched.natsserver import NatsServer

PREFIX = "jobsched"  # the attack as issue 12 tried it: `subscribe jobsched.>` on a real prefix
QUEUES = ("default",)


@pytest.fixture
def secured(nats_binary: str, tmp_path: Path) -> Iterator[tuple[NatsServer, dict[str, Path]]]:
    files, block = generate_users(tmp_path / "creds", PREFIX, QUEUES)
    server = NatsServer(
        nats_binary, tmp_path / "nats", log_file=tmp_path / "nats.log", authorization=block
    )
    server.start()
    yield server, files
    server.stop()


def role_bus(url: str, creds_file: Path, name: str) -> Bus:
    return Bus(
        BusConfig(servers=[url], prefix=PREFIX, credentials=read_credentials(creds_file)), name=name
    )


@contextlib.asynccontextmanager
async def attacker(url: str, creds_file: Path) -> AsyncIterator[tuple[Client, list[str]]]:
    """A raw client with a role's credentials, and the errors the server sends it."""
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    creds = read_credentials(creds_file)
    nc = await nats.connect(
        url,
        user=creds.user,
        password=creds.password,
        inbox_prefix=creds.inbox_prefix,
        error_cb=on_error,
        max_reconnect_attempts=0,
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


async def refused(errors: list[str], what: str, timeout_seconds: float = 5.0) -> None:
    """Wait until the server reported a permission violation for ``what``."""
    wanted = what.lower()
    async with asyncio.timeout(timeout_seconds):
        while not any("permissions violation" in e.lower() and wanted in e.lower() for e in errors):
            await asyncio.sleep(0.02)


def forged_run() -> RunMessage:
    now = datetime.now(UTC)
    return RunMessage(
        execution_id="forged-1",
        job_id="job-forged",
        owner="billing",
        partition=0,
        task_id="generate_report",
        queue="default",
        parameters={"report": "billing-FORGED"},
        scheduled_for=now,
        published_at=now,
        max_attempts=1,
    )


async def test_scheduler_and_worker_do_their_work_under_their_permissions(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    """The roles' permissions cover their own code paths: the scheduler creates the streams and
    the lease bucket, takes a lease and publishes a run; the worker pulls it from its queue,
    acks it and publishes its status; the recorder pulls that. (The whole suite runs jobsched
    under these users too, tests/natsauth.py.)"""
    server, files = secured
    scheduler = role_bus(server.url, files["scheduler"], "jobsched-scheduler")
    worker = role_bus(server.url, files["worker"], "jobsched-worker")
    recorder = role_bus(server.url, files["recorder"], "jobsched-recorder")
    await scheduler.connect()
    await worker.connect()
    await recorder.connect()
    try:
        await scheduler.ensure_streams()
        leases = LeaseBucket(scheduler, ttl_seconds=5)
        await leases.open()
        assert await leases.acquire(0, "s1") is not None
        stop = asyncio.Event()
        assert await worker.wait_for_streams(stop)
        consumer = await worker.work_consumer("default")
        run = forged_run()
        assert await scheduler.publish_runs([run]) == [None]
        assert await scheduler.run_in_stream("default", run.execution_id)
        got = await consumer.fetch(1, timeout_seconds=5)
        assert len(got) == 1
        await got[0].ack()
        await worker.publish_status(
            StatusEvent(
                execution_id=run.execution_id,
                job_id=run.job_id,
                owner=run.owner,
                partition=0,
                task_id=run.task_id,
                status=ExecutionStatus.SUCCEEDED,
                attempt=1,
                at=datetime.now(UTC),
                scheduled_for=run.scheduled_for,
            )
        )
        assert await scheduler.status_last_seq() == 1
        await consumer.close()
        statuses = await recorder.recorder_consumer()
        [recorded] = await statuses.fetch(1, timeout_seconds=5)
        await recorded.ack()
        await statuses.close()
        await recorder.publish_finished([run.job_id])
    finally:
        await recorder.close()
        await worker.close()
        await scheduler.close()


@pytest.mark.parametrize("role", ["worker", "api", "recorder", "live", "notifier"])
async def test_no_role_but_the_schedulers_and_gateways_can_attack_the_bus(
    secured: tuple[NatsServer, dict[str, Path]], role: str
) -> None:
    server, files = secured
    scheduler = role_bus(server.url, files["scheduler"], "jobsched-scheduler")
    await scheduler.connect()
    try:
        await scheduler.ensure_streams()
        leases = LeaseBucket(scheduler, ttl_seconds=5)
        await leases.open()
        await leases.acquire(0, "s1")
        async with attacker(server.url, files[role]) as (nc, errors):
            # publish a run to a work subject
            work_subject = scheduler.config.work_subject("default", "forged-1")
            await nc.publish(work_subject, b'{"task": "generate_report"}')
            await refused(errors, f'Publish to "{work_subject}"')
            # read every tenant's events and the API clients' tokens
            await nc.subscribe(f"{PREFIX}.>")
            await refused(errors, f'Subscription to "{PREFIX}.>"')
            # read the lease bucket, through the JetStream API and through the KV subjects
            js = nc.jetstream(timeout=1)
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.get_last_msg(f"KV_{PREFIX}_leases", f"$KV.{PREFIX}_leases.>")
            await refused(errors, f"$JS.API.STREAM.MSG.GET.KV_{PREFIX}_leases")
            await nc.publish(f"$KV.{PREFIX}_leases.p.0", b"attacker")
            await refused(errors, f'Publish to "$KV.{PREFIX}_leases.p.0"')
            # delete a stream
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.delete_stream(scheduler.config.work_stream)
            await refused(errors, f"$JS.API.STREAM.DELETE.{scheduler.config.work_stream}")
            # another user's replies
            await nc.subscribe("_INBOX.>")
            await refused(errors, 'Subscription to "_INBOX.>"')
            await nc.subscribe("_INBOX_jobsched-gateway.>")
            await refused(errors, 'Subscription to "_INBOX_jobsched-gateway.>"')
            # create a stream that captures the work subjects, or change the work stream
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.add_stream(name="STEAL", subjects=[f"{PREFIX}.work.>"])
            await refused(errors, "$JS.API.STREAM.CREATE.STEAL")
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.update_stream(name=scheduler.config.work_stream, max_msgs=1)
            await refused(errors, f"$JS.API.STREAM.UPDATE.{scheduler.config.work_stream}")
        # nothing of it took effect
        assert not await scheduler.run_in_stream("default", "forged-1")
        assert await scheduler.status_last_seq() == 0
        snapshot = await leases.snapshot()
        assert snapshot is not None
    finally:
        await scheduler.close()


async def test_the_gateway_reads_leases_and_queues_for_explain_but_cannot_change_them(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    """``GET /jobs/{id}/explain`` reads a partition's lease and a queue's consumer info on the
    gateway's connection (:mod:`bus.inspect`); the same user may neither write, delete nor purge
    a lease (taking a partition would let it dispatch runs), nor bind to the lease bucket's
    stream with a consumer."""
    server, files = secured
    scheduler = role_bus(server.url, files["scheduler"], "jobsched-scheduler")
    gateway = role_bus(server.url, files["gateway"], "jobsched-gateway")
    await scheduler.connect()
    await gateway.connect()
    try:
        inspector = BusInspector(gateway)
        assert (await inspector.partition_lease(0)).owner is None, "no bucket yet: nobody"
        await scheduler.ensure_streams()
        leases = LeaseBucket(scheduler, ttl_seconds=5)
        await leases.open()
        assert (await inspector.partition_lease(0)).owner is None, "no lease: nobody"
        revision = await leases.acquire(0, "s1")
        assert revision is not None
        lease = await inspector.partition_lease(0)
        assert lease.owner == "s1" and lease.expires_at is not None
        assert not (await inspector.queue_state("default")).consumer_exists
        worker = role_bus(server.url, files["worker"], "jobsched-worker")
        await worker.connect()
        try:
            await worker.ensure_work_consumer("default")
        finally:
            await worker.close()
        assert (await inspector.queue_state("default")).consumer_exists
        await leases.release(0, revision)
        assert (await inspector.partition_lease(0)).owner is None, "a released lease: nobody"
        async with attacker(server.url, files["gateway"]) as (nc, errors):
            await nc.publish(f"$KV.{PREFIX}_leases.p.1", b'{"owner": "gateway"}')
            await refused(errors, f'Publish to "$KV.{PREFIX}_leases.p.1"')
            js = nc.jetstream(timeout=1)
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.purge_stream(f"KV_{PREFIX}_leases")
            await refused(errors, f"$JS.API.STREAM.PURGE.KV_{PREFIX}_leases")
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.add_consumer(f"KV_{PREFIX}_leases", durable_name="steal")
            await refused(errors, f"$JS.API.CONSUMER.DURABLE.CREATE.KV_{PREFIX}_leases.steal")
        assert (await leases.snapshot()).taken == frozenset(), "nothing of it took effect"
    finally:
        await gateway.close()
        await scheduler.close()


async def test_the_live_feed_cannot_take_or_delete_the_recorders_events(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    """The live user may pull from its own consumers of the status stream, but never from the
    recorder's (taking events from it would lose them from every job's history), nor delete
    or redefine it."""
    server, files = secured
    scheduler = role_bus(server.url, files["scheduler"], "jobsched-scheduler")
    recorder = role_bus(server.url, files["recorder"], "jobsched-recorder")
    await scheduler.connect()
    await recorder.connect()
    try:
        await scheduler.ensure_streams()
        await recorder.ensure_recorder_consumer()
        status = scheduler.config.status_stream
        async with attacker(server.url, files["live"]) as (nc, errors):
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{status}.recorder", b"1")
            await refused(errors, f"$JS.API.CONSUMER.MSG.NEXT.{status}.recorder")
            js = nc.jetstream(timeout=1)
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.delete_consumer(status, "recorder")
            await refused(errors, f"$JS.API.CONSUMER.DELETE.{status}.recorder")
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.add_consumer(status, durable_name="recorder", ack_wait=0.5)
            await refused(errors, f"$JS.API.CONSUMER.DURABLE.CREATE.{status}.recorder")
        assert await scheduler.recorder_ack_floor() == 0  # still there, untouched
    finally:
        await recorder.close()
        await scheduler.close()


async def test_a_client_without_credentials_is_refused(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    server, _ = secured
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    nc = Client()
    try:
        with pytest.raises(nats.errors.Error) as refusal:
            async with asyncio.timeout(10):
                await nc.connect(server.url, error_cb=on_error, allow_reconnect=False)
    finally:
        await nc.close()  # nats-py leaves the refused socket open otherwise
    assert "authorization violation" in f"{refusal.value} {errors}".lower()


async def test_credentials_files_are_private_and_never_repeat_the_password(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    server, files = secured
    for path in files.values():
        assert path.stat().st_mode & 0o777 == 0o600
        assert "password=<hidden>" in repr(read_credentials(path))
    assert (server.store_dir / "nats-server.conf").stat().st_mode & 0o777 == 0o600


async def test_the_notifier_reads_its_own_consumer_only_and_cannot_forge_an_event(
    secured: tuple[NatsServer, dict[str, Path]],
) -> None:
    """The notifier calls URLs users chose: its NATS user may pull the status stream's
    ``notifier`` consumer, and nothing else — no event it could forge (a run's outcome in
    everyone's history), no run, no taking events from the recorders."""
    server, files = secured
    scheduler = role_bus(server.url, files["scheduler"], "jobsched-scheduler")
    notifier = role_bus(server.url, files["notifier"], "jobsched-notifier")
    await scheduler.connect()
    await notifier.connect()
    try:
        await scheduler.ensure_streams()
        stream = NotifierStream(notifier)
        consumer = await stream.notifier_consumer()  # allowed: create and pull its own
        assert await consumer.fetch(1, timeout_seconds=0.2) == []
        await consumer.close()
        status = scheduler.config.status_stream
        async with attacker(server.url, files["notifier"]) as (nc, errors):
            subject = scheduler.config.status_subject("alice", "job-1")
            await nc.publish(subject, b'{"kind": "run", "status": "SUCCEEDED"}')
            await refused(errors, f'Publish to "{subject}"')
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{status}.recorder", b"1")
            await refused(errors, f"$JS.API.CONSUMER.MSG.NEXT.{status}.recorder")
        assert await scheduler.status_last_seq() == 0
    finally:
        await notifier.close()
        await scheduler.close()
