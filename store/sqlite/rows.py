"""Row mapping of the SQLite store: the one place that converts jobs, runs, events, dead letters
and audit records to the columns of :mod:`store.sqlite.schema` and back.

Instants are epoch-millisecond integers; the immutable part of a job (task, schedule, parameters,
options) is one msgspec-JSON column (``spec``), as are a run's once-set facts (``extra``) and its
attempt history (``attempts``).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from core.audit import AuditRecord
from core.job_status import job_status_write
from core.labels import label_terms
from core.model import (
    TERMINAL_EXECUTION_STATUSES,
    Attempt,
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobSpec,
    JobStatus,
    Missed,
    Model,
    RunTrigger,
    StatusEvent,
    spec_values,
)
from core.timeutil import from_epoch_ms, to_epoch_ms

log = logging.getLogger(__name__)


class _Extra(Model, kw_only=True, frozen=True):
    """Per-run facts that never change after the run is recorded, as one JSON column."""

    trigger: RunTrigger = RunTrigger.SCHEDULE
    jitter_ms: int = 0
    skip_reason: str | None = None
    missed: Missed | None = None
    replay_of: str | None = None
    backfill: bool = False


_encoder = msgspec.json.Encoder()
_spec_decoder = msgspec.json.Decoder(JobSpec)
_extra_decoder = msgspec.json.Decoder(_Extra)
_attempts_decoder = msgspec.json.Decoder(list[Attempt])
_json_decoder = msgspec.json.Decoder()
_NO_EXTRA = _encoder.encode(_Extra())
_audit_decoder = msgspec.json.Decoder(AuditRecord)


def spec_column(spec: JobSpec) -> bytes:
    """The ``spec`` column of a job (or of the spec a change sets): its :class:`JobSpec`."""
    return _encoder.encode(spec.spec if isinstance(spec, Job) else spec)


def epoch_ms(t: datetime | None) -> int | None:
    """An instant column: epoch milliseconds, NULL for None."""
    return None if t is None else to_epoch_ms(t)


def instant(ms: int | None) -> datetime | None:
    """The instant of an epoch-milliseconds column (None for NULL)."""
    return None if ms is None else from_epoch_ms(ms)


def job_from_row(row: sqlite3.Row) -> Job:
    spec = _spec_decoder.decode(row["spec"])
    return Job(
        **spec_values(spec),
        id=row["id"],
        owner=row["owner"],
        status=JobStatus(row["status"]),
        partition=row["partition"],
        created_at=from_epoch_ms(row["created_at"]),
        updated_at=from_epoch_ms(row["updated_at"]),
        next_run_at=instant(row["next_run_at"]),
        last_run_at=instant(row["last_run_at"]),
        last_run_status=ExecutionStatus(row["last_run_status"]) if row["last_run_status"] else None,
        last_error=row["last_error"],
        last_execution_id=row["last_execution_id"],
        last_scheduled_for=instant(row["last_scheduled_for"]),
        last_dispatched_for=instant(row["last_dispatched_for"]),
        run_count=row["run_count"],
        idempotency_key=row["idempotency_key"],
    )


def job_row(job: Job) -> tuple[Any, ...]:
    return (
        job.id,
        job.owner,
        job.partition,
        job.status.value,
        epoch_ms(job.next_run_at),
        to_epoch_ms(job.created_at),
        to_epoch_ms(job.updated_at),
        epoch_ms(job.last_run_at),
        job.last_run_status.value if job.last_run_status else None,
        job.last_error,
        job.last_execution_id,
        epoch_ms(job.last_scheduled_for),
        job.run_count,
        spec_column(job),
        job.idempotency_key,
        epoch_ms(job.last_dispatched_for),
    )


def label_rows(job: Job, labels: Mapping[str, str] | None = None) -> list[tuple[Any, ...]]:
    """The ``job_labels`` rows of ``job`` (of ``labels``, the job's new labels, when given): one
    per term (:func:`core.labels.label_terms`)."""
    created = to_epoch_ms(job.created_at)
    terms = label_terms(job.labels if labels is None else labels)
    return [(job.id, job.owner, created, term) for term in terms]


def execution_from_row(row: sqlite3.Row) -> Execution:
    extra = _extra_decoder.decode(row["extra"]) if row["extra"] else _Extra()
    return Execution(
        id=row["id"],
        job_id=row["job_id"],
        owner=row["owner"],
        partition=row["partition"],
        task_id=row["task_id"],
        queue=row["queue"],
        status=ExecutionStatus(row["status"]),
        state_rank=row["state_rank"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        scheduled_for=from_epoch_ms(row["scheduled_for"]),
        created_at=from_epoch_ms(row["created_at"]),
        updated_at=from_epoch_ms(row["updated_at"]),
        published_at=instant(row["published_at"]),
        started_at=instant(row["started_at"]),
        finished_at=instant(row["finished_at"]),
        next_attempt_at=instant(row["next_attempt_at"]),
        worker_id=row["worker_id"],
        error=row["error"],
        result=None if row["result"] is None else _json_decoder.decode(row["result"]),
        dispatched_by=row["dispatched_by"],
        trigger=extra.trigger,
        jitter_ms=extra.jitter_ms,
        skip_reason=extra.skip_reason,
        missed=extra.missed,
        replay_of=extra.replay_of,
        backfill=extra.backfill,
        attempts=_attempts_decoder.decode(row["attempts"]) if row["attempts"] else [],
    )


def execution_row(e: Execution) -> tuple[Any, ...]:
    return (
        e.id,
        e.job_id,
        e.owner,
        e.partition,
        e.task_id,
        e.queue,
        e.status.value,
        e.state_rank,
        e.attempt,
        e.max_attempts,
        to_epoch_ms(e.scheduled_for),
        to_epoch_ms(e.created_at),
        to_epoch_ms(e.updated_at),
        epoch_ms(e.published_at),
        epoch_ms(e.started_at),
        epoch_ms(e.finished_at),
        epoch_ms(e.next_attempt_at),
        e.worker_id,
        e.error,
        None if e.result is None else msgspec.json.encode(e.result),
        e.dispatched_by,
        _encoder.encode(
            _Extra(
                trigger=e.trigger,
                jitter_ms=e.jitter_ms,
                skip_reason=e.skip_reason,
                missed=e.missed,
                replay_of=e.replay_of,
                backfill=e.backfill,
            )
        ),
        _encoder.encode(e.attempts) if e.attempts else None,
        int(e.backfill or e.replay_of is not None),
    )


def event_row(ev: StatusEvent) -> tuple[Any, ...]:
    at = to_epoch_ms(ev.at)
    return (
        ev.execution_id,
        ev.job_id,
        ev.owner,
        ev.partition,
        ev.task_id,
        ev.queue,
        ev.status.value,
        ev.rank,
        ev.attempt,
        ev.max_attempts,
        to_epoch_ms(ev.scheduled_for),
        at,
        at,
        epoch_ms(ev.published_at),
        epoch_ms(ev.started_at),
        epoch_ms(ev.finished_at),
        epoch_ms(ev.next_attempt_at),
        ev.worker_id,
        ev.error,
        None if ev.result is None else msgspec.json.encode(ev.result),
        None,
        _encoder.encode(_Extra(skip_reason=ev.error))
        if ev.status == ExecutionStatus.SKIPPED and ev.error is not None
        else _NO_EXTRA,
        None,
        0,
    )


def summary_params(ev: StatusEvent) -> dict[str, Any]:
    """The parameters of ``JOB_SUMMARY`` for ``ev``; the job's status is
    :func:`core.job_status.job_status_write` of it."""
    write = job_status_write(ev.status)
    return {
        "status": ev.status.value,
        "status_with_next_run": write.with_next_run.value,
        "status_without_next_run": write.without_next_run.value,
        "started_at": epoch_ms(ev.started_at),
        "terminal": ev.status in TERMINAL_EXECUTION_STATUSES,
        "error": ev.error,
        "execution_id": ev.execution_id,
        "scheduled_for": to_epoch_ms(ev.scheduled_for),
        "now": to_epoch_ms(ev.at),
        "job_id": ev.job_id,
        "rank": ev.rank,
    }


def dead_letter_from_row(row: sqlite3.Row) -> DeadLetter:
    return DeadLetter(
        id=row["id"],
        at=from_epoch_ms(row["at"]),
        source=row["source"],
        reason=row["reason"],
        error=row["error"],
        subject=row["subject"],
        size=row["size"],
        execution_id=row["execution_id"],
        job_id=row["job_id"],
        owner=row["owner"],
        data=bytes(row["data"]),
    )


def attempts_column(history: list[Attempt]) -> bytes:
    """The ``attempts`` column of a run's attempt history."""
    return _encoder.encode(history)


def dead_letter_row(x: DeadLetter) -> tuple[Any, ...]:
    """The values of :data:`store.sqlite.schema.DEAD_LETTER_INSERT`."""
    return (
        x.id,
        to_epoch_ms(x.at),
        x.source,
        x.reason,
        x.error,
        x.subject,
        x.size,
        x.execution_id,
        x.job_id,
        x.owner,
        x.data,
    )


def audit_row(r: AuditRecord) -> tuple[Any, ...]:
    """The values of :data:`store.sqlite.schema.AUDIT_INSERT`: the filter fields as columns,
    the record as msgspec JSON."""
    return (r.id, r.job_id, r.owner, r.actor, to_epoch_ms(r.at), _encoder.encode(r))


def audit_from_row(row: sqlite3.Row) -> AuditRecord:
    """The record of an ``audit`` row (its ``record`` column)."""
    return _audit_decoder.decode(row["record"])


def stored_attempts(run_id: str, raw: bytes | None) -> list[Attempt]:
    """A run's stored attempts; an unreadable value (a newer version's, edited by hand) is
    logged and started anew, so it never stops the recorder."""
    if not raw:
        return []
    try:
        return _attempts_decoder.decode(raw)
    except msgspec.DecodeError as e:
        log.warning("sqlite: run %s has unreadable attempts (%s); recording them anew", run_id, e)
        return []
