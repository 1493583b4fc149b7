"""Store-independent part of :meth:`core.ports.JobStore.dispatch`: which runs advanced their job."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from datetime import datetime

from core.bulk import replayed_by_another
from core.model import Execution
from core.ports import AnyDispatch, Dispatch, ManualDispatch

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


def sole_originals(runs: Sequence[AnyDispatch]) -> list[str]:
    """The runs that the ``sole_replay`` dispatches of ``runs`` replay (each once, in order)."""
    return list(
        dict.fromkeys(
            d.execution.replay_of
            for d in runs
            if isinstance(d, ManualDispatch) and d.sole_replay and d.execution.replay_of
        )
    )


class ReplayGuard:
    """The ``sole_replay`` rule of :class:`core.ports.ManualDispatch` over one batch, as the
    store records it: the replays the batch's originals had when it started (the store's
    :meth:`core.ports.RunStore.replays_of` of :func:`sole_originals`, read where the inserts
    cannot be raced: in the SQLite store's write transaction), plus each replay the batch
    records (a later sole replay of the same run in the batch sees it).

    Args:
        found: original run id → its replays' ids, sorted (``replays_of``).
    """

    def __init__(self, found: Mapping[str, Sequence[str]]) -> None:
        self._replays = {k: list(v) for k, v in found.items()}

    def refusal(self, d: AnyDispatch) -> str | None:
        """The latest other replay that refuses ``d`` (:func:`core.bulk.replayed_by_another`),
        or None: ``d`` is no sole replay, or its run has no replay but ``d``'s own id."""
        if not isinstance(d, ManualDispatch) or not d.sole_replay or not d.execution.replay_of:
            return None
        return replayed_by_another(d.execution.replay_of, self._replays, d.execution.id)

    def recorded(self, execution: Execution) -> None:
        """Note a run the batch inserted (a replay of a run it guards counts from now on)."""
        if execution.replay_of is not None:
            ids = self._replays.setdefault(execution.replay_of, [])
            if execution.id not in ids:
                bisect.insort(ids, execution.id)
