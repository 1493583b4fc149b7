"""Backfill: the runs a cron or interval job would have had in a past time range, as Temporal
schedules' backfill creates them (``POST /jobs/{id}/backfill``).

Pure: :func:`fire_times` lists the job's occurrences in ``[from, to)`` with the same schedule
functions the scheduler uses (:mod:`core.schedule`), bounded by :data:`MAX_BACKFILL_RUNS`;
:func:`planned_statuses` applies the overlap policy. Every occurrence's run has the deterministic
id of that occurrence (:func:`core.ids.execution_id`), so an occurrence that has a run already
(it ran, or an earlier backfill created it) gets no second one, and repeating a backfill
creates nothing new.

Overlap: the backfilled runs are all due at once, as Temporal's backfill treats them.
``allow`` runs every one; ``forbid`` runs the earliest (none while a run of the job is in
progress) and records the others SKIPPED; ``bufferOne`` is as ``forbid`` (its one buffered run
is the job's own next one); ``replace`` runs only the latest. A request may name another policy
for the backfill (``overlapPolicy``, Temporal's ``BackfillRequest.overlap_policy``).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from core.model import (
    CronSchedule,
    ExecutionStatus,
    Instant,
    IntervalSchedule,
    Job,
    Model,
    OverlapPolicy,
)
from core.schedule import next_run_after
from core.timeutil import to_utc_ms

MAX_BACKFILL_RUNS = 1000
"""Most occurrences one backfill request may cover; a range with more is refused (422)."""
_MS = timedelta(milliseconds=1)


class BackfillRequest(Model, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Body of ``POST /jobs/{id}/backfill``: the occurrences with ``from <= scheduledFor < to``
    (RFC 3339 with an offset; ``to`` not after now). ``dryRun``: list them, create nothing.
    ``overlapPolicy``: the policy among the backfilled runs (default: the job's)."""

    scheduled_from: Instant = msgspec.field(name="from")
    scheduled_to: Instant = msgspec.field(name="to")
    dry_run: bool = False
    overlap_policy: OverlapPolicy | None = None


class BackfillRun(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One occurrence of a backfill: its run's id, its planned status (``QUEUED`` or
    ``SKIPPED``), and whether its record was created now (False on a dry run, or when the
    occurrence had a run already)."""

    scheduled_for: Instant
    execution_id: str
    status: ExecutionStatus
    created: bool = False


Count = Annotated[int, msgspec.Meta(ge=0)]


class BackfillResult(Model, kw_only=True, omit_defaults=False, frozen=True):
    """The answer of ``POST /jobs/{id}/backfill``: the fire times, each occurrence's run, and
    counts: ``queued`` runs created to run now, ``skipped`` created as SKIPPED by the overlap
    policy, ``existing`` occurrences that had a run already (a dry run counts what the
    backfill would do); each occurrence that has a run shows that run's status."""

    dry_run: bool
    overlap_policy: OverlapPolicy
    fire_times: list[Instant]
    runs: list[BackfillRun]
    queued: Count = 0
    skipped: Count = 0
    existing: Count = 0


def interval_anchor(job: Job, schedule: IntervalSchedule) -> datetime:
    """A point of an interval job's grid: its latest scheduled run, else its ``startAt``,
    else its first run (one interval after its creation)."""
    return (
        job.last_scheduled_for
        or schedule.start_at
        or to_utc_ms(job.created_at + timedelta(seconds=schedule.every_seconds))
    )


def fire_times(job: Job, start: datetime, end: datetime, *, limit: int) -> list[datetime]:
    """The occurrences of ``job``'s schedule with ``start <= t < end`` (aware UTC), earliest
    first, within its ``startAt`` / ``endAt``; at most ``limit + 1`` (one more than allowed
    says the range holds too many). A one-time schedule has none."""
    schedule = job.schedule
    t: datetime | None
    match schedule:
        case CronSchedule(start_at=start_at):
            begin = start if start_at is None else max(start, start_at)
            t = next_run_after(schedule, begin - _MS)
        case IntervalSchedule(start_at=start_at, every_seconds=every):
            begin = start if start_at is None else max(start, start_at)
            anchor = interval_anchor(job, schedule)
            steps = math.ceil((begin - anchor) / timedelta(seconds=every))
            t = to_utc_ms(anchor + steps * timedelta(seconds=every))
            while t < begin:  # rounding of a fractional interval
                t = to_utc_ms(t + timedelta(seconds=every))
            if schedule.end_at is not None and t > schedule.end_at:
                t = None
        case _:
            return []
    out: list[datetime] = []
    while t is not None and t < end and len(out) <= limit:
        out.append(t)
        try:
            t = next_run_after(schedule, t)
        except (OverflowError, ValueError):  # the calendar ends (year 9999)
            break
    return out


def planned_statuses(count: int, policy: OverlapPolicy, *, active: bool) -> list[ExecutionStatus]:
    """The status of each of ``count`` backfilled runs (earliest first) under ``policy``;
    ``active``: a run of the job is in progress (see the module docstring)."""
    queued, skipped = ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED
    match policy:
        case OverlapPolicy.ALLOW:
            return [queued] * count
        case OverlapPolicy.REPLACE:
            return [skipped] * (count - 1) + [queued] if count else []
        case _:  # forbid, bufferOne
            first = skipped if active else queued
            return [first, *[skipped] * (count - 1)] if count else []


def skip_reason(policy: OverlapPolicy, *, active: bool) -> str:
    """The ``skipReason`` of a backfilled run the overlap policy skipped."""
    if policy == OverlapPolicy.REPLACE:
        return "overlap: backfilled occurrences are due at once; only the latest runs (replace)"
    if active:
        return f"overlap: a run of the job is in progress ({policy})"
    return f"overlap: backfilled occurrences are due at once; only the earliest runs ({policy})"
