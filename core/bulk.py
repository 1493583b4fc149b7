"""Dead letters, replays and bulk actions: the shapes and the pure rules.

A *dead letter* is a run that failed its last attempt (status ``FAILED``): listed across a
user's jobs by ``GET /executions`` (:class:`RunQuery`), replayed one by one
(``POST /jobs/{id}/executions/{eid}/replay``) or in bulk by filter (``POST /bulk/replay``), and
runs still in progress are cancelled in bulk (``POST /bulk/cancel``). A replay is a new run with
a new id whose ``replayOf`` names the original, dispatched as a manual trigger is.

Each bulk action is its own record (:class:`BulkAction`, ``GET /bulk/{id}``), processed in
batches by whichever gateway holds its lease (:mod:`gateway.bulk`), as Trigger.dev's and
Hatchet's bulk replays are tracked. Its progress (phase and keyset cursor) is saved with its
counts after every batch under a compare-and-set on the lease, so a gateway that crashes loses
at most one batch's bookkeeping: the next holder repeats that batch, and a replay's id is
derived from (bulk id, original run id) (:func:`replay_nonce`), so a repeated batch creates no
second replay.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from core.access import Role
from core.errors import Conflict, NotFound
from core.ids import manual_execution_id
from core.labels import Selector, parse_selector
from core.model import (
    ACTIVE_EXECUTION_STATUSES,
    Execution,
    ExecutionStatus,
    Instant,
    Job,
    JobStatus,
    Model,
    TaskId,
)

MAX_ERROR_FILTER = 200
"""Most characters of an ``error`` filter (a case-insensitive substring of the run's error)."""
BULK_BATCH = 100
"""Runs one batch of a bulk action handles (one page of the listing, one dispatch)."""
BULK_LEASE_SECONDS = 30.0
"""How long a gateway holds a bulk action's lease between two batches (seconds); another
gateway takes an action whose lease expired over where its progress was saved."""

ErrorFilter = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ERROR_FILTER)]


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Filters of ``list_runs`` (the runs of every job of an owner, newest scheduled first).

    Attributes:
        status: only runs in this status (``FAILED``: the dead letters).
        task_id: only runs of this task (exact).
        scheduled_from / scheduled_to: ``scheduledFor`` >= / < these (aware UTC).
        error: only runs whose error contains this text (case-insensitive; at most
            :data:`MAX_ERROR_FILTER` characters).
        labels: only runs whose job's labels match this Kubernetes label selector
            (:func:`core.labels.parse_selector`; None or empty: any job).
    """

    status: ExecutionStatus = ExecutionStatus.FAILED
    task_id: str | None = None
    scheduled_from: datetime | None = None
    scheduled_to: datetime | None = None
    error: str | None = None
    labels: Selector | None = None


class BulkKind(enum.StrEnum):
    """What a bulk action does to each run its filter selects."""

    REPLAY = "replay"
    CANCEL = "cancel"


class BulkStatus(enum.StrEnum):
    """QUEUED (no gateway took it yet) → RUNNING → SUCCEEDED (every selected run handled) |
    FAILED (it could not go on: its ``error`` says why)."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


OPEN_BULK_STATUSES = (BulkStatus.QUEUED, BulkStatus.RUNNING)
REPLAYABLE = frozenset(
    {ExecutionStatus.FAILED, ExecutionStatus.CANCELLED, ExecutionStatus.SUCCEEDED}
)
"""Statuses a run may be replayed from (a finished run that ran or was given up)."""
CANCELLABLE = (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.RETRYING)
assert frozenset(CANCELLABLE) == ACTIVE_EXECUTION_STATUSES


