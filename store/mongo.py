"""MongoDB store on PyMongo's async API (``pymongo.AsyncMongoClient``).

Selected by ``JOBSCHED_STORE_URL=mongodb://…`` (or ``mongodb+srv://…``); the database is the URL's
path, ``jobsched`` when it has none. Motor reached its end of life in May 2026; PyMongo's native
async API is its official successor, so this adapter uses it directly.

Two collections, one document per job and one per run (execution), with the msgspec schema's
camelCase field names and BSON dates (UTC, milliseconds). :func:`to_document` and
:func:`from_document` are the one place that maps ``id`` ↔ ``_id`` and converts documents. A field
whose value is null is absent from the stored document: that keeps ``$min`` ("keep the first
``startedAt``") correct, since BSON orders null below every date.

Durability and correctness without multi-document transactions:

- Every write is acknowledged by a majority of the replica set and journaled
  (``WriteConcern(w="majority", j=True)``); retryable writes and reads are on.
- The scheduler's advance of a job is a compare-and-set on ``nextRunAt``; execution transitions
  are conditional on ``stateRank`` so a late or duplicate event never moves a run backwards; the
  job summary is conditional on the run it follows (``lastRunScheduledFor``,
  ``lastRunStateRank``) and on ``nextRunAt`` (which decides its status).
- :meth:`MongoStore.dispatch` inserts the executions first (a duplicate key means it existed),
  then compare-and-sets the jobs, so a crash in between leaves a QUEUED record rather than a lost
  run; an execution it created for a job it could not advance is deleted again.
- An idempotency key is unique per owner through a partial unique index: of two concurrent
  creates with one key, the server lets one insert through, and the other reads the winner.
- :meth:`MongoStore.update_job` (pause, resume, cancel, PATCH) is one ``findAndModify`` with the
  allowed statuses in its filter, so no read-modify-write can lose a concurrent change.
- Driver errors never leave this module: connection loss, timeouts, elections and write-concern
  failures become :class:`core.errors.StoreUnavailable` (retried by the actors, 503 at the
  gateway); a duplicate job id becomes :class:`core.errors.Conflict`, a reused idempotency key
  :class:`core.ports.IdempotencyKeyReused`.

Every query this module sends is served by an index of :data:`INDEXES` (or ``_id``).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import msgspec
from bson.binary import Binary
from bson.codec_options import CodecOptions
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel, ReturnDocument, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, ConfigurationError, DuplicateKeyError
from pymongo.write_concern import WriteConcern

from core.errors import ConfigError, Conflict, JobNotFound, StoreRejected, StoreUnavailable
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
    Model,
    Page,
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
from store.mongo_errors import duplicate_index, duplicate_indexes, index_error, translated
from store.rows import RowReader

log = logging.getLogger(__name__)

Document = dict[str, Any]
M = TypeVar("M", bound=Model)

DEFAULT_DATABASE = "jobsched"
JOBS = "jobs"
EXECUTIONS = "executions"
DEAD_LETTERS = "dead_letters"
ID = "_id"

DURABLE = WriteConcern(w="majority", j=True)
"""Every write: acknowledged by a majority of the replica set, after it reached the journal."""

CODEC_OPTIONS: CodecOptions[Document] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)
"""BSON dates come back as aware UTC datetimes."""

RUN_STATUSES = (ExecutionStatus.RUNNING.value, ExecutionStatus.RETRYING.value)

# Bookkeeping fields of a job document that are not part of the Job schema: the scheduled time
# and state rank of the run the job's summary (status, lastRun*) follows.
LAST_RUN_SCHEDULED_FOR = "lastRunScheduledFor"
LAST_RUN_STATE_RANK = "lastRunStateRank"
# ... and the hash of the request that created the job (idempotency: same key, same request?).
REQUEST_HASH = "requestHash"

HELD_JOB_STATUSES = (JobStatus.PAUSED.value, JobStatus.CANCELLED.value)
"""Job statuses that a run's report never changes (the user's decision stands)."""

JOB_STATUS_AFTER = {
    ExecutionStatus.SUCCEEDED: JobStatus.SUCCEEDED,
    ExecutionStatus.FAILED: JobStatus.FAILED,
    ExecutionStatus.CANCELLED: JobStatus.CANCELLED,
    ExecutionStatus.SKIPPED: JobStatus.SUCCEEDED,
}
"""A job with no run left takes the status of its last run's outcome (as the SQLite store's
``JOB_STATUS_AFTER``; ``tests/store/test_mongo.py`` checks that both are equal)."""

READ_BACK = {"stateRank": 1, "status": 1, "startedAt": 1, "error": 1, "attempts": 1}
"""Fields of an execution that :meth:`MongoStore.apply_events` reads back after its transitions."""

MAX_SCANS_TO_EXPLODE = 200
"""The query planner's ``internalQueryMaxScansToExplode``: a ``$in`` over at most this many
partitions, sorted on the next index key, is answered by one index scan per partition merged in
order (``SORT_MERGE``); over more, by a blocking in-memory ``SORT`` of every matching document.
The due and stale queries are therefore sent in chunks of at most this many partitions."""

UPDATE_ATTEMPTS = 3
"""How often a conditional write is retried when the document changed between its write and
the read that explains why the write matched nothing."""


@dataclass(frozen=True, slots=True)
class IndexSpec:
    """One declared index.

    Attributes:
        collection: ``jobs`` or ``executions``.
        name: the index name on the server.
        keys: (field, direction) pairs, 1 ascending, -1 descending.
        serves: the query it exists for.
        partial: ``partialFilterExpression``; queries repeat it verbatim so the planner can use it.
        unique: a unique index.
    """

    collection: str
    name: str
    keys: tuple[tuple[str, int], ...]
    serves: str
    partial: Mapping[str, Any] | None = None
    unique: bool = False

    def describe(self) -> str:
        """Keys and options, for an operator: ``{partition: 1, nextRunAt: 1}, partial {…}``."""
        keys = ", ".join(f"{k}: {d}" for k, d in self.keys)
        text = f"{{{keys}}}"
        if self.partial is not None:
            text += f", partialFilterExpression {dict(self.partial)}"
        return text + (", unique" if self.unique else "")

    def model(self) -> IndexModel:
        options: dict[str, Any] = {"name": self.name}
        if self.partial is not None:
            options["partialFilterExpression"] = dict(self.partial)
        if self.unique:
            options["unique"] = True
        return IndexModel(list(self.keys), **options)


DUE = {"nextRunAt": {"$type": "date"}}
"""Partial filter of ``jobs_due``: only jobs with a next run are indexed."""
FINISHED = {"stateRank": {"$gte": TERMINAL_RANK}}
"""Partial filter of ``executions_job_finished``: SUCCEEDED, FAILED, CANCELLED and SKIPPED runs."""
UNFINISHED = {"stateRank": {"$lt": TERMINAL_RANK}}
"""Partial filter of ``executions_open``: QUEUED, RUNNING and RETRYING runs (rank below terminal).
A range rather than ``status: {$in: …}`` so it works on every server version (``$in`` in partial
filters needs MongoDB 6.0)."""
KEYED = {"idempotencyKey": {"$type": "string"}}
"""Partial filter of ``jobs_owner_idempotency_key``: only jobs created with a key are indexed (and
unique). ``$type`` rather than ``$exists``, so a stray explicit null would not count as a key."""
IDEMPOTENCY_INDEX = "jobs_owner_idempotency_key"

INDEXES: tuple[IndexSpec, ...] = (
    IndexSpec(
        JOBS,
        "jobs_due",
        (("partition", ASCENDING), ("nextRunAt", ASCENDING)),
        "due_jobs: a scheduler's partitions, next run time <= until, earliest first",
        partial=DUE,
    ),
    IndexSpec(
        JOBS,
        "jobs_owner_created",
        (("owner", ASCENDING), ("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs without a status filter: newest first, keyset cursor (createdAt, _id)",
    ),
    IndexSpec(
        JOBS,
        "jobs_owner_status_created",
        (("owner", ASCENDING), ("status", ASCENDING), ("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs?status=…",
    ),
    IndexSpec(
        JOBS,
        "jobs_owner_last_run_status_created",
        (
            ("owner", ASCENDING),
            ("lastRunStatus", ASCENDING),
            ("createdAt", DESCENDING),
            (ID, DESCENDING),
        ),
        "list_jobs?lastRunStatus=…",
    ),
    IndexSpec(
        JOBS,
        IDEMPOTENCY_INDEX,
        (("owner", ASCENDING), ("idempotencyKey", ASCENDING)),
        "create_job: an idempotency key is unique per owner; the lookup of the job that has it",
        partial=KEYED,
        unique=True,
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_job_scheduled",
        (("jobId", ASCENDING), ("scheduledFor", DESCENDING), (ID, DESCENDING)),
        "list_executions: a job's runs, newest scheduled time first, keyset cursor",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_owner_status_scheduled",
        (("owner", ASCENDING), ("status", ASCENDING), ("scheduledFor", DESCENDING)),
        "dashboards of one user: runs by status and scheduled time",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_status_scheduled",
        (("status", ASCENDING), ("scheduledFor", DESCENDING)),
        "dashboards of all users: runs by status and scheduled time, running jobs",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_job_finished",
        (("jobId", ASCENDING), ("finishedAt", DESCENDING), (ID, DESCENDING)),
        "prune_executions: a job's finished runs, most recently finished first (count rule) or "
        "finished before a time (age rule)",
        partial=FINISHED,
    ),
    IndexSpec(
        JOBS,
        "jobs_partition",
        (("partition", ASCENDING), (ID, ASCENDING)),
        "partition_jobs: the jobs of one partition in id order (the retention sweep)",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_open",
        (("partition", ASCENDING), ("updatedAt", ASCENDING)),
        "stale_executions: unfinished runs of a scheduler's partitions, oldest transition first",
        partial=UNFINISHED,
    ),
    IndexSpec(
        DEAD_LETTERS,
        "dead_letters_at",
        (("at", DESCENDING), (ID, DESCENDING)),
        "dead_letters: the latest first",
    ),
)
"""Every index jobsched creates, besides the unique ``_id_`` index of each collection (job id;
execution id ``<jobId>:<scheduledFor>``, so a duplicate dispatch cannot create a second record)."""


# --- documents: the one place that maps id <-> _id ----------------------------------------------


def to_document(obj: Model) -> Document:
    """The stored document of a job or an execution: camelCase fields, ``_id``, BSON dates.

    Null fields are left out (absent means null).
    """
    fields = msgspec.to_builtins(obj, builtin_types=(datetime,))
    doc: Document = {ID: fields.pop("id")}
    doc.update((k, v) for k, v in fields.items() if v is not None)
    return doc


def from_document(doc: Mapping[str, Any], kind: type[M]) -> M:
    """The struct stored as ``doc`` (unknown fields are ignored, absent ones take defaults)."""
    fields = {k: v for k, v in doc.items() if k != ID}
    fields["id"] = doc[ID]
    return msgspec.convert(fields, kind)


def dead_letter_document(letter: DeadLetter) -> Document:
    """The stored document of a dead letter: its payload as BSON binary."""
    doc = to_document(letter)
    doc["data"] = Binary(letter.data)
    return doc


def dead_letter_from_document(doc: Mapping[str, Any]) -> DeadLetter:
    return from_document({**doc, "data": bytes(doc.get("data", b""))}, DeadLetter)


SPEC_FIELDS = {
    f.name: f.encode_name
    for f in msgspec.structs.fields(Job)
    if f.name in {s.name for s in dataclasses.fields(JobSpec)}
}
"""The job document's field of each :class:`core.ports.JobSpec` attribute (the Job's renames)."""
assert len(SPEC_FIELDS) == len(dataclasses.fields(JobSpec)), "a JobSpec field is not a Job field"


def spec_fields(spec: JobSpec) -> Document:
    """The job-document fields of ``spec``, encoded as :func:`to_document` encodes a job's."""
    return {
        name: msgspec.to_builtins(getattr(spec, attr), builtin_types=(datetime,))
        for attr, name in SPEC_FIELDS.items()
    }


