"""The peers ``bench.peers`` measures, each started fresh on this machine for every run.

A :class:`Peer` starts what it needs in a temp dir (a private ``redis-server`` on a free port, a
private nats-server, its worker processes), submits once jobs due at given instants (epoch
seconds), and its workers run :func:`bench.peer_tasks.record`, which notes when each job started.
Every peer's libraries are the ``peers`` extra; :func:`missing` says which one is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import REPO, free_port, tail
from bench.peer_tasks import (
    ARQ_MAX_JOBS,
    ARQ_POLL_DELAY_SECONDS,
    CELERY_WORKER_ARGS,
    TASKIQ_BUCKET,
    celery_app,
    record_async,
)
from jobsched.natsserver import NatsServer, find_nats_server

SUBMIT_CONCURRENCY = 50
TASKIQ_ARGS = ["--log-level", "WARNING"]
"""taskiq's CLI logs every task at INFO, which the other peers are not asked to do."""
REDIS_ARGS = ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
"""Redis as durable as jobsched's JetStream (an fsync per second), no RDB snapshots."""


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def at(due: float) -> datetime:
    """The instant ``due`` (epoch s) as a UTC datetime, or now if it is past (the warm-up job)."""
    return datetime.fromtimestamp(max(due, time.time()), UTC)


