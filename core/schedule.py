"""Fire-time rules per schedule type: validation, the first run, the next run, misfires.

Pure functions of their arguments: "now" is always passed in. The next run is computed from the
previous *scheduled* time, never from now, so an early timer wake-up or a clock step cannot fire
the same occurrence twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from core import cron
from core.errors import FieldError, InvalidRequest
from core.model import CronSchedule, ImmediateSchedule, IntervalSchedule, OnceSchedule, Schedule
from core.timeutil import to_utc_ms

DEFAULT_MISFIRE_GRACE_S = 60.0
MAX_CATCH_UP_SCAN = 1_000_000


def normalize(
    schedule: Schedule, now: datetime, *, grace_s: float = DEFAULT_MISFIRE_GRACE_S
) -> Schedule:
    """Validate a schedule from a request and return it with instants in UTC.

    Raises:
        InvalidRequest: naming ``schedule.<field>``: an ``executeAt`` without an offset or more than
            ``grace_s`` seconds in the past, an unknown time zone, an invalid cron expression.
    """
    match schedule:
        case OnceSchedule(execute_at=at):
            if at.tzinfo is None:
                raise InvalidRequest(
                    FieldError("schedule.executeAt", "must include a UTC offset, e.g. Z or +02:00")
                )
            at = to_utc_ms(at)
            if at < now - timedelta(seconds=grace_s):
                raise InvalidRequest(
                    FieldError(
                        "schedule.executeAt",
                        f"is in the past (more than {grace_s:g} s before now, {now.isoformat()})",
                    )
                )
            return type(schedule)(execute_at=at)
        case CronSchedule(expression=expression, timezone=tz):
            cron.resolve_timezone(tz)
            cron.parse_cron(expression)
            return schedule
        case ImmediateSchedule() | IntervalSchedule():
            return schedule
    raise AssertionError(f"unhandled schedule {schedule!r}")


def first_run_at(schedule: Schedule, now: datetime) -> datetime:
    """The scheduled time of a new job's first run (aware UTC)."""
    match schedule:
        case ImmediateSchedule():
            return now
        case OnceSchedule(execute_at=at):
            return to_utc_ms(at)
        case IntervalSchedule(every_seconds=every):
            return to_utc_ms(now + timedelta(seconds=every))
        case CronSchedule(expression=expression, timezone=tz):
            return cron.parse_cron(expression).next_after(now, cron.resolve_timezone(tz))
    raise AssertionError(f"unhandled schedule {schedule!r}")


def next_run_after(schedule: Schedule, occurrence: datetime) -> datetime | None:
    """The occurrence after ``occurrence`` (aware UTC), or None for one-time schedules."""
    match schedule:
        case ImmediateSchedule() | OnceSchedule():
            return None
        case IntervalSchedule(every_seconds=every):
            return to_utc_ms(occurrence + timedelta(seconds=every))
        case CronSchedule(expression=expression, timezone=tz):
            return cron.parse_cron(expression).next_after(occurrence, cron.resolve_timezone(tz))
    raise AssertionError(f"unhandled schedule {schedule!r}")


@dataclass(frozen=True, slots=True)
class Misfire:
    """Occurrences that came due while the job could not be dispatched.

    Attributes:
        missed: how many occurrences were not run (the one run instead is not counted).
        first_missed / last_missed: the earliest and latest of them (aware UTC), None if none.
    """

    missed: int
    first_missed: datetime | None
    last_missed: datetime | None


@dataclass(frozen=True, slots=True)
class DuePlan:
    """What to dispatch for a due job: run ``run_for``, then wait for ``next_run_at``."""

    run_for: datetime
    next_run_at: datetime | None
    misfire: Misfire | None = None


def plan_due(
    schedule: Schedule,
    occurrence: datetime,
    now: datetime,
    *,
    grace_s: float = DEFAULT_MISFIRE_GRACE_S,
) -> DuePlan:
    """Plan the dispatch of a job whose occurrence ``occurrence`` is due at ``now``.

    A run that starts at most ``grace_s`` seconds late is on time. A recurring job later than that
    misfired: it runs once for its most recent missed occurrence (the ``runOnce`` policy, as
    Quartz's "fire once now" and cronie after downtime), the older ones are reported as missed,
    and the next run is the first occurrence after now. One-time jobs always run once, however late.
    """
    nxt = next_run_after(schedule, occurrence)
    if nxt is None or now - occurrence <= timedelta(seconds=grace_s) or nxt > now:
        return DuePlan(occurrence, nxt, None)
    if isinstance(schedule, IntervalSchedule):
        step = timedelta(seconds=schedule.every_seconds)
        missed = int((now - occurrence) / step)
        latest = to_utc_ms(occurrence + missed * step)
        return DuePlan(
            latest, to_utc_ms(latest + step), Misfire(missed, occurrence, to_utc_ms(latest - step))
        )
    latest, missed = occurrence, 0
    while nxt is not None and nxt <= now:
        if missed == MAX_CATCH_UP_SCAN:
            jump = _previous(schedule, now + timedelta(seconds=1))
            if jump is not None and jump > nxt:
                nxt = jump
        latest, missed = nxt, missed + 1
        nxt = next_run_after(schedule, nxt)
    return DuePlan(latest, nxt, Misfire(missed, occurrence, _previous(schedule, latest)))


def _previous(schedule: Schedule, occurrence: datetime) -> datetime | None:
    match schedule:
        case IntervalSchedule(every_seconds=every):
            return to_utc_ms(occurrence - timedelta(seconds=every))
        case CronSchedule(expression=expression, timezone=tz):
            return cron.parse_cron(expression).previous_at_or_before(
                occurrence - timedelta(seconds=1), cron.resolve_timezone(tz)
            )
    return None
