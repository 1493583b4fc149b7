"""Embedded store on SQLite (aiosqlite): the default of ``jobsched dev`` and single-node setups.

One database file in the data directory, in WAL mode (readers never block the writer) with
``synchronous=FULL`` so that a committed job survives a power loss. Several processes of one host
may share the file; writes are serialized by SQLite's lock (``busy_timeout``) and, inside a
process, by an asyncio lock around each write transaction.

Mutable job fields are columns so that the scheduler's compare-and-set and the recorder's
conditional transitions are single SQL statements; the immutable part of a job (task,
schedule, parameters, options) is one msgspec-JSON column.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from core.errors import Conflict, JobNotFound, StoreRejected, StoreUnavailable
from core.history import NEVER_RAN, observes_attempt, record_attempts
from core.model import (
    TERMINAL_EXECUTION_STATUSES,
    TERMINAL_RANK,
    Attempt,
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
    MisfirePolicy,
    Missed,
    Model,
    OverlapPolicy,
    Page,
    RunTrigger,
    Schedule,
    StatusEvent,
)
from core.ports import (
    UNCHANGED,
    Dispatch,
    DispatchOutcome,
    IdempotencyKeyReused,
    JobChange,
    JobQuery,
    JobSpec,
    JobStatusConflict,
    PruneResult,
    PruneTarget,
)
from core.timeutil import from_epoch_ms, to_epoch_ms
from core.values import storable_event
from store.cursor import decode_cursor, encode_cursor
from store.dispatching import advanced
from store.rows import RowReader

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    partition INTEGER NOT NULL,
    status TEXT NOT NULL,
    next_run_at INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    last_run_at INTEGER,
    last_run_status TEXT,
    last_error TEXT,
    last_execution_id TEXT,
    last_scheduled_for INTEGER,
    last_dispatched_for INTEGER,
    last_run_scheduled_for INTEGER,
    run_count INTEGER NOT NULL DEFAULT 0,
    spec BLOB NOT NULL,
    idempotency_key TEXT,
    request_hash TEXT
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (partition, next_run_at) WHERE next_run_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_owner_created ON jobs (owner, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_owner_status_created
    ON jobs (owner, status, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_owner_last_run_status_created
    ON jobs (owner, last_run_status, created_at DESC, id DESC);
CREATE TABLE IF NOT EXISTS executions (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    partition INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    status TEXT NOT NULL,
    state_rank INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    scheduled_for INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    published_at INTEGER,
    started_at INTEGER,
    finished_at INTEGER,
    next_attempt_at INTEGER,
    worker_id TEXT,
    error TEXT,
    result BLOB,
    dispatched_by TEXT,
    extra BLOB,
    attempts BLOB
);
CREATE INDEX IF NOT EXISTS executions_job ON executions (job_id, scheduled_for DESC, id DESC);
CREATE INDEX IF NOT EXISTS executions_owner_status
    ON executions (owner, status, scheduled_for DESC);
CREATE INDEX IF NOT EXISTS executions_open ON executions (partition, updated_at)
    WHERE status IN ('QUEUED', 'RUNNING', 'RETRYING');
CREATE INDEX IF NOT EXISTS executions_job_finished
    ON executions (job_id, finished_at DESC, id DESC) WHERE state_rank = 1000000;
CREATE INDEX IF NOT EXISTS jobs_partition ON jobs (partition, id);
CREATE TABLE IF NOT EXISTS dead_letters (
    id TEXT PRIMARY KEY,
    at INTEGER NOT NULL,
    source TEXT NOT NULL,
    reason TEXT NOT NULL,
    error TEXT NOT NULL,
    subject TEXT NOT NULL,
    size INTEGER NOT NULL,
    execution_id TEXT,
    job_id TEXT,
    owner TEXT,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS dead_letters_at ON dead_letters (at DESC, id DESC);
"""

MIGRATIONS = (
    ("executions", "dispatched_by", "TEXT"),
    ("executions", "extra", "BLOB"),
    ("jobs", "idempotency_key", "TEXT"),
    ("jobs", "request_hash", "TEXT"),
    ("jobs", "last_dispatched_for", "INTEGER"),
    ("executions", "attempts", "BLOB"),
)
INDEXES_AFTER_MIGRATIONS = """
CREATE UNIQUE INDEX IF NOT EXISTS jobs_owner_idempotency_key
    ON jobs (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;
"""
"""Columns added after a table's first release: (table, column, type), applied on open."""