def set_or_unset(fields: Mapping[str, Any]) -> Document:
    """An update that sets the non-null ``fields`` and removes the null ones."""
    update: Document = {}
    values = {k: v for k, v in fields.items() if v is not None}
    nulls = {k: "" for k, v in fields.items() if v is None}
    if values:
        update["$set"] = values
    if nulls:
        update["$unset"] = nulls
    return update


def database_name(url: str) -> str:
    """The database named by a ``mongodb://host/<name>?…`` URL, ``jobsched`` when it has none."""
    return unquote(urlsplit(url).path.lstrip("/")) or DEFAULT_DATABASE


# --- queries (pure: tests check that every one is served by an index) ---------------------------


def jobs_query(owner: str, query: JobQuery, cursor: str | None) -> Document:
    """The filter of ``list_jobs``; sort with :data:`NEWEST_JOBS_FIRST`."""
    where: Document = {"owner": owner}
    if query.status is not None:
        where["status"] = query.status.value
    if query.last_run_status is not None:
        where["lastRunStatus"] = query.last_run_status.value
    created: Document = {}
    if query.created_from is not None:
        created["$gte"] = query.created_from
    if query.created_to is not None:
        created["$lt"] = query.created_to
    if cursor is not None:
        created_ms, last_id = decode_cursor(cursor)
        after = from_epoch_ms(created_ms)
        created["$lte"] = after
        where["$or"] = [{"createdAt": {"$lt": after}}, {ID: {"$lt": last_id}}]
    if created:
        where["createdAt"] = created
    return where


