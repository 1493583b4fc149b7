"""SQLite-only behaviour of ``store.sqlite.SqliteStore``: WAL, several processes on one file, locks.

Two stores on one file stand for two processes of one host; a plain ``sqlite3`` connection
holding ``BEGIN EXCLUSIVE`` stands for a process that keeps the database locked.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiosqlite
import msgspec
import pytest

from bench.common import interval_jobs, seed_jobs
from bench.memory import build_store
from core.errors import NameTaken, StoreUnavailable
from core.ids import execution_id
from core.labels import parse_selector
from core.model import (
    CronSchedule,
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
    OnceSchedule,
    StatusEvent,
)
from core.ports import Dispatch, DispatchOutcome, JobQuery, ManualDispatch
from core.runs import replay_run
from store.sqlite import MIGRATIONS, SqliteStore
from store.sqlite.schema import LABELS_JOIN
from tests.store.test_contract import at, create, make_execution
from tests.store.test_contract import make_job as contract_job

T0 = datetime(2026, 6, 1, tzinfo=UTC)
BUSY_TIMEOUT_SECONDS = 0.2


def make_job(job_id: str = "job-1") -> Job:
    return Job(
        id=job_id,
        owner="alice",
        task_id="noop",
        schedule=CronSchedule(expression="* * * * *"),
        created_at=T0,
        updated_at=T0,
        next_run_at=T0 + timedelta(minutes=1),
    )


def make_run(job: Job) -> Dispatch:
    assert job.next_run_at is not None
    due = job.next_run_at
    ex = Execution(
        id=execution_id(job.id, due),
        job_id=job.id,
        owner=job.owner,
        task_id=job.task_id,
        scheduled_for=due,
        created_at=due,
        updated_at=due,
    )
    return Dispatch(ex, expected_next_run_at=due, next_run_at=due + timedelta(minutes=1))


def running(ex: Execution) -> StatusEvent:
    return StatusEvent(
        execution_id=ex.id,
        job_id=ex.job_id,
        owner=ex.owner,
        partition=ex.partition,
        task_id=ex.task_id,
        status=ExecutionStatus.RUNNING,
        attempt=1,
        at=ex.scheduled_for + timedelta(seconds=1),
        scheduled_for=ex.scheduled_for,
        started_at=ex.scheduled_for + timedelta(seconds=1),
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "jobsched.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(db, busy_timeout_seconds=BUSY_TIMEOUT_SECONDS)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another process's connection holding the database's write lock inside the block."""
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads started since ``before`` that are still alive a second later (a closed
    connection's thread may need a moment to finish after ``close()`` returned)."""
    new = [t for t in threading.enumerate() if t not in before]
    for t in new:
        t.join(timeout=1.0)
    return [t for t in new if t.is_alive()]


@pytest.fixture
async def reap_connections() -> AsyncIterator[set[threading.Thread]]:
    """Threads alive before the test; afterwards, close any aiosqlite connection it leaked.

    A leaked connection's thread is not a daemon and would keep the test process from exiting;
    collected unclosed, it would warn from ``__del__`` in whichever test runs then. So the cyclic
    garbage collector is paused until the leak is closed here.
    """
    before = set(threading.enumerate())
    gc.disable()
    try:
        yield before
        leaked = _new_threads(before)
        for obj in gc.get_objects():
            if isinstance(obj, aiosqlite.Connection) and obj._thread in leaked:
                await obj.close()
    finally:
        gc.enable()


async def test_the_database_file_is_in_wal_mode(store: SqliteStore, db: Path) -> None:
    assert db.is_file()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


async def test_open_and_close_are_idempotent(db: Path) -> None:
    s = SqliteStore(db)
    await s.open()
    await s.open()
    await s.create_job(make_job())
    await s.close()
    await s.close()

    reopened = SqliteStore(db)
    await reopened.open()
    try:
        assert await reopened.get_job("alice", "job-1") == make_job()
    finally:
        await reopened.close()


async def test_a_closed_store_is_unavailable(db: Path) -> None:
    s = SqliteStore(db)
    await s.open()
    await s.close()

    with pytest.raises(StoreUnavailable):
        await s.ping()
    with pytest.raises(StoreUnavailable):
        await s.create_job(make_job())


async def test_two_stores_on_one_file_see_each_others_writes(store: SqliteStore, db: Path) -> None:
    other = SqliteStore(db)
    await other.open()
    try:
        job = make_job()
        await store.create_job(job)
        assert await other.get_job("alice", job.id) == job

        run = make_run(job)
        assert await other.dispatch([run]) == [DispatchOutcome(created=True, advanced=True)]
        assert (await store.get_job("alice", job.id)).run_count == 1
        assert await store.get_execution(run.execution.id) == run.execution

        assert await store.apply_events([running(run.execution)]) == 1
        seen = await other.get_execution(run.execution.id)
        assert seen is not None
        assert seen.status == ExecutionStatus.RUNNING
        # The second store's compare-and-set sees the first store's state: no double dispatch.
        assert await store.dispatch([run]) == [DispatchOutcome(created=False, advanced=True)]
        assert (await other.get_job("alice", job.id)).run_count == 1
    finally:
        await other.close()


async def test_sole_replays_from_several_stores_on_one_file_record_one(
    store: SqliteStore, db: Path
) -> None:
    """Each store has its own writer connection on its own thread (as a process would): their
    dispatches race for the file's write lock, and the replays' check runs under it."""
    job = make_job()
    await store.create_job(job)
    original = make_execution(job, T0)
    await store.insert_execution(original)
    others = [SqliteStore(db) for _ in range(3)]
    try:
        for other in others:
            await other.open()
        stores = [store, *others] * 2
        racers = [replay_run(job, original, T0, nonce=f"{i:08x}") for i in range(len(stores))]
        answers = await asyncio.gather(
            *(
                s.dispatch([ManualDispatch(r, sole_replay=True)])
                for s, r in zip(stores, racers, strict=True)
            )
        )
        won = [r.id for r, [o] in zip(racers, answers, strict=True) if o.created]
        assert len(won) == 1, answers
        assert sorted(o.replayed_as or "" for [o] in answers) == ["", *won * (len(stores) - 1)]
        assert await others[0].replays_of([original.id]) == {original.id: won}
    finally:
        for other in others:
            await other.close()


async def test_a_locked_database_makes_writes_unavailable_within_the_busy_timeout(
    store: SqliteStore, db: Path
) -> None:
    job = make_job()
    await store.create_job(job)
    run = make_run(job)
    loop = asyncio.get_running_loop()

    with locked(db):
        for write in (
            lambda: store.create_job(make_job("job-2")),
            lambda: store.dispatch([run]),
            lambda: store.apply_events([running(run.execution)]),
        ):
            started = loop.time()
            async with asyncio.timeout(5):
                with pytest.raises(StoreUnavailable):
                    await write()
            assert loop.time() - started < BUSY_TIMEOUT_SECONDS + 2.0

    # Once the lock is released the same store works again, and nothing half-written remains.
    assert await store.dispatch([run]) == [DispatchOutcome(created=True, advanced=True)]
    assert (await store.get_job("alice", job.id)).run_count == 1
    await store.create_job(make_job("job-2"))


async def test_an_open_that_failed_on_a_lock_can_be_retried(
    db: Path, reap_connections: set[threading.Thread]
) -> None:
    s = SqliteStore(db, busy_timeout_seconds=BUSY_TIMEOUT_SECONDS)
    with locked(db):
        async with asyncio.timeout(5):
            with pytest.raises(StoreUnavailable):
                await s.open()

    await s.open()
    try:
        await s.create_job(make_job())
        assert (await s.get_job("alice", "job-1")).id == "job-1"
    finally:
        await s.close()


async def test_an_open_that_failed_while_migrating_can_be_retried(db: Path) -> None:
    first = SqliteStore(db)
    await first.open()
    await first.close()
    table, column, _ = MIGRATIONS[0]
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")  # the file of an older release
    conn.close()
    s = SqliteStore(db, busy_timeout_seconds=BUSY_TIMEOUT_SECONDS)
    with locked(db):
        async with asyncio.timeout(5):
            with pytest.raises(StoreUnavailable):
                await s.open()

    try:
        await s.open()
        await s.create_job(make_job())
        assert (await s.get_job("alice", "job-1")).id == "job-1"
    finally:
        await s.close()


async def test_a_file_of_before_catch_up_marks_its_replays_and_backfills_on_open(db: Path) -> None:
    first = SqliteStore(db)
    await first.open()
    job = make_job()
    await first.create_job(job)
    plain = make_execution(job, T0)
    replay = msgspec.structs.replace(make_execution(job, T0 + timedelta(minutes=1)), replay_of="x")
    filled = msgspec.structs.replace(make_execution(job, T0 + timedelta(minutes=2)), backfill=True)
    for run in (plain, replay, filled):
        assert await first.insert_execution(run)
    await first.close()
    conn = sqlite3.connect(db, isolation_level=None)  # the file of an older release
    conn.execute("DROP INDEX executions_stats_owner_started_on_time")
    conn.execute("DROP INDEX executions_stats_started_on_time")
    conn.execute("ALTER TABLE executions DROP COLUMN catch_up")
    conn.close()
    again = SqliteStore(db)
    await again.open()
    await again.close()
    conn = sqlite3.connect(db)
    marked = dict(conn.execute("SELECT id, catch_up FROM executions").fetchall())
    conn.close()
    assert marked == {plain.id: 0, replay.id: 1, filled.id: 1}


async def test_a_failed_open_leaks_no_connection(
    db: Path, reap_connections: set[threading.Thread]
) -> None:
    s = SqliteStore(db, busy_timeout_seconds=BUSY_TIMEOUT_SECONDS)
    with locked(db):
        async with asyncio.timeout(5):
            with pytest.raises(StoreUnavailable):
                await s.open()
    await s.close()

    assert _new_threads(reap_connections) == []


async def test_concurrent_creates_share_commits_and_each_gets_its_answer(
    store: SqliteStore,
) -> None:
    """Group commit: 300 concurrent creates, one of them a duplicate id, all answered."""
    from core.errors import Conflict
    from core.ports import JobQuery

    await store.create_job(make_job("dup"))
    jobs = [make_job(f"job-{i:03d}") for i in range(300)] + [make_job("dup")]
    results = await asyncio.gather(*(store.create_job(j) for j in jobs), return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == [results[-1]]
    assert isinstance(results[-1], Conflict)
    page = await store.list_jobs("alice", JobQuery(), limit=500, cursor=None)
    assert len(page.items) == 301


async def test_the_benchmark_seeders_write_jobs_the_store_reads(tmp_path: Path) -> None:
    """bench/ inserts jobs with raw SQL on the store's schema; a schema change must not break it."""
    seeded = interval_jobs(3, 10.0, T0.timestamp(), partitions=64)
    seed_jobs(tmp_path / "seeded.db", seeded)
    build_store(tmp_path / "memory.db", 5, 2, 10.0, int(T0.timestamp() * 1000))

    store = SqliteStore(tmp_path / "seeded.db")
    await store.open()
    try:
        read = await store.get_jobs([j.id for j in seeded])
        assert sorted(read, key=lambda j: j.id) == sorted(seeded, key=lambda j: j.id)
    finally:
        await store.close()
    store = SqliteStore(tmp_path / "memory.db")
    await store.open()
    try:
        found = await store.due_jobs(frozenset(range(64)), T0 + timedelta(days=60), limit=10)
        due = await store.get_jobs([d.id for d in found])
        assert len(due) == 5
        assert {j.status for j in due} == {JobStatus.SCHEDULED}
        assert all(isinstance(j.schedule, OnceSchedule) for j in due)
    finally:
        await store.close()


async def test_the_spec_column_keeps_the_shape_earlier_releases_wrote(
    store: SqliteStore, db: Path
) -> None:
    """The ``spec`` column is the job's JobSpec as compact JSON (defaults left out); a row written
    before JobSpec became the one schema of a job's options reads back unchanged."""
    job = make_job()
    await store.create_job(job)
    written = (
        b'{"taskId":"noop","schedule":{"type":"cron","expression":"* * * * *","timezone":"UTC",'
        b'"gap":"shift","fold":"once","startAt":null,"endAt":null,"jitterSeconds":0.0}}'
    )
    with sqlite3.connect(db) as conn:
        [(column,)] = conn.execute("SELECT spec FROM jobs WHERE id = ?", (job.id,)).fetchall()
        assert column == written
        earlier = (
            b'{"taskId":"noop","schedule":{"type":"once","executeAt":"2026-06-01T00:01:00Z"},'
            b'"queue":"q","maxAttempts":5,"historyLimit":7}'
        )
        conn.execute("UPDATE jobs SET spec = ? WHERE id = ?", (earlier, job.id))
    got = await store.get_job("alice", job.id)

    assert (got.schedule, got.queue, got.max_attempts, got.history_limit) == (
        OnceSchedule(execute_at=T0 + timedelta(minutes=1)),
        "q",
        5,
        7,
    )
    assert (got.timeout_seconds, got.misfire_grace_seconds) == (300.0, 60.0)


async def test_a_database_of_an_older_release_gets_names_and_labels_indexed(db: Path) -> None:
    """Opening a file from before names and labels adds the virtual columns, their indexes and
    the label table, and fills it from the jobs there."""
    first = SqliteStore(db)
    await first.open()
    await first.create_job(msgspec.structs.replace(make_job(), name="n", labels={"team": "a"}))
    await first.close()
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in (
        "DROP TABLE job_labels",
        "DROP INDEX jobs_owner_name",
        "DROP INDEX jobs_name",
        "DROP INDEX jobs_owner_task_created",
        "DROP INDEX jobs_task_created",
        "ALTER TABLE jobs DROP COLUMN name",
        "ALTER TABLE jobs DROP COLUMN task_id",
    ):
        conn.execute(statement)
    conn.close()

    s = SqliteStore(db)
    await s.open()
    try:
        team = JobQuery(labels=parse_selector("team=a"))
        assert [j.id for j in (await s.list_jobs("alice", team, limit=5, cursor=None)).items] == [
            "job-1"
        ]
        named = JobQuery(name="n", task_id="noop")
        assert len((await s.list_jobs("alice", named, limit=5, cursor=None)).items) == 1
        with pytest.raises(NameTaken):
            await s.create_job(msgspec.structs.replace(make_job("job-2"), name="n"))
    finally:
        await s.close()
    conn = sqlite3.connect(db, isolation_level=None)
    plans = [
        " ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
        for sql in (  # the shapes of list_jobs with a selector: one owner's, everyone's
            f"SELECT id FROM jobs {LABELS_JOIN} WHERE owner = 'alice' AND term = 'team=a' "
            "AND job_owner = 'alice' AND NOT EXISTS (SELECT 1 FROM job_labels AS t WHERE "
            "t.job_id = jobs.id AND t.term IN ('env')) "
            "ORDER BY job_created_at DESC, job_id DESC LIMIT 51",
            f"SELECT id FROM jobs {LABELS_JOIN} WHERE term = 'team=a' "
            "ORDER BY job_created_at DESC, job_id DESC LIMIT 51",
        )
    ]
    conn.close()
    assert "job_labels_owner_term (job_owner=? AND term=?)" in plans[0], plans
    assert "job_labels_term (term=?)" in plans[1], plans
    assert "SEARCH t USING PRIMARY KEY (job_id=? AND term=?)" in plans[0], plans
    assert not any("TEMP B-TREE" in p for p in plans), plans  # walked in order, never sorted


async def test_the_scan_of_due_jobs_reads_one_covering_index_and_sorts_in_python(
    tmp_path: Path,
) -> None:
    """``due_jobs`` (every scheduler's safety scan, up to 100,000 jobs every 5 s) reads the
    covering index ``jobs_due_id`` and never a job row, and lets SQLite sort only a backlog
    larger than its limit. A store of an earlier release loses its ``jobs_due`` index."""
    db = tmp_path / "due.db"
    s = SqliteStore(db)
    await s.open()
    await s.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP INDEX jobs_due_id")  # as an earlier release left it
    conn.execute(
        "CREATE INDEX jobs_due ON jobs (partition, next_run_at) WHERE next_run_at IS NOT NULL"
    )
    conn.close()
    s = SqliteStore(db)
    await s.open()
    statements: list[str] = []
    try:
        await create(s, *(contract_job(f"job-{i}", partition=i % 3, next_run_at=at(9 - i))
                          for i in range(6)))  # fmt: skip
        await s._r.set_trace_callback(statements.append)
        assert [d.id for d in await s.due_jobs({0, 1, 2}, at(60), limit=10)] == [
            f"job-{i}" for i in range(5, -1, -1)
        ]
        assert [d.id for d in await s.due_jobs({0, 1, 2}, at(60), limit=2)] == ["job-5", "job-4"]
    finally:
        await s.close()
    conn = sqlite3.connect(db, isolation_level=None)
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    plans = [
        " ".join(str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
        for sql in statements
        if sql.startswith("SELECT") and "next_run_at <=" in sql
    ]
    conn.close()
    assert "jobs_due_id" in indexes and "jobs_due" not in indexes
    assert len(plans) == 3, statements  # limit 10: one read; limit 2: a larger backlog, two
    assert all("COVERING INDEX jobs_due_id" in p for p in plans), plans
    assert [("TEMP B-TREE" in p) for p in plans] == [False, False, True], plans


async def test_list_jobs_by_idempotency_key_walks_the_key_index(tmp_path: Path) -> None:
    """The listing of one key probes ``jobs_owner_idempotency_key`` (the index of idempotent
    creation), neither the owner's jobs in creation order nor a scan."""
    db = tmp_path / "keys.db"
    s = SqliteStore(db)
    await s.open()
    try:
        for i in range(3):
            job = msgspec.structs.replace(make_job(f"job-{i}"), idempotency_key=f"key-{i}")
            await s.create_job(job, request_hash="h")
        keyed = JobQuery(idempotency_key="key-1")
        assert [j.id for j in (await s.list_jobs("alice", keyed, limit=5, cursor=None)).items] == [
            "job-1"
        ]
    finally:
        await s.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("ANALYZE")
    plan = " ".join(
        str(row[3])
        for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE owner = 'alice' AND "
            "idempotency_key = 'key-1' ORDER BY created_at DESC, id DESC LIMIT 51"
        )
    )
    conn.close()
    assert "jobs_owner_idempotency_key (owner=? AND idempotency_key=?)" in plan, plan


async def test_processes_opening_a_new_database_at_once_all_open_it(tmp_path: Path) -> None:
    """Two processes (compose's scheduler and gateway, `jobsched dev` and a CLI) opening a fresh
    file at the same moment: the schema and its migrations are created once, under SQLite's
    write lock, and neither open fails ("duplicate column name" before)."""
    for attempt in range(8):
        path = tmp_path / f"race-{attempt}.db"
        stores = [SqliteStore(path) for _ in range(3)]
        try:
            await asyncio.gather(*(s.open() for s in stores))
            assert [await s.get_jobs(["nope"]) for s in stores] == [[], [], []]
        finally:
            for s in stores:
                await s.close()
