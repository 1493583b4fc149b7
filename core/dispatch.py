"""What a scheduler does with a due job, decided without I/O.

Given the job, now, and the state of its previous run, :func:`plan_job` answers: wait (jitter
not over yet, or ``bufferOne`` waiting for the previous run to end), or record a chain of
executions — runs to publish and SKIPPED records (misfired occurrences, occurrences skipped
because of an overlap) — each advancing the job's ``nextRunAt`` by compare-and-set.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from core.model import (
    ACTIVE_EXECUTION_STATUSES,
    Execution,
    ExecutionStatus,
    Job,
    Missed,
    OverlapPolicy,
    RunTrigger,
)
from core.ports import Dispatch
from core.runs import queued_run, skipped_run
from core.schedule import DuePlan, Misfire, jitter_ms, plan_buffered, plan_due, schedule_jitter


@dataclass(frozen=True, slots=True)
class JobPlan:
    """The decision for one due job.

    Attributes:
        dispatches: the chain to record, in order (empty: nothing to record now).
        not_before: the job is not due yet (its jitter delay runs until then).
        wait_for: ``bufferOne``: wait until this previous run ends, then dispatch.
        cancel: ``replace``: cancel this previous run first.
        misfire: occurrences recorded as missed, for the log.
    """

    dispatches: list[Dispatch] = field(default_factory=list)
    not_before: datetime | None = None
    wait_for: str | None = None
    cancel: str | None = None
    misfire: Misfire | None = None

    @property
    def queued(self) -> list[Execution]:
        """The executions of the chain that are runs to publish."""
        return [
            d.execution for d in self.dispatches if d.execution.status == ExecutionStatus.QUEUED
        ]


def due_at(job: Job) -> datetime | None:
    """When the job's next occurrence may be dispatched: its scheduled time plus its jitter."""
    if job.next_run_at is None:
        return None
    delay = jitter_ms(job.id, job.next_run_at, schedule_jitter(job.schedule))
    return job.next_run_at + timedelta(milliseconds=delay)


def previous_active(previous: Execution | None, *, ended: Container[str] = ()) -> bool:
    """Whether a job's previous run is still active, so that a new run would overlap it.

    The one answer to the question, for every caller: the scheduler deciding a job now or
    deferring it to its due time, choosing which runs to look up in the work stream, and
    :func:`plan_job`.

    Args:
        previous: the job's latest dispatched run as the store has it (None: none or unknown).
        ended: ids of runs known to have ended although the store does not show it yet: their
            message is gone from the work stream (the recorder has not written the end, or the
            run was lost, which the re-dispatch sweep handles).

    Returns:
        True when the store shows ``previous`` QUEUED, RUNNING or RETRYING and it is not in
        ``ended``.
    """
    return (
        previous is not None
        and previous.status in ACTIVE_EXECUTION_STATUSES
        and previous.id not in ended
    )


def plan_job(
    job: Job,
    now: datetime,
    *,
    previous: Execution | None,
    buffered: bool,
    scheduler_id: str,
    held_by: str | None = None,
    ended: Container[str] = (),
) -> JobPlan:
    """Decide what to do with ``job`` at ``now`` (see module docstring).

    Args:
        previous: the job's latest dispatched run (None if unknown or none).
        buffered: the job was waiting (``bufferOne``) and its previous run has ended since.
        scheduler_id: recorded on the executions.
        held_by: why the job is late, when the scheduler held it back (a quota): named in the
            reason of its misfire record, if it has one.
        ended: runs known to have ended that the store still shows active (see
            :func:`previous_active`).
    """
    occurrence = job.next_run_at
    assert occurrence is not None
    start = due_at(job)
    if start is not None and start > now:
        return JobPlan(not_before=start)
    active = previous_active(previous, ended=ended)
    policy = job.overlap_policy if job.recurring else OverlapPolicy.ALLOW
    if active and policy == OverlapPolicy.BUFFER_ONE:
        assert previous is not None
        return JobPlan(wait_for=previous.id)
    if buffered and job.recurring:
        plan = plan_buffered(job.schedule, occurrence, now)
    else:
        plan = plan_due(
            job.schedule,
            occurrence,
            now,
            grace_seconds=job.misfire_grace_seconds,
            policy=job.misfire_policy,
            max_catch_up=job.max_catch_up,
        )
    skip_reason = None
    if active and policy == OverlapPolicy.FORBID:
        assert previous is not None
        skip_reason = f"overlap: previous run {previous.id} is still {previous.status}"
    latest_only = policy != OverlapPolicy.ALLOW and len(plan.runs) > 1
    misfire = "misfire" if held_by is None else f"misfire: {held_by}"
    chain = _chain(job, occurrence, plan, now, scheduler_id, skip_reason, latest_only, misfire)
    cancel = previous.id if active and policy == OverlapPolicy.REPLACE and previous else None
    return JobPlan(dispatches=chain, cancel=cancel, misfire=plan.misfire)


def _chain(
    job: Job,
    occurrence: datetime,
    plan: DuePlan,
    now: datetime,
    scheduler_id: str,
    skip_reason: str | None,
    latest_only: bool,
    misfire_reason: str = "misfire",
) -> list[Dispatch]:
    """The chain of ``plan``. With ``latest_only`` (an overlap policy other than ``allow`` and
    several occurrences due at once, e.g. within the misfire grace after a delay) only the
    latest runs: the earlier ones would overlap it and are recorded SKIPPED.

    Occurrences skipped together for one reason are one SKIPPED record (the first of them, with
    ``missed``), like misfired ones: a scheduler that fell behind by k periods writes three
    records per job at most, not k + 1, so falling behind does not make each job dearer.
    """
    chain: list[Dispatch] = []
    expected = occurrence
    steps: list[tuple[datetime, Execution]] = []
    if plan.misfire is not None:
        m = plan.misfire
        assert m.first_missed is not None
        missed = Missed(count=m.missed, first=m.first_missed, last=m.last_missed, policy=m.policy)
        steps.append(
            (
                m.first_missed,
                skipped_run(job, m.first_missed, now, scheduler_id, misfire_reason, missed),
            )
        )
    runs = list(plan.runs)
    if skip_reason is not None:
        skipped, runs = runs, []
    elif latest_only:
        skipped, runs = runs[:-1], runs[-1:]
        skip_reason = (
            f"overlap: {len(plan.runs)} occurrences were due at once; only the latest runs"
        )
    else:
        skipped = []
    if skipped:
        assert skip_reason is not None
        together = None
        if len(skipped) > 1:
            together = Missed(
                count=len(skipped), first=skipped[0], last=skipped[-1], policy=job.overlap_policy
            )
        steps.append(
            (skipped[0], skipped_run(job, skipped[0], now, scheduler_id, skip_reason, together))
        )
    grace = timedelta(seconds=job.misfire_grace_seconds)
    for run_at in runs:
        trigger = RunTrigger.CATCH_UP if now - run_at > grace else RunTrigger.SCHEDULE
        steps.append((run_at, queued_run(job, run_at, now, scheduler_id, trigger)))
    targets = [t for t, _ in steps[1:]] + [plan.next_run_at]
    for (_, ex), target in zip(steps, targets, strict=True):
        chain.append(Dispatch(ex, expected_next_run_at=expected, next_run_at=target))
        if target is not None:
            expected = target
    return chain
