"""Interfaces the adapters implement (``typing.Protocol``), all on one page.

``store/`` implements :class:`JobStore` (SQLite, MongoDB); ``bus/`` the bus roles below
(:class:`RunPublisher`, :class:`RunQueue`, :class:`WorkIntake`, :class:`StatusReports`,
:class:`StatusIntake`, :class:`RecorderProgress`, :class:`EventFeed`, :class:`JobNotices`,
:class:`Notices`, :class:`BusHealth`, :class:`CancelRequests`, :class:`CancelSignals`,
:class:`Leases`, :class:`StatusStream`, :class:`ServiceHost`, :class:`RunInspector`) with
NATS, and ``tests/fakes.py`` in memory. The scheduler, worker, recorder and gateway depend on
these protocols only, never on a driver; ``jobsched/runtime.py`` wires the adapters in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import msgspec

from core.audit import AuditEntry, AuditQuery, AuditRecord
from core.bulk import BulkAction, RunQuery
from core.cluster import WorkerHeartbeat
from core.concurrency import ConcurrencyWait, SlotDecision, SlotRequest, SlotState
from core.errors import BusUnavailable, Conflict
from core.labels import Selector
from core.live import EventBatch, StoredEvent
from core.model import (
    DeadLetter,
    Event,
    Execution,
    ExecutionStatus,
    Job,
    JobNotice,
    JobSpec,
    JobStatus,
    Page,
    RunMessage,
    RunsFinished,
    StatusEvent,
)
from core.notifications import NotificationStore
from core.quotas import Bucket, TokenRequest

if TYPE_CHECKING:  # core.explain imports core.dispatch, which imports this module
    from core.explain import LeaseView, QueueState


@dataclass(frozen=True, slots=True)
class JobQuery:
    """Filters of ``list_jobs``; every bound is optional.

    Attributes:
        status: only jobs in this status.
        last_run_status: only jobs whose latest finished run ended so (find recurring jobs whose
            latest run failed with ``FAILED``).
        created_from: creation time >= this (aware).
        created_to: creation time < this (aware).
        task_id: only jobs of this task (exact match).
        name: only the job of this name (exact match).
        labels: only jobs whose labels match this selector (:mod:`core.labels`; None or the
            empty selector: any labels).
        idempotency_key: only the job created with this ``Idempotency-Key`` (exact match; one
            per owner, found through the index of idempotent creation).
    """

    status: JobStatus | None = None
    last_run_status: ExecutionStatus | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    task_id: str | None = None
    name: str | None = None
    labels: Selector | None = None
    idempotency_key: str | None = None


class IdempotencyKeyReused(Conflict):
    """A job with this idempotency key exists for this owner (RFC draft "Idempotency-Key").

    Attributes:
        job: the job created by the first request with the key.
        same_request: whether that request had the same body (then the job is the answer).
    """

    code = "idempotency_key_reused"

    def __init__(self, job: Job, *, same_request: bool) -> None:
        super().__init__(
            "this Idempotency-Key was used for another request"
            if not same_request
            else "this Idempotency-Key was used already"
        )
        self.job = job
        self.same_request = same_request


class JobStatusConflict(Conflict):
    """The job's status does not allow the change (e.g. resuming a job that is not paused)."""

    code = "job_state_conflict"

    def __init__(self, job_id: str, status: JobStatus, action: str) -> None:
        super().__init__(f"job {job_id} is {status}; it cannot be {action}")
        self.job_status = status


UNCHANGED: object = object()
"""Marker: a :class:`JobChange` field that is left as it is."""


@dataclass(frozen=True, slots=True)
class JobChange:
    """A conditional change of one job (pause, resume, cancel, PATCH).

    Applied atomically, and only if the job's status is in ``allowed_from`` (None: any).

    Attributes:
        action: what the change is, for the error message ("paused", "resumed"…).
        allowed_from: statuses the job must be in.
        status: the new status (None: unchanged).
        next_run_at: the new next run time (:data:`UNCHANGED`: unchanged; None: no run).
        spec: the new spec (None: unchanged).
    """

    action: str
    allowed_from: frozenset[JobStatus] | None = None
    status: JobStatus | None = None
    next_run_at: datetime | object | None = UNCHANGED
    spec: JobSpec | None = None


