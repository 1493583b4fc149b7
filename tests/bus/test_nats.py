"""``bus.nats.Bus`` against a real nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime

import msgspec
import pytest
from nats.aio.client import Client

import bus.nats
from bus.nats import ATOMIC_BATCH_MIN, RUN_LOOKUP_CONCURRENCY, Bus, BusConfig, NatsClient
from core.errors import BusUnavailable
from core.ids import execution_id
from core.model import RunMessage
from core.settings import load_settings
from jobsched.natsserver import NatsServer
from jobsched.runtime import bus_config


async def test_cancelled_pings_leave_the_connection_working(
    nats_server: NatsServer, prefix: str
) -> None:
    """Readiness probes get cancelled (client gone, timeouts); the connection must survive it."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        for _ in range(20):
            probe = asyncio.create_task(bus.ping())
            await asyncio.sleep(0)  # let it send its request, then give up on it
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)

        async with asyncio.timeout(5):
            await bus.ping()
            await bus.ensure_streams()
        assert bus.is_connected
    finally:
        await bus.close()


async def test_cancelled_flushes_leave_the_connection_working(
    nats_server: NatsServer, prefix: str
) -> None:
    """A flush cancelled before its PONG (a shutdown, an interrupted NATS micro service start)
    must not end the client's read loop: later requests and a drain still complete."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        for _ in range(5):
            flush = asyncio.create_task(bus.nc.flush())
            await asyncio.sleep(0)  # the PING is on its way; give up on its PONG
            flush.cancel()
            await asyncio.gather(flush, return_exceptions=True)

        async with asyncio.timeout(5):
            await bus.nc.flush()
            await bus.ensure_streams()
    finally:
        async with asyncio.timeout(5):
            await bus.close()


async def test_runs_in_stream_names_exactly_the_runs_whose_message_is_held(
    nats_server: NatsServer, prefix: str
) -> None:
    """The batched lookup the scheduler uses for overlap checks and the re-dispatch sweep: more
    runs than its concurrency limit, across queues, some never published, some deleted."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        await bus.ensure_streams()
        at = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
        runs = [
            RunMessage(
                execution_id=execution_id(f"job-{i}", at),
                job_id=f"job-{i}",
                owner="alice",
                partition=0,
                task_id="noop",
                queue="default" if i % 2 else "reports",
                scheduled_for=at,
                published_at=at,
            )
            for i in range(3 * RUN_LOOKUP_CONCURRENCY)
        ]
        published = runs[:-10]  # the last 10 are never published
        assert all(err is None for err in await bus.publish_runs(published))
        deleted = published[:7]
        for run in deleted:
            msg = await bus.js.get_last_msg(
                bus.config.work_stream, bus.config.work_subject(run.queue, run.execution_id)
            )
            assert msg.seq is not None
            await bus.js.delete_msg(bus.config.work_stream, msg.seq)

        async with asyncio.timeout(10):
            held = await bus.runs_in_stream((r.queue, r.execution_id) for r in runs)

        assert held == {r.execution_id for r in published[7:]}
        assert await bus.runs_in_stream([]) == set()
    finally:
        await bus.close()


async def test_runs_in_stream_bounds_its_lookups_and_stops_them_all_at_the_first_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = Bus(BusConfig(servers=["nats://127.0.0.1:1"]))  # never connected: lookups are stubbed
    in_flight = peak = started = 0
    release = asyncio.Event()

    async def lookup(queue: str, execution_id: str) -> bool:
        nonlocal in_flight, peak, started
        started += 1
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            if execution_id == "fails":
                raise BusUnavailable("look up run message: connection closed")
            await release.wait()
            return True
        finally:
            in_flight -= 1

    monkeypatch.setattr(bus, "run_in_stream", lookup)
    runs = [("default", f"run-{i}") for i in range(3 * RUN_LOOKUP_CONCURRENCY)]

    async with asyncio.timeout(5):
        batch = asyncio.create_task(bus.runs_in_stream(runs))
        while started < RUN_LOOKUP_CONCURRENCY:
            await asyncio.sleep(0)
        release.set()
        assert await batch == {e for _, e in runs}
    assert peak == RUN_LOOKUP_CONCURRENCY

    release.clear()
    started = 0
    with pytest.raises(BusUnavailable):
        async with asyncio.timeout(5):
            await bus.runs_in_stream([("default", "fails"), *runs])
    # the failure frees one slot before the batch sees it: at most one more lookup starts
    assert started <= RUN_LOOKUP_CONCURRENCY + 1
    assert in_flight == 0  # and those started were cancelled, none left running


