"""The dashboard's Overview numbers: what a store counts, and the page's data built from it.

A store answers :meth:`StatsStore.run_stats` with raw counts (:class:`RunStats`); the pure
:func:`overview` turns them into the one answer of ``GET /stats/overview``
(:class:`StatsOverview`): every minute of the window present, zeros included, so a chart needs
no gap logic. Percentiles use the nearest-rank method (the same definition as the MongoDB
dashboards of ``store/mongo_queries.py``): the p-th percentile of ``n`` ascending values is the
value at rank ``ceil(p * n)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from core.cluster import InFlightRun
from core.heatmap import ScheduledGroup
from core.model import ExecutionStatus, Instant, Model
from core.timeutil import from_epoch_ms, to_epoch_ms

WINDOW_SECONDS = 3600
"""The Overview's window: the last hour."""
BUCKET_SECONDS = 60
"""One bar of the runs-per-minute chart."""
FINAL_STATUSES = (
    ExecutionStatus.SUCCEEDED,
    ExecutionStatus.FAILED,
    ExecutionStatus.CANCELLED,
    ExecutionStatus.SKIPPED,
)
OPEN_STATUSES = (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.RETRYING)


@dataclass(frozen=True, slots=True)
class DelaySummary:
    """Schedule-to-start delay (first ``startedAt`` minus ``scheduledFor``, milliseconds) of
    the runs that started in a window, replays and backfilled runs left out; every field None
    when none did."""

    runs: int = 0
    p50_ms: int | None = None
    p95_ms: int | None = None
    p99_ms: int | None = None
    max_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RunStats:
    """What a store counts for the Overview.

    Attributes:
        finished: ``(minute, status, runs)``: runs that reached a final status, by the minute
            (epoch milliseconds, a multiple of 60 000) of their ``finishedAt``.
        delay: the schedule-to-start delay of the runs whose first attempt started in the window.
        open_runs: ``(queue, status, runs)``: runs QUEUED, RUNNING or RETRYING now (any age).
    """

    finished: Sequence[tuple[int, str, int]]
    delay: DelaySummary
    open_runs: Sequence[tuple[str, str, int]]


@runtime_checkable
class StatsStore(Protocol):
    """The statistics query of a store (``SqliteStore``, ``MongoStore``)."""

    async def run_stats(self, owner: str | None, since: datetime, until: datetime) -> RunStats:
        """Counts over ``[since, until)`` of ``owner``'s runs (None: every user's); see
        :class:`RunStats`. Served by indexes (``executions_stats_*``), never a table scan."""
        ...

    async def scheduled_groups(
        self, owner: str | None, until: datetime, *, limit: int
    ) -> list[ScheduledGroup]:
        """``owner``'s jobs (None: everyone's) with a next run at or before ``until``, grouped by
        (schedule, next run), earliest first, at most ``limit`` groups (index
        ``jobs_stats_*next``)."""
        ...

    async def running_runs(self, *, limit: int) -> list[tuple[str, InFlightRun]]:
        """Every user's RUNNING runs with the worker that runs each (``?`` when unknown),
        at most ``limit``, by worker (the Cluster page; index of the unfinished runs)."""
        ...


def nearest_rank(ascending: Sequence[int], fraction: float) -> int | None:
    """The ``fraction`` percentile (0 < fraction <= 1) of ascending values by nearest rank;
    None for no values."""
    if not ascending:
        return None
    rank = max(1, math.ceil(fraction * len(ascending)))
    return ascending[rank - 1]


def delay_summary(ascending_ms: Sequence[int]) -> DelaySummary:
    """The :class:`DelaySummary` of ascending delays (milliseconds)."""
    if not ascending_ms:
        return DelaySummary()
    return DelaySummary(
        runs=len(ascending_ms),
        p50_ms=nearest_rank(ascending_ms, 0.50),
        p95_ms=nearest_rank(ascending_ms, 0.95),
        p99_ms=nearest_rank(ascending_ms, 0.99),
        max_ms=ascending_ms[-1],
    )


