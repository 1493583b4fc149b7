"""core/job_status: the job-status rule after a run's event, and the write the stores make of it."""

from __future__ import annotations

import pytest

from core.job_status import HELD_JOB_STATUSES, HELD_VALUES, job_status_after, job_status_write
from core.model import ExecutionStatus, JobStatus

E = ExecutionStatus
J = JobStatus


@pytest.mark.parametrize(
    ("run", "has_next_run", "expected"),
    [
        (E.RUNNING, True, J.RUNNING),
        (E.RUNNING, False, J.RUNNING),
        (E.RETRYING, False, J.RUNNING),
        (E.SUCCEEDED, True, J.SCHEDULED),
        (E.FAILED, True, J.SCHEDULED),
        (E.SUCCEEDED, False, J.SUCCEEDED),
        (E.FAILED, False, J.FAILED),
        (E.CANCELLED, False, J.CANCELLED),
        (E.CANCELLED, True, J.SCHEDULED),
        (E.SKIPPED, False, J.SKIPPED),
        (E.SKIPPED, True, J.SCHEDULED),
        (E.QUEUED, False, J.SCHEDULED),
    ],
)
def test_a_job_follows_its_latest_run(
    run: ExecutionStatus, has_next_run: bool, expected: JobStatus
) -> None:
    for current in (J.SCHEDULED, J.RUNNING, J.SUCCEEDED, J.FAILED, J.SKIPPED):
        assert job_status_after(current, run, has_next_run=has_next_run) == expected


@pytest.mark.parametrize("current", sorted(HELD_JOB_STATUSES))
@pytest.mark.parametrize("run", list(E))
def test_a_paused_or_cancelled_job_keeps_its_status(
    current: JobStatus, run: ExecutionStatus
) -> None:
    assert job_status_after(current, run, has_next_run=True) == current
    assert job_status_after(current, run, has_next_run=False) == current


@pytest.mark.parametrize("run", list(E))
def test_the_stores_write_is_the_rule_for_every_job_and_run_status(run: ExecutionStatus) -> None:
    write = job_status_write(run)

    for current in J:
        for has_next_run in (True, False):
            if current.value in HELD_VALUES:
                written = current
            else:
                written = write.with_next_run if has_next_run else write.without_next_run
            assert written == job_status_after(current, run, has_next_run=has_next_run)