JOB_COLUMNS = (
    "id, owner, partition, status, next_run_at, created_at, updated_at, last_run_at, "
    "last_run_status, last_error, last_execution_id, last_scheduled_for, run_count, spec, "
    "idempotency_key, last_dispatched_for"
)
JOB_INSERT = (
    f"INSERT INTO jobs ({JOB_COLUMNS}, request_hash) "
    f"VALUES ({', '.join('?' * (JOB_COLUMNS.count(',') + 2))})"
)
"""Inserts one job: the values of ``_job_row`` and then ``request_hash`` (None without a key)."""
EXECUTION_COLUMNS = (
    "id, job_id, owner, partition, task_id, queue, status, state_rank, attempt, max_attempts, "
    "scheduled_for, created_at, updated_at, published_at, started_at, finished_at, "
    "next_attempt_at, worker_id, error, result, dispatched_by, extra, attempts"
)
N_EXECUTION_COLUMNS = EXECUTION_COLUMNS.count(",") + 1

UPSERT_EVENT = f"""
INSERT INTO executions ({EXECUTION_COLUMNS}) VALUES ({", ".join("?" * N_EXECUTION_COLUMNS)})
ON CONFLICT(id) DO UPDATE SET
    status = excluded.status,
    state_rank = excluded.state_rank,
    attempt = excluded.attempt,
    updated_at = excluded.updated_at,
    published_at = COALESCE(executions.published_at, excluded.published_at),
    started_at = COALESCE(executions.started_at, excluded.started_at),
    finished_at = excluded.finished_at,
    next_attempt_at = excluded.next_attempt_at,
    worker_id = COALESCE(excluded.worker_id, executions.worker_id),
    error = CASE WHEN excluded.status = 'SUCCEEDED' THEN NULL
                 ELSE COALESCE(excluded.error, executions.error) END,
    result = excluded.result
WHERE excluded.state_rank > executions.state_rank
"""

JOB_SUMMARY = """
UPDATE jobs SET
    status = CASE
        WHEN status IN ('PAUSED', 'CANCELLED') THEN status
        WHEN :status IN ('RUNNING', 'RETRYING') THEN 'RUNNING'
        WHEN next_run_at IS NULL THEN :job_status
        ELSE 'SCHEDULED' END,
    last_run_at = COALESCE(
        (SELECT started_at FROM executions WHERE id = :execution_id), :started_at, last_run_at),
    last_run_status = CASE WHEN :terminal THEN :status ELSE last_run_status END,
    last_error = CASE WHEN :status = 'SUCCEEDED' THEN NULL
                      ELSE COALESCE((SELECT error FROM executions WHERE id = :execution_id),
                                    :error, last_error) END,
    last_execution_id = :execution_id,
    last_run_scheduled_for = :scheduled_for,
    updated_at = :now
WHERE id = :job_id
  AND (last_run_scheduled_for IS NULL OR last_run_scheduled_for <= :scheduled_for)
  AND EXISTS (SELECT 1 FROM executions
              WHERE id = :execution_id AND state_rank = :rank AND status = :status)
"""

FINISHED_BEYOND = """
SELECT id FROM executions
WHERE job_id = ? AND state_rank = 1000000
ORDER BY finished_at DESC, id DESC LIMIT ? OFFSET ?
"""
"""Finished runs of a job past its ``keep_last`` most recently finished (index
``executions_job_finished``; the literal rank lets SQLite use the partial index)."""

FINISHED_BEFORE = """
SELECT id FROM executions
WHERE job_id = ? AND state_rank = 1000000 AND finished_at < ? AND id IS NOT ?
ORDER BY finished_at LIMIT ?
"""
"""Finished runs of a job that ended before a time, oldest first, but the job's latest run."""
assert TERMINAL_RANK == 1_000_000, "the SQL of this module spells the terminal rank out"

ADVANCE = """
UPDATE jobs SET next_run_at = ?, last_scheduled_for = ?, run_count = run_count + 1, updated_at = ?,
    last_dispatched_for = CASE WHEN ? THEN ? ELSE last_dispatched_for END
WHERE id = ? AND next_run_at = ?
"""


class _Spec(Model, kw_only=True, frozen=True):
    """What a job does and when (the part users set), stored as one JSON column."""

    task_id: str
    schedule: Schedule
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    queue: str = "default"
    max_attempts: int = 3
    timeout_seconds: float = 300.0
    misfire_policy: MisfirePolicy = MisfirePolicy.RUN_ONCE
    misfire_grace_seconds: float = 60.0
    max_catch_up: int = 10
    overlap_policy: OverlapPolicy = OverlapPolicy.FORBID
    history_limit: int | None = None
    history_max_age_seconds: float | None = None


class _Extra(Model, kw_only=True, frozen=True):
    """Per-run facts that never change after the run is recorded, as one JSON column."""

    trigger: RunTrigger = RunTrigger.SCHEDULE
    jitter_ms: int = 0
    skip_reason: str | None = None
    missed: Missed | None = None


