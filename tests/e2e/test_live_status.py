"""Live status over WebSocket (GET /ws) on the real stack."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.model import Event, JobEvent, StatusEvent
from jobsched.client import JobschedClient, WatchClosed
from tests.conftest import SettingsFactory
from tests.support import (
    Stack,
    seed_events,
    stalled_ws,
    start_stack,
    wait_executions,
    wait_job,
)


def label(event: Event) -> str:
    return f"job:{event.event}" if isinstance(event, JobEvent) else f"run:{event.status}"


async def take(
    events: AsyncIterator[tuple[int, Event]], until: str, job_id: str
) -> list[tuple[int, Event]]:
    """Collect events until one of ``job_id`` carries ``until`` (bounded by the caller's timeout)."""
    got = []
    async for eid, event in events:
        got.append((eid, event))
        if event.job_id == job_id and label(event) == until:
            return got
    raise AssertionError(f"stream ended before {until}: {[label(e) for _, e in got]}")


async def test_events_arrive_in_order_for_a_jobs_whole_life(stack: Stack) -> None:
    client = stack.client()
    watch = client.watch()
    first = asyncio.ensure_future(anext(watch))
    await asyncio.sleep(0)  # let the subscription be sent before the job exists
    job_task = asyncio.ensure_future(
        client.create_job({"taskId": "fail", "parameters": {"times": 1}})
    )
    async with asyncio.timeout(20):
        head = await first
        job = await job_task
        rest = await take(watch, "run:SUCCEEDED", job.id)
    await watch.aclose()
    events = [head, *rest]
    ids = [eid for eid, _ in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "event ids strictly increase"
    mine = [label(e) for _, e in events if e.job_id == job.id]
    assert mine == [
        "job:created",
        "run:QUEUED",
        "run:RUNNING",
        "run:RETRYING",
        "run:RUNNING",
        "run:SUCCEEDED",
    ]
    runs = [e for _, e in events if isinstance(e, StatusEvent) and e.job_id == job.id]
    assert [e.attempt for e in runs] == [0, 1, 1, 2, 2]
    assert runs[2].error and "failing on purpose" in runs[2].error
    assert all(e.execution_id == runs[0].execution_id for e in runs)


async def test_with_the_default_grace_short_attempts_report_their_outcome_alone(
    make_settings: SettingsFactory,
) -> None:
    """``JOBSCHED_WORKER_RUNNING_GRACE_SECONDS`` at its default: attempts that end within it
    reach live clients as one event each, carrying when they started."""
    settings = make_settings(worker_running_grace_seconds=0.5)
    async with start_stack(settings) as stack:
        client = stack.client()
        watch = client.watch()
        first = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0)  # let the subscription be sent before the job exists
        job_task = asyncio.ensure_future(
            client.create_job({"taskId": "fail", "parameters": {"times": 1}})
        )
        async with asyncio.timeout(20):
            head = await first
            job = await job_task
            rest = await take(watch, "run:SUCCEEDED", job.id)
        await watch.aclose()
        [run] = await wait_executions(
            client, job.id, lambda rs: bool(rs) and rs[0].status == "SUCCEEDED"
        )
    events = [e for _, e in [head, *rest] if e.job_id == job.id]
    assert [label(e) for e in events] == [
        "job:created",
        "run:QUEUED",
        "run:RETRYING",
        "run:SUCCEEDED",
    ]
    runs = [e for e in events if isinstance(e, StatusEvent)]
    assert [e.attempt for e in runs] == [0, 1, 2]
    assert runs[1].started_at is not None and runs[2].started_at is not None
    assert run.started_at == runs[1].started_at  # the first start, kept through the retry


async def test_a_reconnect_with_the_last_event_id_replays_the_gap(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2099-01-01T00:00:00Z"}}
    )
    async with asyncio.timeout(20):
        watch = client.watch(job_ids=[job.id], last_event_id=0)
        first_id, first = await anext(watch)
        await watch.aclose()
        assert label(first) == "job:created"
        await client.trigger_job(job.id)
        await client.pause_job(job.id)
        await wait_job(client, job.id, {"PAUSED"})
        missed = await take(
            client.watch(job_ids=[job.id], last_event_id=first_id), "job:paused", job.id
        )
    assert [eid for eid, _ in missed] == sorted(eid for eid, _ in missed)
    assert missed[0][0] > first_id
    labels = [label(e) for _, e in missed]
    assert labels[0] == "run:QUEUED" and "job:paused" in labels


async def test_users_never_receive_other_users_events(stack: Stack) -> None:
    alice, bob = stack.client("alice"), stack.client("bob")
    theirs = await alice.create_job({"taskId": "noop"})
    await wait_job(alice, theirs.id, {"SUCCEEDED"})
    mine = await bob.create_job({"taskId": "noop"})
    async with asyncio.timeout(20):
        seen = await take(bob.watch(last_event_id=0), "run:SUCCEEDED", mine.id)
    assert {e.job_id for _, e in seen} == {mine.id}
    assert all(e.owner == "bob" for _, e in seen)


async def test_a_bad_token_is_refused(stack: Stack) -> None:
    bad = JobschedClient(stack.url, "not-a-token")
    try:
        async with asyncio.timeout(10):
            try:
                await anext(bad.watch())
            except WatchClosed as e:
                assert e.code == 4001
            else:
                raise AssertionError("an event without a valid token")
    finally:
        await bad.close()


async def test_browsers_authenticate_with_a_first_message(stack: Stack) -> None:
    client = stack.client()
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(stack.url.replace("http", "ws") + "/ws") as ws,
    ):
        await ws.send_str(json.dumps({"type": "auth", "token": stack.token("alice")}))
        async with asyncio.timeout(10):
            assert json.loads((await ws.receive()).data) == {
                "type": "authenticated",
                "user": "alice",
            }
        await ws.send_str(json.dumps({"type": "subscribe"}))
        async with asyncio.timeout(10):
            subscribed = json.loads((await ws.receive()).data)
            assert subscribed["type"] == "subscribed"
            job = await client.create_job({"taskId": "noop"})
            frame = json.loads((await ws.receive()).data)
    assert frame["type"] == "event" and frame["event"]["jobId"] == job.id


