"""Schema of the SQLite store: tables, indexes, migrations, and the SQL statements that its
compare-and-sets and conditional transitions are (each a single statement).

Mutable job fields are columns; the immutable part of a job is one JSON column (``spec``, see
:mod:`store.sqlite.rows`). Instants are epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from core.job_status import HELD_VALUES
from core.model import TERMINAL_RANK

T = TypeVar("T")

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
CREATE INDEX IF NOT EXISTS jobs_due_id ON jobs (partition, next_run_at, id)
    WHERE next_run_at IS NOT NULL;
DROP INDEX IF EXISTS jobs_due;
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

_SPEC_FIELD = "json_extract(CAST(spec AS TEXT), '$.{}')"
MIGRATIONS = (
    ("executions", "dispatched_by", "TEXT"),
    ("executions", "extra", "BLOB"),
    ("jobs", "idempotency_key", "TEXT"),
    ("jobs", "request_hash", "TEXT"),
    ("jobs", "last_dispatched_for", "INTEGER"),
    ("executions", "attempts", "BLOB"),
    ("jobs", "task_id", f"TEXT GENERATED ALWAYS AS ({_SPEC_FIELD.format('taskId')}) VIRTUAL"),
    ("jobs", "name", f"TEXT GENERATED ALWAYS AS ({_SPEC_FIELD.format('name')}) VIRTUAL"),
    (
        "executions",
        "replay_of",
        "TEXT GENERATED ALWAYS AS (json_extract(CAST(extra AS TEXT), '$.replayOf')) VIRTUAL",
    ),
    ("executions", "catch_up", "INTEGER NOT NULL DEFAULT 0"),
)
"""Columns added after a table's first release: (table, column, type), applied on open.
``task_id`` and ``name`` are virtual columns over the ``spec`` JSON (always in step with it,
whatever writes it), there to be indexed; so is a run's ``replay_of`` over its ``extra``
JSON. ``catch_up`` is 1 for a replay or a backfilled run (its ``scheduledFor`` lies in the past
by design: left out of the schedule-to-start delay), written with the run; a plain column, so
that the delay's partial index covers its query (a virtual column's would not)."""
MIGRATION_FILLS = {
    ("executions", "catch_up"): "UPDATE executions SET catch_up = 1 WHERE replay_of IS NOT NULL "
    "OR json_extract(CAST(extra AS TEXT), '$.backfill') IS 1",
}
"""What fills a migrated column from the rows it is added to (run once, when it is added)."""
INDEXES_AFTER_MIGRATIONS = """
CREATE UNIQUE INDEX IF NOT EXISTS jobs_owner_idempotency_key
    ON jobs (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_owner_name ON jobs (owner, name) WHERE name IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_name ON jobs (name, created_at DESC, id DESC)
    WHERE name IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_owner_task_created
    ON jobs (owner, task_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_task_created ON jobs (task_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS executions_replay_of ON executions (replay_of)
    WHERE replay_of IS NOT NULL;
"""
"""Indexes on migrated columns: a name is unique per owner (``jobs_owner_name``); the name and
task filters of ``list_jobs``, of one owner's jobs and of everyone's (admins); the replays of
a run (``replays_of``: only replays are indexed)."""

LABELS_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_labels (
    job_id TEXT NOT NULL,
    job_owner TEXT NOT NULL,
    job_created_at INTEGER NOT NULL,
    term TEXT NOT NULL,
    PRIMARY KEY (job_id, term)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_labels_owner_term
    ON job_labels (job_owner, term, job_created_at DESC, job_id DESC);
CREATE INDEX IF NOT EXISTS job_labels_term ON job_labels (term, job_created_at DESC, job_id DESC);
"""
"""The label index: one row per term of a job's labels (:func:`core.labels.label_terms`:
``key`` and ``key=value``) with the job's owner and creation time (which never change). The
store writes it in the transaction of every write of a job's spec (create, PATCH, delete), and
only for jobs with labels: a job without any costs nothing (a trigger would cost every insert
about 15 µs of the writer's CPU, measured).

A listing with a selector walks the index of its first single-term requirement (``key=value``,
``key``) in the listing's order — ``job_labels_owner_term`` for one owner, ``job_labels_term``
for every owner (admins), as MongoDB's multikey index on ``labelTerms`` — joined to ``jobs``;
every other requirement is a ``[NOT] EXISTS`` probe of the primary key ``(job_id, term)`` for
each row walked. Columns are named apart from the ``jobs`` columns, so the join
needs no qualified names."""
LABEL_INSERT = (
    "INSERT OR IGNORE INTO job_labels (job_id, job_owner, job_created_at, term) VALUES (?, ?, ?, ?)"
)
"""Inserts one term of a job: the values of ``label_rows``."""
LABELS_DELETE = "DELETE FROM job_labels WHERE job_id = ?"
_TERMS_OF_JOBS = """
    SELECT jobs.id, jobs.owner, jobs.created_at, {term}
    FROM jobs, json_each(CAST(jobs.spec AS TEXT), '$.labels')"""
LABELS_BACKFILL = (
    "INSERT OR IGNORE INTO job_labels (job_id, job_owner, job_created_at, term) "
    + _TERMS_OF_JOBS.format(term="key")
    + " UNION ALL "
    + _TERMS_OF_JOBS.format(term="key || '=' || value")
)
"""Fills ``job_labels`` from the jobs of a database that predates it (run once, on the open
that creates the table)."""
LABELS_JOIN = "JOIN job_labels ON job_labels.job_id = jobs.id"
"""How a listing driven by one label term joins the label index to the jobs."""

TENANCY_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    actor TEXT NOT NULL,
    at INTEGER NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_job ON audit (job_id, at DESC, id DESC);
CREATE INDEX IF NOT EXISTS audit_owner ON audit (owner, at DESC, id DESC);
CREATE INDEX IF NOT EXISTS audit_actor ON audit (actor, at DESC, id DESC);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at DESC, id DESC);
CREATE TABLE IF NOT EXISTS quota_buckets (
    key TEXT PRIMARY KEY,
    tokens REAL NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_status_created ON jobs (status, created_at DESC, id DESC);
"""
"""Tables of the audit trail (one row per change; the record as msgspec JSON, its filter fields
as columns) and of the quota buckets (one row per user and bucket), and the indexes of admins'
listings over every user's jobs."""
AUDIT_INSERT = "INSERT INTO audit (id, job_id, owner, actor, at, record) VALUES (?, ?, ?, ?, ?, ?)"

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
    "next_attempt_at, worker_id, error, result, dispatched_by, extra, attempts, catch_up"
)
N_EXECUTION_COLUMNS = EXECUTION_COLUMNS.count(",") + 1
EXECUTION_INSERT = (
    f"INSERT OR IGNORE INTO executions ({EXECUTION_COLUMNS}) "
    f"VALUES ({', '.join('?' * N_EXECUTION_COLUMNS)})"
)
"""Inserts one run unless its id exists: the values of ``execution_row``."""
DEAD_LETTER_INSERT = (
    "INSERT OR IGNORE INTO dead_letters (id, at, source, reason, error, subject, "
    "size, execution_id, job_id, owner, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
"""Inserts one dead letter unless its id exists (a redelivery): the values of
``dead_letter_row``."""

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
    result = excluded.result,
    extra = CASE WHEN excluded.status = 'SKIPPED' AND excluded.error IS NOT NULL
                 THEN json_set(COALESCE(CAST(executions.extra AS TEXT), '{{}}'),
                               '$.skipReason', excluded.error)
                 ELSE executions.extra END
WHERE excluded.state_rank > executions.state_rank
"""

_HELD = ", ".join(f"'{s}'" for s in HELD_VALUES)
JOB_SUMMARY = f"""
UPDATE jobs SET
    status = CASE
        WHEN status IN ({_HELD}) THEN status
        WHEN next_run_at IS NULL THEN :status_without_next_run
        ELSE :status_with_next_run END,
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

REPLAYS_OF = "SELECT replay_of, id FROM executions WHERE replay_of IN ({}) ORDER BY replay_of, id"
"""The replays of some runs (``{}``: one ``?`` per run id), by run, in id order (index
``executions_replay_of``). Read by ``replays_of``, and inside the write transaction of a
``dispatch`` with sole replays: there, ``BEGIN IMMEDIATE`` holds the database's write lock from
the transaction's start, so no other connection or process can insert a replay between this
read and the insert it decides (SQLite has one writer at a time), and the check and the insert
are as one."""

COUNT_RUN = "UPDATE jobs SET run_count = run_count + 1 WHERE id = ?"
"""A manual run recorded: it counts like a scheduled one (the job is not advanced)."""

IN_CHUNK = 500
"""Most values :func:`in_chunks` binds in one statement."""


def in_chunks(values: Sequence[T], size: int = IN_CHUNK) -> Iterator[tuple[str, Sequence[T]]]:
    """``values`` in order as consecutive slices of at most ``size``, each with its placeholders.

    Yields ``(marks, chunk)``: ``chunk`` is ``values[i : i + size]`` and ``marks`` is
    ``"?, ?, …"`` with one ``?`` per value of it, for ``... WHERE x IN ({marks})`` bound to
    ``chunk`` (then any other parameters of the statement). Nothing for empty ``values``, so a
    caller runs no statement for an empty list.

    The default of 500 keeps every statement under SQLite's cap on host parameters
    (``SQLITE_MAX_VARIABLE_NUMBER``, https://www.sqlite.org/limits.html#max_variable_number):
    999 in libraries before 3.32.0, 32766 since. Python's ``sqlite3`` uses whatever library the
    platform links, so the store keeps under the older cap, with 499 left for the statement's
    other parameters (``AND status != ?``).
    """
    for i in range(0, len(values), size):
        chunk = values[i : i + size]
        yield ", ".join("?" * len(chunk)), chunk