class Peer:
    """One peer system. Subclasses set the class attributes and implement start and submit."""

    name = ""
    durable = ""
    dists: tuple[str, ...] = ()
    """Distributions whose versions are printed."""
    modules: tuple[str, ...] = ()
    """Import names the peer needs (else :meth:`missing` says which)."""
    needs_redis = False

    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        self.log = log
        self.redis_url = ""
        self.nats_url = ""
        self.procs: list[subprocess.Popen[bytes]] = []

    def missing(self) -> str | None:
        """Why this peer cannot run here (a library or redis-server missing), or None."""
        for m in self.modules:
            if importlib.util.find_spec(m) is None:
                return f"{m} is not installed (pip install -e '.[peers]')"
        if self.needs_redis and not shutil.which("redis-server"):
            return "redis-server is not on PATH (apt-get install redis-server)"
        return None

    def versions(self) -> str:
        out = [f"{d} {version(d)}" for d in self.dists]
        if self.needs_redis:
            out.append(redis_version())
        return ", ".join(out)

    def config(self) -> str:
        return ""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSCHED_")}
        env.update(BENCH_PEER_LOG=str(self.log), BENCH_NATS_URL=self.nats_url)
        return env

    def spawn(self, stack: AsyncExitStack, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = (self.root / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=self.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        stack.push_async_callback(stop_process, proc)
        self.procs.append(proc)
        return proc

    def check_alive(self) -> None:
        """Raises RuntimeError, with their logs, if one of the peer's processes exited."""
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(
                    f"{self.name}: {p.args!r} exited with {p.returncode}:\n"
                    + "\n".join(tail(f) for f in self.root.glob("*.log"))
                )

    async def start(self, stack: AsyncExitStack) -> None:
        if self.needs_redis:
            self.redis_url = await start_redis(stack, self.root)

    async def submit(self, dues: Sequence[float]) -> None:
        raise NotImplementedError


async def stop_process(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.to_thread(proc.wait, 15)
    except subprocess.TimeoutExpired:
        proc.kill()
        await asyncio.to_thread(proc.wait, 10)


def redis_version() -> str:
    out = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    return "redis-server " + next(
        (w.removeprefix("v=") for w in out.split() if w.startswith("v=")), "?"
    )


def spawn_redis(root: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root)]
    return subprocess.Popen(cmd + REDIS_ARGS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def start_redis(stack: AsyncExitStack, root: Path) -> str:
    """A private redis-server on a free loopback port, data in ``root``; its URL."""
    port = free_port()
    proc = spawn_redis(root, port)
    stack.push_async_callback(stop_process, proc)
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return f"redis://127.0.0.1:{port}/0"
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"redis-server on port {port} did not start")
        await asyncio.sleep(0.05)


async def bounded(n: int, coros: Any) -> None:
    """Await the coroutines of an iterable with at most ``n`` in flight."""
    it = iter(coros)

    async def lane() -> None:
        for c in it:
            await c

    await asyncio.gather(*(lane() for _ in range(n)))


class APSchedulerPeer(Peer):
    """APScheduler 4's AsyncScheduler in this process, one ``DateTrigger`` schedule per job."""

    dists: tuple[str, ...] = ("APScheduler",)
    modules: tuple[str, ...] = ("apscheduler",)

    def data_store(self) -> Any:
        raise NotImplementedError

    def config(self) -> str:
        return "AsyncScheduler in the benchmark process, default max_concurrent_jobs (100), "

    async def start(self, stack: AsyncExitStack) -> None:
        from apscheduler import AsyncScheduler  # noqa: PLC0415

        os.environ["BENCH_PEER_LOG"] = str(self.log)
        self.scheduler = await stack.enter_async_context(
            AsyncScheduler(data_store=self.data_store())
        )
        await self.scheduler.start_in_background()

    async def submit(self, dues: Sequence[float]) -> None:
        from apscheduler.triggers.date import DateTrigger  # noqa: PLC0415

        for due in dues:
            await self.scheduler.add_schedule(record_async, DateTrigger(at(due)), args=[due])


class APSchedulerMemory(APSchedulerPeer):
    name = "APScheduler 4 in memory"
    durable = "no"

    def data_store(self) -> Any:
        from apscheduler.datastores.memory import MemoryDataStore  # noqa: PLC0415

        return MemoryDataStore()

    def config(self) -> str:
        return super().config() + "MemoryDataStore"


class APSchedulerSQLite(APSchedulerPeer):
    name = "APScheduler 4 + SQLite"
    durable = "yes"
    dists = ("APScheduler", "SQLAlchemy", "aiosqlite")
    modules = ("apscheduler", "sqlalchemy", "aiosqlite")

    def data_store(self) -> Any:
        from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore  # noqa: PLC0415

        return SQLAlchemyDataStore(f"sqlite+aiosqlite:///{self.root / 'apscheduler.db'}")

    def config(self) -> str:
        return super().config() + "SQLAlchemyDataStore on sqlite+aiosqlite (a file in the temp dir)"


class CeleryPeer(Peer):
    """A Celery worker process on a private Redis; ``apply_async(eta=...)`` per job."""

    name = "Celery + Redis (ETA)"
    durable = "partly"
    dists = ("celery", "kombu", "redis")
    modules = ("celery", "redis")
    needs_redis = True

    def config(self) -> str:
        return (
            f"one worker process ({' '.join(CELERY_WORKER_ARGS)}); ETA jobs wait in the "
            "worker's memory once delivered, and its event loop fires at most 10 due ETA "
            "timers per turn, then polls up to 1 s (kombu Hub.fire_timers), so a burst starts "
            "~10-20 jobs/s; Redis " + shlex.join(REDIS_ARGS)
        )

    async def start(self, stack: AsyncExitStack) -> None:
        await super().start(stack)
        self.app = celery_app(self.redis_url)
        self.spawn(stack, "celery", ["-m", "bench.peer_tasks", "celery", "--redis", self.redis_url])

    async def submit(self, dues: Sequence[float]) -> None:
        self.check_alive()

        def send() -> None:
            for due in dues:
                self.app.send_task("noop", args=(due,), eta=at(due))

        await asyncio.to_thread(send)


class ArqPeer(Peer):
    """An arq worker process on a private Redis; ``enqueue_job(_defer_until=...)`` per job."""

    name = "arq (tuned)"
    durable = "yes"
    dists = ("arq", "redis")
    modules = ("arq", "redis")
    needs_redis = True

    def config(self) -> str:
        return (
            f"one worker process, poll_delay {ARQ_POLL_DELAY_SECONDS} s, max_jobs {ARQ_MAX_JOBS}, "
            f"keep_result 0; Redis " + shlex.join(REDIS_ARGS)
        )

    async def start(self, stack: AsyncExitStack) -> None:
        from arq import create_pool  # noqa: PLC0415
        from arq.connections import RedisSettings  # noqa: PLC0415

        await super().start(stack)
        self.pool = await create_pool(RedisSettings.from_dsn(self.redis_url))
        stack.push_async_callback(self.pool.aclose)
        self.spawn(stack, "arq", ["-m", "bench.peer_tasks", "arq", "--redis", self.redis_url])

    async def submit(self, dues: Sequence[float]) -> None:
        self.check_alive()
        await bounded(
            SUBMIT_CONCURRENCY,
            (self.pool.enqueue_job("noop", due, _defer_until=at(due)) for due in dues),
        )


class TaskiqPeer(Peer):
    """taskiq's worker and scheduler processes on a private nats-server (JetStream, NATS KV)."""

    name = "taskiq + taskiq-nats"
    durable = "yes"
    dists = ("taskiq", "taskiq-nats")
    modules = ("taskiq", "taskiq_nats")

    def config(self) -> str:
        return (
            "one worker process (taskiq worker --workers 1, PullBasedJetStreamBroker), "
            "taskiq scheduler --update-interval 1 (NATSKeyValueScheduleSource, one `time` "
            "schedule per job)"
        )

    async def start(self, stack: AsyncExitStack) -> None:
        nats = NatsServer(
            find_nats_server(os.environ), self.root / "nats", log_file=self.root / "nats.log"
        )
        self.nats_url = nats.start()
        stack.callback(nats.stop)
        from taskiq import ScheduledTask  # noqa: PLC0415
        from taskiq_nats import NATSKeyValueScheduleSource  # noqa: PLC0415

        self.scheduled_task = ScheduledTask
        # the worker first: it creates the stream the scheduler publishes to
        self.spawn(
            stack,
            "taskiq-worker",
            ["-m", "taskiq", "worker", "bench.peer_taskiq:broker", "--workers", "1", *TASKIQ_ARGS],
        )
        self.source = NATSKeyValueScheduleSource(servers=self.nats_url, bucket_name=TASKIQ_BUCKET)
        await self.source.startup()
        stack.push_async_callback(self.source.shutdown)
        self.spawn(
            stack,
            "taskiq-scheduler",
            [
                "-m",
                "taskiq",
                "scheduler",
                "bench.peer_taskiq:scheduler",
                "--update-interval",
                "1",
                *TASKIQ_ARGS,
            ],
        )

    async def submit(self, dues: Sequence[float]) -> None:
        self.check_alive()
        make = self.scheduled_task
        await bounded(
            SUBMIT_CONCURRENCY,
            (
                self.source.add_schedule(
                    make(task_name="noop", labels={}, args=[due], kwargs={}, time=at(due))
                )
                for due in dues
            ),
        )


PEERS: dict[str, type[Peer]] = {
    "apscheduler-memory": APSchedulerMemory,
    "apscheduler-sqlite": APSchedulerSQLite,
    "celery": CeleryPeer,
    "arq": ArqPeer,
    "taskiq": TaskiqPeer,
}
"""The peers by their ``--peers`` key, in the order they run."""