NEWEST_JOBS_FIRST = [("createdAt", DESCENDING), (ID, DESCENDING)]
NEWEST_RUNS_FIRST = [("scheduledFor", DESCENDING), (ID, DESCENDING)]


def executions_query(job_id: str, cursor: str | None) -> Document:
    """The filter of ``list_executions``; sort with :data:`NEWEST_RUNS_FIRST`."""
    where: Document = {"jobId": job_id}
    if cursor is not None:
        sf_ms, last_id = decode_cursor(cursor)
        after = from_epoch_ms(sf_ms)
        where["scheduledFor"] = {"$lte": after}
        where["$or"] = [{"scheduledFor": {"$lt": after}}, {ID: {"$lt": last_id}}]
    return where


def chunks(partitions: Collection[int]) -> list[list[int]]:
    """``partitions``, sorted, in chunks of at most :data:`MAX_SCANS_TO_EXPLODE`."""
    parts = sorted(partitions)
    return [parts[i : i + MAX_SCANS_TO_EXPLODE] for i in range(0, len(parts), MAX_SCANS_TO_EXPLODE)]


def due_query(partitions: Sequence[int], until: datetime) -> Document:
    """The filter of ``due_jobs`` for at most :data:`MAX_SCANS_TO_EXPLODE` partitions (it
    repeats the partial filter of ``jobs_due``)."""
    return {
        "partition": {"$in": list(partitions)},
        "nextRunAt": {**DUE["nextRunAt"], "$lte": until},
    }


def stale_query(
    partitions: Sequence[int], updated_before: datetime, updated_after: datetime | None = None
) -> Document:
    """The filter of ``stale_executions`` for at most :data:`MAX_SCANS_TO_EXPLODE` partitions
    (it repeats the partial filter of ``executions_open``)."""
    updated: Document = {"$lt": updated_before}
    if updated_after is not None:
        updated["$gte"] = updated_after
    return {**UNFINISHED, "partition": {"$in": list(partitions)}, "updatedAt": updated}


MOST_RECENTLY_FINISHED_FIRST = [("finishedAt", DESCENDING), (ID, DESCENDING)]
OLDEST_FINISHED_FIRST = [("finishedAt", ASCENDING), (ID, ASCENDING)]


def finished_query(job_id: str) -> Document:
    """A job's finished runs (it repeats the partial filter of ``executions_job_finished``);
    sort with :data:`MOST_RECENTLY_FINISHED_FIRST` for the count rule."""
    return {"jobId": job_id, **FINISHED}


def finished_before_query(job_id: str, before: datetime, keep_id: str | None) -> Document:
    """A job's runs that finished before ``before``, but ``keep_id``; sort with
    :data:`OLDEST_FINISHED_FIRST`."""
    where: Document = {**finished_query(job_id), "finishedAt": {"$lt": before}}
    if keep_id is not None:
        where[ID] = {"$ne": keep_id}
    return where


def partition_query(partition: int, after: str | None) -> Document:
    """The filter of ``partition_jobs``; sort by ``_id``."""
    return {"partition": partition, ID: {"$gt": after or ""}}


def advance_op(d: Dispatch, now: datetime) -> UpdateOne:
    """The compare-and-set of one dispatch: only if ``nextRunAt`` is still the expected one.

    A run sent to the workers (a QUEUED record, not a SKIPPED one) is also the job's
    ``lastDispatchedFor``.
    """
    fields: Document = {
        "nextRunAt": d.next_run_at,
        "lastScheduledFor": d.execution.scheduled_for,
        "updatedAt": now,
    }
    if d.execution.status == ExecutionStatus.QUEUED:
        fields["lastDispatchedFor"] = d.execution.scheduled_for
    update = set_or_unset(fields)
    update["$inc"] = {"runCount": 1}
    return UpdateOne({ID: d.execution.job_id, "nextRunAt": d.expected_next_run_at}, update)


def key_query(owner: str, idempotency_key: str) -> Document:
    """The filter that finds ``owner``'s job created with ``idempotency_key`` (it repeats the
    partial filter of ``jobs_owner_idempotency_key``)."""
    return {"owner": owner, "idempotencyKey": {**KEYED["idempotencyKey"], "$eq": idempotency_key}}


