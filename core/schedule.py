"""Fire-time rules per schedule type: validation, first and next runs, misfires, jitter.

Pure functions of their arguments: "now" is always passed in. The next run is computed from the
previous *scheduled* time, never from now, so an early timer wake-up or a clock step cannot fire
the same occurrence twice. The rules are described, with examples, in the README's
"Scheduling rules".
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeGuard

import msgspec

from core import cron
from core.errors import FieldError, InvalidRequest
from core.model import (
    CronSchedule,
    ImmediateSchedule,
    IntervalSchedule,
    MisfirePolicy,
    OnceSchedule,
    Schedule,
)
from core.timeutil import isoformat_z, to_epoch_ms, to_utc_ms

DEFAULT_MISFIRE_GRACE_SECONDS = 60.0
MAX_CATCH_UP_SCAN = 1_000_000
"""Missed occurrences of a cron schedule are counted exactly up to this many; past it the count
is a lower bound. An interval's are counted exactly, in constant time."""
MAX_ON_TIME = 1000
"""At most this many occurrences within the misfire grace are planned at once (a scheduler
outage under a long grace and a short interval); earlier ones count as misfired."""

_MS = timedelta(milliseconds=1)


MIN_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
"""The earliest instant a request may name (UTC)."""
MAX_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)
"""The latest instant a request may name (UTC): far enough from year 9999 that every schedule
computation after it (cron's 50-year search, an interval of up to a year) stays in range."""


def checked_instant(value: datetime, field: str) -> datetime:
    """``value`` in UTC, whole milliseconds.

    Raises:
        InvalidRequest: naming ``field``: no UTC offset, or outside
            [:data:`MIN_INSTANT`, :data:`MAX_INSTANT`).
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidRequest(FieldError(field, "must include a UTC offset, e.g. Z or +02:00"))
    try:
        t = to_utc_ms(value)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        t = None
    if t is None or not MIN_INSTANT <= t < MAX_INSTANT:
        raise InvalidRequest(
            FieldError(
                field,
                f"must be from {isoformat_z(MIN_INSTANT)} to before {isoformat_z(MAX_INSTANT)}",
            )
        )
    return t


def _instant(value: datetime | None, field: str) -> datetime | None:
    return None if value is None else checked_instant(value, field)


def normalize(
    schedule: Schedule, now: datetime, *, grace_seconds: float = DEFAULT_MISFIRE_GRACE_SECONDS
) -> Schedule:
    """Validate a schedule from a request and return it with every instant in UTC.

    Raises:
        InvalidRequest: naming ``schedule.<field>``: an instant without an offset, an
            ``executeAt`` more than ``grace_seconds`` seconds in the past, an unknown time zone, an
            invalid cron expression, ``endAt`` not after ``startAt``, a schedule that can never
            run again (its ``endAt`` is before its first run).
    """
    match schedule:
        case OnceSchedule(execute_at=given):
            at = _instant(given, "schedule.executeAt")
            assert at is not None
            if at < now - timedelta(seconds=grace_seconds):
                raise InvalidRequest(
                    FieldError(
                        "schedule.executeAt",
                        f"is in the past (more than {grace_seconds:g} s before now, "
                        f"{isoformat_z(now)})",
                    )
                )
            return type(schedule)(execute_at=at)
        case CronSchedule() | IntervalSchedule():
            start = _instant(schedule.start_at, "schedule.startAt")
            end = _instant(schedule.end_at, "schedule.endAt")
            if start and end and end <= start:
                raise InvalidRequest(FieldError("schedule.endAt", "must be after startAt"))
            if isinstance(schedule, CronSchedule):
                cron.resolve_timezone(schedule.timezone)
                cron.parse_cron(schedule.expression)
            normalized = _replace(schedule, start_at=start, end_at=end)
            if first_run_at(normalized, now) is None:
                raise InvalidRequest(
                    FieldError("schedule.endAt", "is before the schedule's first run")
                )
            return normalized
        case ImmediateSchedule():
            return schedule
    raise AssertionError(f"unhandled schedule {schedule!r}")


def _replace(schedule: CronSchedule | IntervalSchedule, **changes: object) -> Schedule:
    return msgspec.structs.replace(schedule, **changes)


def first_run_at(schedule: Schedule, now: datetime) -> datetime | None:
    """The scheduled time of a new job's first run (aware UTC); None if it can never run."""
    match schedule:
        case ImmediateSchedule():
            return now
        case OnceSchedule(execute_at=at):
            return to_utc_ms(at)
        case IntervalSchedule(every_seconds=every, start_at=start):
            first = start if start is not None else to_utc_ms(now + timedelta(seconds=every))
            return _within(schedule, first)
        case CronSchedule(start_at=start):
            after = now if start is None or start - _MS < now else start - _MS
            return _cron_after(schedule, after)
    raise AssertionError(f"unhandled schedule {schedule!r}")


