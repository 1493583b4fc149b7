"""Shared pieces of the benchmarks: a private deployment, load generation, store timestamps, stats.

A :class:`Deployment` starts its own ``nats-server`` on a free port with its storage in a fresh
temporary directory (never the shared server on 4222), then jobsched in one of these layouts:

* ``inproc`` — :func:`jobsched.runtime.serve` with every role inside the benchmark's own event loop
  (what the tests do);
* ``one`` — every role in one child process (``python -m bench.stackproc``, like ``jobsched dev``);
* ``split`` — ``python -m jobsched gateway``, ``... scheduler`` (with the recorder) and
  ``... worker`` as separate child processes; ``schedulers=`` / ``workers=`` start more of them.

Timestamps come from the store (SQLite, opened read-only with :mod:`sqlite3`; columns are epoch
milliseconds), CPU time and memory of each process from ``/proc/<pid>/stat`` and ``status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from core.ids import new_job_id, partition_of
from core.model import IntervalSchedule, Job, JobStatus, Schedule
from core.settings import load_settings
from gateway.auth import mint_token
from jobsched.natsserver import NatsServer, find_nats_server
from jobsched.runtime import Roles, serve

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(os.environ.get("BENCH_RESULTS_DIR") or REPO / "bench" / "results")
PREFIX = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# --- statistics and output ---------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) with linear interpolation; NaN for no values.

    ``inf`` entries (runs that never happened) sort last, so a percentile that reaches them is inf.
    """
    if not values:
        return float("nan")
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    if xs[hi] == float("inf"):
        return xs[hi] if k > lo else xs[lo]
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True)
class Summary:
    n: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        finite = [v for v in values if v != float("inf")]
        mean = sum(finite) / len(finite) if finite else float("nan")
        return cls(
            n=len(values),
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            p99=percentile(values, 99),
            max=max(values) if values else float("nan"),
            mean=mean,
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "n": self.n,
            "p50": _jsonable(self.p50),
            "p90": _jsonable(self.p90),
            "p99": _jsonable(self.p99),
            "max": _jsonable(self.max),
            "mean": _jsonable(self.mean),
        }


def _jsonable(v: float) -> Any:
    if math.isnan(v):
        return None
    if v == float("inf"):
        return "inf"
    return round(v, 6)


def fmt_seconds(seconds: float) -> str:
    """A duration for a table: ms below 1 s, else seconds; ``never`` for inf, ``-`` for NaN."""
    if math.isnan(seconds):
        return "-"
    if seconds == float("inf"):
        return "never"
    if abs(seconds) < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.3f} s" if abs(seconds) < 10 else f"{seconds:.2f} s"


def fmt_num(x: float, digits: int = 0) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:,.{digits}f}"


def verdict(value: float, target: float, *, higher_is_better: bool = False) -> str:
    """PASS or MISS of ``value`` against ``target`` (NaN: no figure, so MISS)."""
    if math.isnan(value):
        return "MISS"
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "MISS"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Plain-text table with aligned columns (numbers and durations right-aligned)."""
    body = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in body:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            numeric = bool(c) and (c[0].isdigit() or c[0] in "-+<>~") and i > 0
            out.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), sep, *(line(r) for r in body)])


def machine_info() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    try:
        nats_version = subprocess.run(
            [find_nats_server(os.environ), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except Exception as e:  # informational only
        nats_version = f"unknown ({e})"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "source": os.environ.get("BENCH_SOURCE") or commit or str(REPO),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "nats_server": nats_version,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def save_results(name: str, payload: dict[str, Any], path: str | None = None) -> Path:
    """Write ``payload`` and machine info as JSON to ``path`` or bench/results/<name>-<ts>.json."""
    if path:
        out = Path(path)
    else:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        out = RESULTS_DIR / f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "machine": machine_info(), **payload}
    out.write_text(json.dumps(payload, indent=2, default=str))
    return out


# --- processes -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    rest = stat.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def rss_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes: resident memory now and its peak."""
    rss = hwm = 0
    with contextlib.suppress(OSError):
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("VmRSS:"):
                rss = int(ln.split()[1]) * 1024
            elif ln.startswith("VmHWM:"):
                hwm = int(ln.split()[1]) * 1024
    return rss, hwm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Layout:
    """How jobsched runs: ``inproc``, ``one`` (all roles, one child) or ``split`` (one per role)."""

    kind: str = "one"
    schedulers: int = 1
    workers: int = 1

    @classmethod
    def parse(cls, text: str) -> Layout:
        if text not in ("inproc", "one", "split"):
            raise ValueError(f"layout must be inproc, one or split, not {text!r}")
        return cls(kind=text)

    @property
    def label(self) -> str:
        if self.kind == "split" and (self.schedulers, self.workers) != (1, 1):
            return f"split {self.schedulers}s/{self.workers}w"
        return self.kind


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