def change_query(owner: str, job_id: str, change: JobChange) -> Document:
    """The filter of :meth:`MongoStore.update_job`: the job, if its status allows ``change``."""
    where: Document = {ID: job_id, "owner": owner}
    if change.allowed_from is not None:
        where["status"] = {"$in": sorted(s.value for s in change.allowed_from)}
    return where


def change_update(change: JobChange, now: datetime) -> Document:
    """The update of :meth:`MongoStore.update_job`: ``updatedAt``, then what ``change`` sets."""
    fields: Document = {"updatedAt": now}
    if change.status is not None:
        fields["status"] = change.status.value
    if change.next_run_at is not UNCHANGED:
        if change.next_run_at is not None and not isinstance(change.next_run_at, datetime):
            raise TypeError(f"JobChange.next_run_at: {change.next_run_at!r} is not an instant")
        fields["nextRunAt"] = change.next_run_at
    if change.spec is not None:
        fields.update(spec_fields(change.spec))
    return set_or_unset(fields)


def transition_op(ev: StatusEvent, *, upsert: bool = True) -> UpdateOne:
    """The conditional upsert of one event into its execution: applied only if it moves the run
    forward (``stateRank`` below the event's rank). Same rules as the SQLite store: the first
    ``publishedAt`` / ``startedAt`` stay, ``workerId`` and ``error`` keep their last known value,
    SUCCEEDED clears ``error``."""
    set_: Document = {
        "status": ev.status.value,
        "stateRank": ev.rank,
        "attempt": ev.attempt,
        "updatedAt": ev.at,
    }
    unset: Document = {}
    for name, value in (
        ("finishedAt", ev.finished_at),
        ("nextAttemptAt", ev.next_attempt_at),
        ("result", ev.result),
    ):
        if value is None:
            unset[name] = ""
        else:
            set_[name] = value
    if ev.worker_id is not None:
        set_["workerId"] = ev.worker_id
    if ev.status == ExecutionStatus.SUCCEEDED:
        unset["error"] = ""
    elif ev.error is not None:
        set_["error"] = ev.error
    first = {
        k: v
        for k, v in (("publishedAt", ev.published_at), ("startedAt", ev.started_at))
        if v is not None
    }
    on_insert = {
        "jobId": ev.job_id,
        "owner": ev.owner,
        "partition": ev.partition,
        "taskId": ev.task_id,
        "queue": ev.queue,
        "maxAttempts": ev.max_attempts,
        "scheduledFor": ev.scheduled_for,
        "createdAt": ev.at,
    }
    update: Document = {"$set": set_, "$setOnInsert": on_insert}
    if unset:
        update["$unset"] = unset
    if first:
        update["$min"] = first
    return UpdateOne({ID: ev.execution_id, "stateRank": {"$lt": ev.rank}}, update, upsert=upsert)


def summary_ops(
    ev: StatusEvent, *, first_started_at: datetime | None = None, run_error: str | None = None
) -> list[UpdateOne]:
    """The job-summary update of one (non-QUEUED) event whose rank and status are the
    execution's now; ``first_started_at`` is the run's first start (``lastRunAt``) and
    ``run_error`` its error now (``lastError``: a run retrying after a failed attempt keeps it,
    however the events were batched).

    Applied only if the job's summary does not already follow a later run, or a later state of
    this run (equal is re-applied: idempotent). A PAUSED or CANCELLED job keeps its status. Any
    other job is RUNNING while a run is in progress; after a terminal event it takes the status
    :data:`JOB_STATUS_AFTER` that outcome if it has no next run, else SCHEDULED. Updates with
    exclusive filters on ``status`` and ``nextRunAt`` instead of a read; the first (a held
    status) goes first, so no later update of the list matches a job an earlier one changed.
    """
    sf = ev.scheduled_for
    where: Document = {
        ID: ev.job_id,
        "$or": [
            {LAST_RUN_SCHEDULED_FOR: None},
            {LAST_RUN_SCHEDULED_FOR: {"$lt": sf}},
            {LAST_RUN_SCHEDULED_FOR: sf, LAST_RUN_STATE_RANK: {"$lte": ev.rank}},
        ],
    }
    fields: Document = {
        "lastExecutionId": ev.execution_id,
        LAST_RUN_SCHEDULED_FOR: sf,
        LAST_RUN_STATE_RANK: ev.rank,
        "updatedAt": ev.at,
    }
    unset: Document = {}
    started = first_started_at or ev.started_at
    if started is not None:
        fields["lastRunAt"] = started
    if ev.status in TERMINAL_EXECUTION_STATUSES:
        fields["lastRunStatus"] = ev.status.value
    if ev.status == ExecutionStatus.SUCCEEDED:
        unset["lastError"] = ""
    elif (error := run_error if run_error is not None else ev.error) is not None:
        fields["lastError"] = error

    def op(extra: Document, status: JobStatus | None) -> UpdateOne:
        update: Document = {
            "$set": fields if status is None else {**fields, "status": status.value}
        }
        if unset:
            update["$unset"] = unset
        return UpdateOne({**where, **extra}, update)

    held = op({"status": {"$in": list(HELD_JOB_STATUSES)}}, None)
    free: Document = {"status": {"$nin": list(HELD_JOB_STATUSES)}}
    if ev.status.value in RUN_STATUSES:
        return [held, op(free, JobStatus.RUNNING)]
    return [
        held,
        op({**free, "nextRunAt": None}, JOB_STATUS_AFTER.get(ev.status, JobStatus.SCHEDULED)),
        op({**free, "nextRunAt": {"$ne": None}}, JobStatus.SCHEDULED),
    ]


# --- the store -----------------------------------------------------------------------------------