JOB_STATUS_AFTER = {
    ExecutionStatus.SUCCEEDED: JobStatus.SUCCEEDED,
    ExecutionStatus.FAILED: JobStatus.FAILED,
    ExecutionStatus.CANCELLED: JobStatus.CANCELLED,
    ExecutionStatus.SKIPPED: JobStatus.SUCCEEDED,
}
"""A job with no run left takes the status of its last run's outcome."""

_spec_encoder = msgspec.json.Encoder()
_spec_decoder = msgspec.json.Decoder(_Spec)
_extra_decoder = msgspec.json.Decoder(_Extra)
_attempts_decoder = msgspec.json.Decoder(list[Attempt])
_json_decoder = msgspec.json.Decoder()
_NO_EXTRA = _spec_encoder.encode(_Extra())


def _spec_of(job: Job | JobSpec) -> _Spec:
    return _Spec(
        task_id=job.task_id,
        schedule=job.schedule,
        parameters=dict(job.parameters),
        queue=job.queue,
        max_attempts=job.max_attempts,
        timeout_seconds=job.timeout_seconds,
        misfire_policy=job.misfire_policy,
        misfire_grace_seconds=job.misfire_grace_seconds,
        max_catch_up=job.max_catch_up,
        overlap_policy=job.overlap_policy,
        history_limit=job.history_limit,
        history_max_age_seconds=job.history_max_age_seconds,
    )


def _ms(t: datetime | None) -> int | None:
    return None if t is None else to_epoch_ms(t)


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else from_epoch_ms(ms)


def _job_from_row(row: sqlite3.Row) -> Job:
    spec = _spec_decoder.decode(row["spec"])
    return Job(
        id=row["id"],
        owner=row["owner"],
        task_id=spec.task_id,
        schedule=spec.schedule,
        parameters=spec.parameters,
        queue=spec.queue,
        max_attempts=spec.max_attempts,
        timeout_seconds=spec.timeout_seconds,
        misfire_policy=spec.misfire_policy,
        misfire_grace_seconds=spec.misfire_grace_seconds,
        max_catch_up=spec.max_catch_up,
        overlap_policy=spec.overlap_policy,
        history_limit=spec.history_limit,
        history_max_age_seconds=spec.history_max_age_seconds,
        status=JobStatus(row["status"]),
        partition=row["partition"],
        created_at=from_epoch_ms(row["created_at"]),
        updated_at=from_epoch_ms(row["updated_at"]),
        next_run_at=_dt(row["next_run_at"]),
        last_run_at=_dt(row["last_run_at"]),
        last_run_status=ExecutionStatus(row["last_run_status"]) if row["last_run_status"] else None,
        last_error=row["last_error"],
        last_execution_id=row["last_execution_id"],
        last_scheduled_for=_dt(row["last_scheduled_for"]),
        last_dispatched_for=_dt(row["last_dispatched_for"]),
        run_count=row["run_count"],
        idempotency_key=row["idempotency_key"],
    )


def _job_row(job: Job) -> tuple[Any, ...]:
    return (
        job.id,
        job.owner,
        job.partition,
        job.status.value,
        _ms(job.next_run_at),
        to_epoch_ms(job.created_at),
        to_epoch_ms(job.updated_at),
        _ms(job.last_run_at),
        job.last_run_status.value if job.last_run_status else None,
        job.last_error,
        job.last_execution_id,
        _ms(job.last_scheduled_for),
        job.run_count,
        _spec_encoder.encode(_spec_of(job)),
        job.idempotency_key,
        _ms(job.last_dispatched_for),
    )


