"""The job-status rule after a run's event, decided once; each store performs the write.

:func:`job_status_after` is the rule. A store cannot read the job and then write (a scheduler
may advance ``nextRunAt`` in between, a user may pause it), so it asks
:func:`job_status_write` for the rule's answers to the two things it does not know until the
write — whether the job is held (PAUSED, CANCELLED) and whether it has a next run — and makes
them the conditions of one atomic write: a SQL ``CASE`` (SQLite), exclusive filters of an
ordered bulk (MongoDB). ``tests/core/test_job_status.py`` checks that the write is the rule for
every status; the store contract suite, that both stores perform it.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.model import ExecutionStatus, JobStatus

HELD_JOB_STATUSES = frozenset({JobStatus.PAUSED, JobStatus.CANCELLED})
"""Job statuses that a run's event never changes: the user's decision stands."""
HELD_VALUES = tuple(sorted(s.value for s in HELD_JOB_STATUSES))
""":data:`HELD_JOB_STATUSES` as stored, sorted (a query's ``IN`` list)."""

IN_PROGRESS = frozenset({ExecutionStatus.RUNNING, ExecutionStatus.RETRYING})
"""Run statuses during which the job is RUNNING."""

_LAST_RUN_OUTCOME = {
    ExecutionStatus.SUCCEEDED: JobStatus.SUCCEEDED,
    ExecutionStatus.FAILED: JobStatus.FAILED,
    ExecutionStatus.CANCELLED: JobStatus.CANCELLED,
    ExecutionStatus.SKIPPED: JobStatus.SKIPPED,
}


def job_status_after(current: JobStatus, run: ExecutionStatus, *, has_next_run: bool) -> JobStatus:
    """The job's status after an event of its latest run (README "Job status").

    A held job (:data:`HELD_JOB_STATUSES`) keeps its status. Any other is RUNNING while the run
    is in progress; after it, SCHEDULED if the job has a next run, else the outcome of its last
    run: SUCCEEDED, FAILED, CANCELLED, or SKIPPED when it ended without running (a ``once``
    job whose run misfired: saying SUCCEEDED would claim a run that never happened, as Quartz's
    COMPLETE and a Kubernetes CronJob's missed schedule do not). A QUEUED event leaves it
    SCHEDULED.
    """
    if current in HELD_JOB_STATUSES:
        return current
    if run in IN_PROGRESS:
        return JobStatus.RUNNING
    if has_next_run:
        return JobStatus.SCHEDULED
    return _LAST_RUN_OUTCOME.get(run, JobStatus.SCHEDULED)


@dataclass(frozen=True, slots=True)
class JobStatusWrite:
    """:func:`job_status_after` for one run status, as the conditions of a store's write.

    A job in :data:`HELD_JOB_STATUSES` (:data:`HELD_VALUES` as stored) keeps its status.

    Attributes:
        with_next_run: any other job's new status if its ``nextRunAt`` is set at the write.
        without_next_run: its new status if ``nextRunAt`` is null at the write.
    """

    with_next_run: JobStatus
    without_next_run: JobStatus


def job_status_write(run: ExecutionStatus) -> JobStatusWrite:
    """The conditional write of the job's status after an event with status ``run``."""
    free = JobStatus.SCHEDULED  # any status not held: the rule reads only whether it is held
    return JobStatusWrite(
        with_next_run=job_status_after(free, run, has_next_run=True),
        without_next_run=job_status_after(free, run, has_next_run=False),
    )