NO_QUOTAS = {
    "JOBSCHED_QUOTA_ACTIVE_JOBS": "0",
    "JOBSCHED_QUOTA_MIN_INTERVAL_SECONDS": "0",
    "JOBSCHED_QUOTA_CREATES_PER_SECOND": "0",
    "JOBSCHED_QUOTA_RUNS_PER_MINUTE": "0",
}
"""Benchmarks measure one user ("bench") at full load: the per-user quotas are off unless a
benchmark's ``env`` sets them (README "Security model")."""


class Deployment:
    """A private nats-server plus jobsched in a :class:`Layout`, in a fresh temp dir.

    Use as ``async with Deployment(layout) as d:``; ``d.url`` is the gateway, ``d.token`` a bearer
    token, ``d.store_path`` the SQLite file, ``d.pids()`` the processes to measure.

    Args:
        layout: see :class:`Layout`.
        env: extra ``JOBSCHED_*`` settings.
        keep: keep the temp dir (logs, database) after the run.
        warmup: run one immediate noop job end to end before returning (proves every role works).
        seed: called after nats-server started and before jobsched starts (to fill the store).
        nats_monitor: nats-server also serves its monitoring endpoints (``d.nats.monitor_url``).
    """

    def __init__(
        self,
        layout: Layout,
        *,
        env: dict[str, str] | None = None,
        keep: bool = False,
        warmup: bool = True,
        name: str = "bench",
        seed: Callable[[Deployment], None] | None = None,
        nats_monitor: bool = False,
    ) -> None:
        self.layout = layout
        self.seed = seed
        self.extra_env = env or {}
        self.keep = keep
        self.warmup = warmup
        self.root = Path(tempfile.mkdtemp(prefix=f"jobsched-{name}-"))
        self.data_dir = self.root / "data"
        self.store_path = self.data_dir / "jobsched.db"
        self.secret = secrets.token_hex(32)
        self.nats = NatsServer(
            find_nats_server(os.environ),
            self.root / "nats",
            log_file=self.root / "nats.log",
            monitor=nats_monitor,
        )
        self.procs: list[Proc] = []
        self.url = ""
        self.nats_url = ""
        self.token = mint_token(self.secret, "bench", ttl=timedelta(hours=6))
        self._inproc_stop: asyncio.Event | None = None
        self._inproc_task: asyncio.Task[None] | None = None

    # environment of the children
    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSCHED_")}
        env.update(
            {
                "JOBSCHED_NATS_URL": self.nats_url,
                "JOBSCHED_DATA_DIR": str(self.data_dir),
                "JOBSCHED_STORE_URL": f"sqlite:///{self.store_path}",
                "JOBSCHED_AUTH_SECRET": self.secret,
                "JOBSCHED_SUBJECT_PREFIX": PREFIX,
                "JOBSCHED_HTTP_HOST": "127.0.0.1",
                "JOBSCHED_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                **NO_QUOTAS,
            }
        )
        env.update(self.extra_env)
        env.update(extra)
        return env

    def start_nats(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        self.nats_url = self.nats.start()
        return self.nats_url

    def spawn(self, name: str, args: list[str], **extra_env: str) -> Proc:
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, *args],
                env=self.env(**extra_env),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    async def __aenter__(self) -> Deployment:
        try:
            await self.start()
        except BaseException:
            await self.close(failed=True)
            raise
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.close(failed=exc is not None)

    async def start(self) -> None:
        self.start_nats()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.seed is not None:
            self.seed(self)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        lay = self.layout
        if lay.kind == "inproc":
            env = self.env(JOBSCHED_HTTP_PORT=str(port))
            settings = load_settings({k: v for k, v in env.items() if k.startswith("JOBSCHED_")})
            self._inproc_stop = asyncio.Event()
            self._inproc_task = asyncio.create_task(
                serve(
                    settings, Roles(gateway=True, scheduler=True, worker=True), self._inproc_stop
                ),
                name="bench-inproc-stack",
            )
        elif lay.kind == "one":
            self.spawn("stack", ["-m", "bench.stackproc"], JOBSCHED_HTTP_PORT=str(port))
        else:
            # The store's schema first, in this process: processes opening a fresh SQLite file at
            # once race in its migrations (two ALTER TABLE ... ADD COLUMN, one fails with
            # "duplicate column name"). Then the schedulers, the gateway and the workers.
            await create_schema(self.store_path)
            for i in range(lay.schedulers):
                self.spawn(f"scheduler{i + 1}", ["-m", "jobsched", "scheduler"])
            self.spawn("gateway", ["-m", "jobsched", "gateway"], JOBSCHED_HTTP_PORT=str(port))
            for i in range(lay.workers):
                self.spawn(
                    f"worker{i + 1}",
                    ["-m", "jobsched", "worker"],
                    JOBSCHED_WORKER_ID=f"worker{i + 1}",
                )
        await self.wait_ready()

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode}:\n{tail(p.log)}")
        if self._inproc_task is not None and self._inproc_task.done():
            self._inproc_task.result()
            raise RuntimeError("the in-process stack stopped")

    async def wait_ready(self, timeout_seconds: float = 60.0) -> None:
        """Until /readyz answers 200, every worker has a pull request waiting, and (optionally)
        a warm-up job ran end to end."""
        deadline = time.monotonic() + timeout_seconds
        async with aiohttp.ClientSession() as s:
            while True:
                self._check_alive()
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with s.get(self.url + "/readyz") as r:
                        if r.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise TimeoutError("the gateway did not become ready")
                await asyncio.sleep(0.1)
        await self._wait_workers(deadline)
        if self.warmup:
            await self.run_warmup(timeout_seconds=max(5.0, deadline - time.monotonic()))

    async def _wait_workers(self, deadline: float) -> None:
        import nats  # noqa: PLC0415

        want = self.layout.workers if self.layout.kind == "split" else 1
        nc = await nats.connect(self.nats_url)
        try:
            js = nc.jetstream()
            while True:
                self._check_alive()
                with contextlib.suppress(Exception):
                    info = await js.consumer_info(f"{PREFIX.upper()}_WORK", "workers-default")
                    if (info.num_waiting or 0) >= want:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{want} worker(s) did not start pulling")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    async def run_warmup(self, timeout_seconds: float = 30.0) -> None:
        async with aiohttp.ClientSession(headers=self.headers) as s:
            async with s.post(self.url + "/jobs", data=b'{"taskId": "noop"}') as r:
                body = await r.read()
                if r.status != 201:
                    raise RuntimeError(f"warm-up POST answered {r.status}: {body[:300]!r}")
                job_id = msgspec.json.decode(body, type=JobId).id
            deadline = time.monotonic() + timeout_seconds
            while time.monotonic() < deadline:
                self._check_alive()
                async with s.get(f"{self.url}/jobs/{job_id}") as r:
                    if (
                        msgspec.json.decode(await r.read(), type=JobStatusOnly).status
                        == "SUCCEEDED"
                    ):
                        return
                await asyncio.sleep(0.05)
        raise TimeoutError("the warm-up job did not succeed")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}

    def pids(self) -> dict[str, int]:
        """Processes to measure, by name (``bench`` = this process for ``inproc``)."""
        out = {p.name: p.pid for p in self.procs}
        if self.layout.kind == "inproc":
            out["bench (stack inside)"] = os.getpid()
        if self.nats.pid is not None:
            out["nats-server"] = self.nats.pid
        return out

    def python_pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.procs}

    async def close(self, *, failed: bool = False) -> None:
        if self._inproc_stop is not None and self._inproc_task is not None:
            self._inproc_stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(30):
                    await self._inproc_task
        # workers and gateway first, the scheduler last
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                await asyncio.to_thread(p.popen.wait, 20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.kill()
                p.popen.wait(10)
        if failed:
            for p in self.procs:
                print(f"--- {p.name} log ({p.log}) ---\n{tail(p.log)}", file=sys.stderr)
        self.nats.stop()
        if self.keep or failed:
            print(f"(kept {self.root})", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class CpuMeter:
    """CPU seconds of named processes between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._t0: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.wall = 0.0
        self._w0 = 0.0

    def start(self) -> None:
        self._w0 = time.monotonic()
        self._t0 = {n: cpu_seconds(p) for n, p in self.pids.items()}

    def stop(self) -> dict[str, float]:
        self.wall = time.monotonic() - self._w0
        self.used = {n: cpu_seconds(p) - self._t0[n] for n, p in self.pids.items()}
        return self.used


async def nats_message_counts(monitor_url: str) -> tuple[int, int]:
    """nats-server's ``in_msgs`` (received from clients: publishes, acks, pull requests) and
    ``out_msgs`` (sent to clients: deliveries, PubAcks, API replies) so far, from ``/varz``."""
    async with aiohttp.ClientSession() as http, http.get(monitor_url + "/varz") as resp:
        varz = await resp.json()
    return int(varz["in_msgs"]), int(varz["out_msgs"])


class MessageMeter:
    """NATS messages through a nats-server between :meth:`start` and :meth:`stop` (``/varz``
    deltas): ``in_msgs`` and ``out_msgs``, the server's counts of messages it received from and
    sent to clients. ``/varz`` is read over HTTP, so this needs a server with monitoring
    (``Deployment(nats_monitor=True)``)."""

    def __init__(self, monitor_url: str) -> None:
        self.monitor_url = monitor_url
        self._in0 = self._out0 = 0
        self.received = self.sent = 0

    async def start(self) -> None:
        self._in0, self._out0 = await nats_message_counts(self.monitor_url)

    async def stop(self) -> tuple[int, int]:
        """(received, sent) since :meth:`start`."""
        in1, out1 = await nats_message_counts(self.monitor_url)
        self.received, self.sent = in1 - self._in0, out1 - self._out0
        return self.received, self.sent


# --- HTTP load -----------------------------------------------------------------------------------


class JobId(msgspec.Struct):
    id: str


class JobStatusOnly(msgspec.Struct):
    id: str
    status: str


def iso_ms(t: datetime) -> str:
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def epoch_ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def once_body(at: datetime, task: str = "noop") -> bytes:
    return b'{"taskId":"%s","schedule":{"type":"once","executeAt":"%s"}}' % (
        task.encode(),
        iso_ms(at).encode(),
    )


def interval_body(every_seconds: float, task: str = "noop") -> bytes:
    return b'{"taskId":"%s","schedule":{"type":"interval","everySeconds":%s}}' % (
        task.encode(),
        repr(every_seconds).encode(),
    )


IMMEDIATE_BODY = b'{"taskId":"noop"}'


@dataclass
class SubmitResult:
    ids: list[str | None]
    latencies_seconds: list[float]
    errors: list[str] = field(default_factory=list)
    elapsed_seconds: float = 0.0
    started_wall: float = 0.0
    ended_wall: float = 0.0

    @property
    def ok(self) -> int:
        return sum(1 for i in self.ids if i is not None)

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed_seconds if self.elapsed_seconds > 0 else float("nan")


async def post_jobs(
    url: str,
    token: str,
    bodies: Sequence[bytes],
    *,
    concurrency: int = 50,
    spacing_seconds: float = 0.0,
) -> SubmitResult:
    """POST every body to /jobs with ``concurrency`` requests in flight; keeps order of ``bodies``.

    With ``spacing_seconds``, body i is not sent before ``start + i * spacing_seconds`` (paced
    submission).
    """
    ids: list[str | None] = [None] * len(bodies)
    lat: list[float] = [0.0] * len(bodies)
    errors: list[str] = []
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    next_i = 0
    start = 0.0
    decoder = msgspec.json.Decoder(JobId)

    async def one(s: aiohttp.ClientSession) -> None:
        nonlocal next_i
        while next_i < len(bodies):
            i = next_i
            next_i += 1
            if spacing_seconds:
                wait = start + i * spacing_seconds - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
            t0 = time.perf_counter()
            for attempt in range(3):
                try:
                    async with s.post(url + "/jobs", data=bodies[i]) as r:
                        data = await r.read()
                        if r.status == 201:
                            ids[i] = decoder.decode(data).id
                            break
                        errors.append(f"{r.status}: {data[:200]!r}")
                        if r.status != 503:
                            break
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    errors.append(f"{type(e).__name__}: {e}")
                await asyncio.sleep(0.1 * (attempt + 1))
            lat[i] = time.perf_counter() - t0

    conn = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=conn, headers=headers, timeout=timeout) as s:
        w0 = time.time()
        t0 = start = time.perf_counter()
        await asyncio.gather(*(one(s) for _ in range(min(concurrency, len(bodies)) or 1)))
        elapsed = time.perf_counter() - t0
    return SubmitResult(ids, lat, errors, elapsed, w0, time.time())


class WorkObserver:
    """Core-NATS subscription to ``<prefix>.work.>``: when each run message reached the server.

    JetStream forwards a stored message to core subscribers of its subject, so the arrival time
    here is when the publish reached the stream (plus a loopback hop), independent of the
    scheduler's ``publishedAt`` (which is taken when it starts dispatching a batch).
    """

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.seen: list[tuple[bytes, float]] = []
        self._nc: Any = None

    async def __aenter__(self) -> WorkObserver:
        import nats  # noqa: PLC0415

        self._nc = await nats.connect(self.nats_url, pending_size=256 * 1024 * 1024)
        seen = self.seen

        async def on_msg(msg: Any) -> None:
            seen.append((msg.data, time.time()))

        await self._nc.subscribe(
            f"{PREFIX}.work.>",
            cb=on_msg,
            pending_msgs_limit=10_000_000,
            pending_bytes_limit=1 << 30,
        )
        await self._nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._nc is not None:
            await self._nc.close()

    def arrivals_ms(self) -> dict[str, int]:
        """execution id -> first arrival (epoch ms)."""
        out: dict[str, int] = {}
        dec = msgspec.json.Decoder(_RunId)
        for data, t in self.seen:
            with contextlib.suppress(msgspec.DecodeError):
                eid = dec.decode(data).execution_id
                out.setdefault(eid, int(t * 1000))
        return out


class _RunId(msgspec.Struct, rename="camel"):
    execution_id: str


async def calibrate_submit_rate(d: Deployment, *, n: int = 1000, concurrency: int = 50) -> float:
    """POSTs per second of this deployment (jobs a year ahead, never run in the benchmark)."""
    far = datetime.now(UTC) + timedelta(days=365)
    res = await post_jobs(d.url, d.token, [once_body(far)] * n, concurrency=concurrency)
    return res.rate


async def create_schema(path: Path) -> None:
    """Open and close the SQLite store at ``path``: its tables and migrations, done once."""
    from store.sqlite import SqliteStore  # noqa: PLC0415

    store = SqliteStore(path)
    await store.open()
    await store.close()


def seed_jobs(path: Path, jobs: Sequence[Job]) -> None:
    """Insert ``jobs`` straight into a new SQLite store at ``path`` (the store's own schema and
    row mapping), before any jobsched process opens it."""
    from store.sqlite import JOB_INSERT, SCHEMA, job_row  # noqa: PLC0415

    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript("PRAGMA journal_mode=WAL;" + SCHEMA)
        conn.execute("BEGIN")
        conn.executemany(JOB_INSERT, [(*job_row(j), None) for j in jobs])
        conn.execute("COMMIT")
    finally:
        conn.close()


def noop_job(
    schedule: Schedule, *, created_at: datetime, next_run_at: datetime, partitions: int
) -> Job:
    """A scheduled ``noop`` job of the user ``bench`` with a new id, in its partition of
    ``partitions`` (as the gateway would store it)."""
    job_id = new_job_id()
    return Job(
        id=job_id,
        owner="bench",
        task_id="noop",
        schedule=schedule,
        status=JobStatus.SCHEDULED,
        partition=partition_of(job_id, partitions),
        created_at=created_at,
        updated_at=created_at,
        next_run_at=next_run_at,
    )


def interval_jobs(n: int, period_seconds: float, first_at: float, partitions: int) -> list[Job]:
    """``n`` interval noop jobs of ``period_seconds`` whose first runs are spread evenly over one
    period from epoch second ``first_at`` (each "created" one period before its first run)."""
    out = []
    schedule = IntervalSchedule(every_seconds=period_seconds)
    for i in range(n):
        first = datetime.fromtimestamp(first_at + i * period_seconds / n, UTC)
        first = first.replace(microsecond=first.microsecond - first.microsecond % 1000)
        created = first - timedelta(seconds=period_seconds)
        out.append(noop_job(schedule, created_at=created, next_run_at=first, partitions=partitions))
    return out


# --- store timestamps ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    job_id: str
    status: str
    scheduled_for: int
    published_at: int | None
    started_at: int | None
    finished_at: int | None


class StoreReader:
    """Read-only view of the SQLite store (stdlib sqlite3; epoch-ms columns)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)

    def close(self) -> None:
        self.conn.close()

    def runs(self, where: str = "1", params: Sequence[Any] = ()) -> list[Run]:
        rows = self.conn.execute(
            "SELECT id, job_id, status, scheduled_for, published_at, started_at, finished_at "
            f"FROM executions WHERE {where}",
            params,
        ).fetchall()
        return [Run(*r) for r in rows]

    def runs_of(self, job_ids: Sequence[str]) -> dict[str, Run]:
        out: dict[str, Run] = {}
        for i in range(0, len(job_ids), 500):
            chunk = list(job_ids[i : i + 500])
            marks = ", ".join("?" * len(chunk))
            for r in self.runs(f"job_id IN ({marks})", chunk):
                out[r.job_id] = r
        return out

    def count(self, where: str, params: Sequence[Any] = ()) -> int:
        return int(
            self.conn.execute(f"SELECT count(*) FROM executions WHERE {where}", params).fetchone()[
                0
            ]
        )

    def skipped_occurrences(self, where: str, params: Sequence[Any] = ()) -> int:
        """Occurrences recorded SKIPPED: one per record, or its ``missed.count``."""
        row = self.conn.execute(
            "SELECT coalesce(sum(coalesce(json_extract(CAST(extra AS TEXT), '$.missed.count'), 1)"
            f"), 0) FROM executions WHERE status = 'SKIPPED' AND {where}",
            params,
        ).fetchone()
        return int(row[0])

    def jobs_created(self, where: str = "1", params: Sequence[Any] = ()) -> list[int]:
        return [
            r[0] for r in self.conn.execute(f"SELECT created_at FROM jobs WHERE {where}", params)
        ]


def delays(runs: Iterable[Run], frm: str, to: str) -> list[float]:
    """Seconds from one timestamp of each run to another (inf where the second is missing)."""
    out = []
    for r in runs:
        a, b = getattr(r, frm), getattr(r, to)
        out.append(float("inf") if a is None or b is None else (b - a) / 1000.0)
    return out


async def wait_until_wall(t: float) -> None:
    """Sleep until wall-clock epoch second ``t``."""
    while True:
        left = t - time.time()
        if left <= 0:
            return
        await asyncio.sleep(min(left, 0.5))


def add_common_args(parser: Any) -> None:
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    parser.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="results file (default: bench/results/<name>-<time>.json)",
    )
    parser.add_argument("--no-save", action="store_true", help="do not write a results file")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="record each jobsched process with py-spy during the measured window into DIR "
        "(needs py-spy: --py-spy PATH or on PATH)",
    )
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "/tmp/prof/bin/py-spy")
    parser.add_argument(
        "--profile-idle",
        action="store_true",
        help="with --profile: also sample waiting threads (py-spy --idle), to see where time goes "
        "in a loop that waits rather than computes",
    )
    parser.add_argument(
        "--profile-native",
        action="store_true",
        help="with --profile: include C frames (py-spy --native), e.g. inside SQLite",
    )


