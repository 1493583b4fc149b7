"""Why a job's next run has not started, or why its last expected run did not happen.

:func:`explain` is a pure decision: it takes plain data — the job, its latest executions, ``now``,
the state of its queue (:class:`QueueState`), the lease of its partition (:class:`LeaseView`)
and its owner's runs quota (:class:`QuotaState`) — and returns :class:`Reason` s, most important
first. ``GET /jobs/{id}/explain`` (and the NATS API's ``explain``) gathers the inputs through
the ports :class:`core.ports.QueueInspector` and :class:`core.ports.LeaseInspector` and answers
an :class:`Explanation`.

Every reason has a stable ``code`` (:class:`Code`), a ``severity`` (``blocking``: no run starts
until it changes; ``warning``: it may delay or drop a run; ``info``: the healthy state, or the
past), a sentence for humans and ``details`` for programs (instants as RFC 3339 UTC strings,
durations in ``*Seconds``). The rules are :data:`RULES`, in order of importance; adding a reason
is one function there (see :func:`explain`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import msgspec

from core import cron
from core.concurrency import ConcurrencyWait
from core.dispatch import due_at, previous_active
from core.errors import InvalidRequest
from core.model import (
    ACTIVE_EXECUTION_STATUSES,
    ENDED_JOB_STATUSES,
    FINISHED_JOB_STATUSES,
    CronSchedule,
    Execution,
    ExecutionStatus,
    Instant,
    IntervalSchedule,
    Job,
    JobStatus,
    Model,
    OverlapPolicy,
    RunTrigger,
)
from core.quotas import Bucket, Rate, take
from core.schedule import schedule_jitter
from core.scheduling import HELD_BY_QUOTA
from core.timeutil import isoformat_z

OVERDUE_AFTER_SECONDS = 5.0
"""A run this long past its due time (scheduled time plus jitter) and not dispatched is
``overdue``: a scheduler dispatches a due run within milliseconds of its due time, and its safety
scan (``JOBSCHED_SCAN_INTERVAL_SECONDS``) finds a job it missed within seconds."""

RECENT_EXECUTIONS = 10
"""How many of a job's latest executions the gateway passes in (newest first)."""

Severity = Literal["blocking", "warning", "info"]
_SEVERITY_RANK: dict[str, int] = {"blocking": 0, "warning": 1, "info": 2}


class Code(enum.StrEnum):
    """The stable reason codes (API contract: a code never changes meaning)."""

    CANCELLED = "cancelled"
    FINISHED = "finished"
    PAUSED = "paused"
    NOT_STARTED = "not_started"
    ENDED = "ended"
    NO_OWNER = "no_owner"
    OVERLAP_WAITING = "overlap_waiting"
    OVERLAP_WILL_SKIP = "overlap_will_skip"
    OVERLAP_WILL_REPLACE = "overlap_will_replace"
    RETRYING = "retrying"
    QUOTA_REACHED = "quota_reached"
    CONCURRENCY_WAITING = "concurrency_waiting"
    QUEUE_NO_CONSUMER = "queue_no_consumer"
    QUEUE_NO_WORKER = "queue_no_worker"
    QUEUE_BACKLOG = "queue_backlog"
    MISFIRED = "misfired"
    OVERLAP_SKIPPED = "overlap_skipped"
    SKIPPED = "skipped"
    LAST_RUN_FAILED = "last_run_failed"
    RUNNING = "running"
    QUEUED = "queued"
    JITTER_DELAY = "jitter_delay"
    OVERDUE = "overdue"
    SCHEDULED = "scheduled"
    CHECK_UNAVAILABLE = "check_unavailable"


Detail = str | int | float | bool | None


