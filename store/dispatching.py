"""Store-independent part of :meth:`core.ports.JobStore.dispatch`: which runs advanced their job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from core.ports import Dispatch

JobState = tuple[datetime | None, datetime | None]
"""A job's (last_scheduled_for, next_run_at) after the compare-and-sets of a batch."""


def advanced(runs: Sequence[Dispatch], after: Mapping[str, JobState]) -> list[bool]:
    """For each run, whether the job now points past it (advanced by this batch or by a twin).

    The compare-and-sets of a batch are applied in order, so several consecutive occurrences of
    one job form a chain: the last run of a job advanced if the job's final state is that run's
    target; an earlier run advanced if the run after it in the batch continued from its target
    and advanced too.
    """
    result = [False] * len(runs)
    successor: dict[str, int] = {}
    for i in range(len(runs) - 1, -1, -1):
        d = runs[i]
        job_id = d.execution.job_id
        j = successor.get(job_id)
        if j is None:
            result[i] = after.get(job_id) == (d.execution.scheduled_for, d.next_run_at)
        else:
            result[i] = result[j] and runs[j].expected_next_run_at == d.next_run_at
        successor[job_id] = i
    return result
