"""The MongoDB store itself: the client, and the port's methods as bulk writes and
compare-and-sets (see :mod:`store.mongo` for the rules it keeps without transactions).
"""

from __future__ import annotations

import heapq
import logging
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import msgspec
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, ReturnDocument, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, ConfigurationError, DuplicateKeyError

from core.audit import AuditEntry, AuditQuery, AuditRecord, audit_record
from core.bulk import replayed_by_another
from core.cluster import InFlightRun
from core.errors import (
    ConfigError,
    Conflict,
    JobNotFound,
    NameTaken,
    StoreRejected,
    StoreUnavailable,
)
from core.heatmap import ScheduledGroup
from core.history import NEVER_RAN, observes_attempt, record_attempts
from core.labels import label_terms
from core.model import DeadLetter, Execution, ExecutionStatus, Job, JobStatus, Page, StatusEvent
from core.ports import (
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
from core.values import storable_event
from store.dispatching import ReplayGuard, advanced, sole_originals
from store.mongo.documents import (
    dead_letter_document,
    dead_letter_from_document,
    execution_document,
    from_document,
    stored_attempts,
    to_document,
)
from store.mongo.notifications import NOTIFICATION_ATTEMPTS, MongoNotifications
from store.mongo.operations import (
    MOST_RECENTLY_FINISHED_FIRST,
    NEWEST_AUDIT_FIRST,
    NEWEST_JOBS_FIRST,
    NEWEST_RUNS_FIRST,
    OLDEST_FINISHED_FIRST,
    advance_op,
    applied,
    audit_query,
    bucket_write,
    change_query,
    change_update,
    chunks,
    due_query,
    executions_query,
    finished_before_query,
    finished_query,
    jobs_query,
    key_query,
    partition_query,
    stale_query,
    summary_ops,
    transition_op,
)
from store.mongo.runs import MongoRuns
from store.mongo.schema import (
    AUDIT,
    CODEC_OPTIONS,
    DEAD_LETTERS,
    DURABLE,
    EXECUTIONS,
    FINISHED,
    ID,
    IDEMPOTENCY_INDEX,
    JOBS,
    LABEL_TERMS,
    NAME_INDEX,
    QUOTA_BUCKETS,
    REQUEST_HASH,
    Document,
    create_indexes,
    database_name,
)
from store.mongo.stats import run_stats, running_runs, scheduled_groups
from store.mongo_errors import duplicate_index, duplicate_indexes, translated
from store.pages import Keyset
from store.rows import RowReader

log = logging.getLogger(__name__)

READ_BACK = {"stateRank": 1, "status": 1, "startedAt": 1, "error": 1, "attempts": 1}
"""Fields of an execution that :meth:`MongoStore.apply_events` reads back after its transitions."""

DUE_FIELDS = {"nextRunAt": 1, "partition": 1}
"""Fields of a job that :meth:`MongoStore.due_jobs` reads (and ``_id``): a scan does not read
the specs of the jobs it finds (the scheduler reads a job when it dispatches it)."""


def _due_job(doc: Document) -> DueJob:
    """A :class:`DueJob` of a ``due_jobs`` document (raises ``KeyError`` or ``TypeError`` for a
    document without the fields: :class:`store.rows.RowReader` skips it)."""
    next_run_at, partition = doc["nextRunAt"], doc["partition"]
    if not isinstance(next_run_at, datetime) or type(partition) is not int:
        raise TypeError(f"nextRunAt {next_run_at!r}, partition {partition!r}")
    return DueJob(doc[ID], next_run_at, partition)


UPDATE_ATTEMPTS = 3
"""How often a conditional write is retried when the document changed between its write and
the read that explains why the write matched nothing."""


class MongoStore(MongoNotifications, MongoRuns):
    """:class:`core.ports.JobStore` on a MongoDB replica set (MongoDB 6.0 or later).

    A replica set is required (a one-member one will do): majority write concern and retryable
    writes need one. The constructor does no I/O; :meth:`open` connects and creates the indexes.

    Args:
        url: ``mongodb://…`` or ``mongodb+srv://…``; its path names the database (default
            ``jobsched``). Options in the URL win over the defaults below.
        timeout_seconds: server selection and connect timeout (seconds): how long a call waits for a
            reachable primary before it fails with :class:`StoreUnavailable`, so a gateway answers
            503 quickly.
        operation_timeout_seconds: how long one round trip may take, majority acknowledgement
            included, before the connection is dropped and the call fails with
            :class:`StoreUnavailable` (``socketTimeoutMS``; not PyMongo's ``timeoutMS``, which
            would also stretch server selection to this long).
        client: an existing client to use instead of creating one (tests pass an in-process
            fake). The store does not close a client it did not create.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 5.0,
        operation_timeout_seconds: float = 30.0,
        client: AsyncMongoClient[Document] | None = None,
    ) -> None:
        self.url = url
        self.database_name = database_name(url)
        self._timeout_ms = int(timeout_seconds * 1000)
        self._operation_timeout_ms = int(operation_timeout_seconds * 1000)
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
            await create_indexes(db)
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

    @property
    def _audit(self) -> AsyncCollection[Document]:
        return self.database[AUDIT]

    @property
    def _buckets(self) -> AsyncCollection[Document]:
        return self.database[QUOTA_BUCKETS]

    @staticmethod
    async def _fetch_page(
        action: str,
        collection: AsyncCollection[Document],
        where: Document,
        sort: list[tuple[str, int]],
        page: Keyset,
    ) -> list[Document]:
        """The documents of one page: ``where`` (already narrowed to the page's cursor), in
        ``sort`` order, one more than the page holds (see :class:`store.pages.Keyset`)."""
        with translated(action):
            return await collection.find(where).sort(sort).limit(page.fetch).to_list()

    async def ping(self) -> None:
        with translated("ping"):
            await self.database.command("ping")

    async def create_job(
        self, job: Job, *, request_hash: str | None = None, audit: AuditEntry | None = None
    ) -> Job:
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
        if job.labels:
            doc[LABEL_TERMS] = label_terms(job.labels)
        for _ in range(UPDATE_ATTEMPTS):
            try:
                with translated("create job", passing=(DuplicateKeyError,)):
                    await self._jobs.insert_one(doc)
            except DuplicateKeyError as e:
                index = duplicate_index(e)
            else:
                if audit is not None:
                    await self._append_audit(audit_record(audit, None, job))
                return job
            if job.idempotency_key is not None:
                with translated("read the job of an idempotency key"):
                    winner = await self._jobs.find_one(key_query(job.owner, job.idempotency_key))
                if winner is not None:
                    raise IdempotencyKeyReused(
                        from_document(winner, Job),
                        same_request=winner.get(REQUEST_HASH) == request_hash,
                    )
            if index == NAME_INDEX and job.name is not None:
                raise NameTaken(job.name)
            if index != IDEMPOTENCY_INDEX:
                raise Conflict(f"job {job.id} exists")
        raise StoreUnavailable("the job's idempotency key kept changing hands; retry")

    async def update_job(
        self,
        owner: str,
        job_id: str,
        change: JobChange,
        *,
        now: datetime,
        audit: AuditEntry | None = None,
    ) -> Job:
        """See :meth:`core.ports.JobStore.update_job`. One ``findAndModify`` whose filter holds
        the allowed statuses; when it matches nothing, a read tells a missing job from a status
        conflict (and retries if the job reached an allowed status in between).

        It returns the document as it was before the change (the audit record's "old" values,
        exactly as this change found them); the job after it is that document with the change
        applied (:func:`applied`), the same fields the update sets."""
        update = change_update(change, now)
        for _ in range(UPDATE_ATTEMPTS):
            try:
                with translated("update job", passing=(DuplicateKeyError,)):
                    doc = await self._jobs.find_one_and_update(
                        change_query(owner, job_id, change),
                        update,
                        return_document=ReturnDocument.BEFORE,
                    )
            except DuplicateKeyError as e:
                name = change.spec.name if change.spec is not None else None
                if name is not None and duplicate_index(e) == NAME_INDEX:
                    raise NameTaken(name) from None
                raise StoreRejected(f"update job: {e}") from None
            if doc is not None:
                before = from_document(doc, Job)
                after = applied(before, change, now)
                if audit is not None:
                    await self._append_audit(audit_record(audit, before, after))
                return after
            with translated("update job"):
                current = await self._jobs.find_one({ID: job_id, "owner": owner}, {"status": 1})
            if current is None:
                raise JobNotFound(f"job {job_id} not found")
            status = JobStatus(current["status"])
            if change.allowed_from is not None and status not in change.allowed_from:
                raise JobStatusConflict(job_id, status, change.action)
        raise StoreUnavailable(f"job {job_id} kept changing; retry")

    async def delete_job(self, owner: str, job_id: str, *, audit: AuditEntry | None = None) -> None:
        """See :meth:`core.ports.JobStore.delete_job`. The job first (its owner checked by the
        same write, and no dispatch can advance it after), then its executions and their
        notification attempts (index ``notification_attempts_job``). A failure in
        between leaves executions that no API call reaches (they are listed through their job),
        as does a late status event of a deleted job's run."""
        with translated("delete job"):
            result = await self._jobs.delete_one({ID: job_id, "owner": owner})
            if result.deleted_count == 0:
                raise JobNotFound(f"job {job_id} not found")
        if audit is not None:
            await self._append_audit(audit_record(audit, None, None))
        with translated("delete job"):
            await self._executions.delete_many({"jobId": job_id})
            await self.database[NOTIFICATION_ATTEMPTS].delete_many({"jobId": job_id})

    async def insert_execution(
        self, execution: Execution, *, audit: AuditEntry | None = None
    ) -> bool:
        try:
            with translated("insert execution", passing=(DuplicateKeyError,)):
                await self._executions.insert_one(to_document(execution))
        except DuplicateKeyError:
            return False
        if audit is not None:
            await self._append_audit(audit_record(audit, None, None))
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
        self, owner: str | None, query: JobQuery, *, limit: int, cursor: str | None
    ) -> Page[Job]:
        page = Keyset.of(limit, cursor)
        where = jobs_query(owner, query, page)
        docs = await self._fetch_page("list jobs", self._jobs, where, NEWEST_JOBS_FIRST, page)
        return page.page(docs, lambda d: from_document(d, Job), lambda j: (j.created_at, j.id))

    async def list_executions(
        self, owner: str, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        await self.get_job(owner, job_id)
        page = Keyset.of(limit, cursor)
        where = executions_query(job_id, page)
        docs = await self._fetch_page(
            "list executions", self._executions, where, NEWEST_RUNS_FIRST, page
        )
        return page.page(
            docs, lambda d: from_document(d, Execution), lambda e: (e.scheduled_for, e.id)
        )

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
    ) -> list[DueJob]:
        """See :meth:`core.ports.JobStore.due_jobs`: one query per chunk of at most
        :data:`MAX_SCANS_TO_EXPLODE` partitions, each answered in index order with three fields
        per job (:data:`DUE_FIELDS`), merged.

        Once ``limit`` jobs are in hand, later chunks are asked only for jobs due no later
        than the ``limit``-th earliest so far, so a backlog beyond ``limit`` costs a few times
        ``limit`` documents, not one ``limit`` per chunk (with fewer due jobs, all of them).
        """
        if not partitions or limit < 1:
            return []
        found: list[DueJob] = []
        for chunk in chunks(partitions):
            bound = until if len(found) < limit else min(until, found[limit - 1].next_run_at)
            with translated("due jobs"):
                docs = (
                    await self._jobs.find(due_query(chunk, bound), DUE_FIELDS)
                    .sort([("nextRunAt", ASCENDING)])
                    .limit(limit)
                    .to_list()
                )
            due = self.rows.decode(docs, _due_job, what="job", key=lambda d: d.get(ID))
            found = list(heapq.merge(found, due, key=lambda j: j.next_run_at))[:limit]
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
            # a run found finished stays finished: its attempts go with it
            await self.database[NOTIFICATION_ATTEMPTS].delete_many({"executionId": {"$in": ids}})
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

    async def dispatch(self, runs: Sequence[AnyDispatch]) -> list[DispatchOutcome]:
        """See :meth:`core.ports.JobStore.dispatch`. Without a transaction, in four steps:

        1. insert every execution (unordered; a duplicate key means it existed: not created),
           and for each manual run inserted now its audit entry and its job's ``runCount``;
        2. compare-and-set every job of a scheduled run, in order, in one bulk write;
        3. read the jobs back: a run is ``advanced`` when its job now points past it
           (``lastScheduledFor`` = its scheduled time and ``nextRunAt`` = the Dispatch's
           ``next_run_at``), by this call or by a twin — the SQLite store's rule;
        4. delete the executions this call created for runs that were not advanced, while they
           are still in the status it inserted them with (QUEUED; SKIPPED records never change),
           so no orphan run remains.

        A failure between 1 and 2 leaves a QUEUED execution whose job was not advanced; the
        scheduler's retry of the same dispatch finds it (created=False) and advances the job.
        A manual run (:class:`ManualDispatch`) has no steps 2 to 4.

        A sole replay (``ManualDispatch.sole_replay``) is decided in step 1 without a
        transaction, by two checks: the replays its run has before the insert (one
        ``replays_of`` query for the batch: replays recorded earlier, with or without force, by
        any version) refuse it; then its document carries ``firstReplayOf``, whose partial
        unique index lets exactly one of concurrent sole replays of a run in (the server decides
        between gateways). A duplicate key on a sole replay is told apart (its own id existed:
        a repeated batch; or another replay won) by reading the run's replays again.
        """
        if not runs:
            return []
        guard = ReplayGuard(await self.replays_of(sole_originals(runs)))
        inserted, refused = await self._insert_dispatched(runs, [guard.refusal(d) for d in runs])
        audits = {
            d.execution.id: d.audit
            for d, new in zip(runs, inserted, strict=True)
            if new and isinstance(d, ManualDispatch) and d.audit is not None
        }
        for entry in audits.values():
            await self._append_audit(audit_record(entry, None, None))
        counted = [
            UpdateOne({ID: d.execution.job_id}, {"$inc": {"runCount": 1}})
            for d, new in zip(runs, inserted, strict=True)
            if new and isinstance(d, ManualDispatch)
        ]
        if counted:
            with translated("count manual runs"):
                await self._jobs.bulk_write(counted, ordered=False)
        scheduled = [d for d in runs if isinstance(d, Dispatch)]
        cas: list[bool] = []
        if scheduled:
            now = scheduled[0].execution.created_at
            with translated("advance jobs"):
                await self._jobs.bulk_write([advance_op(d, now) for d in scheduled], ordered=True)
            cas = await self._advanced(scheduled)
        advancing = iter(cas)
        oks = [next(advancing) if isinstance(d, Dispatch) else True for d in runs]
        orphans = [
            d.execution for d, ok, new in zip(runs, oks, inserted, strict=True) if new and not ok
        ]
        kept = await self._delete_unchanged(orphans)
        return [
            DispatchOutcome(created=False, advanced=False, replayed_as=latest)
            if latest is not None
            else DispatchOutcome(created=new and (ok or d.execution.id in kept), advanced=ok)
            for d, ok, new, latest in zip(runs, oks, inserted, refused, strict=True)
        ]

    async def _insert_dispatched(
        self, runs: Sequence[AnyDispatch], refused: Sequence[str | None]
    ) -> tuple[list[bool], list[str | None]]:
        """Insert the executions of ``runs`` that no replay ``refused`` already (unordered);
        for each run, whether this call inserted it, and the replay that refused it (a sole
        replay that lost on ``executions_first_replay_of``: its run's latest other replay).

        Raises:
            StoreUnavailable: a sole replay lost to a replay that was gone when read back (its
                job deleted meanwhile): retry.
        """
        todo = [i for i, r in enumerate(refused) if r is None]
        sole = [isinstance(d, ManualDispatch) and d.sole_replay for d in runs]
        inserted, refused = [False] * len(runs), list(refused)
        duplicates: set[int] = set()
        try:
            with translated("insert executions", passing=(BulkWriteError,)):
                if todo:
                    await self._executions.insert_many(
                        [execution_document(runs[i].execution, sole_replay=sole[i]) for i in todo],
                        ordered=False,
                    )
        except BulkWriteError as error:
            duplicates = {todo[k] for k in duplicate_indexes(error, "insert executions")}
        for i in todo:
            inserted[i] = i not in duplicates
        contested = [runs[i].execution for i in sorted(duplicates) if sole[i]]
        if not contested:
            return inserted, refused
        after = await self.replays_of([e.replay_of for e in contested if e.replay_of])
        for i in sorted(duplicates):
            run = runs[i].execution
            if not sole[i] or run.replay_of is None or run.id in after.get(run.replay_of, ()):
                continue  # its own id existed: a repeated dispatch
            latest = replayed_by_another(run.replay_of, after, run.id)
            if latest is None:
                raise StoreUnavailable(
                    f"the replays of run {run.replay_of} changed meanwhile; retry"
                )
            refused[i] = latest
        return inserted, refused

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
                known = stored_attempts(run_id, stored)
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

    # --- tenancy: quotas and the audit trail ----------------------------------------------------

    async def _append_audit(self, record: AuditRecord) -> None:
        """Insert the audit record of a change that was just written.

        After the change, never before: a record must not claim a change that did not happen,
        and an update's record needs the pre-image its ``findAndModify`` returned. The two are
        not one transaction (the store uses none); if the record cannot be written (after the
        driver's retryable-write retry), the change stands, the call still succeeds, and the
        record is logged at ERROR in full — the log keeps what the store missed. A duplicate
        key means a retried insert had already succeeded.
        """
        try:
            with translated("insert audit record", passing=(DuplicateKeyError,)):
                await self._audit.insert_one(to_document(record))
        except DuplicateKeyError:
            pass
        except StoreUnavailable as e:
            log.error(
                "audit record of job %s not stored (%s): %s",
                record.job_id,
                e,
                msgspec.json.encode(record).decode(),
                extra={"job_id": record.job_id},
            )

    async def count_jobs(self, owner: str, statuses: Collection[JobStatus]) -> int:
        """See :meth:`core.ports.JobStore.count_jobs`; served by ``jobs_owner_status_created``."""
        values = sorted(s.value for s in statuses)
        if not values:
            return 0
        with translated("count jobs"):
            return await self._jobs.count_documents({"owner": owner, "status": {"$in": values}})

    async def run_stats(self, owner: str | None, since: datetime, until: datetime) -> RunStats:
        """See :meth:`core.stats.StatsStore.run_stats` (:mod:`store.mongo.stats`)."""
        return await run_stats(self._executions, owner, since, until)

    async def scheduled_groups(
        self, owner: str | None, until: datetime, *, limit: int
    ) -> list[ScheduledGroup]:
        """See :meth:`core.stats.StatsStore.scheduled_groups` (:mod:`store.mongo.stats`)."""
        return await scheduled_groups(self._jobs, owner, until, limit=limit)

    async def running_runs(self, *, limit: int) -> list[tuple[str, InFlightRun]]:
        """See :meth:`core.stats.StatsStore.running_runs`."""
        return await running_runs(self._executions, limit=limit)

    async def take_tokens(self, requests: Sequence[TokenRequest], *, now: datetime) -> list[float]:
        """See :meth:`core.ports.JobStore.take_tokens`. Per round: read the buckets, decide
        (:func:`core.quotas.take_all`), write each changed bucket with a compare-and-set on its
        revision (one unordered bulk); a bucket another process wrote meanwhile is decided again
        in the next round, with its requests. After :data:`UPDATE_ATTEMPTS` rounds of losing,
        a request is denied with a 1 s wait."""
        waits: list[float | None] = [None] * len(requests)
        pending = set(r.key for r in requests)
        for _ in range(UPDATE_ATTEMPTS):
            if not pending:
                break
            with translated("read quota buckets"):
                docs = await self._buckets.find({ID: {"$in": sorted(pending)}}).to_list()
            found = {d[ID]: d for d in docs}
            buckets = {k: Bucket(float(d["tokens"]), d["updatedAt"]) for k, d in found.items()}
            todo = [i for i, r in enumerate(requests) if r.key in pending]
            changed, got = take_all(buckets, [requests[i] for i in todo], now)
            lost = await self._write_buckets(changed, found)
            for i, wait in zip(todo, got, strict=True):
                if requests[i].key not in lost:
                    waits[i] = wait
            pending = lost
        return [1.0 if w is None else w for w in waits]

    async def read_tokens(self, keys: Collection[str]) -> dict[str, Bucket]:
        """See :meth:`core.ports.JobStore.read_tokens`."""
        if not keys:
            return {}
        with translated("read quota buckets"):
            docs = await self._buckets.find({ID: {"$in": sorted(set(keys))}}).to_list()
        return {d[ID]: Bucket(float(d["tokens"]), d["updatedAt"]) for d in docs}

    async def _write_buckets(
        self, changed: Mapping[str, Bucket], found: Mapping[str, Document]
    ) -> set[str]:
        """Compare-and-set ``changed``; the keys whose write lost to another process."""
        if not changed:
            return set()
        writer = uuid.uuid4().hex
        keys = list(changed)
        ops = [bucket_write(k, changed[k], found.get(k), writer) for k in keys]
        try:
            with translated("write quota buckets", passing=(BulkWriteError,)):
                result = await self._buckets.bulk_write(ops, ordered=False)
            if result.matched_count + result.upserted_count == len(ops):
                return set()
        except BulkWriteError as e:
            duplicate_indexes(e, "write quota buckets")  # raises unless all are lost races
        with translated("read back quota buckets"):
            docs = await self._buckets.find({ID: {"$in": keys}}, {"writers": 1}).to_list()
        ours = {d[ID] for d in docs if writer in d.get("writers", ())}
        return set(keys) - ours

    async def list_audit(
        self, query: AuditQuery, *, limit: int, cursor: str | None
    ) -> Page[AuditRecord]:
        page = Keyset.of(limit, cursor)
        where = audit_query(query, page)
        docs = await self._fetch_page(
            "list audit records", self._audit, where, NEWEST_AUDIT_FIRST, page
        )
        return page.page(docs, lambda d: from_document(d, AuditRecord), lambda r: (r.at, r.id))

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
