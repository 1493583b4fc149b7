"""A small jobsched cluster of real OS processes for fault-injection tests and bench/failover.py.

One nats-server (the test's own, so it can be restarted), one SQLite store file shared by every
process, the gateway in the test process, and scheduler / worker child processes
(``python -m jobsched scheduler|worker``) that can be SIGKILLed, SIGTERMed and restarted.
Results are read from the store: every execution records who dispatched it and when.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import nats
import nats.errors
import nats.js.errors

from bus.leases import live_keys
from core.settings import Settings
from core.timeutil import from_epoch_ms
from jobsched.client import JobschedClient
from jobsched.runtime import Roles
from store.sqlite import path_from_url
from tests.natsauth import observer_url
from tests.support import Child, env_for, start_stack


@dataclass(frozen=True)
class Run:
    id: str
    job_id: str
    partition: int
    status: str
    attempt: int
    scheduled_for: datetime
    published_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    dispatched_by: str | None
    worker_id: str | None


@dataclass
class Cluster:
    settings: Settings
    tmp: Path
    url: str = ""
    client: JobschedClient | None = None
    children: dict[str, Child] = field(default_factory=dict)

    def start(self, role: str, name: str) -> Child:
        """Start ``jobsched <role>`` as ``name`` (its scheduler or worker id)."""
        key = "JOBSCHED_SCHEDULER_ID" if role == "scheduler" else "JOBSCHED_WORKER_ID"
        child = Child([role], env_for(self.settings, **{key: name}), self.tmp / f"{name}.log")
        self.children[name] = child
        return child

    def kill(self, name: str) -> datetime:
        """SIGKILL ``name``; returns the instant just before the signal (UTC, aware)."""
        killed_at = now()
        self.children[name].kill()
        return killed_at

    def terminate(self, name: str, timeout_seconds: float = 30.0) -> int:
        return self.children[name].terminate(timeout_seconds)

    async def lease_owners(self) -> dict[int, str]:
        """Partition → owner, as the lease bucket shows now."""
        nc = await nats.connect(observer_url(self.settings.nats.url).split(","))
        try:
            try:
                kv = await nc.jetstream().key_value(f"{self.settings.nats.subject_prefix}_leases")
            except nats.js.errors.BucketNotFoundError:
                return {}
            keys = await live_keys(kv, timeout_seconds=5)
            owners: dict[int, str] = {}
            for key in keys:
                if key.startswith("p."):
                    try:
                        entry = await kv.get(key)
                    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                        continue
                    owners[int(key[2:])] = msgspec.json.decode(entry.value or b"{}").get(
                        "owner", ""
                    )
            return owners
        finally:
            await nc.close()

    async def wait_balanced(
        self, members: Iterable[str], timeout_seconds: float = 30.0
    ) -> dict[str, set[int]]:
        """Wait until every partition is leased and each of ``members`` holds its fair share."""
        wanted = set(members)
        n = self.settings.scheduler.partitions
        share = -(-n // len(wanted))
        by: dict[str, set[int]] = {}
        failed_listings = 0
        try:
            async with asyncio.timeout(timeout_seconds):
                while True:
                    try:
                        owners = await self.lease_owners()
                    except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                        owners = {}  # a NATS cluster still electing its leaders
                        failed_listings += 1
                    by = {m: set() for m in wanted}
                    for p, o in owners.items():
                        by.setdefault(o, set()).add(p)
                    if len(owners) == n and set(by) == wanted and all(share - 1 <= len(v) <= share for v in by.values()):  # fmt: skip
                        return by
                    await asyncio.sleep(0.1)
        except TimeoutError:
            held = {m: len(v) for m, v in by.items()}
            raise TimeoutError(
                f"leases not balanced among {sorted(wanted)} within {timeout_seconds:g} s: last seen "
                f"{held} of {n} partitions; {failed_listings} listings failed\n"
                + self.describe(wanted)
            ) from None

    def describe(self, names: Iterable[str], lines: int = 15) -> str:
        """Each child's state (running or its exit code) and the last ``lines`` of its log: what
        a failed wait prints, so a CI failure says what the processes were doing."""
        parts = []
        for name in sorted(names):
            child = self.children.get(name)
            if child is None:
                parts.append(f"--- {name}: not started")
                continue
            code = child.proc.poll()
            state = "running" if code is None else f"exited with {code}"
            tail = "\n".join(child.output().splitlines()[-lines:])
            parts.append(f"--- {name} ({state}), last {lines} log lines:\n{tail}")
        return "\n".join(parts)

    def runs(self) -> list[Run]:
        """Every execution in the store (read-only connection to the SQLite file)."""
        path = path_from_url(self.settings.resolved_store_url)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT id, job_id, partition, status, attempt, scheduled_for, published_at, "
                "started_at, finished_at, dispatched_by, worker_id FROM executions"
            ).fetchall()
        finally:
            conn.close()

        def dt(ms: int | None) -> datetime | None:
            return None if ms is None else from_epoch_ms(ms)

        return [
            Run(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                from_epoch_ms(r[5]),
                dt(r[6]),
                dt(r[7]),
                dt(r[8]),
                r[9],
                r[10],
            )
            for r in rows
        ]

    async def create_once_jobs(
        self, count: int, first_due: datetime, spread_seconds: float
    ) -> list[str]:
        """``count`` noop once jobs due evenly over ``spread_seconds`` seconds from ``first_due``."""
        assert self.client is not None
        step = spread_seconds / max(1, count - 1)
        ids = []
        for i in range(count):
            due = first_due + timedelta(seconds=i * step)
            job = await self.client.create_job(
                {"taskId": "noop", "schedule": {"type": "once", "executeAt": due.isoformat()}}
            )
            ids.append(job.id)
        return ids

    async def wait_succeeded(self, job_ids: Iterable[str], timeout_seconds: float) -> list[Run]:
        """Wait until every job has a SUCCEEDED run; return all runs of those jobs."""
        wanted = set(job_ids)
        runs: list[Run] = []
        try:
            async with asyncio.timeout(timeout_seconds):
                while True:
                    runs = [r for r in self.runs() if r.job_id in wanted]
                    if {r.job_id for r in runs if r.status == "SUCCEEDED"} >= wanted:
                        return runs
                    await asyncio.sleep(0.2)
        except TimeoutError:
            done = {r.job_id for r in runs if r.status == "SUCCEEDED"}
            statuses = Counter(r.status for r in runs)
            raise TimeoutError(
                f"{len(wanted - done)} of {len(wanted)} jobs not SUCCEEDED after {timeout_seconds} s;"
                f" their {len(runs)} runs by status: {dict(sorted(statuses.items()))}\n"
                + self.describe(self.children)
            ) from None


@asynccontextmanager
async def cluster(settings: Settings, tmp: Path) -> AsyncIterator[Cluster]:
    """A gateway in this process; start schedulers and workers with :meth:`Cluster.start`."""
    c = Cluster(settings, tmp)
    try:
        async with start_stack(settings, Roles(gateway=True)) as stack:
            c.url = stack.url
            c.client = stack.client()
            yield c
    finally:
        for child in c.children.values():
            child.close()


def lost_and_duplicates(job_ids: Iterable[str], runs: list[Run]) -> tuple[int, int]:
    """(jobs without a SUCCEEDED run, extra executions beyond one per once job)."""
    wanted = set(job_ids)
    succeeded = {r.job_id for r in runs if r.status == "SUCCEEDED"}
    per_job: dict[str, int] = {}
    for r in runs:
        per_job[r.job_id] = per_job.get(r.job_id, 0) + 1
    return len(wanted - succeeded), sum(n - 1 for n in per_job.values())


def failover_seconds(runs: list[Run], dead: str, killed_at: datetime) -> float:
    """Seconds from the last run ``dead`` published before ``killed_at`` to the first run of
    its partitions published after it (by whichever scheduler took them over, including runs
    ``dead`` had recorded as QUEUED but not published, which the new owner re-dispatches and
    which keep ``dispatched_by=dead``)."""
    dead_runs = [r for r in runs if r.dispatched_by == dead and r.published_at]
    dead_parts = {r.partition for r in dead_runs}
    last_dead = max(
        r.published_at for r in dead_runs if r.published_at and r.published_at <= killed_at
    )
    taken = [
        r.published_at
        for r in runs
        if r.partition in dead_parts and r.published_at and r.published_at > killed_at
    ]
    return (min(taken) - last_dead).total_seconds()


def now() -> datetime:
    return datetime.now(UTC)