def _execution_from_row(row: sqlite3.Row) -> Execution:
    extra = _extra_decoder.decode(row["extra"]) if row["extra"] else _Extra()
    return Execution(
        id=row["id"],
        job_id=row["job_id"],
        owner=row["owner"],
        partition=row["partition"],
        task_id=row["task_id"],
        queue=row["queue"],
        status=ExecutionStatus(row["status"]),
        state_rank=row["state_rank"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        scheduled_for=from_epoch_ms(row["scheduled_for"]),
        created_at=from_epoch_ms(row["created_at"]),
        updated_at=from_epoch_ms(row["updated_at"]),
        published_at=_dt(row["published_at"]),
        started_at=_dt(row["started_at"]),
        finished_at=_dt(row["finished_at"]),
        next_attempt_at=_dt(row["next_attempt_at"]),
        worker_id=row["worker_id"],
        error=row["error"],
        result=None if row["result"] is None else _json_decoder.decode(row["result"]),
        dispatched_by=row["dispatched_by"],
        trigger=extra.trigger,
        jitter_ms=extra.jitter_ms,
        skip_reason=extra.skip_reason,
        missed=extra.missed,
        attempts=_attempts_decoder.decode(row["attempts"]) if row["attempts"] else [],
    )


def _execution_row(e: Execution) -> tuple[Any, ...]:
    return (
        e.id,
        e.job_id,
        e.owner,
        e.partition,
        e.task_id,
        e.queue,
        e.status.value,
        e.state_rank,
        e.attempt,
        e.max_attempts,
        to_epoch_ms(e.scheduled_for),
        to_epoch_ms(e.created_at),
        to_epoch_ms(e.updated_at),
        _ms(e.published_at),
        _ms(e.started_at),
        _ms(e.finished_at),
        _ms(e.next_attempt_at),
        e.worker_id,
        e.error,
        None if e.result is None else msgspec.json.encode(e.result),
        e.dispatched_by,
        _spec_encoder.encode(
            _Extra(
                trigger=e.trigger,
                jitter_ms=e.jitter_ms,
                skip_reason=e.skip_reason,
                missed=e.missed,
            )
        ),
        _spec_encoder.encode(e.attempts) if e.attempts else None,
    )


def _event_row(ev: StatusEvent) -> tuple[Any, ...]:
    at = to_epoch_ms(ev.at)
    return (
        ev.execution_id,
        ev.job_id,
        ev.owner,
        ev.partition,
        ev.task_id,
        ev.queue,
        ev.status.value,
        ev.rank,
        ev.attempt,
        ev.max_attempts,
        to_epoch_ms(ev.scheduled_for),
        at,
        at,
        _ms(ev.published_at),
        _ms(ev.started_at),
        _ms(ev.finished_at),
        _ms(ev.next_attempt_at),
        ev.worker_id,
        ev.error,
        None if ev.result is None else msgspec.json.encode(ev.result),
        None,
        _NO_EXTRA,
        None,
    )


def _summary_params(ev: StatusEvent) -> dict[str, Any]:
    return {
        "status": ev.status.value,
        "job_status": JOB_STATUS_AFTER.get(ev.status, JobStatus.SCHEDULED).value,
        "started_at": _ms(ev.started_at),
        "terminal": ev.status in TERMINAL_EXECUTION_STATUSES,
        "error": ev.error,
        "execution_id": ev.execution_id,
        "scheduled_for": to_epoch_ms(ev.scheduled_for),
        "now": to_epoch_ms(ev.at),
        "job_id": ev.job_id,
        "rank": ev.rank,
    }


def _dead_letter_from_row(row: sqlite3.Row) -> DeadLetter:
    return DeadLetter(
        id=row["id"],
        at=from_epoch_ms(row["at"]),
        source=row["source"],
        reason=row["reason"],
        error=row["error"],
        subject=row["subject"],
        size=row["size"],
        execution_id=row["execution_id"],
        job_id=row["job_id"],
        owner=row["owner"],
        data=bytes(row["data"]),
    )


def path_from_url(url: str) -> Path:
    """The database file of a URL or a plain path.

    As SQLAlchemy spells it: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``.
    """
    return Path(url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url)


class SqliteStore:
    """:class:`core.ports.JobStore` on one SQLite file.

    Args:
        path: the database file; its directory is created if missing.
        busy_timeout_s: how long a write waits for another process's lock before the store
            reports :class:`StoreUnavailable` (seconds).
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = int(busy_timeout_s * 1000)
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = asyncio.Lock()
        self._create_lock = asyncio.Lock()
        self._creates: list[tuple[Job, asyncio.Future[None]]] = []
        self.rows = RowReader("sqlite")

    async def open(self) -> None:
        if self._writer is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = reader = None
        try:
            with _translated():
                writer = await self._connect()
                await writer.executescript(
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;" + SCHEMA
                )
                await self._migrate(writer)
                reader = await self._connect()
        except BaseException:
            for conn in (reader, writer):
                if conn is not None:
                    await conn.close()
            raise
        self._writer, self._reader = writer, reader

    @staticmethod
    async def _migrate(conn: aiosqlite.Connection) -> None:
        for table, column, kind in MIGRATIONS:
            columns = {r[1] for r in await conn.execute_fetchall(f"PRAGMA table_info({table})")}
            if column not in columns:
                await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        await conn.executescript(INDEXES_AFTER_MIGRATIONS)

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            await conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            await conn.execute("PRAGMA synchronous=FULL")
        except BaseException:
            await conn.close()
            raise
        return conn

    async def close(self) -> None:
        writer, reader, self._writer, self._reader = self._writer, self._reader, None, None
        for conn in (reader, writer):
            if conn is not None:
                await conn.close()

    @property
    def _w(self) -> aiosqlite.Connection:
        if self._writer is None:
            raise StoreUnavailable("the store is not open")
        return self._writer

    @property
    def _r(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise StoreUnavailable("the store is not open")
        return self._reader

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._write_lock:
            with _translated():
                conn = self._w
                await conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    await asyncio.shield(conn.rollback())
                    raise
                await conn.commit()

    async def _fetch(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> list[sqlite3.Row]:
        with _translated():
            return list(await self._r.execute_fetchall(sql, params))

    async def ping(self) -> None:
        await self._fetch("SELECT 1")

    async def create_job(self, job: Job, *, request_hash: str | None = None) -> Job:
        """Insert a job; concurrent calls share one transaction and one fsync (group commit).

        Each caller queues its job, then waits for the create lock; the first to get it inserts
        every job queued by then in one transaction and answers all their callers. So with N
        concurrent requests there are about N / (jobs per commit) fsyncs, not N.
        """
        if job.idempotency_key is not None:
            return await self._create_keyed(job, request_hash)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._creates.append((job, done))
        async with self._create_lock:
            if not done.done():
                batch, self._creates = self._creates, []
                try:
                    await self._insert_jobs(batch)
                finally:
                    for _, waiting in batch:  # the leader was cancelled mid-way: fail, never hang
                        if not waiting.done():
                            waiting.set_exception(StoreUnavailable("the insert was interrupted"))
        await done
        return job

    async def _insert_jobs(self, batch: list[tuple[Job, asyncio.Future[None]]]) -> None:
        try:
            async with self._transaction() as conn:
                await conn.executemany(JOB_INSERT, [(*_job_row(j), None) for j, _ in batch])
        except (sqlite3.IntegrityError, StoreRejected):
            for job, done in batch:  # a duplicate id or a job refused: each on its own
                try:
                    async with self._transaction() as conn:
                        await conn.execute(JOB_INSERT, (*_job_row(job), None))
                    done.set_result(None)
                except sqlite3.IntegrityError:
                    done.set_exception(Conflict(f"job {job.id} exists"))
                except (StoreUnavailable, StoreRejected) as e:
                    done.set_exception(e)
            return
        except StoreUnavailable as e:
            for _, done in batch:
                done.set_exception(e)
            return
        for _, done in batch:
            done.set_result(None)

    async def _create_keyed(self, job: Job, request_hash: str | None) -> Job:
        async with self._transaction() as conn:
            if job.idempotency_key is not None:
                rows = list(
                    await conn.execute_fetchall(
                        f"SELECT {JOB_COLUMNS}, request_hash FROM jobs "
                        "WHERE owner = ? AND idempotency_key = ?",
                        (job.owner, job.idempotency_key),
                    )
                )
                if rows:
                    raise IdempotencyKeyReused(
                        _job_from_row(rows[0]), same_request=rows[0]["request_hash"] == request_hash
                    )
            try:
                await conn.execute(JOB_INSERT, (*_job_row(job), request_hash))
            except sqlite3.IntegrityError:
                raise Conflict(f"job {job.id} exists") from None
        return job

    async def update_job(self, owner: str, job_id: str, change: JobChange, *, now: datetime) -> Job:
        async with self._transaction() as conn:
            rows = list(
                await conn.execute_fetchall(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND owner = ?", (job_id, owner)
                )
            )
            if not rows:
                raise JobNotFound(f"job {job_id} not found")
            current = _job_from_row(rows[0])
            if change.allowed_from is not None and current.status not in change.allowed_from:
                raise JobStatusConflict(job_id, current.status, change.action)
            sets, params = ["updated_at = ?"], [to_epoch_ms(now)]
            if change.status is not None:
                sets.append("status = ?")
                params.append(change.status.value)  # type: ignore[arg-type]
            if change.next_run_at is not UNCHANGED:
                assert change.next_run_at is None or isinstance(change.next_run_at, datetime)
                sets.append("next_run_at = ?")
                params.append(_ms(change.next_run_at))  # type: ignore[arg-type]
            if change.spec is not None:
                sets.append("spec = ?")
                params.append(_spec_encoder.encode(_spec_of(change.spec)))  # type: ignore[arg-type]
            await conn.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", [*params, job_id])
            rows = list(
                await conn.execute_fetchall(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
                )
            )
        return _job_from_row(rows[0])

    async def delete_job(self, owner: str, job_id: str) -> None:
        async with self._transaction() as conn:
            cur = await conn.execute("DELETE FROM jobs WHERE id = ? AND owner = ?", (job_id, owner))
            if cur.rowcount == 0:
                raise JobNotFound(f"job {job_id} not found")
            await conn.execute("DELETE FROM executions WHERE job_id = ?", (job_id,))

    async def insert_execution(self, execution: Execution) -> bool:
        async with self._transaction() as conn:
            cur = await conn.execute(
                f"INSERT OR IGNORE INTO executions ({EXECUTION_COLUMNS}) "
                f"VALUES ({', '.join('?' * N_EXECUTION_COLUMNS)})",
                _execution_row(execution),
            )
            return cur.rowcount == 1

    async def get_executions(self, execution_ids: Collection[str]) -> list[Execution]:
        ids = list(execution_ids)
        out: list[Execution] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            rows = await self._fetch(
                f"SELECT {EXECUTION_COLUMNS} FROM executions "
                f"WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            out.extend(self._runs(rows))
        return out

    async def get_job(self, owner: str, job_id: str) -> Job:
        rows = await self._fetch(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND owner = ?", (job_id, owner)
        )
        if not rows:
            raise JobNotFound(f"job {job_id} not found")
        return _job_from_row(rows[0])

    async def list_jobs(
        self, owner: str, query: JobQuery, *, limit: int, cursor: str | None
    ) -> Page[Job]:
        where, params = ["owner = ?"], [owner]
        if query.status is not None:
            where.append("status = ?")
            params.append(query.status.value)
        if query.last_run_status is not None:
            where.append("last_run_status = ?")
            params.append(query.last_run_status.value)
        if query.created_from is not None:
            where.append("created_at >= ?")
            params.append(to_epoch_ms(query.created_from))  # type: ignore[arg-type]
        if query.created_to is not None:
            where.append("created_at < ?")
            params.append(to_epoch_ms(query.created_to))  # type: ignore[arg-type]
        if cursor is not None:
            created_ms, last_id = decode_cursor(cursor)
            where.append("(created_at, id) < (?, ?)")
            params.extend([created_ms, last_id])  # type: ignore[list-item]
        rows = await self._fetch(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, id DESC LIMIT ?",
            [*params, limit + 1],
        )
        items = [_job_from_row(r) for r in rows[:limit]]
        more = len(rows) > limit
        nxt = encode_cursor(to_epoch_ms(items[-1].created_at), items[-1].id) if more else None
        return Page(items=items, next_cursor=nxt)

    async def list_executions(
        self, owner: str, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        await self.get_job(owner, job_id)
        where, params = ["job_id = ?"], [job_id]
        if cursor is not None:
            sf_ms, last_id = decode_cursor(cursor)
            where.append("(scheduled_for, id) < (?, ?)")
            params.extend([sf_ms, last_id])  # type: ignore[list-item]
        rows = await self._fetch(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE {' AND '.join(where)} "
            "ORDER BY scheduled_for DESC, id DESC LIMIT ?",
            [*params, limit + 1],
        )
        items = [_execution_from_row(r) for r in rows[:limit]]
        more = len(rows) > limit
        nxt = encode_cursor(to_epoch_ms(items[-1].scheduled_for), items[-1].id) if more else None
        return Page(items=items, next_cursor=nxt)

    async def get_execution(self, execution_id: str) -> Execution | None:
        rows = await self._fetch(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE id = ?", (execution_id,)
        )
        return _execution_from_row(rows[0]) if rows else None

    async def get_jobs(self, job_ids: Collection[str]) -> list[Job]:
        ids = list(job_ids)
        jobs: list[Job] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            rows = await self._fetch(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE id IN ({', '.join('?' * len(chunk))})", chunk
            )
            jobs.extend(self._jobs_of(rows))
        return jobs

    async def due_jobs(
        self, partitions: Collection[int], until: datetime, *, limit: int
    ) -> list[Job]:
        parts = sorted(partitions)
        if not parts:
            return []
        rows = await self._fetch(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE partition IN ({', '.join('?' * len(parts))}) "
            "AND next_run_at IS NOT NULL AND next_run_at <= ? ORDER BY next_run_at LIMIT ?",
            [*parts, to_epoch_ms(until), limit],
        )
        return self._jobs_of(rows)

    async def dispatch(self, runs: Sequence[Dispatch]) -> list[DispatchOutcome]:
        if not runs:
            return []
        async with self._transaction() as conn:
            now = to_epoch_ms(runs[0].execution.created_at)
            await conn.executemany(
                ADVANCE,
                [
                    (
                        _ms(d.next_run_at),
                        to_epoch_ms(d.execution.scheduled_for),
                        now,
                        d.execution.status == ExecutionStatus.QUEUED,
                        to_epoch_ms(d.execution.scheduled_for),
                        d.execution.job_id,
                        to_epoch_ms(d.expected_next_run_at),
                    )
                    for d in runs
                ],
            )
            advanced = await self._advanced(conn, runs)
            ids = [d.execution.id for d in runs]
            existing = {
                r[0]
                for r in await conn.execute_fetchall(
                    f"SELECT id FROM executions WHERE id IN ({', '.join('?' * len(ids))})", ids
                )
            }
            await conn.executemany(
                f"INSERT OR IGNORE INTO executions ({EXECUTION_COLUMNS}) "
                f"VALUES ({', '.join('?' * N_EXECUTION_COLUMNS)})",
                [_execution_row(d.execution) for d, ok in zip(runs, advanced, strict=True) if ok],
            )
        return [
            DispatchOutcome(created=ok and d.execution.id not in existing, advanced=ok)
            for d, ok in zip(runs, advanced, strict=True)
        ]

    @staticmethod
    async def _advanced(conn: aiosqlite.Connection, runs: Sequence[Dispatch]) -> list[bool]:
        """Which runs advanced their job (see :func:`store.dispatching.advanced`)."""
        ids = list({d.execution.job_id for d in runs})
        rows = await conn.execute_fetchall(
            f"SELECT id, last_scheduled_for, next_run_at FROM jobs WHERE id IN "
            f"({', '.join('?' * len(ids))})",
            ids,
        )
        return advanced(runs, {r[0]: (_dt(r[1]), _dt(r[2])) for r in rows})

    async def apply_events(self, events: Sequence[StatusEvent]) -> int:
        if not events:
            return 0
        events = [storable_event(ev) for ev in events]
        async with self._transaction() as conn:
            before = conn.total_changes
            await conn.executemany(UPSERT_EVENT, [_event_row(ev) for ev in events])
            changed = conn.total_changes - before
            # A job summary applies only if its event's rank is the run's rank now, so an event
            # overtaken by a later one of the same batch (RUNNING, then SUCCEEDED) is skipped.
            top: dict[str, int] = {}
            for ev in events:
                top[ev.execution_id] = max(top.get(ev.execution_id, -1), ev.rank)
            await conn.executemany(
                JOB_SUMMARY,
                [
                    _summary_params(ev)
                    for ev in events
                    if ev.status != ExecutionStatus.QUEUED and ev.rank == top[ev.execution_id]
                ],
            )
            await self._record_attempts(conn, events)
        return changed

    @staticmethod
    async def _record_attempts(conn: aiosqlite.Connection, events: Sequence[StatusEvent]) -> None:
        """Merge the events into their runs' attempt histories (inside the write transaction
        of :meth:`apply_events`, so no concurrent merge can interleave)."""
        by_run: dict[str, list[StatusEvent]] = {}
        for ev in events:
            if observes_attempt(ev):
                by_run.setdefault(ev.execution_id, []).append(ev)
        ids = list(by_run)
        updates: list[tuple[bytes, str]] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            rows = await conn.execute_fetchall(
                "SELECT id, attempts FROM executions "
                f"WHERE id IN ({', '.join('?' * len(chunk))}) AND status != ?",
                [*chunk, NEVER_RAN.value],
            )
            for run_id, raw in rows:
                stored = _stored_attempts(run_id, raw)
                history = record_attempts(stored, by_run[run_id])
                if history != stored:
                    updates.append((_spec_encoder.encode(history), run_id))
        await conn.executemany("UPDATE executions SET attempts = ? WHERE id = ?", updates)

    async def prune_executions(
        self, targets: Sequence[PruneTarget], *, limit: int
    ) -> list[PruneResult]:
        """See :meth:`core.ports.JobStore.prune_executions`.

        The runs to delete are found on the reader connection (a visit that finds nothing takes
        no write lock), then deleted in one write transaction (one fsync) with ``state_rank``
        checked again. Freed pages go to the file's free list and are reused by later inserts,
        so a steady insert-and-prune load keeps the file at its size.
        """
        plan: list[tuple[list[str], bool]] = []
        budget = limit
        for t in targets:
            doomed: list[str] = []
            complete = True
            if t.finished_before is not None and budget > 0:
                before = to_epoch_ms(t.finished_before)
                rows = await self._fetch(FINISHED_BEFORE, (t.job_id, before, t.keep_id, budget))
                doomed += [r[0] for r in rows]
                complete = len(rows) < budget
            elif t.finished_before is not None:
                complete = False
            left = budget - len(doomed)
            if t.keep_last is not None and complete:
                rows = await self._fetch(FINISHED_BEYOND, (t.job_id, max(left, 0), t.keep_last))
                doomed += [r[0] for r in rows if r[0] != t.keep_id]
                complete = len(rows) < left
            budget -= len(doomed)
            plan.append((doomed, complete))
        if not any(doomed for doomed, _ in plan):
            return [PruneResult(deleted=0, complete=complete) for _, complete in plan]
        results: list[PruneResult] = []
        async with self._transaction() as conn:
            for doomed, complete in plan:
                deleted = await _delete_finished(conn, doomed)
                results.append(PruneResult(deleted=deleted, complete=complete))
        return results

    async def partition_jobs(self, partition: int, *, after: str | None, limit: int) -> list[Job]:
        rows = await self._fetch(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE partition = ? AND id > ? ORDER BY id LIMIT ?",
            (partition, after or "", limit),
        )
        return self._jobs_of(rows)

    async def stale_executions(
        self,
        partitions: Collection[int],
        updated_before: datetime,
        *,
        limit: int,
        updated_after: datetime | None = None,
    ) -> list[Execution]:
        parts = sorted(partitions)
        if not parts:
            return []
        after = -(2**63) if updated_after is None else to_epoch_ms(updated_after)
        rows = await self._fetch(
            f"SELECT {EXECUTION_COLUMNS} FROM executions "
            "WHERE status IN ('QUEUED', 'RUNNING', 'RETRYING') "
            f"AND partition IN ({', '.join('?' * len(parts))}) AND updated_at < ? "
            "AND updated_at >= ? ORDER BY updated_at LIMIT ?",
            [*parts, to_epoch_ms(updated_before), after, limit],
        )
        return self._runs(rows)

    def _jobs_of(self, rows: Sequence[sqlite3.Row]) -> list[Job]:
        return self.rows.decode(rows, _job_from_row, what="job", key=lambda r: r["id"])

    def _runs(self, rows: Sequence[sqlite3.Row]) -> list[Execution]:
        return self.rows.decode(rows, _execution_from_row, what="execution", key=lambda r: r["id"])

    async def dead_letter(self, letters: Sequence[DeadLetter]) -> int:
        if not letters:
            return 0
        async with self._transaction() as conn:
            before = conn.total_changes
            await conn.executemany(
                "INSERT OR IGNORE INTO dead_letters (id, at, source, reason, error, subject, "
                "size, execution_id, job_id, owner, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        x.id,
                        to_epoch_ms(x.at),
                        x.source,
                        x.reason,
                        x.error,
                        x.subject,
                        x.size,
                        x.execution_id,
                        x.job_id,
                        x.owner,
                        x.data,
                    )
                    for x in letters
                ],
            )
            return conn.total_changes - before

    async def dead_letters(self, *, limit: int) -> list[DeadLetter]:
        rows = await self._fetch(
            "SELECT id, at, source, reason, error, subject, size, execution_id, job_id, owner, "
            "data FROM dead_letters ORDER BY at DESC, id DESC LIMIT ?",
            [limit],
        )
        return self.rows.decode(
            rows, _dead_letter_from_row, what="dead letter", key=lambda r: r["id"]
        )


def _stored_attempts(run_id: str, raw: bytes | None) -> list[Attempt]:
    """A run's stored attempts; an unreadable value (a newer version's, edited by hand) is
    logged and started anew, so it never stops the recorder."""
    if not raw:
        return []
    try:
        return _attempts_decoder.decode(raw)
    except msgspec.DecodeError as e:
        log.warning("sqlite: run %s has unreadable attempts (%s); recording them anew", run_id, e)
        return []


async def _delete_finished(conn: aiosqlite.Connection, ids: list[str]) -> int:
    """Delete executions by id if they are (still) finished; how many."""
    deleted = 0
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        cur = await conn.execute(
            f"DELETE FROM executions WHERE id IN ({', '.join('?' * len(chunk))}) "
            "AND state_rank = 1000000",
            chunk,
        )
        deleted += cur.rowcount
    return deleted


class _translated:
    """Context manager turning driver errors into the store's: a value SQLite cannot bind (an
    integer beyond 64 bits, a lone surrogate, a string or blob over SQLite's limit) into
    :class:`StoreRejected` (this write, for good); operational errors (locked, busy, I/O, disk
    full, a damaged file) into :class:`StoreUnavailable` (the store, for now). Constraint
    violations go through: the caller knows what a duplicate key means."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None or isinstance(exc, sqlite3.IntegrityError):
            return
        if isinstance(
            exc,
            OverflowError
            | UnicodeEncodeError
            | sqlite3.DataError
            | sqlite3.ProgrammingError
            | sqlite3.InterfaceError,
        ) and not _closed(exc):
            raise StoreRejected(
                f"the store refuses this write: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(exc, sqlite3.OperationalError | sqlite3.DatabaseError):
            log.warning("sqlite error: %s", exc)
            raise StoreUnavailable(f"the store cannot be used right now: {exc}") from exc
        if isinstance(exc, ValueError) and _closed(exc):
            raise StoreUnavailable("the store connection is closed") from exc


def _closed(exc: BaseException) -> bool:
    """A call on a closed connection (aiosqlite's ValueError, sqlite3's ProgrammingError)."""
    return "closed" in str(exc).lower()