async def test_an_unexpected_disconnect_is_reported_and_a_close_is_not(
    own_nats: NatsServer, prefix: str
) -> None:
    lost = asyncio.Event()
    count = 0

    def on_disconnect() -> None:
        nonlocal count
        count += 1
        lost.set()

    bus = Bus(BusConfig(servers=[own_nats.url], prefix=prefix), on_disconnect=on_disconnect)
    await bus.connect()
    try:
        own_nats.restart()
        async with asyncio.timeout(10):
            await lost.wait()
            await bus.connected.wait()
            await bus.ping()
    finally:
        await bus.close()
    assert count == 1


def test_header_parsing_gives_what_nats_py_gives() -> None:
    """``NatsClient`` parses headers faster than nats-py; the result must be the same."""
    blocks = [
        b"Nats-Stream: S\r\nNats-Subject: a.b\r\nNats-Sequence: 12\r\nNats-Num-Pending: 0\r\n\r\n",
        b"Name:Value\r\nTab:\tValue \r\n  Spaced  :  x  \r\nNo colon\r\n:empty name\r\n\r\n",
        b"Dup: 1\r\nDup: 2\r\nEmpty:\r\n\r\n",
        "Caf\u00e9: x\r\nValue: caf\u00e9\r\n".encode() + b"Bad: \xff\xfe\r\n",
        b"",
        b"\r\n",
    ]
    blocks += [b"K%sey: v\r\nok: 1\r\n" % bytes([c]) for c in range(128) if c not in b"\r\n:"]
    for raw in blocks:
        assert NatsClient._parse_header_lines(raw) == Client._parse_header_lines(raw), raw


async def test_the_recorder_consumer_takes_the_configured_ack_wait(
    nats_server: NatsServer, prefix: str
) -> None:
    """``JOBSCHED_RECORDER_ACK_WAIT_SECONDS`` reaches the recorders' consumer, also one that
    exists already with another ack wait (an upgrade, a changed setting)."""
    first = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    changed = Bus(
        BusConfig(servers=[nats_server.url], prefix=prefix, recorder_ack_wait_seconds=7.5)
    )
    await first.connect()
    await changed.connect()
    try:
        await first.ensure_streams()
        await first.ensure_recorder_consumer()
        info = await first.js.consumer_info(first.config.status_stream, "recorder")
        assert info.config.ack_wait == 30.0

        await changed.ensure_recorder_consumer()

        info = await changed.js.consumer_info(changed.config.status_stream, "recorder")
        assert info.config.ack_wait == 7.5
    finally:
        await changed.close()
        await first.close()


def test_the_recorder_ack_wait_setting_reaches_the_bus() -> None:
    settings = load_settings({"JOBSCHED_RECORDER_ACK_WAIT_SECONDS": "45"})

    assert bus_config(settings.nats).recorder_ack_wait_seconds == 45.0
    assert bus_config(load_settings({}).nats).recorder_ack_wait_seconds == 30.0


def _runs(n: int, tag: str) -> list[RunMessage]:
    at = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    return [
        RunMessage(
            execution_id=execution_id(f"{tag}-{i}", at),
            job_id=f"{tag}-{i}",
            owner="alice",
            partition=0,
            task_id="noop",
            queue="default",
            scheduled_for=at,
            published_at=at,
        )
        for i in range(n)
    ]


async def _stored_headers(bus: Bus, runs: list[RunMessage]) -> list[dict[str, str]]:
    out = []
    for r in runs:
        msg = await bus.js.get_last_msg(
            bus.config.work_stream, bus.config.work_subject(r.queue, r.execution_id)
        )
        out.append(dict(msg.headers or {}))
    return out


