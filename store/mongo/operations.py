"""The filters, sorts and update operations that the MongoDB store sends, as pure functions
(tests check that every query is served by an index of :data:`store.mongo.schema.INDEXES`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec
from pymongo import ASCENDING, DESCENDING, UpdateOne

from core.audit import AuditQuery
from core.job_status import HELD_VALUES, job_status_write
from core.labels import Selector, label_terms
from core.model import (
    TERMINAL_EXECUTION_STATUSES,
    ExecutionStatus,
    Job,
    JobStatus,
    StatusEvent,
    spec_values,
)
from core.ports import UNCHANGED, Dispatch, JobChange, JobQuery
from core.quotas import Bucket
from core.timeutil import from_epoch_ms, to_utc_ms
from store.mongo.documents import set_or_unset, spec_fields
from store.mongo.schema import (
    DUE,
    FINISHED,
    ID,
    KEYED,
    LABEL_TERMS,
    LAST_RUN_SCHEDULED_FOR,
    LAST_RUN_STATE_RANK,
    NAMED,
    UNFINISHED,
    Document,
)
from store.pages import Keyset

MAX_SCANS_TO_EXPLODE = 200
"""The query planner's ``internalQueryMaxScansToExplode``: a ``$in`` over at most this many
partitions, sorted on the next index key, is answered by one index scan per partition merged in
order (``SORT_MERGE``); over more, by a blocking in-memory ``SORT`` of every matching document.
The due and stale queries are therefore sent in chunks of at most this many partitions."""


def older_than(where: Document, field: str, after: tuple[int, str] | None) -> Document:
    """``where`` narrowed to the documents after the sort key ``after`` (epoch ms, ``_id``) in
    newest-first ``(field, _id)`` order: a :class:`store.pages.Keyset` page. The bound on
    ``field`` keeps the index's range scan; the ``$or`` breaks ties on ``_id``."""
    if after is None:
        return where
    at = from_epoch_ms(after[0])
    return {
        **where,
        field: {**where.get(field, {}), "$lte": at},
        "$or": [{field: {"$lt": at}}, {ID: {"$lt": after[1]}}],
    }


def jobs_query(owner: str | None, query: JobQuery, page: Keyset) -> Document:
    """The filter of ``list_jobs`` (``owner`` None: every user's); sort with
    :data:`NEWEST_JOBS_FIRST`."""
    where: Document = {} if owner is None else {"owner": owner}
    if query.status is not None:
        where["status"] = query.status.value
    if query.last_run_status is not None:
        where["lastRunStatus"] = query.last_run_status.value
    if query.task_id is not None:
        where["taskId"] = query.task_id
    if query.name is not None:
        where["name"] = {**NAMED["name"], "$eq": query.name}
    if query.idempotency_key is not None:  # repeats the partial filter, as key_query
        where["idempotencyKey"] = {**KEYED["idempotencyKey"], "$eq": query.idempotency_key}
    if query.labels:
        where.update(labels_filter(query.labels))
    created: Document = {}
    if query.created_from is not None:
        created["$gte"] = query.created_from
    if query.created_to is not None:
        created["$lt"] = query.created_to
    if created:
        where["createdAt"] = created
    return older_than(where, "createdAt", page.after)


def labels_filter(selector: Selector) -> Document:
    """The filter of a label selector over a job's ``labelTerms``
    (:meth:`core.labels.Selector.clauses`): the single terms the job must have (``$all``, the
    index's bounds), one set of which it must have one (``$in``), further sets (``$and``), and
    the terms it must not have, all in one ``$nin`` (none of A and none of B: none of both)."""
    required: list[str] = []
    any_of: list[list[str]] = []
    excluded: list[str] = []
    for clause in selector.clauses():
        if clause.negated:
            excluded.extend(clause.terms)
        elif len(clause.terms) == 1:
            required.append(clause.terms[0])
        else:
            any_of.append(sorted(clause.terms))
    terms: Document = {}
    if required:
        terms["$all"] = sorted(set(required))
    if any_of:
        terms["$in"] = any_of[0]
    if excluded:
        terms["$nin"] = sorted(set(excluded))
    where: Document = {LABEL_TERMS: terms} if terms else {}
    if len(any_of) > 1:
        where["$and"] = [{LABEL_TERMS: {"$in": t}} for t in any_of[1:]]
    return where


