"""The SQLite store itself: connections, transactions, group commits, and the port's methods.

See :mod:`store.sqlite` for its durability and locking; :mod:`store.sqlite.schema` for the
tables and statements, :mod:`store.sqlite.rows` for the row mapping.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from core.audit import AuditEntry, AuditQuery, AuditRecord, audit_record
from core.cluster import InFlightRun
from core.errors import Conflict, JobNotFound, NameTaken, StoreRejected, StoreUnavailable
from core.heatmap import ScheduledGroup
from core.history import NEVER_RAN, observes_attempt, record_attempts
from core.model import DeadLetter, Execution, ExecutionStatus, Job, JobStatus, Page, StatusEvent
from core.ports import (
    UNCHANGED,
    AnyDispatch,
    Dispatch,
    DispatchOutcome,
    DueJob,
    IdempotencyKeyReused,
    JobChange,
    JobQuery,
    JobStatusConflict,
    ManualDispatch,
    PruneResult,
    PruneTarget,
)
from core.quotas import Bucket, TokenRequest, take_all
from core.stats import RunStats
from core.timeutil import from_epoch_ms, to_epoch_ms
from core.values import storable_event
from store.dispatching import JobState, ReplayGuard, advanced, sole_originals
from store.pages import Keyset
from store.rows import RowReader
from store.sqlite.notifications import NOTIFICATION_SCHEMA, SqliteNotifications
from store.sqlite.rows import (
    attempts_column,
    audit_from_row,
    audit_row,
    dead_letter_from_row,
    dead_letter_row,
    epoch_ms,
    event_row,
    execution_from_row,
    execution_row,
    instant,
    job_from_row,
    job_row,
    label_rows,
    spec_column,
    stored_attempts,
    summary_params,
)
from store.sqlite.runs import RUNS_SCHEMA, SqliteRuns
from store.sqlite.schema import (
    ADVANCE,
    AUDIT_INSERT,
    COUNT_RUN,
    DEAD_LETTER_INSERT,
    EXECUTION_COLUMNS,
    EXECUTION_INSERT,
    FINISHED_BEFORE,
    FINISHED_BEYOND,
    INDEXES_AFTER_MIGRATIONS,
    JOB_COLUMNS,
    JOB_INSERT,
    JOB_SUMMARY,
    LABEL_INSERT,
    LABELS_BACKFILL,
    LABELS_DELETE,
    LABELS_JOIN,
    LABELS_SCHEMA,
    MIGRATION_FILLS,
    MIGRATIONS,
    REPLAYS_OF,
    SCHEMA,
    TENANCY_SCHEMA,
    UPSERT_EVENT,
    in_chunks,
)
from store.sqlite.stats import STATS_SCHEMA, run_stats, running_runs, scheduled_groups

log = logging.getLogger(__name__)
T = TypeVar("T")


def path_from_url(url: str) -> Path:
    """The database file of a URL or a plain path.

    As SQLAlchemy spells it: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``.
    """
    return Path(url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url)


class SqliteStore(SqliteNotifications, SqliteRuns):
    """:class:`core.ports.JobStore` on one SQLite file.

    Args:
        path: the database file; its directory is created if missing.
        busy_timeout_seconds: how long a write waits for another process's lock before the store
            reports :class:`StoreUnavailable` (seconds).
    """

    def __init__(self, path: str | Path, *, busy_timeout_seconds: float = 5.0) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = int(busy_timeout_seconds * 1000)
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = asyncio.Lock()
        self._create_lock = asyncio.Lock()
        self._creates: list[tuple[Job, asyncio.Future[None]]] = []
        self.rows = RowReader("sqlite")
        self._create_audits: dict[str, AuditEntry] = {}
        self._take_lock = asyncio.Lock()
        self._takes: list[tuple[list[TokenRequest], datetime, asyncio.Future[list[float]]]] = []

    async def open(self) -> None:
        if self._writer is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = reader = None
        try:
            with _translated():
                writer = await self._connect()
                await self._wal(writer)
                await self._create_schema(writer)
                reader = await self._connect()
        except BaseException:
            for conn in (reader, writer):
                if conn is not None:
                    await conn.close()
            raise
        self._writer, self._reader = writer, reader

    async def _wal(self, conn: aiosqlite.Connection) -> None:
        """Switch the file to WAL (once per file; a no-op after). The switch takes an exclusive
        lock and SQLite calls no busy handler for it: another process opening the same new file
        at that moment makes it fail with "database is locked", so it is retried, within the
        busy timeout."""
        deadline = asyncio.get_running_loop().time() + self._busy_timeout_ms / 1000
        delay = 0.005
        while True:
            try:
                await conn.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or asyncio.get_running_loop().time() >= deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    @classmethod
    async def _create_schema(cls, conn: aiosqlite.Connection) -> None:
        """Create the tables and indexes and migrate an older database, as one transaction under
        SQLite's write lock (``BEGIN IMMEDIATE``): processes opening a new file at the same time
        (compose's services, ``jobsched dev`` and a CLI) wait for each other within the busy
        timeout instead of racing between a column check and its ``ALTER TABLE``.

        The scripts run statement by statement: ``executescript`` would commit first."""
        await conn.execute("BEGIN IMMEDIATE")
        try:
            await cls._script(conn, SCHEMA)
            await cls._migrate(conn)
            for script in (TENANCY_SCHEMA, NOTIFICATION_SCHEMA, RUNS_SCHEMA, STATS_SCHEMA):
                await cls._script(conn, script)
        except BaseException:
            await conn.rollback()
            raise
        await conn.commit()

    @staticmethod
    async def _script(conn: aiosqlite.Connection, script: str) -> None:
        """Each complete SQL statement of ``script`` (triggers included: ``sqlite3``'s own
        statement splitter), in the open transaction."""
        statement = ""
        for part in script.split(";"):
            statement += part + ";"
            if sqlite3.complete_statement(statement):
                if statement.strip(" \t\n;"):
                    await conn.execute(statement)
                statement = ""
        if statement.strip(" \t\n;"):
            raise ValueError(f"incomplete SQL statement in a schema script: {statement!r}")

    @classmethod
    async def _migrate(cls, conn: aiosqlite.Connection) -> None:
        for table, column, kind in MIGRATIONS:
            info = await conn.execute_fetchall(f"PRAGMA table_xinfo({table})")  # generated too
            if column not in {r[1] for r in info}:
                await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                fill = MIGRATION_FILLS.get((table, column))
                if fill is not None:
                    await conn.execute(fill)
        await cls._script(conn, INDEXES_AFTER_MIGRATIONS)
        had_labels = await conn.execute_fetchall(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'job_labels'"
        )
        await cls._script(conn, LABELS_SCHEMA)
        if not had_labels:
            await conn.execute(LABELS_BACKFILL)

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

    async def _in_one_hop(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work(db)`` inside ``BEGIN IMMEDIATE`` … ``COMMIT`` on the writer's thread, in one
        hand-off to that thread instead of one per statement (each costs a queue put, a
        thread wake-up and a loop wake-up: at a few runs per batch, more than the SQL).

        ``work`` runs on the writer's thread: it must only touch ``db`` and its arguments. It
        is rolled back if ``work`` raises. A caller cancelled while it runs does not stop it:
        the transaction still commits or rolls back before the thread takes the next one.
        """
        async with self._write_lock:
            with _translated():
                conn = self._w
                run: Callable[..., Awaitable[T]] = conn._execute  # one hop (aiosqlite's queue)
                return await run(_transact, conn._conn, work)

    @asynccontextmanager
    async def _light_transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """A write transaction committed without waiting for an fsync (``synchronous=NORMAL``
        for this transaction only): it survives a crash of the process, and a power loss once
        the next durable commit (or checkpoint) has synced the log after it."""
        async with self._write_lock:
            with _translated():
                conn = self._w
                await conn.execute("PRAGMA synchronous=NORMAL")
                try:
                    await conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield conn
                    except BaseException:
                        await asyncio.shield(conn.rollback())
                        raise
                    await conn.commit()
                finally:
                    await asyncio.shield(_set_synchronous_full(conn))

    async def _fetch(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> list[sqlite3.Row]:
        with _translated():
            return list(await self._r.execute_fetchall(sql, params))

    async def _fetch_page(
        self,
        select: str,
        where: list[str],
        params: list[Any],
        page: Keyset,
        sort: str,
        tie: str = "id",
    ) -> list[sqlite3.Row]:
        """The rows of one page of ``select … WHERE where``, newest first by ``(sort, tie)``:
        those before the page's cursor, one more than it holds (see :class:`Keyset`)."""
        if page.after is not None:
            where = [*where, f"({sort}, {tie}) < (?, ?)"]
            params = [*params, *page.after]
        return await self._fetch(
            f"{select} WHERE {' AND '.join(where) or '1'} ORDER BY {sort} DESC, {tie} DESC LIMIT ?",
            [*params, page.fetch],
        )

    async def ping(self) -> None:
        await self._fetch("SELECT 1")

    async def create_job(
        self, job: Job, *, request_hash: str | None = None, audit: AuditEntry | None = None
    ) -> Job:
        """Insert a job; concurrent calls share one transaction and one fsync (group commit).

        Each caller queues its job, then waits for the create lock; the first to get it inserts
        every job queued by then in one transaction and answers all their callers. So with N
        concurrent requests there are about N / (jobs per commit) fsyncs, not N. The audit
        record of each job is inserted in the same transaction as the job.
        """
        if job.idempotency_key is not None:
            return await self._create_keyed(job, request_hash, audit)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if audit is not None:
            self._create_audits[job.id] = audit
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
        audits = [self._create_audits.pop(j.id, None) for j, _ in batch]
        created = [(e, j) for (j, _), e in zip(batch, audits, strict=True) if e is not None]
        try:
            async with self._transaction() as conn:
                await conn.executemany(JOB_INSERT, [(*job_row(j), None) for j, _ in batch])
                await conn.executemany(LABEL_INSERT, [r for j, _ in batch for r in label_rows(j)])
                await _insert_audit(conn, [audit_record(e, None, j) for e, j in created])
        except (sqlite3.IntegrityError, StoreRejected):
            for (job, done), entry in zip(batch, audits, strict=True):  # a duplicate id or a
                try:  # job refused: each on its own
                    async with self._transaction() as conn:
                        await conn.execute(JOB_INSERT, (*job_row(job), None))
                        await conn.executemany(LABEL_INSERT, label_rows(job))
                        if entry is not None:
                            await _insert_audit(conn, [audit_record(entry, None, job)])
                    done.set_result(None)
                except sqlite3.IntegrityError as e:
                    done.set_exception(_insert_conflict(job, e))
                except (StoreUnavailable, StoreRejected) as e:
                    done.set_exception(e)
            return
        except StoreUnavailable as e:
            for _, done in batch:
                done.set_exception(e)
            return
        for _, done in batch:
            done.set_result(None)

    async def _create_keyed(
        self, job: Job, request_hash: str | None, audit: AuditEntry | None
    ) -> Job:
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
                        job_from_row(rows[0]), same_request=rows[0]["request_hash"] == request_hash
                    )
            try:
                await conn.execute(JOB_INSERT, (*job_row(job), request_hash))
            except sqlite3.IntegrityError as e:
                raise _insert_conflict(job, e) from None
            await conn.executemany(LABEL_INSERT, label_rows(job))
            if audit is not None:
                await _insert_audit(conn, [audit_record(audit, None, job)])
        return job

    async def update_job(
        self,
        owner: str,
        job_id: str,
        change: JobChange,
        *,
        now: datetime,
        audit: AuditEntry | None = None,
    ) -> Job:
        async with self._transaction() as conn:
            rows = list(
                await conn.execute_fetchall(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND owner = ?", (job_id, owner)
                )
            )
            if not rows:
                raise JobNotFound(f"job {job_id} not found")
            current = job_from_row(rows[0])
            if change.allowed_from is not None and current.status not in change.allowed_from:
                raise JobStatusConflict(job_id, current.status, change.action)
            sets = ["updated_at = ?"]
            params: list[Any] = [to_epoch_ms(now)]
            if change.status is not None:
                sets.append("status = ?")
                params.append(change.status.value)
            if change.next_run_at is not UNCHANGED:
                assert change.next_run_at is None or isinstance(change.next_run_at, datetime)
                sets.append("next_run_at = ?")
                params.append(epoch_ms(change.next_run_at))
            if change.spec is not None:
                sets.append("spec = ?")
                params.append(spec_column(change.spec))
            try:
                await conn.execute(
                    f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", [*params, job_id]
                )
            except sqlite3.IntegrityError as e:
                if change.spec is not None and change.spec.name and _name_taken(e):
                    raise NameTaken(change.spec.name) from None
                raise
            if change.spec is not None and (change.spec.labels or current.labels):
                await conn.execute(LABELS_DELETE, (job_id,))
                await conn.executemany(LABEL_INSERT, label_rows(current, change.spec.labels))
            rows = list(
                await conn.execute_fetchall(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
                )
            )
            after = job_from_row(rows[0])
            if audit is not None:
                await _insert_audit(conn, [audit_record(audit, current, after)])
        return after

    async def delete_job(self, owner: str, job_id: str, *, audit: AuditEntry | None = None) -> None:
        async with self._transaction() as conn:
            cur = await conn.execute("DELETE FROM jobs WHERE id = ? AND owner = ?", (job_id, owner))
            if cur.rowcount == 0:
                raise JobNotFound(f"job {job_id} not found")
            await conn.execute(
                "DELETE FROM notification_attempts WHERE execution_id IN "
                "(SELECT id FROM executions WHERE job_id = ?)",
                (job_id,),
            )
            await conn.execute("DELETE FROM executions WHERE job_id = ?", (job_id,))
            await conn.execute(LABELS_DELETE, (job_id,))
            if audit is not None:
                await _insert_audit(conn, [audit_record(audit, None, None)])

    async def insert_execution(
        self, execution: Execution, *, audit: AuditEntry | None = None
    ) -> bool:
        async with self._transaction() as conn:
            cur = await conn.execute(EXECUTION_INSERT, execution_row(execution))
            if cur.rowcount == 1 and audit is not None:
                await _insert_audit(conn, [audit_record(audit, None, None)])
            return cur.rowcount == 1

    async def get_executions(self, execution_ids: Collection[str]) -> list[Execution]:
        out: list[Execution] = []
        for marks, chunk in in_chunks(list(execution_ids)):
            rows = await self._fetch(
                f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE id IN ({marks})", chunk
            )
            out.extend(self._runs(rows))
        return out

    async def get_job(self, owner: str, job_id: str) -> Job:
        rows = await self._fetch(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND owner = ?", (job_id, owner)
        )
        if not rows:
            raise JobNotFound(f"job {job_id} not found")
        return job_from_row(rows[0])

    async def list_jobs(
        self, owner: str | None, query: JobQuery, *, limit: int, cursor: str | None
    ) -> Page[Job]:
        where: list[str] = [] if owner is None else ["owner = ?"]
        params: list[Any] = [] if owner is None else [owner]
        if query.status is not None:
            where.append("status = ?")
            params.append(query.status.value)
        if query.last_run_status is not None:
            where.append("last_run_status = ?")
            params.append(query.last_run_status.value)
        if query.created_from is not None:
            where.append("created_at >= ?")
            params.append(to_epoch_ms(query.created_from))
        if query.created_to is not None:
            where.append("created_at < ?")
            params.append(to_epoch_ms(query.created_to))
        if query.task_id is not None:
            where.append("task_id = ?")
            params.append(query.task_id)
        if query.name is not None:
            where.append("name = ?")
            params.append(query.name)
        if query.idempotency_key is not None:  # implies the partial index's IS NOT NULL
            where.append("idempotency_key = ?")
            params.append(query.idempotency_key)
        clauses = query.labels.clauses() if query.labels else []
        driving = next((c for c in clauses if not c.negated and len(c.terms) == 1), None)
        select, sort, tie = f"SELECT {JOB_COLUMNS} FROM jobs", "created_at", "id"
        if driving is not None:  # walk the label index in the listing's order (LABELS_SCHEMA)
            clauses.remove(driving)
            select, sort, tie = f"{select} {LABELS_JOIN}", "job_created_at", "job_id"
            where.append("term = ?")
            params.append(driving.terms[0])
            if owner is not None:
                where.append("job_owner = ?")
                params.append(owner)
        for clause in clauses:  # probes of the primary key (job_id, term), row by row
            where.append(
                f"{'NOT ' if clause.negated else ''}EXISTS (SELECT 1 FROM job_labels AS t "
                f"WHERE t.job_id = jobs.id AND t.term IN ({', '.join('?' * len(clause.terms))}))"
            )
            params.extend(clause.terms)
        page = Keyset.of(limit, cursor)
        rows = await self._fetch_page(select, where, params, page, sort, tie)
        return page.page(rows, job_from_row, lambda j: (j.created_at, j.id))

    async def list_executions(
        self, owner: str, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        await self.get_job(owner, job_id)
        page = Keyset.of(limit, cursor)
        rows = await self._fetch_page(
            f"SELECT {EXECUTION_COLUMNS} FROM executions",
            ["job_id = ?"],
            [job_id],
            page,
            "scheduled_for",
        )
        return page.page(rows, execution_from_row, lambda e: (e.scheduled_for, e.id))

    async def get_execution(self, execution_id: str) -> Execution | None:
        rows = await self._fetch(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE id = ?", (execution_id,)
        )
        return execution_from_row(rows[0]) if rows else None

    async def get_jobs(self, job_ids: Collection[str]) -> list[Job]:
        jobs: list[Job] = []
        for marks, chunk in in_chunks(list(job_ids)):
            rows = await self._fetch(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id IN ({marks})", chunk)
            jobs.extend(self._jobs_of(rows))
        return jobs

    async def due_jobs(
        self, partitions: Collection[int], until: datetime, *, limit: int
    ) -> list[DueJob]:
        """See :meth:`core.ports.JobStore.due_jobs`: read from the covering index
        ``jobs_due_id`` (no job row, no spec to decode). The rows are sorted here when all of
        them fit in ``limit``, the usual case: SQLite's sort of a large answer costs three times
        the read (measured with 100,000 due jobs, ``bench/README.md``); only a backlog larger
        than ``limit`` is read again, sorted by SQLite."""
        parts = sorted(partitions)
        if not parts or limit < 1:
            return []
        select = (
            "SELECT next_run_at, id, partition FROM jobs "
            f"WHERE partition IN ({', '.join('?' * len(parts))}) "
            "AND next_run_at IS NOT NULL AND next_run_at <= ?"
        )
        params = [*parts, to_epoch_ms(until)]
        rows = await self._fetch(f"{select} LIMIT ?", [*params, limit + 1])
        if len(rows) > limit:
            rows = await self._fetch(f"{select} ORDER BY next_run_at LIMIT ?", [*params, limit])
        else:
            rows.sort(key=itemgetter(0))
        return [DueJob(job_id, from_epoch_ms(ms), partition) for ms, job_id, partition in rows]

    async def dispatch(self, runs: Sequence[AnyDispatch]) -> list[DispatchOutcome]:
        """See :meth:`core.ports.JobStore.dispatch`: one transaction, one thread hand-off.

        Each compare-and-set's own row count says whether it matched, so the jobs are not read
        back: a job's state after the batch is the target of its last compare-and-set that
        matched. Only a job none of whose compare-and-sets matched (another scheduler, or an
        earlier try of this batch that committed, advanced it) is read, to see whether it
        points past the run anyway (:func:`store.dispatching.advanced`). A
        :class:`ManualDispatch` has no compare-and-set: its run is inserted unless it exists,
        and only then counted in its job's ``run_count`` and audited. An insert's row count
        says whether the record was created now. The replays of the runs that sole replays
        replay are read in the same transaction, before the inserts (:data:`REPLAYS_OF`, one
        statement per 500 runs; none without a sole replay), and decide each sole replay
        (:class:`store.dispatching.ReplayGuard`): under ``BEGIN IMMEDIATE`` no other writer can
        come between, so of concurrent sole replays of one run exactly one is recorded.
        """
        if not runs:
            return []
        with _translated():  # a value no row can hold is refused, as when it is bound
            now = to_epoch_ms(runs[0].execution.created_at)
            cas = [
                (
                    epoch_ms(d.next_run_at),
                    to_epoch_ms(d.execution.scheduled_for),
                    now,
                    d.execution.status == ExecutionStatus.QUEUED,
                    to_epoch_ms(d.execution.scheduled_for),
                    d.execution.job_id,
                    to_epoch_ms(d.expected_next_run_at),
                )
                if isinstance(d, Dispatch)
                else None
                for d in runs
            ]
            rows = [execution_row(d.execution) for d in runs]
            audits = [
                audit_row(audit_record(d.audit, None, None))
                if isinstance(d, ManualDispatch) and d.audit is not None
                else None
                for d in runs
            ]
        scheduled = [d for d in runs if isinstance(d, Dispatch)]

        originals = sole_originals(runs)

        def work(db: sqlite3.Connection) -> list[DispatchOutcome]:
            guard = ReplayGuard(_replays_of(db, originals))
            after: dict[str, JobState] = {}
            for d, params in zip(runs, cas, strict=True):
                if not isinstance(d, Dispatch) or params is None:
                    continue
                if db.execute(ADVANCE, params).rowcount == 1:
                    after[d.execution.job_id] = (d.execution.scheduled_for, d.next_run_at)
            missing = list({d.execution.job_id for d in scheduled} - after.keys())
            for marks, chunk in in_chunks(missing):
                found = db.execute(
                    f"SELECT id, last_scheduled_for, next_run_at FROM jobs WHERE id IN ({marks})",
                    chunk,
                ).fetchall()
                after.update((r[0], (instant(r[1]), instant(r[2]))) for r in found)
            oks = iter(advanced(scheduled, after))
            outcomes = []
            for d, row, audit in zip(runs, rows, audits, strict=True):
                latest = guard.refusal(d)
                if latest is not None:
                    outcomes.append(
                        DispatchOutcome(created=False, advanced=False, replayed_as=latest)
                    )
                    continue
                adv = next(oks) if isinstance(d, Dispatch) else True
                created = adv and db.execute(EXECUTION_INSERT, row).rowcount == 1
                if created:
                    guard.recorded(d.execution)
                if created and isinstance(d, ManualDispatch):
                    db.execute(COUNT_RUN, (d.execution.job_id,))
                if created and audit is not None:
                    db.execute(AUDIT_INSERT, audit)
                outcomes.append(DispatchOutcome(created=created, advanced=adv))
            return outcomes

        return await self._in_one_hop(work)

    async def apply_events(self, events: Sequence[StatusEvent]) -> int:
        """See :meth:`core.ports.JobStore.apply_events`: one transaction, one thread hand-off
        (the rows are built before it, the attempt histories merged inside it)."""
        if not events:
            return 0
        events = [storable_event(ev) for ev in events]
        with _translated():  # a value no row can hold is refused, as when it is bound
            upserts = [event_row(ev) for ev in events]
        # A job summary applies only if its event's rank is the run's rank now, so an event
        # overtaken by a later one of the same batch (RUNNING, then SUCCEEDED) is skipped.
        top: dict[str, int] = {}
        for ev in events:
            top[ev.execution_id] = max(top.get(ev.execution_id, -1), ev.rank)
        summaries = [
            summary_params(ev)
            for ev in events
            if ev.status != ExecutionStatus.QUEUED and ev.rank == top[ev.execution_id]
        ]
        by_run: dict[str, list[StatusEvent]] = {}
        for ev in events:
            if observes_attempt(ev):
                by_run.setdefault(ev.execution_id, []).append(ev)

        def work(db: sqlite3.Connection) -> int:
            before = db.total_changes
            db.executemany(UPSERT_EVENT, upserts)
            changed = db.total_changes - before
            db.executemany(JOB_SUMMARY, summaries)
            _record_attempts(db, by_run)
            return changed

        return await self._in_one_hop(work)

    async def prune_executions(
        self, targets: Sequence[PruneTarget], *, limit: int
    ) -> list[PruneResult]:
        """See :meth:`core.ports.JobStore.prune_executions`.

        The runs to delete are found on the reader connection (a visit that finds nothing takes
        no write lock), then deleted in one write transaction (one fsync) with ``state_rank``
        checked again. Freed pages go to the file's free list and are reused by later inserts,
        so a steady insert-and-prune load keeps the file at its size.

        One statement first counts every target's finished runs (and finds its oldest); a job's
        own lookups run only where that count passes its ``keep_last`` or that oldest run
        ended before its ``finished_before`` — after a burst of runs, most jobs keep all they
        have, and they then cost no statement of their own.
        """
        stats = await self._finished_stats([t.job_id for t in targets])
        plan: list[tuple[list[str], bool]] = []
        budget = limit
        for t in targets:
            count, oldest = stats.get(t.job_id, (0, None))
            doomed: list[str] = []
            complete = True
            if t.finished_before is not None and budget > 0:
                before = to_epoch_ms(t.finished_before)
                rows = []
                if oldest is not None and oldest < before:
                    rows = await self._fetch(FINISHED_BEFORE, (t.job_id, before, t.keep_id, budget))
                doomed += [r[0] for r in rows]
                complete = len(rows) < budget
            elif t.finished_before is not None:
                complete = False
            left = budget - len(doomed)
            if t.keep_last is not None and complete:
                rows = []
                if count > t.keep_last:
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

    async def _finished_stats(self, job_ids: list[str]) -> dict[str, tuple[int, int | None]]:
        """Each job's finished runs: how many, and when the oldest ended (epoch ms)."""
        out: dict[str, tuple[int, int | None]] = {}
        for marks, chunk in in_chunks(job_ids):
            rows = await self._fetch(
                "SELECT job_id, COUNT(*), MIN(finished_at) FROM executions "
                f"WHERE job_id IN ({marks}) AND state_rank = 1000000 GROUP BY job_id",
                chunk,
            )
            out.update((r[0], (int(r[1]), r[2])) for r in rows)
        return out

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
        return self.rows.decode(rows, job_from_row, what="job", key=lambda r: r["id"])

    def _runs(self, rows: Sequence[sqlite3.Row]) -> list[Execution]:
        return self.rows.decode(rows, execution_from_row, what="execution", key=lambda r: r["id"])

    async def dead_letter(self, letters: Sequence[DeadLetter]) -> int:
        if not letters:
            return 0
        async with self._transaction() as conn:
            before = conn.total_changes
            await conn.executemany(DEAD_LETTER_INSERT, [dead_letter_row(x) for x in letters])
            return conn.total_changes - before

    async def dead_letters(self, *, limit: int) -> list[DeadLetter]:
        rows = await self._fetch(
            "SELECT id, at, source, reason, error, subject, size, execution_id, job_id, owner, "
            "data FROM dead_letters ORDER BY at DESC, id DESC LIMIT ?",
            [limit],
        )
        return self.rows.decode(
            rows, dead_letter_from_row, what="dead letter", key=lambda r: r["id"]
        )

    # --- tenancy: quotas and the audit trail ----------------------------------------------------

    async def count_jobs(self, owner: str, statuses: Collection[JobStatus]) -> int:
        values = sorted(s.value for s in statuses)
        if not values:
            return 0
        marks = ", ".join("?" * len(values))
        rows = await self._fetch(
            f"SELECT COUNT(*) FROM jobs WHERE owner = ? AND status IN ({marks})", [owner, *values]
        )
        return int(rows[0][0])

    async def run_stats(self, owner: str | None, since: datetime, until: datetime) -> RunStats:
        """See :meth:`core.stats.StatsStore.run_stats` (:mod:`store.sqlite.stats`)."""
        return await run_stats(self._fetch, owner, since, until)

    async def scheduled_groups(
        self, owner: str | None, until: datetime, *, limit: int
    ) -> list[ScheduledGroup]:
        """See :meth:`core.stats.StatsStore.scheduled_groups` (:mod:`store.sqlite.stats`)."""
        return await scheduled_groups(self._fetch, owner, until, limit=limit)

    async def running_runs(self, *, limit: int) -> list[tuple[str, InFlightRun]]:
        """See :meth:`core.stats.StatsStore.running_runs`."""
        return await running_runs(self._fetch, limit=limit)

    async def take_tokens(self, requests: Sequence[TokenRequest], *, now: datetime) -> list[float]:
        """See :meth:`core.ports.JobStore.take_tokens`. Concurrent calls share one transaction,
        as creations do (each caller's requests applied in turn, at its own ``now``); SQLite's
        write lock makes it atomic across processes. It is committed without an fsync of its
        own: a bucket lost to a power failure only refills early."""
        if not requests:
            return []
        done: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._takes.append((list(requests), now, done))
        async with self._take_lock:
            if not done.done():
                batch, self._takes = self._takes, []
                try:
                    await self._take_batch(batch)
                finally:
                    for _, _, waiting in batch:  # the leader was cancelled: fail, never hang
                        if not waiting.done():
                            waiting.set_exception(StoreUnavailable("the update was interrupted"))
        return await done

    async def _take_batch(
        self, batch: list[tuple[list[TokenRequest], datetime, asyncio.Future[list[float]]]]
    ) -> None:
        keys = sorted({r.key for requests, _, _ in batch for r in requests})
        results: list[list[float]] = []
        try:
            async with self._light_transaction() as conn:
                state: dict[str, Bucket] = {}
                for marks, chunk in in_chunks(keys):
                    rows = await conn.execute_fetchall(
                        f"SELECT key, tokens, updated_at FROM quota_buckets WHERE key IN ({marks})",
                        chunk,
                    )
                    state.update((r[0], Bucket(r[1], from_epoch_ms(r[2]))) for r in rows)
                changed: dict[str, Bucket] = {}
                for requests, now, _ in batch:
                    after, waits = take_all(state, requests, now)
                    state.update(after)
                    changed.update(after)
                    results.append(waits)
                await conn.executemany(
                    "INSERT INTO quota_buckets (key, tokens, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET tokens = excluded.tokens, "
                    "updated_at = excluded.updated_at",
                    [(k, b.tokens, to_epoch_ms(b.updated_at)) for k, b in changed.items()],
                )
        except StoreUnavailable as e:
            for _, _, done in batch:
                done.set_exception(e)
            return
        for (_, _, done), waits in zip(batch, results, strict=True):
            done.set_result(waits)

    async def read_tokens(self, keys: Collection[str]) -> dict[str, Bucket]:
        """See :meth:`core.ports.JobStore.read_tokens`."""
        wanted = sorted(set(keys))
        found: dict[str, Bucket] = {}
        for marks, chunk in in_chunks(wanted):
            rows = await self._fetch(
                f"SELECT key, tokens, updated_at FROM quota_buckets WHERE key IN ({marks})", chunk
            )
            found.update((r[0], Bucket(r[1], from_epoch_ms(r[2]))) for r in rows)
        return found

    async def list_audit(
        self, query: AuditQuery, *, limit: int, cursor: str | None
    ) -> Page[AuditRecord]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("job_id", query.job_id),
            ("owner", query.owner),
            ("actor", query.actor),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        page = Keyset.of(limit, cursor)
        rows = await self._fetch_page("SELECT record FROM audit", where, params, page, "at")
        return page.page(rows, audit_from_row, lambda r: (r.at, r.id))


def _name_taken(error: sqlite3.IntegrityError) -> bool:
    """Whether ``error`` is the unique index of job names (``jobs_owner_name``)."""
    return "jobs.name" in str(error)


def _insert_conflict(job: Job, error: sqlite3.IntegrityError) -> Conflict:
    """The error of an insert of ``job`` that broke a unique constraint: its name, or its id."""
    if job.name is not None and _name_taken(error):
        return NameTaken(job.name)
    return Conflict(f"job {job.id} exists")


def _transact(db: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """``work(db)`` in a write transaction (on the connection's thread; see ``_in_one_hop``)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        out = work(db)
    except BaseException:
        db.rollback()
        raise
    db.commit()
    return out


def _replays_of(db: sqlite3.Connection, originals: Sequence[str]) -> dict[str, list[str]]:
    """:meth:`SqliteRuns.replays_of` on the writer's connection, inside its write transaction
    (``dispatch``'s sole replays: see :data:`REPLAYS_OF`)."""
    out: dict[str, list[str]] = {}
    for marks, chunk in in_chunks(originals):
        for original, replay in db.execute(REPLAYS_OF.format(marks), chunk):
            out.setdefault(original, []).append(replay)
    return out


def _record_attempts(db: sqlite3.Connection, by_run: dict[str, list[StatusEvent]]) -> None:
    """Merge each run's attempt-observing events into its attempt history (inside the write
    transaction of ``apply_events``, so no concurrent merge can interleave)."""
    updates: list[tuple[bytes, str]] = []
    for marks, chunk in in_chunks(list(by_run)):
        rows = db.execute(
            f"SELECT id, attempts FROM executions WHERE id IN ({marks}) AND status != ?",
            [*chunk, NEVER_RAN.value],
        ).fetchall()
        for run_id, raw in rows:
            stored = stored_attempts(run_id, raw)
            history = record_attempts(stored, by_run[run_id])
            if history != stored:
                updates.append((attempts_column(history), run_id))
    db.executemany("UPDATE executions SET attempts = ? WHERE id = ?", updates)


async def _delete_finished(conn: aiosqlite.Connection, ids: list[str]) -> int:
    """Delete executions by id if they are (still) finished, with their notification
    attempts; how many executions."""
    deleted = 0
    for marks, chunk in in_chunks(ids):
        cur = await conn.execute(
            f"DELETE FROM executions WHERE id IN ({marks}) AND state_rank = 1000000", chunk
        )
        deleted += cur.rowcount
        await conn.execute(
            f"DELETE FROM notification_attempts WHERE execution_id IN ({marks}) "
            "AND NOT EXISTS (SELECT 1 FROM executions WHERE id = execution_id)",
            chunk,
        )
    return deleted


async def _set_synchronous_full(conn: aiosqlite.Connection) -> None:
    await conn.execute("PRAGMA synchronous=FULL")


async def _insert_audit(conn: aiosqlite.Connection, records: Sequence[AuditRecord]) -> None:
    """Insert audit records in the caller's transaction (with the change they describe)."""
    if records:
        await conn.executemany(AUDIT_INSERT, [audit_row(r) for r in records])


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