def next_run_after(schedule: Schedule, occurrence: datetime) -> datetime | None:
    """The occurrence after ``occurrence`` (aware UTC), or None (one-time, or past ``endAt``)."""
    match schedule:
        case ImmediateSchedule() | OnceSchedule():
            return None
        case IntervalSchedule(every_seconds=every):
            return _within(schedule, to_utc_ms(occurrence + timedelta(seconds=every)))
        case CronSchedule():
            return _cron_after(schedule, occurrence)
    raise AssertionError(f"unhandled schedule {schedule!r}")


def next_run_from_now(
    schedule: Schedule, previous: datetime | None, now: datetime
) -> datetime | None:
    """The first occurrence strictly after ``now`` (resume, patch): no storm of missed runs.

    An interval keeps its phase: the next point of the grid through ``previous`` (or through
    ``start_at``) that lies after now.
    """
    match schedule:
        case ImmediateSchedule():
            return now
        case OnceSchedule(execute_at=at):
            return to_utc_ms(at) if at > now else now
        case IntervalSchedule(every_seconds=every, start_at=start):
            anchor = previous or start
            if anchor is None:
                return _within(schedule, to_utc_ms(now + timedelta(seconds=every)))
            step = timedelta(seconds=every)
            if anchor > now:
                return _within(schedule, anchor)
            k = int((now - anchor) / step) + 1
            return _within(schedule, to_utc_ms(anchor + k * step))
        case CronSchedule(start_at=start):
            after = now if start is None or start - _MS < now else start - _MS
            return _cron_after(schedule, after)
    raise AssertionError(f"unhandled schedule {schedule!r}")


def upcoming(schedule: Schedule, first: datetime | None, count: int) -> list[datetime]:
    """``first`` and the occurrences after it, ``count`` at most (aware UTC)."""
    out: list[datetime] = []
    t = first
    while t is not None and len(out) < count:
        out.append(t)
        try:
            t = next_run_after(schedule, t)
        except (OverflowError, ValueError):  # the calendar ends (year 9999) before ``count``
            break
    return out


def _within(schedule: CronSchedule | IntervalSchedule, t: datetime) -> datetime | None:
    return None if schedule.end_at is not None and t > schedule.end_at else t


def _cron_after(schedule: CronSchedule, after: datetime) -> datetime | None:
    expr = cron.parse_cron(schedule.expression)
    nxt = expr.next_after(
        after, cron.resolve_timezone(schedule.timezone), gap=schedule.gap, fold=schedule.fold
    )
    return _within(schedule, nxt)