class MongoStore:
    """:class:`core.ports.JobStore` on a MongoDB replica set (MongoDB 6.0 or later).

    A replica set is required (a one-member one will do): majority write concern and retryable
    writes need one. The constructor does no I/O; :meth:`open` connects and creates the indexes.

    Args:
        url: ``mongodb://…`` or ``mongodb+srv://…``; its path names the database (default
            ``jobsched``). Options in the URL win over the defaults below.
        timeout_s: server selection and connect timeout (seconds): how long a call waits for a
            reachable primary before it fails with :class:`StoreUnavailable`, so a gateway answers
            503 quickly.
        operation_timeout_s: how long one round trip may take, majority acknowledgement included,
            before the connection is dropped and the call fails with :class:`StoreUnavailable`
            (``socketTimeoutMS``; not PyMongo's ``timeoutMS``, which would also stretch server
            selection to this long).
        client: an existing client to use instead of creating one (tests pass an in-process
            fake). The store does not close a client it did not create.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        operation_timeout_s: float = 30.0,
        client: AsyncMongoClient[Document] | None = None,
    ) -> None:
        self.url = url
        self.database_name = database_name(url)
        self._timeout_ms = int(timeout_s * 1000)
        self._operation_timeout_ms = int(operation_timeout_s * 1000)
        self._given_client = client
        self._client: AsyncMongoClient[Document] | None = None
        self._db: AsyncDatabase[Document] | None = None
        self.rows = RowReader("mongodb")

    def _client_options(self) -> dict[str, Any]:
        in_url = {k.lower() for k, _ in parse_qsl(urlsplit(self.url).query)}
        defaults: dict[str, Any] = {
            "serverSelectionTimeoutMS": self._timeout_ms,
            "connectTimeoutMS": self._timeout_ms,
            "socketTimeoutMS": self._operation_timeout_ms,
            "retryWrites": True,
            "retryReads": True,
            "appname": "jobsched",
        }
        options = {k: v for k, v in defaults.items() if k.lower() not in in_url}
        options.update(document_class=dict, tz_aware=True, tzinfo=UTC)
        return options

    async def open(self) -> None:
        if self._db is not None:
            return
        client = self._given_client
        if client is None:
            try:
                client = AsyncMongoClient(self.url, **self._client_options())
            except ConfigurationError as e:
                raise ConfigError(f"JOBSCHED_STORE_URL: {e}") from None
        db = client.get_database(
            self.database_name, codec_options=CODEC_OPTIONS, write_concern=DURABLE
        )
        try:
            await _create_indexes(db)
        except BaseException:
            if client is not self._given_client:
                await client.close()
            raise
        self._client, self._db = client, db

    async def close(self) -> None:
        client, self._client, self._db = self._client, None, None
        if client is not None and client is not self._given_client:
            await client.close()

    @property
    def database(self) -> AsyncDatabase[Document]:
        """The open database (for dashboards and tests).

        Raises:
            StoreUnavailable: the store is not open.
        """
        if self._db is None:
            raise StoreUnavailable("the store is not open")
        return self._db

    @property
    def _jobs(self) -> AsyncCollection[Document]:
        return self.database[JOBS]

    @property
    def _executions(self) -> AsyncCollection[Document]:
        return self.database[EXECUTIONS]

    async def ping(self) -> None:
        with translated("ping"):
            await self.database.command("ping")

    async def create_job(self, job: Job, *, request_hash: str | None = None) -> Job:
        """See :meth:`core.ports.JobStore.create_job`. One insert; the unique indexes decide.

        A duplicate key on a job with an idempotency key reads the job that holds the key (the
        winner of a concurrent create, or an earlier one): if there is one, the key was reused,
        whichever index the server reported (a key outranks a duplicate id, as in the SQLite
        store). If the key's index reported the duplicate but its job is gone (deleted
        meanwhile), the insert is tried again.
        """
        doc = to_document(job)
        if request_hash is not None:
            doc[REQUEST_HASH] = request_hash
        for _ in range(UPDATE_ATTEMPTS):
            try:
                with translated("create job", passing=(DuplicateKeyError,)):
                    await self._jobs.insert_one(doc)
            except DuplicateKeyError as e:
                index = duplicate_index(e)
            else:
                return job
            if job.idempotency_key is not None:
                with translated("read the job of an idempotency key"):
                    winner = await self._jobs.find_one(key_query(job.owner, job.idempotency_key))
                if winner is not None:
                    raise IdempotencyKeyReused(
                        from_document(winner, Job),
                        same_request=winner.get(REQUEST_HASH) == request_hash,
                    )
            if index != IDEMPOTENCY_INDEX:
                raise Conflict(f"job {job.id} exists")
        raise StoreUnavailable("the job's idempotency key kept changing hands; retry")

    async def update_job(self, owner: str, job_id: str, change: JobChange, *, now: datetime) -> Job:
        """See :meth:`core.ports.JobStore.update_job`. One ``findAndModify`` whose filter holds
        the allowed statuses; when it matches nothing, a read tells a missing job from a status
        conflict (and retries if the job reached an allowed status in between)."""
        update = change_update(change, now)
        for _ in range(UPDATE_ATTEMPTS):
            with translated("update job"):
                doc = await self._jobs.find_one_and_update(
                    change_query(owner, job_id, change),
                    update,
                    return_document=ReturnDocument.AFTER,
                )
                if doc is not None:
                    return from_document(doc, Job)
                current = await self._jobs.find_one({ID: job_id, "owner": owner}, {"status": 1})
            if current is None:
                raise JobNotFound(f"job {job_id} not found")
            status = JobStatus(current["status"])
            if change.allowed_from is not None and status not in change.allowed_from:
                raise JobStatusConflict(job_id, status, change.action)
        raise StoreUnavailable(f"job {job_id} kept changing; retry")

    async def delete_job(self, owner: str, job_id: str) -> None:
        """See :meth:`core.ports.JobStore.delete_job`. The job first (its owner checked by the
        same write, and no dispatch can advance it after), then its executions. A failure in
        between leaves executions that no API call reaches (they are listed through their job),
        as does a late status event of a deleted job's run."""
        with translated("delete job"):
            result = await self._jobs.delete_one({ID: job_id, "owner": owner})
            if result.deleted_count == 0:
                raise JobNotFound(f"job {job_id} not found")
            await self._executions.delete_many({"jobId": job_id})

    async def insert_execution(self, execution: Execution) -> bool:
        try:
            with translated("insert execution", passing=(DuplicateKeyError,)):
                await self._executions.insert_one(to_document(execution))
        except DuplicateKeyError:
            return False
        return True

    async def get_executions(self, execution_ids: Collection[str]) -> list[Execution]:
        ids = list(dict.fromkeys(execution_ids))
        if not ids:
            return []
        with translated("get executions"):
            docs = await self._executions.find({ID: {"$in": ids}}).to_list()
        return self._runs(docs)

    async def get_job(self, owner: str, job_id: str) -> Job:
        with translated("get job"):
            doc = await self._jobs.find_one({ID: job_id, "owner": owner})
        if doc is None:
            raise JobNotFound(f"job {job_id} not found")
        return from_document(doc, Job)

    async def list_jobs(
        self, owner: str, query: JobQuery, *, limit: int, cursor: str | None
    ) -> Page[Job]:
        where = jobs_query(owner, query, cursor)
        with translated("list jobs"):
            docs = await self._jobs.find(where).sort(NEWEST_JOBS_FIRST).limit(limit + 1).to_list()
        items = [from_document(d, Job) for d in docs[:limit]]
        more = len(docs) > limit
        nxt = encode_cursor(to_epoch_ms(items[-1].created_at), items[-1].id) if more else None
        return Page(items=items, next_cursor=nxt)

    async def list_executions(
        self, owner: str, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        await self.get_job(owner, job_id)
        where = executions_query(job_id, cursor)
        with translated("list executions"):
            docs = (
                await self._executions.find(where)
                .sort(NEWEST_RUNS_FIRST)
                .limit(limit + 1)
                .to_list()
            )
        items = [from_document(d, Execution) for d in docs[:limit]]
        more = len(docs) > limit
        nxt = encode_cursor(to_epoch_ms(items[-1].scheduled_for), items[-1].id) if more else None
        return Page(items=items, next_cursor=nxt)

    async def get_execution(self, execution_id: str) -> Execution | None:
        with translated("get execution"):
            doc = await self._executions.find_one({ID: execution_id})
        return None if doc is None else from_document(doc, Execution)

    async def get_jobs(self, job_ids: Collection[str]) -> list[Job]:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        with translated("get jobs"):
            docs = await self._jobs.find({ID: {"$in": ids}}).to_list()
        return self._jobs_of(docs)

    async def due_jobs(
        self, partitions: Collection[int], until: datetime, *, limit: int
    ) -> list[Job]:
        """See :meth:`core.ports.JobStore.due_jobs`: one query per chunk of at most
        :data:`MAX_SCANS_TO_EXPLODE` partitions, each answered in index order, merged.

        Once ``limit`` jobs are in hand, later chunks are asked only for jobs due no later
        than the ``limit``-th earliest so far, so a backlog beyond ``limit`` costs a few times
        ``limit`` documents, not one ``limit`` per chunk (with fewer due jobs, all of them).
        """
        if not partitions or limit < 1:
            return []
        found: list[Job] = []
        for chunk in chunks(partitions):
            bound = (
                until if len(found) < limit else min(until, found[limit - 1].next_run_at or until)
            )
            with translated("due jobs"):
                docs = (
                    await self._jobs.find(due_query(chunk, bound))
                    .sort([("nextRunAt", ASCENDING)])
                    .limit(limit)
                    .to_list()
                )
            merged = heapq.merge(found, self._jobs_of(docs), key=lambda j: j.next_run_at or until)
            found = list(merged)[:limit]
        return found

    async def stale_executions(
        self,
        partitions: Collection[int],
        updated_before: datetime,
        *,
        limit: int,
        updated_after: datetime | None = None,
    ) -> list[Execution]:
        """See :meth:`core.ports.JobStore.stale_executions`; chunked as :meth:`due_jobs`."""
        if not partitions or limit < 1:
            return []
        found: list[Execution] = []
        for chunk in chunks(partitions):
            bound = updated_before
            if len(found) >= limit:  # no later than the limit-th oldest so far (ms precision)
                bound = min(bound, found[limit - 1].updated_at + timedelta(milliseconds=1))
            with translated("stale executions"):
                docs = (
                    await self._executions.find(stale_query(chunk, bound, updated_after))
                    .sort([("updatedAt", ASCENDING)])
                    .limit(limit)
                    .to_list()
                )
            found = list(heapq.merge(found, self._runs(docs), key=lambda e: e.updated_at))[:limit]
        return found

    def _jobs_of(self, docs: list[Document]) -> list[Job]:
        return self.rows.decode(
            docs, lambda d: from_document(d, Job), what="job", key=lambda d: d.get(ID)
        )

    def _runs(self, docs: list[Document]) -> list[Execution]:
        return self.rows.decode(
            docs, lambda d: from_document(d, Execution), what="execution", key=lambda d: d.get(ID)
        )

    async def prune_executions(
        self, targets: Sequence[PruneTarget], *, limit: int
    ) -> list[PruneResult]:
        """See :meth:`core.ports.JobStore.prune_executions`. Per target, the runs to delete are
        found with the index ``executions_job_finished`` (the age rule: finished before the
        cutoff, oldest first; the count rule: skip the ``keep_last`` most recently finished) and
        deleted with ``{_id: {$in: …}, stateRank: {$gte: <terminal>}}``, so a run that is not
        finished is never deleted whatever happened in between."""
        results: list[PruneResult] = []
        budget = limit
        for t in targets:
            doomed: list[str] = []
            complete = True
            if t.finished_before is not None:
                where = finished_before_query(t.job_id, t.finished_before, t.keep_id)
                doomed = await self._finished_ids(where, OLDEST_FINISHED_FIRST, 0, budget)
                complete = len(doomed) < budget
            if t.keep_last is not None and complete:
                left = budget - len(doomed)
                where = finished_query(t.job_id)
                ids = await self._finished_ids(
                    where, MOST_RECENTLY_FINISHED_FIRST, t.keep_last, left
                )
                doomed += [i for i in ids if i != t.keep_id]
                complete = len(ids) < left
            budget -= len(doomed)
            deleted = await self._delete_finished(doomed)
            results.append(PruneResult(deleted=deleted, complete=complete))
        return results

    async def _finished_ids(
        self, where: Document, sort: list[tuple[str, int]], skip: int, limit: int
    ) -> list[str]:
        if limit < 1:
            return []
        with translated("find runs to prune"):
            docs = (
                await self._executions.find(where, {ID: 1})
                .sort(sort)
                .skip(skip)
                .limit(limit)
                .to_list()
            )
        return [d[ID] for d in docs]

    async def _delete_finished(self, ids: list[str]) -> int:
        if not ids:
            return 0
        with translated("delete finished runs"):
            result = await self._executions.delete_many({ID: {"$in": ids}, **FINISHED})
        return result.deleted_count

    async def partition_jobs(self, partition: int, *, after: str | None, limit: int) -> list[Job]:
        if limit < 1:
            return []
        with translated("partition jobs"):
            docs = (
                await self._jobs.find(partition_query(partition, after))
                .sort([(ID, ASCENDING)])
                .limit(limit)
                .to_list()
            )
        return self._jobs_of(docs)

    async def dispatch(self, runs: Sequence[Dispatch]) -> list[DispatchOutcome]:
        """See :meth:`core.ports.JobStore.dispatch`. Without a transaction, in four steps:

        1. insert every execution (unordered; a duplicate key means it existed: not created);
        2. compare-and-set every job, in order, in one bulk write;
        3. read the jobs back: a run is ``advanced`` when its job now points past it
           (``lastScheduledFor`` = its scheduled time and ``nextRunAt`` = the Dispatch's
           ``next_run_at``), by this call or by a twin — the SQLite store's rule;
        4. delete the executions this call created for runs that were not advanced, while they
           are still in the status it inserted them with (QUEUED; SKIPPED records never change),
           so no orphan run remains.

        A failure between 1 and 2 leaves a QUEUED execution whose job was not advanced; the
        scheduler's retry of the same dispatch finds it (created=False) and advances the job.
        """
        if not runs:
            return []
        inserted = await self._insert_executions([d.execution for d in runs])
        now = runs[0].execution.created_at
        with translated("advance jobs"):
            await self._jobs.bulk_write([advance_op(d, now) for d in runs], ordered=True)
        advanced = await self._advanced(runs)
        orphans = [
            d.execution
            for d, ok, new in zip(runs, advanced, inserted, strict=True)
            if new and not ok
        ]
        kept = await self._delete_unchanged(orphans)
        return [
            DispatchOutcome(created=new and (ok or d.execution.id in kept), advanced=ok)
            for d, ok, new in zip(runs, advanced, inserted, strict=True)
        ]

    async def _insert_executions(self, executions: Sequence[Execution]) -> list[bool]:
        """Insert ``executions``; for each, whether this call inserted it."""
        try:
            with translated("insert executions", passing=(BulkWriteError,)):
                await self._executions.insert_many(
                    [to_document(e) for e in executions], ordered=False
                )
        except BulkWriteError as e:
            existed = duplicate_indexes(e, "insert executions")
            return [i not in existed for i in range(len(executions))]
        return [True] * len(executions)

    async def _advanced(self, runs: Sequence[Dispatch]) -> list[bool]:
        """Which runs advanced their job (see :func:`store.dispatching.advanced`)."""
        ids = list(dict.fromkeys(d.execution.job_id for d in runs))
        with translated("read back jobs"):
            docs = await self._jobs.find(
                {ID: {"$in": ids}}, {"lastScheduledFor": 1, "nextRunAt": 1}
            ).to_list()
        return advanced(
            runs, {d[ID]: (d.get("lastScheduledFor"), d.get("nextRunAt")) for d in docs}
        )

    async def _delete_unchanged(self, executions: list[Execution]) -> set[str]:
        """Delete those of ``executions`` still in the status they were inserted with (one
        delete per status); return the ids of the ones kept."""
        if not executions:
            return set()
        by_status: dict[str, list[str]] = {}
        for e in executions:
            by_status.setdefault(e.status.value, []).append(e.id)
        with translated("delete orphan executions"):
            deleted = 0
            for status, of_status in by_status.items():
                result = await self._executions.delete_many(
                    {ID: {"$in": of_status}, "status": status}
                )
                deleted += result.deleted_count
            if deleted == len(executions):
                return set()
            kept = await self._executions.find(
                {ID: {"$in": [e.id for e in executions]}}, {ID: 1}
            ).to_list()
        ids = {d[ID] for d in kept}
        log.warning("dispatch: kept %d execution(s) that moved on meanwhile: %s", len(ids), ids)
        return ids

    async def apply_events(self, events: Sequence[StatusEvent]) -> int:
        """See :meth:`core.ports.JobStore.apply_events`. Without a transaction:

        1. one unordered bulk of conditional upserts (``stateRank < rank``); a duplicate key on
           upsert means the execution exists with a rank >= the event's, unless a concurrent
           upsert created it a moment ago: those are retried once without upsert;
        2. read back the executions: the summary of an event applies only if its rank and status
           are the execution's now (moved forward now, or a redelivery of the current state —
           re-applied, idempotent), as the SQLite store's ``EXISTS (… state_rank = :rank AND
           status = :status)``; ``lastRunAt`` is the run's first start, ``lastError`` its error;
        3. one ordered bulk of conditional job-summary updates (:func:`summary_ops`).

        Returns how many events moved an execution forward. Results and errors are stored as
        :func:`core.values.storable_event` bounds them (as the SQLite store stores them).
        """
        if not events:
            return 0
        events = [storable_event(ev) for ev in events]
        changed, retry = await self._transitions(events, upsert=True)
        if retry:
            again, _ = await self._transitions([events[i] for i in retry], upsert=False)
            changed += again
        summaries = [ev for ev in events if ev.status != ExecutionStatus.QUEUED]
        observing: dict[str, list[StatusEvent]] = {}
        for ev in events:
            if observes_attempt(ev):
                observing.setdefault(ev.execution_id, []).append(ev)
        ids = list(dict.fromkeys([*(ev.execution_id for ev in summaries), *observing]))
        if not ids:
            return changed
        with translated("read back executions"):
            docs = await self._executions.find({ID: {"$in": ids}}, READ_BACK).to_list()
            now = {d[ID]: d for d in docs}
            ops = [
                op
                for ev in summaries
                if (run := now.get(ev.execution_id)) is not None
                and (run.get("stateRank"), run.get("status")) == (ev.rank, ev.status.value)
                for op in summary_ops(
                    ev, first_started_at=run.get("startedAt"), run_error=run.get("error")
                )
            ]
            if ops:
                await self._jobs.bulk_write(ops, ordered=True)
        await self._record_attempts(observing, now)
        return changed

    async def _record_attempts(
        self, observing: Mapping[str, Sequence[StatusEvent]], docs: Mapping[str, Document]
    ) -> None:
        """Merge the events into their runs' ``attempts`` (:func:`core.history.record_attempts`).

        Each merged list is written with a compare-and-set on the list read (``{_id, attempts:
        <as read>}``): a concurrent recorder's merge in between makes it match nothing, and that
        run is read and merged again (merging is idempotent, so runs already written are left
        alone). ``docs`` are the executions as read back by :meth:`apply_events`.

        Raises:
            StoreUnavailable: a history kept changing under :data:`UPDATE_ATTEMPTS` merges (the
                recorder retries the batch).
        """
        for _ in range(UPDATE_ATTEMPTS):
            ops, ids = [], []
            for run_id, events in observing.items():
                doc = docs.get(run_id)
                if doc is None or doc.get("status") == NEVER_RAN.value:  # deleted; never ran
                    continue
                stored = doc.get("attempts")
                known = _stored_attempts(run_id, stored)
                history = record_attempts(known, events)
                if history == known:
                    continue
                read = {"$exists": False} if stored is None else stored
                update = {
                    "$set": {"attempts": msgspec.to_builtins(history, builtin_types=(datetime,))}
                }
                ops.append(UpdateOne({ID: run_id, "attempts": read}, update))
                ids.append(run_id)
            if not ops:
                return
            with translated("record attempts"):
                result = await self._executions.bulk_write(ops, ordered=False)
                if result.matched_count == len(ops):
                    return
                again = await self._executions.find(
                    {ID: {"$in": ids}}, {"status": 1, "attempts": 1}
                ).to_list()
            docs = {d[ID]: d for d in again}
            observing = {run_id: observing[run_id] for run_id in ids}
        raise StoreUnavailable("the attempt history of a run kept changing; retry")

    async def _transitions(
        self, events: Sequence[StatusEvent], *, upsert: bool
    ) -> tuple[int, list[int]]:
        """Apply ``events`` to their executions; return (moved forward, indexes to retry)."""
        ops = [transition_op(ev, upsert=upsert) for ev in events]
        try:
            with translated("record transitions", passing=(BulkWriteError,)):
                result = await self._executions.bulk_write(ops, ordered=False)
        except BulkWriteError as e:
            duplicates = duplicate_indexes(e, "record transitions")
            return e.details.get("nModified", 0) + e.details.get("nUpserted", 0), sorted(duplicates)
        return result.modified_count + result.upserted_count, []

    async def dead_letter(self, letters: Sequence[DeadLetter]) -> int:
        """See :meth:`core.ports.JobStore.dead_letter`: one unordered insert; a duplicate id is
        a letter stored before (a redelivery)."""
        if not letters:
            return 0
        try:
            with translated("store dead letters", passing=(BulkWriteError,)):
                await self.database[DEAD_LETTERS].insert_many(
                    [dead_letter_document(x) for x in letters], ordered=False
                )
        except BulkWriteError as e:
            return len(letters) - len(duplicate_indexes(e, "store dead letters"))
        return len(letters)

    async def dead_letters(self, *, limit: int) -> list[DeadLetter]:
        with translated("read dead letters"):
            docs = (
                await self.database[DEAD_LETTERS]
                .find({})
                .sort([("at", DESCENDING), (ID, DESCENDING)])
                .limit(limit)
                .to_list()
            )
        return self.rows.decode(
            docs, dead_letter_from_document, what="dead letter", key=lambda d: d.get(ID)
        )


async def _create_indexes(db: AsyncDatabase[Document]) -> None:
    """Create every index of :data:`INDEXES` (idempotent), one at a time so that an index the
    server cannot create as declared is named.

    Raises:
        ConfigError: an index of the same name or keys exists with other options, or the server
            refuses to build it (see :func:`store.mongo_errors.index_error`).
        StoreUnavailable: the server cannot be reached.
    """
    for spec in INDEXES:
        try:
            with translated(f"create index {spec.collection}.{spec.name}"):
                await db[spec.collection].create_indexes([spec.model()])
        except (StoreUnavailable, StoreRejected) as e:
            error = index_error(e, spec.collection, spec.name, spec.describe())
            if error is not None:
                raise error from None
            raise


def _stored_attempts(run_id: str, stored: Any) -> list[Attempt]:
    """A run's stored ``attempts``; an unreadable value (a newer version's, edited by hand) is
    logged and started anew, so it never stops the recorder."""
    if not stored:
        return []
    try:
        return msgspec.convert(stored, list[Attempt])
    except msgspec.ValidationError as e:
        log.warning("mongodb: run %s has unreadable attempts (%s); recording them anew", run_id, e)
        return []