class Reason(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One reason.

    Attributes:
        code: stable code (:class:`Code`).
        severity: ``blocking`` | ``warning`` | ``info`` (see module docstring).
        message: one sentence for humans (times in UTC, a cron job's also in its time zone).
        details: the facts behind it, camelCase keys (instants RFC 3339 UTC, ``*Seconds``).
    """

    code: str
    severity: Severity
    message: str
    details: dict[str, Detail] = msgspec.field(default_factory=dict)


class Explanation(Model, kw_only=True, omit_defaults=False, frozen=True):
    """Body of ``GET /jobs/{id}/explain``: the job's state and the reasons, most important first.

    Attributes:
        job_id / status / next_run_at: the job as the store has it.
        at: the instant the explanation holds for (the gateway's clock).
        reasons: never empty.
    """

    job_id: str
    status: JobStatus
    at: Instant
    next_run_at: Instant | None = None
    reasons: list[Reason]


@dataclass(frozen=True, slots=True)
class QueueState:
    """The JetStream consumer of the job's queue (consumer info of ``workers-<queue>``).

    Attributes:
        queue: the queue's name.
        consumer_exists: the consumer exists (a worker of the queue creates it on start).
        pending: runs stored and not yet delivered to a worker (``num_pending``).
        in_progress: runs delivered and not yet acknowledged (``num_ack_pending``).
        waiting_pulls: pull requests of workers waiting for a run (``num_waiting``): 0 while no
            worker is pulling, or every worker is busy.
    """

    queue: str
    consumer_exists: bool
    pending: int = 0
    in_progress: int = 0
    waiting_pulls: int = 0


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The lease of the job's partition in the lease bucket (:mod:`bus.leases`).

    Attributes:
        partition: the partition.
        owner: the scheduler holding it (None: nobody; the bucket may not even exist).
        expires_at: when the server expires it unless renewed (aware UTC; None: unknown).
    """

    partition: int
    owner: str | None
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class QuotaState:
    """The owner's runs-per-minute quota (:mod:`core.quotas`): its rate (None: off) and its
    bucket as the store holds it (None: never taken, i.e. full)."""

    runs_per_minute: int
    rate: Rate | None
    bucket: Bucket | None = None


@dataclass(frozen=True, slots=True)
class ExplainInput:
    """What :func:`explain` decides from. A check that could not be made is None (the answer
    then says so with a ``check_unavailable`` reason, instead of guessing).

    Attributes:
        job: the job.
        now: the instant to explain for (aware UTC).
        recent: its latest executions, newest scheduled time first (:data:`RECENT_EXECUTIONS`).
        previous: its latest dispatched run (``lastDispatchedFor``), which the overlap policy
            looks at (None: none).
        queue / lease / quota: see :class:`QueueState`, :class:`LeaseView`, :class:`QuotaState`.
        concurrency: the slots of the job's concurrency key (:func:`core.concurrency.explain_wait`
            with no execution id; None: the job has no key, or the slots could not be read).
    """

    job: Job
    now: datetime
    recent: Sequence[Execution] = ()
    previous: Execution | None = None
    queue: QueueState | None = None
    lease: LeaseView | None = None
    quota: QuotaState | None = None
    concurrency: ConcurrencyWait | None = None

    @property
    def expects_run(self) -> bool:
        """The job is live and has a next run to dispatch."""
        return (
            self.job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING)
            and self.job.next_run_at is not None
        )

    @property
    def active_runs(self) -> list[Execution]:
        """Its QUEUED, RUNNING or RETRYING runs among ``recent`` and ``previous``, newest first."""
        seen: dict[str, Execution] = {}
        for ex in (*self.recent, *([self.previous] if self.previous else [])):
            if ex.status in ACTIVE_EXECUTION_STATUSES:
                seen.setdefault(ex.id, ex)
        return sorted(seen.values(), key=lambda e: e.scheduled_for, reverse=True)


Rule = Callable[[ExplainInput, Sequence[Reason]], Iterable[Reason]]
"""One rule: the input and the reasons of the rules before it → its reasons (often none)."""


def explain(inp: ExplainInput) -> list[Reason]:
    """The reasons why ``inp.job``'s next run has not started (or its last expected run did
    not happen), ordered by severity (blocking, warning, info) and, within one, by the rule
    order of :data:`RULES`. Never empty: a job with nothing in its way gets ``scheduled`` (or
    ``finished`` / ``cancelled`` / ``ended`` when it has no run left).

    Adding a reason: write a :data:`Rule` and insert it into :data:`RULES` at its rank (a new
    input goes into :class:`ExplainInput` with a default, so existing callers keep working).
    """
    found: list[Reason] = []
    for rule in RULES:
        found.extend(rule(inp, found))
    return sorted(found, key=lambda r: _SEVERITY_RANK[r.severity])


# --- formatting -----------------------------------------------------------------------------


def _z(t: datetime | None) -> str | None:
    return None if t is None else isoformat_z(t)


def _when(t: datetime, job: Job) -> str:
    """``t`` in UTC, and for a cron job outside UTC also in its zone (DST made visible)."""
    text = isoformat_z(t)
    sched = job.schedule
    if isinstance(sched, CronSchedule) and sched.timezone not in ("UTC", "Etc/UTC"):
        try:
            local = t.astimezone(cron.resolve_timezone(sched.timezone))
        except InvalidRequest:
            return text
        text += f" ({local:%Y-%m-%d %H:%M:%S} {local.tzname()} in {sched.timezone})"
    return text


def _span(seconds: float) -> str:
    """A duration for humans: ``45 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 // 60 else f"{s // 3600} h"
    return f"{s // 86400} d {s % 86400 // 3600} h" if s % 86400 // 3600 else f"{s // 86400} d"


def _seconds(a: datetime, b: datetime) -> float:
    return round((b - a).total_seconds(), 3)


def _reason(code: Code, severity: Severity, message: str, **details: Detail) -> Reason:
    return Reason(code=code.value, severity=severity, message=message, details=details)


def _window(job: Job) -> tuple[datetime | None, datetime | None]:
    sched = job.schedule
    if isinstance(sched, CronSchedule | IntervalSchedule):
        return sched.start_at, sched.end_at
    return None, None


# --- the rules, in order of importance --------------------------------------------------------


def job_state(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Cancelled, paused, or finished (a one-time job's run is over; a schedule that ended)."""
    job = inp.job
    if job.status == JobStatus.CANCELLED:
        yield _reason(
            Code.CANCELLED, "blocking", "the job was cancelled: no run of it starts again"
        )
    elif job.status == JobStatus.PAUSED:
        yield _reason(
            Code.PAUSED,
            "blocking",
            "the job is paused: no run starts until it is resumed "
            "(POST /jobs/{id}/resume, `jobsched resume`)",
            pausedSince=_z(job.updated_at),
        )
    elif job.next_run_at is None and job.status in ENDED_JOB_STATUSES:
        _, end = _window(job)
        if job.recurring and end is not None:
            return  # ``ended`` says it
        last = f"; its run ended {job.last_run_status}" if job.last_run_status else ""
        yield _reason(
            Code.FINISHED,
            "info",
            f"the job is {job.status}: it had one run and no run is left{last}",
            lastRunStatus=job.last_run_status,
            lastExecutionId=job.last_execution_id,
        )


def schedule_window(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Outside ``startAt`` / ``endAt``: not started yet, or ended."""
    job, now = inp.job, inp.now
    if not job.recurring or job.status in (JobStatus.CANCELLED, JobStatus.PAUSED):
        return
    start, end = _window(job)
    if start is not None and now < start:
        first = job.next_run_at
        nxt = f"; its first run is at {_when(first, job)}" if first is not None else ""
        yield _reason(
            Code.NOT_STARTED,
            "blocking",
            f"its schedule starts at {_when(start, job)} (startAt), "
            f"in {_span(_seconds(now, start))}{nxt}",
            startAt=_z(start),
            nextRunAt=_z(first),
            startsInSeconds=_seconds(now, start),
        )
    if end is not None and (job.next_run_at is None or end < now):
        if job.next_run_at is None:
            message = f"its schedule ended at {_when(end, job)} (endAt): no run is left"
        else:
            message = (
                f"its schedule ended at {_when(end, job)} (endAt); the occurrence at "
                f"{_when(job.next_run_at, job)} is the last one it may still run"
            )
        last = f"; its last run ended {job.last_run_status}" if job.last_run_status else ""
        severity: Severity = "info" if job.next_run_at is None else "warning"
        yield _reason(
            Code.ENDED,
            severity,
            message + last,
            endAt=_z(end),
            lastRunStatus=job.last_run_status,
        )


def ownership(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Nobody owns the job's partition (or its lease has expired): nothing dispatches it."""
    lease = inp.lease
    if not inp.expects_run or lease is None:
        return
    if lease.owner is None:
        yield _reason(
            Code.NO_OWNER,
            "blocking",
            f"no scheduler owns partition {lease.partition}: its runs are dispatched once a "
            "scheduler takes it (is a scheduler running and connected to NATS?)",
            partition=lease.partition,
        )
    elif lease.expires_at is not None and lease.expires_at <= inp.now:
        yield _reason(
            Code.NO_OWNER,
            "blocking",
            f"the lease of partition {lease.partition} by scheduler {lease.owner} expired at "
            f"{isoformat_z(lease.expires_at)}: that scheduler stopped renewing it, and no other "
            "has taken it yet",
            partition=lease.partition,
            lastOwner=lease.owner,
            expiredAt=_z(lease.expires_at),
        )


def overlap(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """The previous run is still active and the overlap policy holds, skips or replaces the
    next one."""
    job, prev, now = inp.job, inp.previous, inp.now
    if not job.recurring or not inp.expects_run or prev is None or not previous_active(prev):
        return
    nxt = job.next_run_at
    assert nxt is not None
    due = due_at(job) or nxt
    details: dict[str, Detail] = {
        "executionId": prev.id,
        "executionStatus": prev.status,
        "overlapPolicy": job.overlap_policy,
        "nextRunAt": _z(nxt),
    }
    match job.overlap_policy:
        case OverlapPolicy.BUFFER_ONE if due <= now:
            yield Reason(
                code=Code.OVERLAP_WAITING,
                severity="blocking",
                message=(
                    f"its run due at {_when(nxt, job)} waits for the previous run {prev.id}, "
                    f"still {prev.status}, to end (overlapPolicy bufferOne)"
                ),
                details=details,
            )
        case OverlapPolicy.BUFFER_ONE:
            yield Reason(
                code=Code.OVERLAP_WAITING,
                severity="warning",
                message=(
                    f"the previous run {prev.id} is still {prev.status}: the run due at "
                    f"{_when(nxt, job)} will wait for it to end (overlapPolicy bufferOne)"
                ),
                details=details,
            )
        case OverlapPolicy.FORBID:
            yield Reason(
                code=Code.OVERLAP_WILL_SKIP,
                severity="warning",
                message=(
                    f"the previous run {prev.id} is still {prev.status}: the run due at "
                    f"{_when(nxt, job)} will be skipped if it is still active then "
                    "(overlapPolicy forbid)"
                ),
                details=details,
            )
        case OverlapPolicy.REPLACE:
            yield Reason(
                code=Code.OVERLAP_WILL_REPLACE,
                severity="info",
                message=(
                    f"the previous run {prev.id} is still {prev.status}: the run due at "
                    f"{_when(nxt, job)} will cancel it (overlapPolicy replace)"
                ),
                details=details,
            )


def retrying(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """A run failed an attempt and waits out its backoff."""
    for ex in inp.active_runs:
        if ex.status != ExecutionStatus.RETRYING:
            continue
        job, now = inp.job, inp.now
        error = f" ({ex.error[:200]})" if ex.error else ""
        at = ex.next_attempt_at
        if at is not None and at > now:
            when = f"retries after its backoff at {_when(at, job)}, in {_span(_seconds(now, at))}"
        elif at is not None:
            when = f"its retry was due at {_when(at, job)}; it waits for a worker to take it"
        else:
            when = "it will be retried"
        yield _reason(
            Code.RETRYING,
            "blocking" if at is not None and at > now else "warning",
            f"run {ex.id} failed attempt {ex.attempt} of {ex.max_attempts}{error}; {when}",
            executionId=ex.id,
            attempt=ex.attempt,
            maxAttempts=ex.max_attempts,
            nextAttemptAt=_z(at),
            error=ex.error[:200] if ex.error else None,
        )
        return


def quota(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """The owner's runs-per-minute quota has no token for the next run: it is held back."""
    q = inp.quota
    if q is None or q.rate is None or not inp.expects_run:
        return
    _, wait = take(q.bucket, q.rate, 1, inp.now)
    if wait <= 0:
        return
    job = inp.job
    until = inp.now + timedelta(seconds=wait)
    nxt = job.next_run_at
    assert nxt is not None
    due = (due_at(job) or nxt) <= inp.now
    message = f"its owner's quota of {q.runs_per_minute} runs started per minute is used up: " + (
        f"its run due at {_when(nxt, job)} is held back until about {isoformat_z(until)}"
        if due
        else f"a run due now would be held back until about {isoformat_z(until)}"
    )
    yield _reason(
        Code.QUOTA_REACHED,
        "blocking" if due else "warning",
        message,
        limit="runsPerMinute",
        runsPerMinute=q.runs_per_minute,
        retryAfterSeconds=round(wait, 3),
        heldUntil=isoformat_z(until),
    )


def concurrency(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """A run of the job waits in line for a slot of its concurrency key (blocking), or every
    slot of the key is taken by other runs and its next run will wait (warning)."""
    c = inp.concurrency
    if c is None or inp.job.status == JobStatus.CANCELLED:
        return
    details: dict[str, Detail] = {
        "concurrencyKey": c.key,
        "maxConcurrent": c.max_concurrent,
        "running": len(c.running),
        "runningExecutionIds": ",".join(c.running),
        "waiting": len(c.waiting),
    }
    running = f"{len(c.running)}/{c.max_concurrent} running ({', '.join(c.running) or 'none'})"
    for ex in reversed(inp.active_runs):  # oldest first: the first in line
        if ex.status == ExecutionStatus.QUEUED and ex.id in c.waiting:
            position = c.waiting.index(ex.id)
            yield Reason(
                code=Code.CONCURRENCY_WAITING,
                severity="blocking",
                message=(
                    f"run {ex.id} waits for a slot of concurrency key {c.key!r}: {running}, "
                    f"{position} waiting ahead of it"
                ),
                details={**details, "executionId": ex.id, "position": position},
            )
            return
    mine = {ex.id for ex in inp.active_runs}
    if inp.expects_run and len(c.running) >= c.max_concurrent and not mine & set(c.running):
        yield Reason(
            code=Code.CONCURRENCY_WAITING,
            severity="warning",
            message=(
                f"every slot of concurrency key {c.key!r} is taken: {running}; its next run "
                f"will wait for one (concurrencyPolicy {inp.job.concurrency_policy})"
            ),
            details={**details, "executionId": None, "position": None},
        )


def queue(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """The job's queue has no consumer, no worker pulling, or a backlog before its run."""
    q = inp.queue
    if q is None or inp.job.status == JobStatus.CANCELLED:
        return
    waiting = [
        ex
        for ex in inp.active_runs
        if ex.status == ExecutionStatus.QUEUED
        or (
            ex.status == ExecutionStatus.RETRYING
            and ex.next_attempt_at is not None
            and ex.next_attempt_at <= inp.now
        )
    ]
    run = f"run {waiting[0].id} waits in it" if waiting else "its runs will wait there"
    details: dict[str, Detail] = {
        "queue": q.queue,
        "pending": q.pending,
        "inProgress": q.in_progress,
        "waitingPulls": q.waiting_pulls,
        "executionId": waiting[0].id if waiting else None,
    }
    if not q.consumer_exists:
        yield Reason(
            code=Code.QUEUE_NO_CONSUMER,
            severity="blocking" if waiting else "warning",
            message=(
                f"queue {q.queue!r} has no consumer: no worker serving it has ever started "
                f"(JOBSCHED_QUEUES); {run}"
            ),
            details=details,
        )
    elif q.pending > 0 and q.in_progress == 0 and q.waiting_pulls == 0:
        yield Reason(
            code=Code.QUEUE_NO_WORKER,
            severity="blocking" if waiting else "warning",
            message=(
                f"no worker is pulling from queue {q.queue!r}: {q.pending} runs wait and "
                f"none is in progress; {run}"
            ),
            details=details,
        )
    elif waiting and q.pending > 0:
        yield Reason(
            code=Code.QUEUE_BACKLOG,
            severity="warning",
            message=(
                f"queue {q.queue!r} has a backlog of {q.pending} runs not yet taken by a worker "
                f"({q.in_progress} in progress); {run}"
            ),
            details=details,
        )


def skipped(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Its latest expected runs did not happen: the SKIPPED records newer than its latest
    finished scheduled run (misfired, or skipped by the overlap policy), each with its rule.
    Runs in progress, manual runs and misfire catch-ups do not hide the records before them."""
    job = inp.job
    for ex in inp.recent:
        if ex.status != ExecutionStatus.SKIPPED:
            if ex.status in ACTIVE_EXECUTION_STATUSES or ex.trigger != RunTrigger.SCHEDULE:
                continue
            return
        why = ex.skip_reason or ""
        missed = ex.missed
        count = missed.count if missed is not None else 1
        first = missed.first if missed is not None and missed.first else ex.scheduled_for
        last = missed.last if missed is not None and missed.last else ex.scheduled_for
        occurrences = (
            f"the run due at {_when(first, job)}"
            if count == 1
            else f"{count} runs due from {_when(first, job)} to {_when(last, job)}"
        )
        details: dict[str, Detail] = {
            "executionId": ex.id,
            "skipReason": ex.skip_reason,
            "count": count,
            "first": _z(first),
            "last": _z(last),
            "policy": missed.policy if missed is not None else None,
        }
        if why.startswith("misfire"):
            policy = missed.policy if missed is not None else job.misfire_policy
            cause = (
                "its owner's runs-per-minute quota held them back"
                if HELD_BY_QUOTA in why
                else "no scheduler could dispatch them in time"
            )
            yield Reason(
                code=Code.MISFIRED,
                severity="warning",
                message=(
                    f"{occurrences} did not run: they misfired ({cause}, beyond the misfire "
                    f"grace of {job.misfire_grace_seconds:g} s) and misfirePolicy {policy} "
                    "skipped them"
                ),
                details={**details, "heldByQuota": HELD_BY_QUOTA in why},
            )
        elif why.startswith("overlap"):
            yield Reason(
                code=Code.OVERLAP_SKIPPED,
                severity="warning",
                message=f"{occurrences} did not run: {why} (overlapPolicy {job.overlap_policy})",
                details=details,
            )
        else:
            yield Reason(
                code=Code.SKIPPED,
                severity="warning",
                message=f"{occurrences} did not run: {why or 'skipped'}",
                details=details,
            )


def last_failure(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Its latest finished run did happen, and FAILED (or was CANCELLED): often what "has not
    run" means. Not for a cancelled job (the cancellation is the reason)."""
    job = inp.job
    if job.status == JobStatus.CANCELLED:
        return
    for ex in inp.recent:
        if ex.status in ACTIVE_EXECUTION_STATUSES or ex.status == ExecutionStatus.SKIPPED:
            continue
        if ex.status in (ExecutionStatus.FAILED, ExecutionStatus.CANCELLED):
            ended = ex.finished_at or ex.updated_at
            error = f": {ex.error[:200]}" if ex.error else ""
            yield _reason(
                Code.LAST_RUN_FAILED,
                "info",
                f"its latest run {ex.id} ran and ended {ex.status} at {_when(ended, job)} "
                f"after {ex.attempt} of {ex.max_attempts} attempts{error}",
                executionId=ex.id,
                executionStatus=ex.status,
                finishedAt=_z(ended),
                attempt=ex.attempt,
                error=ex.error[:200] if ex.error else None,
            )
        return


def in_progress(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """A run of the job is QUEUED or RUNNING now."""
    job, now = inp.job, inp.now
    for ex in inp.active_runs:
        if ex.status == ExecutionStatus.RUNNING:
            since = ex.started_at or ex.updated_at
            where = f" on worker {ex.worker_id}" if ex.worker_id else ""
            yield _reason(
                Code.RUNNING,
                "info",
                f"run {ex.id} is RUNNING{where} since {_when(since, job)}, for "
                f"{_span(_seconds(since, now))}, attempt {ex.attempt} of {ex.max_attempts}",
                executionId=ex.id,
                startedAt=_z(since),
                workerId=ex.worker_id,
                attempt=ex.attempt,
            )
        elif ex.status == ExecutionStatus.QUEUED:
            since = ex.published_at or ex.created_at
            waits = f"a worker of queue {ex.queue!r}"
            for r in found:  # a worker holds it, in line for a slot (the blocking reason)
                if r.code == Code.CONCURRENCY_WAITING and r.details.get("executionId") == ex.id:
                    waits = f"a slot of concurrency key {r.details['concurrencyKey']!r}"
            yield _reason(
                Code.QUEUED,
                "info",
                f"run {ex.id} is QUEUED since {_when(since, job)}, for "
                f"{_span(_seconds(since, now))}: it waits for {waits}",
                executionId=ex.id,
                queuedAt=_z(since),
                queue=ex.queue,
            )


def jitter(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Its scheduled time has passed but its jitter delay has not."""
    job, now = inp.job, inp.now
    due = due_at(job)
    if not inp.expects_run or due is None or job.next_run_at is None:
        return
    if job.next_run_at <= now < due:
        yield _reason(
            Code.JITTER_DELAY,
            "info",
            f"its run scheduled at {_when(job.next_run_at, job)} is delayed by its jitter "
            f"(up to {schedule_jitter(job.schedule):g} s) until {_when(due, job)}",
            nextRunAt=_z(job.next_run_at),
            dueAt=_z(due),
        )


def overdue(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Due for a while, not dispatched, and no reason above says why."""
    job, now = inp.job, inp.now
    due = due_at(job)
    if not inp.expects_run or due is None or any(r.severity == "blocking" for r in found):
        return
    late = _seconds(due, now)
    if late < OVERDUE_AFTER_SECONDS:
        return
    owner = inp.lease.owner if inp.lease is not None else None
    by = f"scheduler {owner}" if owner else "its scheduler"
    yield _reason(
        Code.OVERDUE,
        "warning",
        f"its run was due at {_when(due, job)}, {_span(late)} ago, and {by} has not "
        f"dispatched it yet (partition {job.partition}); it may be behind or restarting",
        dueAt=_z(due),
        lateSeconds=late,
        partition=job.partition,
        owner=owner,
    )


def healthy(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """Nothing in the way: when the next run is, and who dispatches it."""
    job, now = inp.job, inp.now
    if not inp.expects_run or any(r.severity != "info" for r in found):
        return
    nxt = job.next_run_at
    assert nxt is not None
    lease = inp.lease
    owner = lease.owner if lease is not None else None
    by = (
        f"partition {job.partition} is owned by scheduler {owner}"
        if owner
        else f"partition {job.partition}"
    )
    when = f"in {_span(_seconds(now, nxt))}" if nxt > now else "due now"
    yield _reason(
        Code.SCHEDULED,
        "info",
        f"its next run is at {_when(nxt, job)} ({when}); {by}",
        nextRunAt=_z(nxt),
        inSeconds=max(0.0, _seconds(now, nxt)),
        partition=job.partition,
        owner=owner,
    )


def unavailable(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """The checks that could not be made (NATS did not answer): said, not guessed."""
    if inp.job.status in FINISHED_JOB_STATUSES:
        return
    checks: list[tuple[str, object]] = [
        ("lease", inp.lease),
        ("queue", inp.queue),
        ("quota", inp.quota),
    ]
    if inp.job.concurrency_key is not None:
        checks.append(("concurrency", inp.concurrency))
    for name, value in checks:
        if value is None:
            yield _reason(
                Code.CHECK_UNAVAILABLE,
                "info",
                f"the {name} check could not be made now; the answer may miss a reason",
                check=name,
            )


def fallback(inp: ExplainInput, found: Sequence[Reason]) -> Iterable[Reason]:
    """No rule applied (a state no rule above expects): the job's status, so the answer is
    never empty."""
    if not found:
        yield _reason(
            Code.FINISHED,
            "info",
            f"the job is {inp.job.status}: no run of it is expected",
            lastRunStatus=inp.job.last_run_status,
            lastExecutionId=inp.job.last_execution_id,
        )


RULES: tuple[Rule, ...] = (
    job_state,
    schedule_window,
    ownership,
    overlap,
    retrying,
    quota,
    concurrency,
    queue,
    skipped,
    last_failure,
    in_progress,
    jitter,
    overdue,
    healthy,
    unavailable,
    fallback,
)
"""The rules of :func:`explain`, most important first."""


def finished_job(job: Job) -> bool:
    """No run of ``job`` can start again (cancelled, or finished with no run left): the gateway
    then skips the NATS checks."""
    return job.status == JobStatus.CANCELLED or (
        job.next_run_at is None and job.status in ENDED_JOB_STATUSES
    )