NEWEST_JOBS_FIRST = [("createdAt", DESCENDING), (ID, DESCENDING)]
NEWEST_RUNS_FIRST = [("scheduledFor", DESCENDING), (ID, DESCENDING)]


def executions_query(job_id: str, page: Keyset) -> Document:
    """The filter of ``list_executions``; sort with :data:`NEWEST_RUNS_FIRST`."""
    return older_than({"jobId": job_id}, "scheduledFor", page.after)


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
        fields[LABEL_TERMS] = label_terms(change.spec.labels) or None
    return set_or_unset(fields)


def applied(job: Job, change: JobChange, now: datetime) -> Job:
    """``job`` after :func:`change_update` ``(change, now)``: the same fields, set the same way."""
    fields: dict[str, Any] = {"updated_at": to_utc_ms(now)}
    if change.status is not None:
        fields["status"] = change.status
    if change.next_run_at is not UNCHANGED:
        assert change.next_run_at is None or isinstance(change.next_run_at, datetime)
        fields["next_run_at"] = (
            None if change.next_run_at is None else to_utc_ms(change.next_run_at)
        )
    if change.spec is not None:
        fields.update(spec_values(change.spec))
    return msgspec.structs.replace(job, **fields)


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
    if ev.status == ExecutionStatus.SKIPPED and ev.error is not None:
        # a worker's skip (concurrencyPolicy skip): its reason is the run's skipReason too
        set_["skipReason"] = ev.error
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
    this run (equal is re-applied: idempotent). The job's status is
    :func:`core.job_status.job_status_write` of the event: updates with exclusive filters on
    ``status`` (held or not) and ``nextRunAt`` (null or not) instead of a read; the first (a
    held status) goes first, so no later update of the list matches a job an earlier one
    changed.
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

    write = job_status_write(ev.status)
    held = op({"status": {"$in": list(HELD_VALUES)}}, None)
    free: Document = {"status": {"$nin": list(HELD_VALUES)}}
    if write.with_next_run == write.without_next_run:
        return [held, op(free, write.with_next_run)]
    return [
        held,
        op({**free, "nextRunAt": None}, write.without_next_run),
        op({**free, "nextRunAt": {"$ne": None}}, write.with_next_run),
    ]


NEWEST_AUDIT_FIRST = [("at", DESCENDING), (ID, DESCENDING)]


def audit_query(query: AuditQuery, page: Keyset) -> Document:
    """The filter of ``list_audit``; sort with :data:`NEWEST_AUDIT_FIRST`. Served by the index of
    its most selective field (``jobId``, then ``owner``, then ``actor``; ``audit_at`` without
    one), the other fields filtered on the fetched records."""
    where: Document = {
        name: value
        for name, value in (("jobId", query.job_id), ("owner", query.owner), ("actor", query.actor))
        if value is not None
    }
    return older_than(where, "at", page.after)


BUCKET_WRITERS = 16
"""How many of a bucket's latest writers it remembers (``writers``), so a process can tell
whether its compare-and-set won even if others wrote the bucket after it."""


def bucket_write(
    key: str, bucket: Bucket, current: Mapping[str, Any] | None, writer: str
) -> UpdateOne:
    """The compare-and-set of one quota bucket: only if its revision is still the one read
    (``current`` None: only if nobody created it meanwhile — an upsert that fails on ``_id``).
    ``writer`` (unique per attempt) joins the bucket's ``writers``."""
    fields: Document = {"tokens": bucket.tokens, "updatedAt": bucket.updated_at}
    mark = {"writers": {"$each": [writer], "$slice": -BUCKET_WRITERS}}
    if current is None:
        return UpdateOne(
            {ID: key, "rev": {"$exists": False}},
            {"$set": {**fields, "rev": 1}, "$push": mark},
            upsert=True,
        )
    return UpdateOne(
        {ID: key, "rev": current["rev"]}, {"$set": fields, "$inc": {"rev": 1}, "$push": mark}
    )