async def test_a_connection_that_does_not_authenticate_in_time_is_closed_with_4000(
    stack: Stack,
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(stack.url.replace("http", "ws") + "/ws") as ws,
    ):
        async with asyncio.timeout(15):
            msg = await ws.receive()
    assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4000
    assert "within 5 s" in str(msg.extra)


def raw_ws(url: str, token: str) -> socket.socket:
    """A WebSocket client that will not read after the handshake (small receive buffer)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {token}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head, head
    payload = json.dumps({"type": "subscribe", "lastEventId": 0}).encode()
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    return sock


def read_until_close(sock: socket.socket) -> tuple[int, int]:
    """Read every frame until the server's close frame: (text frames read, close code)."""
    sock.settimeout(30)
    data, texts = b"", 0

    def need(n: int) -> None:
        nonlocal data
        while len(data) < n:
            chunk = sock.recv(65536)
            assert chunk, f"the connection ended after {texts} frames without a close frame"
            data += chunk

    while True:
        need(2)
        opcode, length, i = data[0] & 0x0F, data[1] & 0x7F, 2
        if length == 126:
            need(4)
            length, i = int.from_bytes(data[2:4], "big"), 4
        elif length == 127:
            need(10)
            length, i = int.from_bytes(data[2:10], "big"), 10
        need(i + length)
        if opcode == 0x8:
            return texts, int.from_bytes(data[i : i + 2], "big")
        texts += opcode == 0x1
        data = data[i + length :]