class DueJob(msgspec.Struct, frozen=True, gc=False):
    """A job the scheduler's safety scan found due (:meth:`JobStore.due_jobs`): what its heap
    holds of it. The job itself is read when it is dispatched, so a scan does not read and
    decode the specs of every job due within the lookahead window each time it runs (a scan
    answers up to ``heap_limit``, 100,000, of them every 5 s: a Struct, not a dataclass, as it
    is built ten times faster).

    Attributes:
        id: the job's id.
        next_run_at: when its next run is due (UTC, aware).
        partition: the partition that owns it.
    """

    id: str
    next_run_at: datetime
    partition: int


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One due run, as the scheduler records it.

    The store inserts ``execution`` unless a record with its id exists, and advances the job
    with a compare-and-set: only if its ``next_run_at`` still equals ``expected_next_run_at``
    it sets ``next_run_at`` (None = no run left), ``last_scheduled_for`` (and, for a QUEUED
    execution, ``last_dispatched_for``) and adds one to
    ``run_count``.
    """

    execution: Execution
    expected_next_run_at: datetime
    next_run_at: datetime | None


@dataclass(frozen=True, slots=True)
class ManualDispatch:
    """One run triggered by hand (``trigger: manual``, :func:`core.runs.manual_run`), outside
    the job's schedule.

    The store inserts ``execution`` unless a record with its id exists, and records ``audit``
    (optional) with it, only if it inserted it. There is no compare-and-set: the job is left as
    it is (``next_run_at``, ``last_scheduled_for``, ``last_dispatched_for``, ``run_count``), so
    its scheduled occurrences go on as if the manual run did not exist, and its outcome is
    ``advanced`` unless ``sole_replay`` refused it.

    ``sole_replay`` (for a replay: ``execution.replay_of`` set; a replay without ``force``, and
    every bulk replay): the run is recorded only if the run it replays has no other replay (a
    record with the execution's own id does not count: a repeated bulk batch), the rule of
    :func:`core.bulk.replayed_by_another`, checked atomically with the insert: of concurrent
    sole replays of one run (other gateways' included) exactly one is recorded. A refused one
    creates nothing (no record, no audit entry, no ``run_count``) and its outcome names the
    run's latest other replay (:attr:`DispatchOutcome.replayed_as`). A replay with ``force``
    (``sole_replay`` False) is recorded whatever replays the run has.
    """

    execution: Execution
    audit: AuditEntry | None = None
    sole_replay: bool = False


AnyDispatch = Dispatch | ManualDispatch
"""What :meth:`JobStore.dispatch` records: a scheduled run (with the job's compare-and-set) or
a manual one (without)."""


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """What :meth:`JobStore.dispatch` did for one :class:`Dispatch` or :class:`ManualDispatch`.

    Attributes:
        created: the execution record was inserted now (False: it existed already).
        advanced: the job's compare-and-set succeeded (False: someone else advanced or changed
            the job; the caller must not publish a run it did not create or advance). True for
            a :class:`ManualDispatch`, which has no compare-and-set, unless its
            ``sole_replay`` was refused.
        replayed_as: a refused ``sole_replay``: the latest other replay of the run it replays
            (``created`` and ``advanced`` False); None otherwise.
    """

    created: bool
    advanced: bool
    replayed_as: str | None = None


@dataclass(frozen=True, slots=True)
class PruneTarget:
    """The finished runs of one job to delete (:meth:`JobStore.prune_executions`).

    A finished run (SUCCEEDED, FAILED, CANCELLED, SKIPPED) of ``job_id`` is deleted when it is
    not among the job's ``keep_last`` most recently finished runs (by ``finishedAt``, then id;
    None: no count rule), or when it finished before ``finished_before`` (aware; None: no age
    rule). Never an unfinished run (QUEUED, RUNNING, RETRYING), never ``keep_id`` (the job's
    latest run, ``lastExecutionId``, which the job's summary points to).
    """

    job_id: str
    keep_last: int | None
    finished_before: datetime | None
    keep_id: str | None = None


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :meth:`JobStore.prune_executions` did for one :class:`PruneTarget`.

    Attributes:
        deleted: runs deleted now.
        complete: nothing is left to delete (False: the call's limit stopped it; call again).
    """

    deleted: int
    complete: bool


class RunStore(Protocol):
    """Dead letters, replays' bulk actions and backfills: the part of :class:`JobStore` that
    reads runs across jobs and keeps :class:`core.bulk.BulkAction` records."""

    async def list_runs(
        self, owner: str | None, query: RunQuery, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        """Runs of every job of ``owner`` (None: every user's) matching ``query``, newest
        scheduled time first (then id), ``limit`` per page; served by an index on
        (owner, status[, taskId], scheduledFor, id), the error text filtered on the scan.

        Raises:
            InvalidRequest: on field ``cursor``.
        """
        ...

    async def replays_of(self, execution_ids: Collection[str]) -> dict[str, list[str]]:
        """The replays each of ``execution_ids`` has: original run id → the ids of the runs
        whose ``replayOf`` is it (sorted); a run without any is absent. Served by an index
        on ``replayOf`` (only replays are indexed)."""
        ...

    async def create_bulk(self, action: BulkAction, *, audit: AuditEntry | None = None) -> None:
        """Insert a new bulk action durably, with its ``audit`` record (optional).

        Raises:
            Conflict: an action with this id exists.
        """
        ...

    async def get_bulk(self, bulk_id: str) -> BulkAction | None:
        """One bulk action by id, or None."""
        ...

    async def claim_bulk(
        self, holder: str, *, now: datetime, lease_seconds: float
    ) -> BulkAction | None:
        """Take the lease of one open (QUEUED or RUNNING) action whose lease expired
        (``lease_expires_at <= now``; a new action's lease is expired from the start), the
        longest-expired first: set ``lease_owner`` to ``holder``, ``lease_expires_at`` to
        ``now + lease_seconds`` seconds and the status to RUNNING, atomically (two claimers
        never both win); the action as claimed, or None when none is free."""
        ...

    async def save_bulk(self, action: BulkAction, *, holder: str) -> bool:
        """Replace the stored action with ``action`` only if its lease is still ``holder``'s
        (a compare-and-set); False when another gateway took it over (then stop)."""
        ...

    async def record_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Store audit records of changes that are not a job's (a run's cancellation, a bulk
        action, a backfill), each with no field changes (:func:`core.audit.audit_record`)."""
        ...


class JobStore(NotificationStore, RunStore, Protocol):
    """Durable state: jobs and their executions. The source of truth of jobsched.

    Every method is safe to call concurrently from several processes. Connection loss and
    timeouts raise :class:`core.errors.StoreUnavailable` (retry); a write the store refuses
    for good raises :class:`core.errors.StoreRejected` (set it aside); driver exceptions never
    escape. Values are within :mod:`core.values`' range, the same for every store; run results
    and errors are brought within it by :meth:`apply_events` itself. Bulk reads for the actors
    (:meth:`get_jobs`, :meth:`due_jobs`, :meth:`get_executions`, :meth:`stale_executions`)
    skip a row that cannot be read (logged once), so one bad row never stops a scheduler.
    Instants in and out are aware UTC datetimes with millisecond precision.
    """

    async def open(self) -> None:
        """Connect and create the schema / indexes if missing (idempotent)."""
        ...

    async def close(self) -> None:
        """Release connections (idempotent)."""
        ...

    async def ping(self) -> None:
        """Return if the store answers; raise StoreUnavailable otherwise."""
        ...

    async def create_job(
        self, job: Job, *, request_hash: str | None = None, audit: AuditEntry | None = None
    ) -> Job:
        """Insert a new job durably (SQLite: committed in WAL; MongoDB: majority, journaled).

        ``job.idempotency_key`` (optional) is unique per owner; ``request_hash`` identifies the
        request that created it. ``audit`` (optional) is recorded with the job
        (:func:`core.audit.audit_record`); nothing is recorded when nothing is created.

        Raises:
            IdempotencyKeyReused: the owner already has a job with this key.
            Conflict: a job with this id exists.
            StoreRejected: the store cannot hold this job (it alone: jobs committed together
                with it are not affected).
        """
        ...

    async def update_job(
        self,
        owner: str,
        job_id: str,
        change: JobChange,
        *,
        now: datetime,
        audit: AuditEntry | None = None,
    ) -> Job:
        """Apply ``change`` atomically if the job's status allows it; the job after the change.

        ``audit`` (optional) is recorded with the change, its changes computed from the job
        exactly as it was before this change and after it.

        Raises:
            JobNotFound: no such job for ``owner``.
            JobStatusConflict: the job's status is not in ``change.allowed_from``.
        """
        ...

    async def delete_job(self, owner: str, job_id: str, *, audit: AuditEntry | None = None) -> None:
        """Delete the job and its executions; record ``audit`` (optional) with the deletion.
        Audit records outlive their job.

        Raises:
            JobNotFound: no such job for ``owner``.
        """
        ...

    async def insert_execution(
        self, execution: Execution, *, audit: AuditEntry | None = None
    ) -> bool:
        """Insert an execution unless one with its id exists; whether it was inserted.
        ``audit`` (optional) is recorded with it, only if it was inserted."""
        ...

    async def get_executions(self, execution_ids: Collection[str]) -> list[Execution]:
        """The executions among ``execution_ids`` that exist (any order)."""
        ...

    async def get_job(self, owner: str, job_id: str) -> Job:
        """The job ``job_id`` of ``owner``.

        Raises:
            JobNotFound: no such job, or it belongs to another owner.
        """
        ...

    async def list_jobs(
        self, owner: str | None, query: JobQuery, *, limit: int, cursor: str | None
    ) -> Page[Job]:
        """``owner``'s jobs (None: every user's), newest first (creation time, then id),
        ``limit`` per page.

        The cursor is opaque and stays correct while jobs are inserted: newer jobs never shift
        the pages after it.

        Raises:
            InvalidRequest: on field ``cursor`` when the cursor cannot be decoded.
        """
        ...

    async def list_executions(
        self, owner: str, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        """Executions of one of ``owner``'s jobs, newest scheduled time first.

        Raises:
            JobNotFound: as :meth:`get_job`.
            InvalidRequest: on field ``cursor``.
        """
        ...

    async def get_execution(self, execution_id: str) -> Execution | None:
        """One execution by id, or None."""
        ...

    async def get_jobs(self, job_ids: Collection[str]) -> list[Job]:
        """The jobs among ``job_ids`` that exist (any owner, any order). For actors."""
        ...

    async def due_jobs(
        self, partitions: Collection[int], until: datetime, *, limit: int
    ) -> list[DueJob]:
        """The jobs of ``partitions`` due by ``until`` (``next_run_at <= until``), earliest
        first, at most ``limit``: their ids, due times and partitions, not the jobs (the
        scheduler reads a job when it dispatches it)."""
        ...

    async def dispatch(self, runs: Sequence[AnyDispatch]) -> list[DispatchOutcome]:
        """Record due runs (:class:`Dispatch`) and manual runs (:class:`ManualDispatch`), in one
        transaction on SQLite. Outcomes are in the order of ``runs``.

        Idempotent: repeating a dispatch creates no second execution, advances no job twice and
        records no second audit entry.

        Raises:
            StoreRejected: a run of the batch can never be recorded (the caller dispatches the
                others without it; compare-and-set keeps each job's chain consistent).
        """
        ...

    async def apply_events(self, events: Sequence[StatusEvent]) -> int:
        """Record status transitions; return how many changed an execution.

        An event is applied only if its rank (:func:`core.model.state_rank`) is higher than the
        stored one, so a late or duplicate event never moves a run backwards. The job's summary
        (``status``, ``lastRunAt``, ``lastRunStatus``, ``lastError``, ``lastExecutionId``) follows
        the run with the latest scheduled time that reported. Results and errors are stored as
        :func:`core.values.storable_event` bounds them. Events may be applied in any grouping
        and order (a batch split in two gives the same state).

        Raises:
            StoreRejected: an event of the batch can never be written; nothing is promised about
                the others, which the caller applies again without it.
        """
        ...

    async def prune_executions(
        self, targets: Sequence[PruneTarget], *, limit: int
    ) -> list[PruneResult]:
        """Delete the finished runs each target names, at most ``limit`` runs in all (the
        targets in order: later ones may get none); results in the order of ``targets``.

        Idempotent and safe beside every other call: a run that is unfinished, or the target's
        ``keep_id``, is never deleted, whatever happens concurrently.
        """
        ...

    async def partition_jobs(self, partition: int, *, after: str | None, limit: int) -> list[Job]:
        """Up to ``limit`` jobs of ``partition`` with an id greater than ``after`` (None: from
        the first), in id order: one page of a walk over a partition (the retention sweep)."""
        ...

    async def stale_executions(
        self,
        partitions: Collection[int],
        updated_before: datetime,
        *,
        limit: int,
        updated_after: datetime | None = None,
    ) -> list[Execution]:
        """Unfinished (QUEUED, RUNNING, RETRYING) executions of ``partitions`` whose last
        transition is older than ``updated_before`` (and not older than ``updated_after``, when
        given), oldest first: candidates for re-dispatch, or a taken-over partition's runs that
        its previous owner recorded and may not have published."""
        ...

    async def dead_letter(self, letters: Sequence[DeadLetter]) -> int:
        """Store messages set aside for good; how many were new. Idempotent: a letter whose
        ``id`` is stored already is skipped. Every letter is storable (its payload is bytes,
        bounded), so this raises only :class:`core.errors.StoreUnavailable`."""
        ...

    async def dead_letters(self, *, limit: int) -> list[DeadLetter]:
        """The latest ``limit`` dead letters, newest first (for operators and tests)."""
        ...

    # --- tenancy: quotas and the audit trail ------------------------------------------------

    async def count_jobs(self, owner: str, statuses: Collection[JobStatus]) -> int:
        """How many of ``owner``'s jobs are in one of ``statuses`` (an index count)."""
        ...

    async def take_tokens(self, requests: Sequence[TokenRequest], *, now: datetime) -> list[float]:
        """Take tokens from per-user buckets (:func:`core.quotas.take_all`), atomically per
        bucket across every process sharing the store; per request, 0.0 when granted, else
        the seconds until it could be. Requests are applied in order; a denied one takes
        nothing."""
        ...

    async def read_tokens(self, keys: Collection[str]) -> dict[str, Bucket]:
        """The buckets among ``keys`` as stored (key → level at its ``updated_at``; a key never
        taken is absent: a full bucket). Read only: for ``GET /jobs/{id}/explain``, which
        applies :func:`core.quotas.take` to them without taking anything."""
        ...

    async def list_audit(
        self, query: AuditQuery, *, limit: int, cursor: str | None
    ) -> Page[AuditRecord]:
        """Audit records matching ``query``, newest first (``at``, then id), ``limit`` per page.

        Raises:
            InvalidRequest: on field ``cursor``.
        """
        ...


# --- the bus: what the actors ask of NATS ---------------------------------------------------
#
# ``bus/`` implements these with NATS JetStream (:class:`bus.nats.Bus`, :class:`bus.nats.
# PullConsumer`, :class:`bus.leases.LeaseBucket`, :class:`bus.cancel.CancelMarkers`,
# :class:`bus.status.LiveStream`); ``tests/fakes.py`` in memory. Failures surface as
# :class:`core.errors.BusUnavailable` (retry); no driver exception escapes.


class Delivery(Protocol):
    """One message handed out by a :class:`Consumer`, with its acknowledgement verbs
    (JetStream: ``+ACK``, ``-NAK``, ``+WPI``, ``+TERM``; NATS ADR-15)."""

    @property
    def data(self) -> bytes: ...

    @property
    def subject(self) -> str: ...

    @property
    def msg_id(self) -> str | None:
        """The publisher's de-duplication id (``Nats-Msg-Id``), if it set one."""
        ...

    @property
    def num_delivered(self) -> int:
        """1 for the first delivery, +1 for each redelivery (ack-wait expiry or nak)."""
        ...

    @property
    def stored_id(self) -> str:
        """The identity of the stored message, the same on every redelivery."""
        ...

    async def ack(self) -> None:
        """Done: never deliver it again."""
        ...

    async def nak(self, delay_seconds: float | None = None) -> None:
        """Deliver it again after ``delay_seconds`` seconds (None: at once)."""
        ...

    async def in_progress(self) -> None:
        """Still working on it: restart its ack-wait timer."""
        ...

    async def term(self) -> None:
        """Never deliver it again, without success (poison, given up)."""
        ...


class Consumer(Protocol):
    """A durable consumer shared by every process of one role (work queue, status stream)."""

    async def fetch(self, batch: int, timeout_seconds: float) -> Sequence[Delivery]:
        """Up to ``batch`` messages, waiting up to ``timeout_seconds`` seconds for the first
        ([] after that). ``batch`` is the caller's free capacity: what is handed out is the
        caller's to acknowledge.

        Raises:
            ConsumerMissing: the consumer (or its stream) was deleted; ensure it and fetch again.
            BusUnavailable: the request could not be sent.
        """
        ...

    async def quiesce(self) -> int:
        """Take no more: hand back (nak) what is still arriving; how many were handed back."""
        ...

    def take_unprocessed(self) -> Sequence[Delivery]:
        """Messages received but not handed out yet (to hand back on shutdown)."""
        ...

    async def close(self) -> None: ...


class Subscription(Protocol):
    """A subscription to notices; closing it works whether or not the connection lives."""

    async def close(self) -> None: ...


class Streams(Protocol):
    async def wait_for_streams(self, stop: asyncio.Event, *, interval_seconds: float = 1.0) -> bool:
        """Wait until the work and status streams exist (a scheduler creates them); True once
        they do, False if ``stop`` was set first.

        Raises:
            BusUnavailable: a lookup was not answered.
        """
        ...


class RunPublisher(Protocol):
    """The work queue, as the manual trigger sees it: publish runs."""

    async def publish_runs(self, runs: Sequence[RunMessage]) -> list[BusUnavailable | None]:
        """Publish runs to their queues; one result per run, in order (None: stored).

        De-duplicated by execution id (``Nats-Msg-Id``) within the duplicate window, so
        re-publishing a run whose first publish went through stores no second message.
        """
        ...


class RunQueue(RunPublisher, Protocol):
    """The work queue, as the scheduler sees it: publish runs, ask whether a run's message is
    still queued, re-create the streams."""

    async def runs_in_stream(self, runs: Iterable[tuple[str, str]]) -> set[str]:
        """The execution ids among ``(queue, execution id)`` pairs whose message is still held
        (queued, delivered, or waiting for a retry); not once acked, terminated or lost.

        Raises:
            BusUnavailable: a lookup failed.
        """
        ...

    async def ensure_streams_quietly(self) -> None:
        """Re-create deleted streams, best effort (after a failed publish); never raises."""
        ...


class WorkIntake(Protocol):
    """The work queue, as a worker sees it."""

    async def work_consumer(self, queue: str) -> Consumer:
        """The consumer every worker of ``queue`` shares (created if missing).

        Raises:
            BusUnavailable: it cannot be created or bound.
        """
        ...

    async def ensure_work_consumer(self, queue: str) -> None:
        """Create the consumer of ``queue`` again (after :class:`ConsumerMissing`)."""
        ...


class StatusReports(Protocol):
    """The status stream, as a worker writes it."""

    async def publish_status(self, event: StatusEvent) -> None:
        """Store one transition durably; de-duplicated by (execution id, status, attempt).

        Raises:
            BusUnavailable: not acknowledged (retry).
        """
        ...

    async def publish_statuses(self, events: Sequence[StatusEvent]) -> list[BusUnavailable | None]:
        """Store transitions of different runs at once (one round trip for the batch where the
        bus can); one result per event: None = stored, else the error (retry that event). Each
        is de-duplicated as in :meth:`publish_status`; never raises :class:`BusUnavailable`."""
        ...


class StatusIntake(Protocol):
    """The status stream, as the recorders consume it."""

    async def recorder_consumer(self) -> Consumer:
        """The consumer that every recorder shares (created if missing)."""
        ...

    async def ensure_recorder_consumer(self) -> None:
        """Create it again (after :class:`ConsumerMissing`)."""
        ...


class RecorderProgress(Protocol):
    """How far the recorders got: the re-dispatch sweep's proof that no event is in flight."""

    async def status_last_seq(self) -> int:
        """Sequence number of the newest event in the status stream (0: none)."""
        ...

    async def recorder_ack_floor(self) -> int:
        """Sequence up to which every status event has been recorded in the store."""
        ...


class EventFeed(Protocol):
    """Events for live clients that the store already holds (job changes, QUEUED, SKIPPED)."""

    async def publish_events(self, events: Sequence[Event]) -> int:
        """Publish, best effort (failures are logged, not raised); how many were stored."""
        ...


class JobNotices(Protocol):
    """Job notices, as the gateway sends them (best effort: a lost one is covered by the
    scheduler's scan)."""

    async def notify(self, notice: JobNotice) -> None:
        """A job was created or changed: tell its partition's scheduler.

        Raises:
            BusUnavailable: not sent.
        """
        ...


class Notices(JobNotices, Protocol):
    """Best-effort core-NATS notices between processes; a lost one is covered by a scan."""

    async def subscribe_notices(
        self, handler: Callable[[JobNotice], Awaitable[None]]
    ) -> Subscription:
        """``handler`` for every job notice of every partition."""
        ...

    async def publish_finished(self, job_ids: list[str]) -> None:
        """Runs of these jobs ended (schedulers wake ``bufferOne`` occurrences)."""
        ...

    async def subscribe_finished(
        self, handler: Callable[[RunsFinished], Awaitable[None]]
    ) -> Subscription:
        """``handler`` for every finished-runs notice."""
        ...


class BusHealth(Protocol):
    async def ping(self) -> None:
        """Return if the bus answers (a round trip, bounded by a short timeout).

        Raises:
            BusUnavailable: it did not answer.
        """
        ...


class QueueDepth(Protocol):
    async def queue_depth(self, queue: str) -> int:
        """Runs waiting in ``queue``: not yet delivered plus delivered and not yet acknowledged.

        Raises:
            BusUnavailable: not answered (also while the queue's consumer does not exist).
        """
        ...


class QueueInspector(Protocol):
    async def queue_state(self, queue: str) -> QueueState:
        """The shared consumer of ``queue`` as the bus reports it now (read only; a consumer
        that does not exist is ``consumer_exists=False``, not an error).

        Raises:
            BusUnavailable: not answered.
        """
        ...


class LeaseInspector(Protocol):
    async def partition_lease(self, partition: int) -> LeaseView:
        """Who holds ``partition``'s lease and until when (read only; no lease, or no lease
        bucket at all, is ``owner=None``).

        Raises:
            BusUnavailable: not answered.
        """
        ...


class SlotInspector(Protocol):
    async def concurrency_wait(
        self, owner: str, key: str, max_concurrent: int, execution_id: str | None, now_ms: int
    ) -> ConcurrencyWait:
        """The slots of (``owner``, rendered ``key``) at ``now_ms`` (epoch ms), read only:
        :func:`core.concurrency.explain_wait` of the stored entry (no entry: nobody holds one).

        Raises:
            BusUnavailable: not answered (or no slot bucket yet).
        """
        ...


class RunInspector(QueueInspector, LeaseInspector, SlotInspector, Protocol):
    """What ``GET /jobs/{id}/explain`` reads of the bus (:mod:`core.explain`; NATS:
    :class:`bus.inspect.BusInspector`)."""


class SchedulerBus(RunQueue, RecorderProgress, EventFeed, Notices, Protocol):
    """What :class:`actors.scheduler.Scheduler` needs of the bus."""


class WorkerBus(Streams, WorkIntake, StatusReports, Protocol):
    """What :class:`actors.worker.Worker` needs of the bus."""


class RecorderBus(Streams, StatusIntake, Notices, Protocol):
    """What :class:`actors.recorder.Recorder` needs of the bus."""


class GatewayBus(RunPublisher, EventFeed, JobNotices, BusHealth, Protocol):
    """What the gateway's API connection needs of the bus (:class:`gateway.service.JobService`:
    job notices, job events, manual runs; readiness: :meth:`ping`)."""


class CancelRequests(Protocol):
    """Setting cancellation markers (the gateway, the scheduler)."""

    async def cancel_job(self, job_id: str) -> None:
        """Mark every run of ``job_id`` cancelled (idempotent).

        Raises:
            BusUnavailable: not stored.
        """
        ...

    async def cancel_run(self, execution_id: str) -> None:
        """Mark one run cancelled (idempotent; ``overlapPolicy: replace``).

        Raises:
            BusUnavailable: not stored.
        """
        ...


class CancelSignals(CancelRequests, Protocol):
    """Cancellation markers: "no run of this job may start or continue" and "this run must
    stop", seen by every worker (a NATS KV bucket, :mod:`bus.cancel`)."""

    ready: asyncio.Event
    """Set once the markers that existed when :meth:`watch` started are known."""

    def is_cancelled(self, job_id: str, execution_id: str) -> bool:
        """Whether a marker seen so far names the job or the run."""
        ...

    async def watch(self, on_marker: Callable[[str | None, str | None], None]) -> None:
        """Follow the markers until cancelled: ``on_marker(job_id, None)`` for a job marker,
        ``on_marker(None, run_key)`` for a run marker (:func:`core.ids.run_key`)."""
        ...


@dataclass(frozen=True, slots=True)
class LeaseSnapshot:
    """Live schedulers and taken partitions, as the lease bucket shows them now."""

    members: frozenset[str]
    taken: frozenset[int]


class Leases(Protocol):
    """Partition leases with fencing tokens, and scheduler membership (:mod:`bus.leases`).

    A lease expires ``ttl`` seconds after its last write unless renewed; its revision is the
    fencing token every renewal and release is checked against.
    """

    async def open(self) -> None:
        """Create the bucket if missing (idempotent)."""
        ...

    async def acquire(self, partition: int, owner: str) -> int | None:
        """Take ``partition``; its revision, or None when another owner holds it. A lease that
        names ``owner`` already is taken back."""
        ...

    async def renew(self, partition: int, owner: str, revision: int) -> int:
        """Extend the lease; its new revision.

        Raises:
            LeaseLost: expired or taken over.
            BusUnavailable: not answered (the lease may still be valid: retry).
        """
        ...

    async def release(self, partition: int, revision: int) -> None:
        """Give it up, only if still ours at ``revision``."""
        ...

    async def heartbeat(self, member: str) -> None: ...

    async def leave(self, member: str) -> None: ...

    async def snapshot(self) -> LeaseSnapshot:
        """Current members and taken partitions."""
        ...


# --- live status: the status stream as WebSocket clients read it ---------------------------


class LiveFeed(Protocol):
    """Every status event from a sequence on, in stream order and without gaps (NATS:
    :class:`bus.status.StatusFeed`). It reads at its caller's pace: nothing is buffered beyond
    the batch asked for."""

    async def next_batch(self, timeout_seconds: float) -> list[StoredEvent]:
        """The next events; waits up to ``timeout_seconds`` seconds for the first ([] if none came).

        Raises:
            BusUnavailable: the stream cannot be read now (back off, call again: the feed
                resumes where it stopped).
        """
        ...

    async def close(self) -> None:
        """Stop reading (best effort; idempotent)."""
        ...


class StatusStream(Protocol):
    """The status stream, as a gateway's live status reads it (:mod:`gateway.live`; NATS:
    :class:`bus.status.LiveStream`, on the gateway's own live-status connection).

    Events are :class:`core.live.StoredEvent`; an event id is its stream sequence. A
    subscription's events are named by an opaque filter (:meth:`status_filter`).
    """

    async def status_last_seq(self) -> int:
        """Sequence of the newest event in the stream (0: none).

        Raises:
            BusUnavailable: not answered.
        """
        ...

    def feed(self, start_seq: int) -> LiveFeed:
        """A feed of every event from ``start_seq`` on (no I/O until its first batch)."""
        ...

    def status_filter(self, owner: str, job_id: str | None = None) -> str:
        """The filter of ``owner``'s events: of one job, or (None) of all of them."""
        ...

    async def read(
        self, subject_filter: str, start_seq: int, *, batch: int, max_bytes: int
    ) -> EventBatch:
        """Events matching ``subject_filter`` from ``start_seq`` on: at most ``batch``, and no
        more once about ``max_bytes`` bytes were read (at least one event). May be answered by
        a replica that lags: :meth:`next_on_leader` is the reference for "nothing more".

        Raises:
            BusUnavailable: no answer at all (a read cut short returns what arrived).
        """
        ...

    async def next_on_leader(self, subject_filter: str, start_seq: int) -> StoredEvent | None:
        """The first event matching ``subject_filter`` at or after ``start_seq``, as the
        stream's leader holds it now; None when there is none.

        Raises:
            BusUnavailable: not answered.
        """
        ...


# --- request-reply services ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to one service request.

    Attributes:
        data: the body.
        error_code: None on success; else the service error code (the NATS services protocol,
            ADR-32: header ``Nats-Service-Error-Code``; jobsched sends the HTTP status).
        error: the error's description (header ``Nats-Service-Error``).
        headers: further headers (``Retry-After`` …).
    """

    data: bytes
    error_code: str | None = None
    error: str | None = None
    headers: Mapping[str, str] | None = None


ServiceHandler = Callable[[bytes, Mapping[str, str]], Awaitable[Reply]]
"""One endpoint: ``(request body, request headers) -> reply``. An exception it raises is
answered as an error ``500`` (and logged) by the host."""


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A request-reply service (ADR-32: discoverable by ``$SRV.PING`` / ``INFO`` / ``STATS``).

    Attributes:
        name: the service name.
        version: its semantic version.
        description: one line for humans.
        queue_group: every instance answers in this queue group (one of them per request).
        group: endpoints answer on ``<prefix>.<group>.<endpoint>``.
    """

    name: str
    version: str
    description: str
    queue_group: str
    group: str


class ServiceHost(Protocol):
    """Serves request-reply endpoints (NATS: :class:`bus.micro.MicroHost`)."""

    def serve(
        self, spec: ServiceSpec, endpoints: Mapping[str, ServiceHandler]
    ) -> AbstractAsyncContextManager[None]:
        """Serve ``endpoints`` while the context is open; stopped (and deregistered) on exit.

        Raises:
            BusUnavailable: the service could not be started.
        """
        ...


class ConcurrencySlots(Protocol):
    """Concurrency slots shared by every worker (:mod:`core.concurrency`; NATS:
    :class:`bus.slots.SlotBucket`). Every write is a compare-and-set of one (owner, key) entry.
    Instants are epoch milliseconds of the caller's wall clock."""

    lease_seconds: float
    """How long a slot or a place in line lasts without renewal (seconds)."""

    async def acquire(self, request: SlotRequest, now_ms: int) -> SlotDecision:
        """Take a slot, join (or keep a place in) the line, or be skipped
        (:func:`core.concurrency.acquire`).

        Raises:
            BusUnavailable: not decided (the caller retries).
        """
        ...

    async def renew(self, request: SlotRequest, now_ms: int) -> None:
        """Re-lease the slot the request holds. Raises: BusUnavailable."""
        ...

    async def release(self, owner: str, key: str, execution_id: str, now_ms: int) -> None:
        """Give up the slot or place of ``execution_id`` (idempotent). Raises: BusUnavailable."""
        ...

    async def read(self, owner: str, key: str) -> SlotState | None:
        """The slots of (owner, key) as stored. Raises: BusUnavailable."""
        ...

    async def changed(
        self, owner: str, key: str, timeout_seconds: float
    ) -> tuple[bool, SlotState | None]:
        """Wait for a write of (owner, key) (True and the state written, when known) or
        ``timeout_seconds`` (False, None)."""
        ...

    async def watch(self) -> None:
        """Follow every write until cancelled (wakes :meth:`changed`)."""
        ...


class WorkerPresenceBoard(Protocol):
    """Where a worker announces that it is alive (:mod:`core.cluster`; NATS:
    :class:`bus.presence.PresenceBucket`)."""

    async def announce(self, heartbeat: WorkerHeartbeat) -> None:
        """Write ``heartbeat`` as its worker's presence, expiring unless rewritten.

        Raises:
            BusUnavailable: not stored (the caller tries again at its next heartbeat).
        """
        ...

    async def withdraw(self, worker_id: str) -> None:
        """Delete the presence of ``worker_id`` (idempotent). Raises: BusUnavailable."""
        ...
