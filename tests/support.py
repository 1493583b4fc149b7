"""Test helpers: an in-process stack, a status-event recorder, child processes of jobsched."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from bus.nats import Bus, BusConfig
from core.clock import Clock
from core.model import Event, Execution, ExecutionStatus, Job, JobEvent, JobStatus, StatusEvent
from core.settings import Settings
from gateway.auth import mint_token
from jobsched.client import ApiError, JobschedClient
from jobsched.runtime import Roles, serve
from tests.natsauth import observer_url

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Stack:
    """A running stack: its settings, gateway URL and per-user clients."""

    settings: Settings
    url: str
    stop_event: asyncio.Event
    task: asyncio.Task[None]
    clients: dict[str, JobschedClient] = field(default_factory=dict)

    def token(self, user: str = "alice") -> str:
        return mint_token(self.settings.gateway.auth_secret, user, ttl=timedelta(hours=1))

    def client(self, user: str = "alice") -> JobschedClient:
        if user not in self.clients:
            self.clients[user] = JobschedClient(self.url, self.token(user))
        return self.clients[user]

    async def stop(self) -> None:
        self.stop_event.set()
        for c in self.clients.values():
            await c.close()
        self.clients.clear()
        async with asyncio.timeout(30):
            await self.task


@asynccontextmanager
async def start_stack(
    settings: Settings,
    roles: Roles | None = None,
    *,
    clock: Clock | None = None,
    ready: bool = True,
    freeze_heap: bool = False,
) -> AsyncIterator[Stack]:
    """Run ``roles`` (default: all) in this process until the block ends; the block starts
    once every actor is ready, or at once without ``ready``. ``freeze_heap``: as ``serve``'s
    (a test that sets it replaces ``jobsched.runtime.freeze_startup_heap``: the test process
    must not freeze its heap)."""
    stop = asyncio.Event()
    started: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            settings,
            roles or Roles(gateway=True, scheduler=True, worker=True),
            stop,
            clock=clock,
            started=started,
            freeze_heap=freeze_heap,
        ),
        name="test-stack",
    )
    if ready:
        async with asyncio.timeout(20):
            first: set[asyncio.Future[Any]] = {task, started}  # a stop or the ready stack's URL
            done, _ = await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
            raise RuntimeError("the stack stopped before it was ready")
    stack = Stack(settings, started.result()["url"] if started.done() else "", stop, task)
    try:
        yield stack
    finally:
        await stack.stop()


class EventLog:
    """Collects every status event of a deployment (core subscription to ``<prefix>.status.>``)."""

    def __init__(self, nats_url: str, prefix: str) -> None:
        self.nats_url = nats_url
        self.prefix = prefix
        self.events: list[StatusEvent] = []
        self.job_events: list[JobEvent] = []
        self._changed = asyncio.Condition()
        self._nc: Client | None = None
        self._decoder = msgspec.json.Decoder(Event)

    async def __aenter__(self) -> EventLog:
        self._nc = await nats.connect(observer_url(self.nats_url))

        async def on_msg(msg: Msg) -> None:
            event = self._decoder.decode(msg.data)
            if isinstance(event, StatusEvent):
                self.events.append(event)
            else:
                self.job_events.append(event)
            async with self._changed:
                self._changed.notify_all()

        await self._nc.subscribe(f"{self.prefix}.status.>", cb=on_msg)
        await self._nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._nc is not None:
            await self._nc.close()

    def of(self, execution_or_job_id: str) -> list[StatusEvent]:
        return [e for e in self.events if execution_or_job_id in (e.execution_id, e.job_id)]

    async def wait_for(
        self,
        predicate: Callable[[list[StatusEvent]], bool],
        *,
        timeout_seconds: float,
        what: str = "",
    ) -> list[StatusEvent]:
        """Wait until ``predicate(events)`` holds. Raises TimeoutError naming ``what``."""
        try:
            async with asyncio.timeout(timeout_seconds):
                async with self._changed:
                    await self._changed.wait_for(lambda: predicate(self.events))
        except TimeoutError:
            raise TimeoutError(
                f"timed out after {timeout_seconds} s waiting for {what or predicate}; "
                f"events: {[(e.execution_id[-30:], e.status, e.attempt) for e in self.events]}"
            ) from None
        return self.events

    async def wait_status(
        self, job_id: str, status: ExecutionStatus, *, timeout_seconds: float, count: int = 1
    ) -> list[StatusEvent]:
        return await self.wait_for(
            lambda evs: sum(1 for e in evs if e.job_id == job_id and e.status == status) >= count,
            timeout_seconds=timeout_seconds,
            what=f"{count}x {status} of job {job_id}",
        )


async def wait_job(
    client: JobschedClient, job_id: str, statuses: Collection[str], *, timeout_seconds: float = 15.0
) -> Job:
    """Wait until the stored job reaches one of ``statuses`` (as recorded by the recorder)."""
    return await client.wait_for_status(job_id, statuses, timeout_seconds=timeout_seconds)


async def executions(client: JobschedClient, job_id: str) -> list[Execution]:
    page = await client.list_executions(job_id, limit=500)
    return page.items


def problem_fields(error: ApiError) -> list[str]:
    """The fields that the RFC 9457 problem body of ``error`` names (none without a body)."""
    problem = error.problem
    return [e.field for e in problem.errors or ()] if problem is not None else []


def succeeded(n: int) -> Callable[[list[Execution]], bool]:
    """A :func:`wait_executions` predicate: exactly ``n`` runs SUCCEEDED."""
    return lambda runs: sum(r.status == ExecutionStatus.SUCCEEDED for r in runs) == n


async def wait_executions(
    client: JobschedClient,
    job_id: str,
    predicate: Callable[[list[Execution]], bool],
    *,
    timeout_seconds: float = 15.0,
    what: str = "",
) -> list[Execution]:
    """Poll the job's executions until ``predicate`` holds."""
    runs: list[Execution] = []
    try:
        async with asyncio.timeout(timeout_seconds):
            while True:
                runs = await executions(client, job_id)
                if predicate(runs):
                    return runs
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise TimeoutError(
            f"timed out waiting for {what}; executions: {[(r.id[-24:], r.status, r.attempt) for r in runs]}"
        ) from None


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment of a child jobsched process with these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSCHED_")}
    env.update(settings.env())
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Child:
    """A ``python -m jobsched <command>`` child process (its own process group)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args = args
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobsched", *args],
            env=env,
            cwd=REPO,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL, no cleanup (a crash)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_seconds: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_seconds)
        finally:
            self._log_file.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._log_file.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def noop_body(**kw: Any) -> dict[str, Any]:
    return {"taskId": "noop", **kw}


async def stalled_ws(url: str, token: str, *, last_event_id: int | None = 0) -> socket.socket:
    """A WebSocket client of ``GET /ws`` that subscribes to all of its user's jobs from
    ``last_event_id`` (None: from now) and then never reads: a noisy neighbour. Its receive
    buffer is 4 KiB, so the gateway's writes back up quickly. The caller closes the socket.
    """
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        await loop.sock_sendall(
            sock,
            (
                f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
            ).encode(),
        )
        head = b""
        while b"\r\n\r\n" not in head:
            byte = await loop.sock_recv(sock, 1)
            if not byte:
                raise ConnectionError(f"the gateway closed the upgrade: {head!r}")
            head += byte
        if b" 101 " not in head:
            raise ConnectionError(f"no WebSocket upgrade: {head!r}")
        message: dict[str, Any] = {"type": "subscribe"}
        if last_event_id is not None:
            message["lastEventId"] = last_event_id
        payload = json.dumps(message).encode()
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        await loop.sock_sendall(sock, bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    except BaseException:
        sock.close()
        raise
    return sock


async def ws_close_code(sock: socket.socket) -> tuple[int, int]:
    """Read the frames of a :func:`stalled_ws` socket until the server's close frame:
    (text frames read, close code). Raises ConnectionError if it ends without one."""
    loop = asyncio.get_running_loop()
    data, texts = b"", 0

    async def need(n: int) -> None:
        nonlocal data
        while len(data) < n:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                raise ConnectionError(f"the connection ended after {texts} frames, no close frame")
            data += chunk

    while True:
        await need(2)
        opcode, length, i = data[0] & 0x0F, data[1] & 0x7F, 2
        if length == 126:
            await need(4)
            length, i = int.from_bytes(data[2:4], "big"), 4
        elif length == 127:
            await need(10)
            length, i = int.from_bytes(data[2:10], "big"), 10
        await need(i + length)
        if opcode == 0x8:
            return texts, int.from_bytes(data[i : i + 2], "big")
        texts += opcode == 0x1
        data = data[i + length :]


async def seed_events(nats_url: str, prefix: str, owner: str, count: int) -> None:
    """Publish ``count`` job events of ``owner`` (about 250 bytes each, over 50 job ids) to the
    status stream of deployment ``prefix``: a busy user's history, for replays to read. The
    recorder acknowledges job events without storing them."""
    bus = Bus(BusConfig(servers=[observer_url(nats_url)], prefix=prefix), name="test-seed")
    await bus.connect()
    try:
        at = datetime.now(UTC)
        for first in range(0, count, 1000):
            events = [
                JobEvent(
                    job_id=f"{i % 50:032x}",
                    owner=owner,
                    partition=0,
                    event="changed",
                    status=JobStatus.SCHEDULED,
                    at=at + timedelta(milliseconds=i),
                )
                for i in range(first, min(first + 1000, count))
            ]
            assert await bus.publish_events(events) == len(events)
    finally:
        await bus.close()
