"""Schema of the MongoDB store: its collections, the bookkeeping fields of a job document, the
write concern and codec options, and every index (:data:`INDEXES`), created by
:func:`create_indexes`. The document shapes are a public interface: dashboards read them
(``docs/data-model.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import unquote, urlsplit

from bson.codec_options import CodecOptions
from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.write_concern import WriteConcern

from core.errors import StoreRejected, StoreUnavailable
from core.model import TERMINAL_RANK
from store.mongo_errors import index_error, translated

Document = dict[str, Any]

DEFAULT_DATABASE = "jobsched"
JOBS = "jobs"
EXECUTIONS = "executions"
DEAD_LETTERS = "dead_letters"
AUDIT = "audit"
QUOTA_BUCKETS = "quota_buckets"
BULK_ACTIONS = "bulk_actions"
ID = "_id"

DURABLE = WriteConcern(w="majority", j=True)
"""Every write: acknowledged by a majority of the replica set, after it reached the journal."""

CODEC_OPTIONS: CodecOptions[Document] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)
"""BSON dates come back as aware UTC datetimes."""

# Bookkeeping fields of a job document that are not part of the Job schema: the scheduled time
# and state rank of the run the job's summary (status, lastRun*) follows.
LAST_RUN_SCHEDULED_FOR = "lastRunScheduledFor"
LAST_RUN_STATE_RANK = "lastRunStateRank"
# ... and the hash of the request that created the job (idempotency: same key, same request?).
REQUEST_HASH = "requestHash"
# ... and the index terms of its labels (:func:`core.labels.label_terms`: "key", "key=value").
LABEL_TERMS = "labelTerms"
# Bookkeeping field of an execution document that is not part of the Execution schema: set on
# a replay made without force (``ManualDispatch.sole_replay``), the run it replays (as
# ``replayOf``); unique (``executions_first_replay_of``), so a run has at most one such replay.
FIRST_REPLAY_OF = "firstReplayOf"


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
REPLAYS = {"replayOf": {"$type": "string"}}
"""Partial filter of ``executions_replay_of``: only replays are indexed."""
FIRST_REPLAYS = {FIRST_REPLAY_OF: {"$type": "string"}}
"""Partial filter of ``executions_first_replay_of``: only replays made without force are indexed
(and unique)."""
FIRST_REPLAY_INDEX = "executions_first_replay_of"
IDEMPOTENCY_INDEX = "jobs_owner_idempotency_key"
NAMED = {"name": {"$type": "string"}}
"""Partial filter of ``jobs_owner_name`` and ``jobs_name``: only jobs with a name are indexed
(and, per owner, unique)."""
NAME_INDEX = "jobs_owner_name"

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
        "create_job: an idempotency key is unique per owner; the lookup of the job that has it "
        "(also list_jobs by idempotency key)",
        partial=KEYED,
        unique=True,
    ),
    IndexSpec(
        JOBS,
        NAME_INDEX,
        (("owner", ASCENDING), ("name", ASCENDING)),
        "create_job, update_job: a name is unique per owner; list_jobs?name=…",
        partial=NAMED,
        unique=True,
    ),
    IndexSpec(
        JOBS,
        "jobs_name_created",
        (("name", ASCENDING), ("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs?name=… of every user (admins)",
        partial=NAMED,
    ),
    IndexSpec(
        JOBS,
        "jobs_owner_task_created",
        (("owner", ASCENDING), ("taskId", ASCENDING), ("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs?taskId=…",
    ),
    IndexSpec(
        JOBS,
        "jobs_task_created",
        (("taskId", ASCENDING), ("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs?taskId=… of every user (admins)",
    ),
    IndexSpec(
        JOBS,
        "jobs_owner_labels_created",
        (
            ("owner", ASCENDING),
            (LABEL_TERMS, ASCENDING),
            ("createdAt", DESCENDING),
            (ID, DESCENDING),
        ),
        "list_jobs?labels=<selector> (multikey: one entry per label term)",
    ),
    IndexSpec(
        JOBS,
        "jobs_labels_created",
        ((LABEL_TERMS, ASCENDING), ("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs?labels=<selector> of every user (admins)",
    ),
    IndexSpec(
        JOBS,
        "jobs_created",
        (("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs of every user (admins): newest first, keyset cursor (createdAt, _id)",
    ),
    IndexSpec(
        JOBS,
        "jobs_status_created",
        (("status", ASCENDING), ("createdAt", DESCENDING), (ID, DESCENDING)),
        "list_jobs?status=… of every user (admins)",
    ),
    IndexSpec(
        AUDIT,
        "audit_job_at",
        (("jobId", ASCENDING), ("at", DESCENDING), (ID, DESCENDING)),
        "list_audit of one job: newest first, keyset cursor (at, _id)",
    ),
    IndexSpec(
        AUDIT,
        "audit_owner_at",
        (("owner", ASCENDING), ("at", DESCENDING), (ID, DESCENDING)),
        "list_audit of one owner's jobs",
    ),
    IndexSpec(
        AUDIT,
        "audit_actor_at",
        (("actor", ASCENDING), ("at", DESCENDING), (ID, DESCENDING)),
        "list_audit of one actor's changes (what an admin did)",
    ),
    IndexSpec(
        AUDIT,
        "audit_at",
        (("at", DESCENDING), (ID, DESCENDING)),
        "list_audit of everything (admins)",
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
    IndexSpec(
        "notification_attempts",
        "notification_attempts_run",
        (("executionId", ASCENDING), ("attempt", ASCENDING)),
        "notification_attempts: one run's delivery attempts, in order",
    ),
    IndexSpec(
        "notification_attempts",
        "notification_attempts_job",
        (("jobId", ASCENDING),),
        "delete_job: a deleted job's delivery attempts go with it",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_owner_status_scheduled_id",
        (
            ("owner", ASCENDING),
            ("status", ASCENDING),
            ("scheduledFor", DESCENDING),
            (ID, DESCENDING),
        ),
        "list_runs of one user (dead letters: status FAILED), newest scheduled first, keyset",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_owner_status_task_scheduled",
        (
            ("owner", ASCENDING),
            ("status", ASCENDING),
            ("taskId", ASCENDING),
            ("scheduledFor", DESCENDING),
            (ID, DESCENDING),
        ),
        "list_runs?taskId=… of one user",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_status_scheduled_id",
        (("status", ASCENDING), ("scheduledFor", DESCENDING), (ID, DESCENDING)),
        "list_runs of every user (admins, bulk actions over every user's runs)",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_status_task_scheduled",
        (
            ("status", ASCENDING),
            ("taskId", ASCENDING),
            ("scheduledFor", DESCENDING),
            (ID, DESCENDING),
        ),
        "list_runs?taskId=… of every user",
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_replay_of",
        (("replayOf", ASCENDING),),
        "replays_of: the replays of a run (a bulk replay skips a run replayed already)",
        partial=REPLAYS,
    ),
    IndexSpec(
        EXECUTIONS,
        FIRST_REPLAY_INDEX,
        ((FIRST_REPLAY_OF, ASCENDING),),
        "dispatch: of concurrent replays of a run without force (one-by-one or bulk), the "
        "server lets one insert through",
        partial=FIRST_REPLAYS,
        unique=True,
    ),
    IndexSpec(
        BULK_ACTIONS,
        "bulk_actions_claim",
        (("status", ASCENDING), ("leaseExpiresAt", ASCENDING)),
        "claim_bulk: an open bulk action whose lease expired, the longest-expired first",
    ),
)
"""Every index jobsched creates, besides the unique ``_id_`` index of each collection (job id;
execution id ``<jobId>:<scheduledFor>``, so a duplicate dispatch cannot create a second record)."""


def database_name(url: str) -> str:
    """The database named by a ``mongodb://host/<name>?…`` URL, ``jobsched`` when it has none."""
    return unquote(urlsplit(url).path.lstrip("/")) or DEFAULT_DATABASE


