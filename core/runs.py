"""The shapes of a run, each built by one function: its execution record, its run message and
its status events.

The scheduler (a due occurrence, a take-over, a re-dispatch), the gateway's manual trigger and
the worker build every :class:`~core.model.Execution`, :class:`~core.model.RunMessage` and
:class:`~core.model.StatusEvent` here, so a field added once appears on every path.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from core.concurrency import render_key
from core.ids import execution_id, manual_execution_id, parse_execution_id
from core.model import (
    TERMINAL_RANK,
    Execution,
    ExecutionStatus,
    Job,
    Missed,
    RunMessage,
    RunTrigger,
    StatusEvent,
)
from core.ports import DispatchOutcome
from core.schedule import jitter_ms, schedule_jitter

MANUAL_DISPATCHER = "gateway"
"""``dispatchedBy`` of a manual run."""


def queued_run(
    job: Job, scheduled_for: datetime, now: datetime, dispatched_by: str, trigger: RunTrigger
) -> Execution:
    """The QUEUED record of the occurrence of ``job`` at ``scheduled_for``, with its
    deterministic id (:func:`core.ids.execution_id`) and jitter."""
    return _run(
        job,
        execution_id(job.id, scheduled_for),
        scheduled_for,
        now,
        dispatched_by,
        trigger=trigger,
        jitter=jitter_ms(job.id, scheduled_for, schedule_jitter(job.schedule)),
    )


def manual_run(job: Job, now: datetime) -> Execution:
    """The QUEUED record of a run of ``job`` triggered by hand at ``now`` (no jitter; its id is
    :func:`core.ids.manual_execution_id`, a new one each call)."""
    return _run(
        job,
        manual_execution_id(job.id, now),
        now,
        now,
        MANUAL_DISPATCHER,
        trigger=RunTrigger.MANUAL,
        jitter=0,
    )


def replay_run(
    job: Job,
    original: Execution,
    now: datetime,
    *,
    nonce: str | None = None,
    at: datetime | None = None,
) -> Execution:
    """The QUEUED record of a replay of ``original`` (a run of ``job``), recorded at ``now``: a
    manual run (:func:`manual_run`) whose ``replayOf`` names the original. Its id
    (:func:`core.ids.manual_execution_id`) and ``scheduledFor`` are ``at`` (default ``now``)
    and ``nonce`` (default random): a bulk replay fixes both, from the action's creation time
    and from the action and the original (:func:`core.bulk.replay_nonce`), so the same replay
    always gets the same id."""
    fixed = now if at is None else at
    return msgspec.structs.replace(
        _run(
            job,
            manual_execution_id(job.id, fixed, nonce),
            fixed,
            now,
            MANUAL_DISPATCHER,
            trigger=RunTrigger.MANUAL,
            jitter=0,
        ),
        replay_of=original.id,
    )


def backfill_run(
    job: Job, scheduled_for: datetime, now: datetime, *, skip_reason: str | None = None
) -> Execution:
    """The record of a backfilled occurrence of ``job`` at ``scheduled_for`` (past), recorded
    at ``now``: QUEUED with the occurrence's deterministic id, no jitter, ``backfill`` set
    (``trigger: manual``: a user asked for it); SKIPPED with ``skip_reason`` when the overlap
    policy leaves it out (:mod:`core.backfill`)."""
    run = msgspec.structs.replace(
        _run(
            job,
            execution_id(job.id, scheduled_for),
            scheduled_for,
            now,
            MANUAL_DISPATCHER,
            trigger=RunTrigger.MANUAL,
            jitter=0,
        ),
        backfill=True,
    )
    if skip_reason is None:
        return run
    return msgspec.structs.replace(
        run,
        status=ExecutionStatus.SKIPPED,
        state_rank=TERMINAL_RANK,
        finished_at=now,
        skip_reason=skip_reason,
    )


def skipped_run(
    job: Job,
    scheduled_for: datetime,
    now: datetime,
    dispatched_by: str,
    reason: str,
    missed: Missed | None,
) -> Execution:
    """The SKIPPED record of an occurrence that does not run (misfire, overlap): finished at
    ``now`` with ``reason`` (and ``missed``, when it stands for several occurrences)."""
    run_id = execution_id(job.id, scheduled_for)
    return msgspec.structs.replace(
        _run(job, run_id, scheduled_for, now, dispatched_by, trigger=RunTrigger.SCHEDULE, jitter=0),
        status=ExecutionStatus.SKIPPED,
        state_rank=TERMINAL_RANK,
        finished_at=now,
        skip_reason=reason,
        missed=missed,
    )


def _run(
    job: Job,
    run_id: str,
    scheduled_for: datetime,
    now: datetime,
    dispatched_by: str,
    *,
    trigger: RunTrigger,
    jitter: int,
) -> Execution:
    return Execution(
        id=run_id,
        job_id=job.id,
        owner=job.owner,
        task_id=job.task_id,
        queue=job.queue,
        partition=job.partition,
        status=ExecutionStatus.QUEUED,
        max_attempts=job.max_attempts,
        scheduled_for=scheduled_for,
        created_at=now,
        updated_at=now,
        dispatched_by=dispatched_by,
        trigger=trigger,
        jitter_ms=jitter,
    )


def run_message(
    job: Job,
    run: Execution,
    now: datetime,
    *,
    attempt_offset: int = 0,
    redispatched_at_ms: int = 0,
) -> RunMessage:
    """The work message of ``run`` of ``job``, published at ``now``.

    Args:
        attempt_offset: attempts already spent (a re-dispatch of a lost run: its ``attempt``).
        redispatched_at_ms: when it is re-dispatched (epoch ms; 0: the first publish), which
            changes its ``Nats-Msg-Id`` (:func:`core.ids.run_msg_id`).
    """
    return RunMessage(
        execution_id=run.id,
        job_id=job.id,
        owner=job.owner,
        partition=job.partition,
        task_id=job.task_id,
        queue=job.queue,
        parameters=job.parameters,
        scheduled_for=run.scheduled_for,
        published_at=now,
        max_attempts=job.max_attempts,
        timeout_seconds=job.timeout_seconds,
        attempt_offset=attempt_offset,
        redispatched_at_ms=redispatched_at_ms,
        trigger=run.trigger,
        concurrency_key=concurrency_key_of(job),
        max_concurrent=job.max_concurrent,
        concurrency_policy=job.concurrency_policy,
    )


def concurrency_key_of(job: Job) -> str | None:
    """The rendered concurrency key of ``job``'s runs (None: no limit). The gateway validated
    the template against the parameters; should it still not render (a job stored by another
    version), the template's own text is the key, so the limit still holds."""
    if job.concurrency_key is None:
        return None
    try:
        return render_key(job.concurrency_key, job.parameters)
    except ValueError:
        return job.concurrency_key