async def test_a_slow_client_is_cut_off_while_a_fast_one_keeps_receiving(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(
        ws_buffer_events=20,
        ws_stall_seconds=1.0,
        quota_creates_per_second=0,  # 400 jobs of one user at once
    )
    async with start_stack(settings) as stack:
        client = stack.client()
        jobs = []
        for _ in range(8):  # 50 at a time: each POST's 10 s timeout counts its wait for a socket
            jobs += await asyncio.gather(
                *(client.create_job({"taskId": "noop"}) for _ in range(50))
            )
        for j in jobs:
            await wait_job(client, j.id, {"SUCCEEDED"})
        slow = await asyncio.to_thread(raw_ws, stack.url, stack.token("alice"))
        try:
            async with asyncio.timeout(60):
                fast = await take(client.watch(last_event_id=0), "run:SUCCEEDED", jobs[-1].id)
                # Being slow is the fault injected here: the slow client reads nothing for three
                # stall periods (ws_stall_seconds) after the fast one has had every event.
                await asyncio.sleep(3 * stack.settings.gateway.ws_stall_seconds)
                received, code = await asyncio.to_thread(read_until_close, slow)
        finally:
            slow.close()
    assert len(fast) >= 1000
    assert code == 4008
    assert received < len(fast), "the slow client was cut off before the end of the stream"


async def test_an_out_of_range_last_event_id_gets_an_error_frame_and_the_socket_stays_open(
    stack: Stack,
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            stack.url.replace("http", "ws") + "/ws",
            headers={"Authorization": f"Bearer {stack.token('alice')}"},
        ) as ws,
    ):
        async with asyncio.timeout(10):
            for bad in (2**64 - 1, -1):
                await ws.send_str(json.dumps({"type": "subscribe", "lastEventId": bad}))
                frame = json.loads((await ws.receive()).data)
                assert frame["type"] == "error"
                assert "lastEventId" in frame["message"]
            await ws.send_str(json.dumps({"type": "subscribe", "lastEventId": 0}))
            assert json.loads((await ws.receive()).data)["type"] == "subscribed"


async def gauge(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return next(
        (
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == name
        ),
        0.0,
    )


async def test_a_client_that_resets_its_connection_mid_replay_ends_quietly(
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A client gone while its writer waits for the socket: no 500, no error, nothing left."""
    settings = make_settings()
    async with start_stack(settings) as stack:
        await seed_events(settings.nats.url, settings.nats.subject_prefix, "alice", 2000)
        sock = await stalled_ws(stack.url, stack.token("alice"))
        try:
            async with asyncio.timeout(30):
                # two reads: more than the socket takes, so the writer waits on it
                while await gauge(stack.url, "jobsched_ws_replayed_events_total") < 256:
                    await asyncio.sleep(0.05)
        finally:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # with a zero linger: a reset
        async with asyncio.timeout(30):
            while await gauge(stack.url, "jobsched_ws_connections") > 0:
                await asyncio.sleep(0.05)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


async def test_a_stopping_gateway_closes_its_websockets_with_1001(
    make_settings: SettingsFactory,
) -> None:
    """A rolling restart tells each live client to go elsewhere at once (1001 Going Away)
    rather than holding the gateway's shutdown until the client leaves."""
    async with start_stack(make_settings()) as stack, aiohttp.ClientSession() as session:
        ws = await session.ws_connect(stack.url.replace("http", "ws") + "/ws")
        await ws.send_str(json.dumps({"type": "auth", "token": stack.token("alice")}))
        await ws.send_str(json.dumps({"type": "subscribe"}))
        async with asyncio.timeout(10):
            assert json.loads((await ws.receive()).data)["type"] == "authenticated"
            assert json.loads((await ws.receive()).data)["type"] == "subscribed"
        stopping = asyncio.create_task(stack.stop())
        async with asyncio.timeout(10):
            msg = await ws.receive()
        assert (msg.type, msg.data, msg.extra) == (
            aiohttp.WSMsgType.CLOSE,
            1001,
            "gateway shutting down",
        )
        async with asyncio.timeout(10):
            await stopping
        await ws.close()


async def test_a_second_auth_message_is_answered_with_an_error_and_changes_nothing(
    stack: Stack,
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(stack.url.replace("http", "ws") + "/ws") as ws,
    ):
        await ws.send_str(json.dumps({"type": "auth", "token": stack.token("alice")}))
        async with asyncio.timeout(10):
            assert json.loads((await ws.receive()).data)["user"] == "alice"
        await ws.send_str(json.dumps({"type": "auth", "token": stack.token("bob")}))
        async with asyncio.timeout(10):
            answer = json.loads((await ws.receive()).data)
        assert answer["type"] == "error" and "already authenticated as 'alice'" in answer["message"]
        await ws.send_str(json.dumps({"type": "subscribe"}))
        async with asyncio.timeout(10):
            assert json.loads((await ws.receive()).data)["type"] == "subscribed"