async def create_indexes(db: AsyncDatabase[Document]) -> None:
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


STARTED = {"startedAt": {"$type": "date"}}
"""Partial filter of the started-runs indexes: only runs whose first attempt started."""

STATS_INDEXES: tuple[IndexSpec, ...] = (
    IndexSpec(
        EXECUTIONS,
        "executions_stats_owner_finished",
        (("owner", ASCENDING), ("finishedAt", ASCENDING), ("status", ASCENDING)),
        "run_stats of one user: runs finished in a window, by minute and status",
        partial=FINISHED,
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_stats_finished",
        (("finishedAt", ASCENDING), ("status", ASCENDING)),
        "run_stats of every user (admins): runs finished in a window",
        partial=FINISHED,
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_stats_owner_started",
        (("owner", ASCENDING), ("startedAt", ASCENDING), ("scheduledFor", ASCENDING)),
        "run_stats of one user: schedule-to-start delay of the runs started in a window",
        partial=STARTED,
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_stats_started",
        (("startedAt", ASCENDING), ("scheduledFor", ASCENDING)),
        "run_stats of every user (admins): schedule-to-start delay",
        partial=STARTED,
    ),
    IndexSpec(
        EXECUTIONS,
        "executions_stats_owner_open",
        (("owner", ASCENDING), ("queue", ASCENDING), ("status", ASCENDING)),
        "run_stats of one user: unfinished runs per queue and status (every user's: "
        "executions_open)",
        partial=UNFINISHED,
    ),
)
"""The indexes of the dashboard's statistics (:mod:`store.mongo.stats`), created with the
others (new names only)."""
STATS_INDEXES += (
    IndexSpec(
        JOBS,
        "jobs_stats_owner_next",
        (("owner", ASCENDING), ("nextRunAt", ASCENDING)),
        "scheduled_jobs of one user: jobs with a next run before a time (the Upcoming heatmap)",
        partial=DUE,
    ),
    IndexSpec(
        JOBS,
        "jobs_stats_next",
        (("nextRunAt", ASCENDING),),
        "scheduled_jobs of every user (admins)",
        partial=DUE,
    ),
)
INDEXES = (*INDEXES, *STATS_INDEXES)