class Profiler:
    """py-spy ``record`` of each Python process of a deployment for a fixed duration.

    Writes ``<dir>/<label>-<process>.txt`` in py-spy's raw (collapsed stacks) format, which
    ``python -m bench.profile_report`` summarises.
    """

    def __init__(
        self,
        py_spy: str,
        out_dir: str | None,
        label: str,
        *,
        idle: bool = False,
        native: bool = False,
    ) -> None:
        self.idle = idle
        self.native = native
        self.py_spy = py_spy
        self.out_dir = Path(out_dir) if out_dir else None
        self.label = label
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []

    def start(self, pids: dict[str, int], duration_seconds: float) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            if name == "nats-server":
                continue
            out = self.out_dir / f"{self.label}-{name}.txt".replace(" ", "_").replace("/", "_")
            self.files.append(out)
            cmd = [
                self.py_spy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(duration_seconds)),
            ]
            cmd += ["--rate", "100", "--format", "raw", "-o", str(out)]
            if self.idle:
                cmd.append("--idle")
            # native stacks need the process paused while sampled (py-spy refuses both)
            cmd.append("--native" if self.native else "--nonblocking")
            self.procs.append(
                subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )

    async def wait(self) -> None:
        for p in self.procs:
            try:
                await asyncio.to_thread(p.wait, 60)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.files:
            if f.exists():
                print(f"profile: {f}", file=sys.stderr)