class MinuteRuns(Model, kw_only=True, omit_defaults=False, frozen=True):
    """Runs that reached a final status in one minute, by status."""

    at: Instant
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    skipped: int = 0


class Delay(Model, kw_only=True, omit_defaults=False, frozen=True):
    """Schedule-to-start delay percentiles (milliseconds, nearest rank), of the runs that are
    neither replays nor backfilled (their ``scheduledFor`` lies in the past by design)."""

    runs: int = 0
    p50_ms: int | None = None
    p95_ms: int | None = None
    p99_ms: int | None = None
    max_ms: int | None = None


class QueueRuns(Model, kw_only=True, omit_defaults=False, frozen=True):
    """Unfinished runs of one queue, by status, as the store records them."""

    queue: str
    queued: int = 0
    running: int = 0
    retrying: int = 0


class StatsOverview(Model, kw_only=True, omit_defaults=False, frozen=True):
    """The answer of ``GET /stats/overview``.

    Attributes:
        window_start, window_end: the window ``[start, end)`` (aware UTC, whole minutes).
        bucket_seconds: the width of one entry of ``minutes`` (60).
        minutes: one entry per minute of the window, oldest first, zeros included.
        totals: runs that reached each final status in the window.
        failure_rate: FAILED / (SUCCEEDED + FAILED) in the window; None when neither happened.
        delay: schedule-to-start delay of the runs that started in the window.
        queues: unfinished runs per queue now, by queue name.
    """

    window_start: Instant
    window_end: Instant
    bucket_seconds: int = BUCKET_SECONDS
    minutes: list[MinuteRuns]
    totals: dict[str, int]
    failure_rate: float | None
    delay: Delay
    queues: list[QueueRuns]


def window(now: datetime) -> tuple[datetime, datetime]:
    """The Overview's window for ``now``: the last hour, up to the end of the current minute
    (so the current minute's runs count as they happen)."""
    end_ms = (to_epoch_ms(now) // (BUCKET_SECONDS * 1000) + 1) * BUCKET_SECONDS * 1000
    end = from_epoch_ms(end_ms)
    return end - timedelta(seconds=WINDOW_SECONDS), end


def overview(stats: RunStats, since: datetime, until: datetime) -> StatsOverview:
    """The page's data from a store's counts over ``[since, until)`` (whole minutes)."""
    step_ms = BUCKET_SECONDS * 1000
    start_ms, end_ms = to_epoch_ms(since), to_epoch_ms(until)
    counts: dict[int, dict[str, int]] = {m: {} for m in range(start_ms, end_ms, step_ms)}
    totals = {s.value: 0 for s in FINAL_STATUSES}
    for minute, status, runs in stats.finished:
        if minute in counts and status in totals:
            counts[minute][status] = counts[minute].get(status, 0) + runs
            totals[status] += runs
    minutes = [
        MinuteRuns(
            at=from_epoch_ms(m),
            succeeded=c.get("SUCCEEDED", 0),
            failed=c.get("FAILED", 0),
            cancelled=c.get("CANCELLED", 0),
            skipped=c.get("SKIPPED", 0),
        )
        for m, c in counts.items()
    ]
    decided = totals["SUCCEEDED"] + totals["FAILED"]
    queues: dict[str, dict[str, int]] = {}
    for queue, status, runs in stats.open_runs:
        per = queues.setdefault(queue, {})
        per[status] = per.get(status, 0) + runs
    d = stats.delay
    return StatsOverview(
        window_start=since,
        window_end=until,
        minutes=minutes,
        totals=totals,
        failure_rate=round(totals["FAILED"] / decided, 4) if decided else None,
        delay=Delay(
            runs=d.runs, p50_ms=d.p50_ms, p95_ms=d.p95_ms, p99_ms=d.p99_ms, max_ms=d.max_ms
        ),
        queues=[
            QueueRuns(
                queue=q,
                queued=per.get("QUEUED", 0),
                running=per.get("RUNNING", 0),
                retrying=per.get("RETRYING", 0),
            )
            for q, per in sorted(queues.items())
        ],
    )