def run_event(
    run: Execution | RunMessage,
    status: ExecutionStatus,
    *,
    attempt: int,
    at: datetime,
    published_at: datetime | None = None,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    next_attempt_at: datetime | None = None,
    worker_id: str | None = None,
    error: str | None = None,
    result: Any = None,
) -> StatusEvent:
    """A status event of ``run`` (a record or the message a worker received): its identity
    fields and the given transition. Instants are aware UTC."""
    return StatusEvent(
        execution_id=run.id if isinstance(run, Execution) else run.execution_id,
        job_id=run.job_id,
        owner=run.owner,
        partition=run.partition,
        task_id=run.task_id,
        queue=run.queue,
        status=status,
        attempt=attempt,
        max_attempts=run.max_attempts,
        at=at,
        scheduled_for=run.scheduled_for,
        published_at=published_at,
        started_at=started_at,
        finished_at=finished_at,
        next_attempt_at=next_attempt_at,
        worker_id=worker_id,
        error=error,
        result=result,
    )


def recorded_event(run: Execution) -> StatusEvent:
    """The QUEUED or SKIPPED event of a run just recorded, by a scheduler or a manual trigger
    (for live clients)."""
    return run_event(
        run,
        run.status,
        attempt=0,
        at=run.created_at,
        finished_at=run.finished_at,
        error=run.skip_reason,
    )


def dispatched(
    job: Job, run: Execution, outcome: DispatchOutcome, now: datetime
) -> tuple[StatusEvent | None, RunMessage | None]:
    """What to publish for a run the store dispatched (a scheduler's or a manual trigger's): its
    QUEUED or SKIPPED event if the record was created now (live clients see it once), and its
    run message if the dispatch took effect and the run is QUEUED. A dispatch that lost its
    compare-and-set publishes nothing: whoever won publishes. Publish the event first: QUEUED
    precedes RUNNING."""
    if not outcome.advanced:
        return None, None
    event = recorded_event(run) if outcome.created else None
    message = run_message(job, run, now) if run.status == ExecutionStatus.QUEUED else None
    return event, message


def poison_event(
    message_execution_id: str, *, attempt: int, at: datetime, worker_id: str, error: str
) -> StatusEvent | None:
    """The FAILED event of a run whose message cannot be read, from the execution id in its
    ``Nats-Msg-Id`` alone (owner, partition and task unknown: empty); None if that is no
    execution id."""
    parsed = parse_execution_id(message_execution_id)
    if parsed is None:
        return None
    job_id, scheduled_for = parsed
    known = Execution(  # the run as far as its id tells
        id=message_execution_id,
        job_id=job_id,
        owner="",
        task_id="",
        scheduled_for=scheduled_for,
        created_at=at,
        updated_at=at,
    )
    return run_event(
        known,
        ExecutionStatus.FAILED,
        attempt=attempt,
        at=at,
        finished_at=at,
        worker_id=worker_id,
        error=error,
    )
