"""The audit trail: one record per change of a job, who made it, when, and what changed.

Every change through the API (create, patch, pause, resume, cancel, delete, trigger) is
recorded with the acting user (``actor``, a token's ``sub``) next to the job's ``owner``, so an
admin's action on another user's job names the admin. Records are written by the store with
the change itself (one transaction on SQLite; see ``docs/data-model.md`` for MongoDB), from the
job as it was before and after the change — so the record says exactly what that change did,
even when other changes raced with it.

Secrets never enter a record: the token is not stored, and parameter *values* are not copied —
a change of ``parameters`` is recorded per top-level key, with ``redacted`` set and no values,
since task parameters are free-form and often carry credentials; a webhook (``notify``) is
recorded without its secret (``hasSecret``), a new secret as ``notify.secret`` with ``redacted``
set. Every other field of the job
(schedule, queue, options, status, next run) is recorded with its old and new value.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from core.access import Principal, Role
from core.model import SPEC_FIELDS, Instant, Job, Model
from core.notifications import redacted

RECORDED_FIELDS = (*(f for f in SPEC_FIELDS if f != "parameters"), "status", "next_run_at")
"""The job fields whose old and new values a record keeps: its options but ``parameters``
(redacted, each key recorded as changed or not), its status and next run time."""

_NAMES = {f.name: f.encode_name for f in msgspec.structs.fields(Job)}


class AuditAction(enum.StrEnum):
    """What a recorded change did."""

    CREATED = "created"
    CHANGED = "changed"
    PAUSED = "paused"
    RESUMED = "resumed"
    CANCELLED = "cancelled"
    DELETED = "deleted"
    TRIGGERED = "triggered"
    REPLAYED = "replayed"
    BACKFILLED = "backfilled"
    RUN_CANCELLED = "runCancelled"
    BULK_REPLAY = "bulkReplay"
    BULK_CANCEL = "bulkCancel"


class AuditChange(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One changed field: its name as in the job (``schedule``, ``parameters.region``), its
    value before and after (JSON; None when absent), or ``redacted`` without the values."""

    field: str
    old: Any = None
    new: Any = None
    redacted: bool = False


class AuditRecord(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One change of one job. Stored in ``audit``; returned by ``GET /jobs/{id}/audit`` and
    ``GET /audit``, newest first.

    Attributes:
        id: unique id of the record.
        job_id / owner: the job and the user who owns it.
        actor: the user whose token made the change; ``actor_role`` that token's role (an
            ``admin`` acting on another user's job has ``actor != owner``).
        action: what the change did.
        at: when (aware UTC, milliseconds).
        changes: the fields it changed (empty for ``deleted`` and ``triggered``).
        execution_id: the run a ``triggered`` or ``replayed`` change created, or the run a
            ``runCancelled`` one cancelled.
        replay_of: the run a ``replayed`` change replays.
        bulk_id: the bulk action (:mod:`core.bulk`) a change belongs to; a ``bulkReplay`` or
            ``bulkCancel`` record is the bulk action's creation itself (its ``job_id`` is
            empty: it is about the runs its filter selects, not one job).
        runs: how many runs a ``backfilled`` change created.
    """

    id: str
    job_id: str
    owner: str
    actor: str
    actor_role: Role = Role.USER
    action: AuditAction
    at: Instant
    changes: list[AuditChange] = msgspec.field(default_factory=list)
    execution_id: str | None = None
    replay_of: str | None = None
    bulk_id: str | None = None
    runs: int | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """The part of a record the caller knows before the store applies the change; the store
    adds the changes (:func:`audit_record`) from the job before and after."""

    id: str
    job_id: str
    owner: str
    actor: str
    actor_role: Role
    action: AuditAction
    at: datetime
    execution_id: str | None = None
    replay_of: str | None = None
    bulk_id: str | None = None
    runs: int | None = None


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters of ``list_audit``; None means any.

    Attributes:
        owner: records of this owner's jobs.
        actor: records of changes made by this user.
        job_id: records of this job.
    """

    owner: str | None = None
    actor: str | None = None
    job_id: str | None = None


def audit_entry(
    who: Principal,
    action: AuditAction,
    job_id: str,
    owner: str,
    at: datetime,
    *,
    execution_id: str | None = None,
    replay_of: str | None = None,
    bulk_id: str | None = None,
    runs: int | None = None,
) -> AuditEntry:
    """The entry of ``who``'s ``action`` on ``owner``'s job at ``at``, with a fresh id."""
    return AuditEntry(
        id=uuid.uuid4().hex,
        job_id=job_id,
        owner=owner,
        actor=who.user,
        actor_role=who.role,
        action=action,
        at=at,
        execution_id=execution_id,
        replay_of=replay_of,
        bulk_id=bulk_id,
        runs=runs,
    )


def audit_record(entry: AuditEntry, before: Job | None, after: Job | None) -> AuditRecord:
    """The record of ``entry``'s change, which turned ``before`` into ``after`` (None: the job
    did not exist before, or no longer exists after)."""
    return AuditRecord(
        id=entry.id,
        job_id=entry.job_id,
        owner=entry.owner,
        actor=entry.actor,
        actor_role=entry.actor_role,
        action=entry.action,
        at=entry.at,
        changes=job_changes(before, after),
        execution_id=entry.execution_id,
        replay_of=entry.replay_of,
        bulk_id=entry.bulk_id,
        runs=entry.runs,
    )


def job_changes(before: Job | None, after: Job | None) -> list[AuditChange]:
    """What turned ``before`` into ``after``: a creation lists every recorded field (old None),
    a change the fields that differ; a deletion (``after`` None) lists nothing."""
    if after is None:
        return []
    changes: list[AuditChange] = []
    for name in RECORDED_FIELDS:
        new = _value(_shown(name, getattr(after, name)))
        old = None if before is None else _value(_shown(name, getattr(before, name)))
        if before is None or old != new:
            changes.append(AuditChange(field=_NAMES[name], old=old, new=new))
    old_secret = None if before is None or before.notify is None else before.notify.secret
    new_secret = None if after.notify is None else after.notify.secret
    if old_secret != new_secret:
        changes.append(AuditChange(field="notify.secret", redacted=True))
    old_params = {} if before is None else before.parameters
    for key in sorted(set(old_params) | set(after.parameters)):
        if (
            key not in old_params
            or key not in after.parameters
            or (_value(old_params[key]) != _value(after.parameters[key]))
        ):
            changes.append(AuditChange(field=f"parameters.{key}", redacted=True))
    return changes


def _value(v: object) -> Any:
    return msgspec.to_builtins(v)


def _shown(name: str, v: Any) -> Any:
    """A job field as a record keeps it: a webhook without its secret (``hasSecret``)."""
    return redacted(v) if name == "notify" else v