def jitter_ms(job_id: str, occurrence: datetime, jitter_seconds: float) -> int:
    """The delay of one run, ``0..jitter_seconds`` seconds in milliseconds.

    Derived from (job id, occurrence) with BLAKE2b, so every scheduler — before and after a
    failover — delays the same run by the same amount.
    """
    bound = int(jitter_seconds * 1000)
    if bound <= 0:
        return 0
    digest = hashlib.blake2b(f"{job_id}:{to_epoch_ms(occurrence)}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % (bound + 1)


def schedule_jitter(schedule: Schedule) -> float:
    return schedule.jitter_seconds if isinstance(schedule, CronSchedule | IntervalSchedule) else 0.0


@dataclass(frozen=True, slots=True)
class Misfire:
    """Occurrences that came due while the job could not be dispatched and will not run.

    Attributes:
        missed: how many (exact for an interval; for cron exact below MAX_CATCH_UP_SCAN, a
            lower bound above it).
        first_missed / last_missed: the earliest and latest of them (aware UTC).
        policy: the misfire policy that applied.
    """

    missed: int
    first_missed: datetime | None
    last_missed: datetime | None
    policy: MisfirePolicy


@dataclass(frozen=True, slots=True)
class DuePlan:
    """What to dispatch for a due job: run ``runs`` (in order), then wait for ``next_run_at``."""

    runs: tuple[datetime, ...]
    next_run_at: datetime | None
    misfire: Misfire | None = None


def plan_due(
    schedule: Schedule,
    occurrence: datetime,
    now: datetime,
    *,
    grace_seconds: float = DEFAULT_MISFIRE_GRACE_SECONDS,
    policy: MisfirePolicy = MisfirePolicy.RUN_ONCE,
    max_catch_up: int = 10,
) -> DuePlan:
    """Plan the dispatch of a job whose ``occurrence`` is due at ``now``.

    Every occurrence up to now is either *on time* (at most ``grace_seconds`` seconds late and one
    of the latest ``MAX_ON_TIME``: it runs) or *misfired* (the others). Misfired occurrences follow
    ``policy``:

    - ``runOnce``: one catch-up run, for the most recent misfired occurrence — unless an on-time
      occurrence runs anyway; the others are recorded as missed (Quartz "fire once now",
      cronie after downtime).
    - ``skip``: none runs; all are recorded as missed.
    - ``runAll``: each runs, the most recent ``max_catch_up`` of them; older ones are missed.

    One-time jobs always run once, however late. The next run is the first occurrence after now.
    """
    nxt = next_run_after(schedule, occurrence)
    on_time_alone = (
        nxt is not None and nxt > now and now - occurrence <= timedelta(seconds=grace_seconds)
    )
    if nxt is None or on_time_alone:
        return DuePlan((occurrence,), nxt, None)
    cutoff = now - timedelta(seconds=grace_seconds)
    keep = max(1, max_catch_up)
    if _on_grid(schedule, occurrence):
        scan = _scan_grid(schedule, occurrence, nxt - occurrence, now, cutoff, keep)
    else:
        scan = _scan_steps(schedule, occurrence, now, cutoff, keep)
    late, on_time, count_late, first_late, evicted, t = scan
    if count_late == 0:
        return DuePlan(tuple(on_time), t, None)
    match policy:
        case MisfirePolicy.RUN_ONCE:
            runs = on_time or [late[-1]]
        case MisfirePolicy.SKIP:
            runs = on_time
        case MisfirePolicy.RUN_ALL:
            runs = [*late, *on_time]
    kept_late = [x for x in late if x in runs]
    missed = count_late - len(kept_late)
    if not missed:
        return DuePlan(tuple(runs), t, None)
    dropped = [x for x in late if x not in runs]
    last_missed = max(dropped) if dropped else evicted
    return DuePlan(tuple(runs), t, Misfire(missed, first_late, last_missed, policy))


_Scan = tuple[
    list[datetime], list[datetime], int, datetime | None, datetime | None, datetime | None
]
"""The occurrences from a due one up to now: (the latest ``keep`` late ones, the on-time ones,
how many were late, the first late one, the latest late one beyond ``keep``, the next one
after now or None)."""


def _on_grid(schedule: Schedule, occurrence: datetime) -> TypeGuard[IntervalSchedule]:
    """Whether the occurrences from ``occurrence`` on lie on a grid :func:`_scan_grid` can
    compute: an interval, from a whole millisecond."""
    return isinstance(schedule, IntervalSchedule) and occurrence.microsecond % 1000 == 0


def _scan_steps(
    schedule: Schedule, occurrence: datetime, now: datetime, cutoff: datetime, keep: int
) -> _Scan:
    """:data:`_Scan` by stepping through every occurrence (cron; exact up to
    MAX_CATCH_UP_SCAN steps, then a jump to the last occurrence at or before now)."""
    late: collections.deque[datetime] = collections.deque(maxlen=keep)
    on_time: collections.deque[datetime] = collections.deque()
    count_late, first_late, evicted = 0, None, None
    t: datetime | None = occurrence
    steps = 0
    while t is not None and t <= now:
        on_time.append(t)
        if t < cutoff or len(on_time) > MAX_ON_TIME:
            earliest = on_time.popleft()  # late, or on time but beyond MAX_ON_TIME
            count_late += 1
            first_late = first_late or earliest
            if len(late) == late.maxlen:
                evicted = late[0]
            late.append(earliest)
        steps += 1
        t = next_run_after(schedule, t) if steps < MAX_CATCH_UP_SCAN else _jump(schedule, t, now)
    return list(late), list(on_time), count_late, first_late, evicted, t


def _scan_grid(
    schedule: IntervalSchedule,
    occurrence: datetime,
    step: timedelta,
    now: datetime,
    cutoff: datetime,
    keep: int,
) -> _Scan:
    """:data:`_Scan` of an interval in constant time, however far back ``occurrence`` lies.

    ``step`` is the distance from ``occurrence`` (whole milliseconds) to the next occurrence.
    Every step is the same (the interval cut to whole milliseconds, as :func:`next_run_after`
    does it), so the occurrences are ``occurrence + k * step``; the result equals
    :func:`_scan_steps`, with an exact count.
    """
    limit = now if schedule.end_at is None else min(now, schedule.end_at)
    total = (limit - occurrence) // step + 1 if limit >= occurrence else 0
    count_late = min(total, -((occurrence - cutoff) // step)) if cutoff > occurrence else 0
    count_late = max(count_late, total - MAX_ON_TIME)
    kept_from = max(0, count_late - keep)
    late = [occurrence + k * step for k in range(kept_from, count_late)]
    on_time = [occurrence + k * step for k in range(count_late, total)]
    evicted = occurrence + (kept_from - 1) * step if kept_from else None
    after = _within(schedule, occurrence + total * step)
    return late, on_time, count_late, occurrence if count_late else None, evicted, after


def plan_buffered(schedule: Schedule, occurrence: datetime, now: datetime) -> DuePlan:
    """Plan the buffered run of an ``overlapPolicy: bufferOne`` job whose previous run ended.

    ``occurrence`` runs now, however late; the occurrences that came due while it waited are
    recorded as missed; the next run is the first occurrence after now.
    """
    nxt = next_run_after(schedule, occurrence)
    count, first, last = 0, None, None
    if _on_grid(schedule, occurrence) and nxt is not None and nxt <= now:
        late, _, count, first, _, nxt = _scan_grid(
            schedule, nxt, nxt - occurrence, now, now + _MS, keep=1
        )
        last = late[-1]
    while nxt is not None and nxt <= now and count < MAX_CATCH_UP_SCAN:
        count += 1
        first = first or nxt
        last = nxt
        nxt = next_run_after(schedule, nxt)
    if nxt is not None and nxt <= now:
        nxt = next_run_from_now(schedule, last, now)
    misfire = Misfire(count, first, last, MisfirePolicy.RUN_ONCE) if count else None
    return DuePlan((occurrence,), nxt, misfire)


def _jump(schedule: Schedule, t: datetime, now: datetime) -> datetime | None:
    """After MAX_CATCH_UP_SCAN steps: skip to the last occurrence at or before now."""
    if isinstance(schedule, IntervalSchedule):
        step = timedelta(seconds=schedule.every_seconds)
        return _within(schedule, to_utc_ms(t + max(1, int((now - t) / step)) * step))
    if isinstance(schedule, CronSchedule):
        prev = cron.parse_cron(schedule.expression).previous_at_or_before(
            now, cron.resolve_timezone(schedule.timezone), gap=schedule.gap, fold=schedule.fold
        )
        if prev is not None and prev > t:
            return prev
    return next_run_after(schedule, t)