async def test_a_batch_of_runs_is_one_atomic_batch_and_a_repeat_is_stored_once(
    nats_server: NatsServer, prefix: str
) -> None:
    """One PubAck for the batch (ADR-50): every run stored with the batch's headers; a batch
    that repeats stored runs (a re-publish after a lost PubAck, a take-over) is refused as a
    batch and published one by one, each run stored once."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        await bus.ensure_streams()
        n = ATOMIC_BATCH_MIN
        first = _runs(n, "a")
        assert await bus.publish_runs(first) == [None] * n
        headers = await _stored_headers(bus, first)
        assert len({h["Nats-Batch-Id"] for h in headers}) == 1
        assert [h["Nats-Batch-Sequence"] for h in headers] == [str(i) for i in range(1, n + 1)]

        again = [*first[3:], *_runs(4, "b")]
        assert await bus.publish_runs(again) == [None] * (n + 1)
        info = await bus.js.stream_info(bus.config.work_stream)
        assert info.state.messages == n + 4
        assert bus._atomic
    finally:
        await bus.close()


async def test_a_small_batch_is_pipelined_not_atomic(nats_server: NatsServer, prefix: str) -> None:
    """Below ``ATOMIC_BATCH_MIN`` an atomic batch costs nats-server more than it saves."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        await bus.ensure_streams()
        runs = _runs(ATOMIC_BATCH_MIN - 1, "s")
        assert await bus.publish_runs(runs) == [None] * len(runs)
        assert all("Nats-Batch-Id" not in h for h in await _stored_headers(bus, runs))
        assert bus._atomic
    finally:
        await bus.close()


async def test_a_stream_without_atomic_batches_is_published_to_one_by_one(
    nats_server: NatsServer, prefix: str
) -> None:
    """A work stream created without ``allow_atomic`` (an older deployment's, not updated):
    the first batch is refused and published one by one, and later ones are not tried."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        await bus.ensure_streams()
        cfg = await bus.js.stream_info(bus.config.work_stream)
        await bus.js.delete_stream(bus.config.work_stream)
        await bus.js.add_stream(dataclasses.replace(cfg.config, allow_atomic=False))
        runs = _runs(ATOMIC_BATCH_MIN, "c")
        assert await bus.publish_runs(runs) == [None] * ATOMIC_BATCH_MIN
        assert not bus._atomic
        assert all("Nats-Batch-Id" not in h for h in await _stored_headers(bus, runs))
        assert await bus.publish_runs(_runs(ATOMIC_BATCH_MIN, "d")) == [None] * ATOMIC_BATCH_MIN
        info = await bus.js.stream_info(bus.config.work_stream)
        assert info.state.messages == 2 * ATOMIC_BATCH_MIN
    finally:
        await bus.close()


class _SilentJetStream:
    """A JetStream context whose PubAcks never come (lost to a reconnect)."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []

    async def publish_async(self, *args: object, **kwargs: object) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut


async def test_lost_pubacks_fail_a_pipelined_batch_within_one_wait_not_one_per_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten messages whose PubAcks never arrive: all ten fail once PUBACK_WAIT_SECONDS have
    passed since they went out, not ten times that (a worker's whole report batch waited)."""
    monkeypatch.setattr(bus.nats, "PUBACK_WAIT_SECONDS", 0.2)
    b = Bus(BusConfig(servers=["nats://127.0.0.1:1"], prefix="t"))
    js = _SilentJetStream()
    b._js = js  # type: ignore[assignment]
    batch = [(f"t.work.default.{i}", b"{}", f"id-{i}") for i in range(10)]
    async with asyncio.timeout(1.0):  # 10 x 0.2 s before the fix
        results = await b._publish_pipelined(batch, "publish run")
    assert len(js.futures) == 10
    assert all(isinstance(r, BusUnavailable) for r in results)


@pytest.mark.parametrize(
    ("code", "stays_atomic"),
    [
        (10174, False),  # not enabled on the stream
        (10177, False),  # nats-server 2.12.0: Nats-Msg-Id unsupported in a batch
        (10201, True),  # a duplicate in this batch: the next batch may be fine
    ],
)
def test_a_refused_batch_turns_atomic_publishing_off_only_for_good_reasons(
    code: int, stays_atomic: bool
) -> None:
    b = Bus(BusConfig(servers=["nats://127.0.0.1:1"], prefix="t"))
    reply = {"error": {"code": 400, "err_code": code, "description": "refused"}}
    assert b._batch_accepted(msgspec.json.encode(reply)) is False
    assert b._atomic is stays_atomic