class BulkCreate(Model, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Body of ``POST /bulk/replay`` and ``POST /bulk/cancel``: which runs (every field
    optional).

    ``status``: replay: one of FAILED (default), CANCELLED, SUCCEEDED; cancel: one of QUEUED,
    RUNNING, RETRYING (default: all three). ``from`` / ``to``: the runs' ``scheduledFor``
    range (RFC 3339 with an offset; ``to`` exclusive). ``error``: a case-insensitive substring
    of the run's error. ``labels``: a label selector over the runs' jobs
    (``"team=billing,env!=dev"``, :func:`core.labels.parse_selector`). ``owner`` /
    ``allUsers``: an admin's choice of another user's runs or everyone's (a user: their own
    runs only).
    """

    status: ExecutionStatus | None = None
    task_id: TaskId | None = None
    scheduled_from: Instant | None = msgspec.field(default=None, name="from")
    scheduled_to: Instant | None = msgspec.field(default=None, name="to")
    error: ErrorFilter | None = None
    labels: str | None = None
    owner: str | None = None
    all_users: bool = False


class BulkFilter(Model, kw_only=True, omit_defaults=False, frozen=True):
    """The runs a bulk action handles, as it was asked (``owner`` None: every user's)."""

    statuses: list[ExecutionStatus]
    task_id: str | None = None
    scheduled_from: Instant | None = msgspec.field(default=None, name="from")
    scheduled_to: Instant | None = msgspec.field(default=None, name="to")
    error: str | None = None
    owner: str | None = None
    labels: str | None = None
    """A label selector over the runs' jobs, as given (checked at creation)."""


class BulkAction(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One bulk replay or cancel. Stored in ``bulk_actions``; returned by ``GET /bulk/{id}``.

    Attributes:
        id: its id (32 hex digits).
        kind: ``replay`` or ``cancel``.
        status: see :class:`BulkStatus`.
        filter: the runs it handles (their ``scheduledFor`` before ``created_at`` only: runs
            created after the action, its own replays included, are not its business).
        actor / actor_role: who asked.
        done: runs replayed or cancelled; skipped: runs selected but left alone (a run whose
            job was cancelled or deleted, a run that has a replay already — its replay, if it
            failed, is selected as a run of its own —, one that finished before it could be
            cancelled);
            failed: runs it tried and could not handle (the store or NATS refused).
        created_at / updated_at / finished_at: aware UTC.
        error: why a FAILED action stopped.
        phase / cursor: its progress: the index in ``filter.statuses`` and the keyset cursor
            within that status's listing (None: from the newest).
        lease_owner / lease_expires_at: the gateway processing it and until when; another
            takes it over once the lease expired.
    """

    id: str
    kind: BulkKind
    status: BulkStatus = BulkStatus.QUEUED
    filter: BulkFilter
    actor: str
    actor_role: Role = Role.USER
    done: int = 0
    skipped: int = 0
    failed: int = 0
    created_at: Instant
    updated_at: Instant
    finished_at: Instant | None = None
    error: str | None = None
    phase: int = 0
    cursor: str | None = None
    lease_owner: str | None = None
    lease_expires_at: Instant


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """What one batch did (added to the action's counts)."""

    done: int = 0
    skipped: int = 0
    failed: int = 0


def replay_nonce(bulk_id: str, execution_id: str) -> str:
    """The 8 hex digits that make a bulk replay's execution id
    (:func:`core.ids.manual_execution_id` at the action's creation time): BLAKE2b of the
    action and the original run, so a batch repeated after a crash yields the same ids."""
    digest = hashlib.blake2b(f"{bulk_id}|{execution_id}".encode(), digest_size=4)
    return digest.hexdigest()


def replay_refusal(job: Job | None, original: Execution) -> str | None:
    """Why ``original`` (a run of ``job``; None: the job is gone) is not replayed by a bulk
    replay, before the rule of :func:`replayed_by_another`: its job is cancelled or deleted, or
    the run has not finished (:data:`REPLAYABLE`). None: it may be replayed."""
    if job is None or job.status == JobStatus.CANCELLED:
        return "the job is cancelled or deleted"
    if original.status not in REPLAYABLE:
        return f"the run is {original.status}"
    return None


def bulk_replays(
    action: BulkAction, job: Job | None, original: Execution, replays: dict[str, list[str]]
) -> bool:
    """Whether bulk replay ``action`` will replay ``original``: no :func:`replay_refusal`, and
    no replay but the action's own (``replays``: :meth:`core.ports.RunStore.replays_of`). What
    the action takes a ``runsPerMinute`` token for; the store decides again, atomically."""
    if job is None or replay_refusal(job, original) is not None:
        return False
    own = manual_execution_id(job.id, action.created_at, replay_nonce(action.id, original.id))
    return replayed_by_another(original.id, replays, own_id=own) is None


def phase_query(action: BulkAction) -> RunQuery | None:
    """The listing of the action's current phase, or None when every phase is done. Runs
    scheduled at or after the action's creation are left out."""
    f = action.filter
    if action.phase >= len(f.statuses):
        return None
    to = action.created_at if f.scheduled_to is None else min(f.scheduled_to, action.created_at)
    return RunQuery(
        status=f.statuses[action.phase],
        task_id=f.task_id,
        scheduled_from=f.scheduled_from,
        scheduled_to=to,
        error=f.error,
        labels=parse_selector(f.labels, "labels") if f.labels else None,
    )


def after_batch(
    action: BulkAction,
    next_cursor: str | None,
    counts: BatchCounts,
    now: datetime,
    *,
    lease_seconds: float,
) -> BulkAction:
    """The action after one batch of its current phase: its counts added, its cursor moved
    (the next phase when the listing ended; SUCCEEDED, lease released, after the last), its
    lease extended by ``lease_seconds`` seconds."""
    phase, cursor = action.phase, next_cursor
    if next_cursor is None:
        phase, cursor = phase + 1, None
    finished = phase >= len(action.filter.statuses)
    return msgspec.structs.replace(
        action,
        done=action.done + counts.done,
        skipped=action.skipped + counts.skipped,
        failed=action.failed + counts.failed,
        phase=phase,
        cursor=cursor,
        status=BulkStatus.SUCCEEDED if finished else BulkStatus.RUNNING,
        updated_at=now,
        finished_at=now if finished else None,
        lease_owner=None if finished else action.lease_owner,
        lease_expires_at=now if finished else now + timedelta(seconds=lease_seconds),
    )


class BulkNotFound(NotFound):
    """No such bulk action, or it is another user's (404)."""

    code = "bulk_not_found"


class RunNotReplayable(Conflict):
    """The run is still in progress, or was skipped (409): only a finished run that ran or
    was given up (:data:`REPLAYABLE`) can be replayed."""

    code = "run_not_replayable"


class AlreadyReplayed(Conflict):
    """The run has a replay already (409): replaying it again needs ``force``. A replay that
    failed is a dead letter of its own: replay that one instead.

    Attributes:
        replay_id: the run's latest replay (the problem's ``replayId``).
    """

    code = "already_replayed"

    def __init__(self, execution_id: str, replay_id: str) -> None:
        super().__init__(
            f"run {execution_id} was replayed already as {replay_id}; replay that run if it "
            "failed, or pass force=true to replay this one again"
        )
        self.replay_id = replay_id


def replayed_by_another(
    original_id: str, replays: dict[str, list[str]], own_id: str | None = None
) -> str | None:
    """The rule of a bulk replay (and of a one-by-one replay without ``force``): a run that has
    a replay is not replayed again. ``replays`` is :meth:`core.ports.RunStore.replays_of` of
    the runs at hand; ``own_id`` the id this replay would have (a bulk action's repeated batch
    finds its own replay, which does not count). The latest other replay's id, or None when
    the run may be replayed."""
    others = [r for r in replays.get(original_id, ()) if r != own_id]
    return others[-1] if others else None


class NotRecurring(Conflict):
    """Only a cron or interval job has occurrences to backfill (409)."""

    code = "job_not_recurring"
