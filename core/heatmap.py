"""The Upcoming page's data: a 7-day heatmap by hour of the fire times of a user's jobs, with a
mark on every fire time that a daylight-saving transition moves, doubles or drops.

Fire times come from the core schedule functions (:func:`core.schedule.next_run_after` from each
job's stored ``next_run_at``), so the heatmap shows what the scheduler will do, jitter aside.
Jobs that share a schedule and a next run share one computation. DST rules are those of
:class:`core.model.CronSchedule` (cronie's, for fixed-time expressions):

- ``gap`` (spring forward): an occurrence whose wall time does not exist fires at the first
  instant after the gap (``shift``) or not at all (``skip``);
- ``fold`` (fall back): an occurrence whose wall time exists twice fires on the first pass only
  (``once``) or on both (``both``).

The hours of the heatmap are the wall-clock hours of a display zone, so a spring-forward day
has 23 hours (the missing one is empty) and a fall-back day 25 (the repeated one counts both).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import accumulate
from typing import Literal
from zoneinfo import ZoneInfo

import msgspec

from core import cron
from core import schedule as schedules
from core.model import CronSchedule, Instant, IntervalSchedule, Model, Schedule
from core.timeutil import to_epoch_ms

HORIZON_DAYS = 7
MAX_FIRES_PER_SCHEDULE = 20_160
"""At most this many fire times of one schedule are counted (every 30 s for a week); past it
the schedule's counts stop and the answer says ``truncated``."""
MAX_MARKS = 200
"""At most this many DST marks in one answer (the first ones in time)."""
FIRES_CACHE_SIZE = 16_384
"""Fire-time computations kept between requests (one per schedule and first run)."""
BIN_MS = 60_000
"""Fire times are counted per UTC minute, then placed in the display zone's hours."""


@dataclass(frozen=True, slots=True)
class ScheduledJob:
    """A job the store says will run: its id, task, stored next run (aware UTC), schedule."""

    job_id: str
    task_id: str
    next_run_at: datetime
    schedule: Schedule


@dataclass(frozen=True, slots=True)
class ScheduledGroup:
    """Jobs that share a schedule and a stored next run (aware UTC), so fire at the same times:
    how many, and the first few ids (ascending) for the marks."""

    schedule: Schedule
    next_run_at: datetime
    jobs: int
    job_ids: tuple[str, ...]


SAMPLE_IDS = 5
"""Job ids kept per group (and per DST mark)."""


def group_jobs(jobs: Iterable[ScheduledJob]) -> list[ScheduledGroup]:
    """``jobs`` grouped by (schedule, next run), as the stores group them."""
    groups: dict[tuple[Schedule, datetime], list[str]] = {}
    for job in jobs:
        groups.setdefault((job.schedule, job.next_run_at), []).append(job.job_id)
    return [
        ScheduledGroup(schedule, first, len(ids), tuple(sorted(ids)[:SAMPLE_IDS]))
        for (schedule, first), ids in groups.items()
    ]


Kind = Literal["shifted", "skipped", "fold-first", "fold-second"]


class DstMark(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A fire time that a DST transition changes.

    Attributes:
        at: the fire time (aware UTC); for ``kind`` ``skipped``, the transition instant.
        kind: ``shifted`` (its wall time falls in a gap; it fires at the gap's end), ``skipped``
            (it falls in a gap and does not fire), ``fold-first`` / ``fold-second`` (its wall
            time repeats; this is the first / second pass).
        rule: the schedule's rule that applied: ``gap: shift``, ``gap: skip``, ``fold: once``,
            ``fold: both``.
        timezone: the schedule's zone.
        job_ids: the jobs it concerns (the first 5); ``jobs``: how many.
    """

    at: Instant
    kind: Kind
    rule: str
    timezone: str
    job_ids: list[str] = msgspec.field(default_factory=list)
    jobs: int = 1


class HeatDay(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One local date of the display zone: fire times per wall-clock hour 0..23."""

    date: str
    hours: list[int]


class Transition(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A UTC-offset change of the display zone (seconds east of UTC, before and after)."""

    at: Instant
    offset_before_seconds: int
    offset_after_seconds: int


class UpcomingHeatmap(Model, kw_only=True, omit_defaults=False, frozen=True):
    """The answer of ``GET /stats/upcoming``.

    Attributes:
        timezone: the display zone of ``days`` (the request's, default UTC).
        window_start, window_end: ``[start, end)``, aware UTC (the next 7 days from the hour).
        days: each local date the window touches, oldest first; an hour outside the window
            or in a gap of the display zone counts 0.
        fires: every fire time in the window; ``jobs``: how many jobs were considered.
        busiest: the busiest hour (its start, aware UTC) and its fire count; None without fires.
        marks: fire times that a DST transition changes (at most :data:`MAX_MARKS`).
        transitions: the display zone's offset changes in the window.
        truncated: some schedule fired more than :data:`MAX_FIRES_PER_SCHEDULE` times, or the
            store returned its limit of jobs; the counts are then lower bounds.
    """

    timezone: str
    window_start: Instant
    window_end: Instant
    days: list[HeatDay]
    fires: int
    jobs: int
    busiest_at: Instant | None
    busiest_fires: int
    marks: list[DstMark]
    transitions: list[Transition]
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class _Fires:
    """The fire times of one (schedule, first run) over the window: counts per UTC minute
    (index from the window's start) and its DST marks (without job ids)."""

    bins: Counter[int]
    marks: list[tuple[datetime, Kind, str, str]]
    truncated: bool


def window(now: datetime) -> tuple[datetime, datetime]:
    """The next :data:`HORIZON_DAYS` days from the start of ``now``'s UTC hour."""
    start = now.replace(minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=HORIZON_DAYS)


def heatmap(
    groups: Iterable[ScheduledGroup],
    *,
    start: datetime,
    end: datetime,
    display: ZoneInfo,
    display_name: str,
    truncated: bool = False,
) -> UpcomingHeatmap:
    """The heatmap of the ``groups``' fire times in ``[start, end)``, in ``display``'s wall-clock
    hours (see :func:`group_jobs`). ``start`` must be a whole UTC hour. Pure: the same groups
    give the same answer.
    """
    n_jobs = 0
    bins = _Bins(int((end - start).total_seconds() * 1000) // BIN_MS)
    window_ms = (to_epoch_ms(start), to_epoch_ms(end))
    marks: list[DstMark] = []
    for group in groups:
        schedule, first, n = group.schedule, group.next_run_at, group.jobs
        n_jobs += n
        if isinstance(schedule, IntervalSchedule) and _interval_bins(
            bins, schedule, first, start, end, n, window_ms
        ):
            continue
        fires = _fires(schedule, first, start, end)
        truncated = truncated or fires.truncated
        bins.add_counter(fires.bins, n)
        for at, kind, rule, zone in fires.marks:
            marks.append(
                DstMark(
                    at=at,
                    kind=kind,
                    rule=rule,
                    timezone=zone,
                    job_ids=list(group.job_ids),
                    jobs=n,
                )
            )
    marks.sort(key=lambda m: (m.at, m.job_ids))
    counts = bins.counts()
    days, busiest = _days(counts, start, end, display)
    return UpcomingHeatmap(
        timezone=display_name,
        window_start=start,
        window_end=end,
        days=days,
        fires=sum(counts),
        jobs=n_jobs,
        busiest_at=busiest[0],
        busiest_fires=busiest[1],
        marks=marks[:MAX_MARKS],
        transitions=transitions(display, start, end),
        truncated=truncated,
    )


@lru_cache(maxsize=FIRES_CACHE_SIZE)
def _fires(schedule: Schedule, first: datetime, start: datetime, end: datetime) -> _Fires:
    """The fire times of ``schedule`` from ``first`` on, within ``[start, end)`` (cached: the
    same window, schedule and first run give the same answer until the window moves on the
    hour)."""
    match schedule:
        case IntervalSchedule():
            return _interval_fires(schedule, first, start, end)
        case CronSchedule():
            return _cron_fires(schedule, first, start, end)
    once: Counter[int] = Counter()
    if start <= first < end:
        once[(to_epoch_ms(first) - to_epoch_ms(start)) // BIN_MS] += 1
    return _Fires(once, [], truncated=False)


class _Bins:
    """Fire counts per minute of the window, with arithmetic progressions added in O(1): a
    difference array per stride, summed once at the end."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.dense = [0] * n
        self.strided: dict[int, list[int]] = {}

    def add_counter(self, counter: Counter[int], times: int) -> None:
        for b, c in counter.items():
            if 0 <= b < self.n:
                self.dense[b] += c * times

    def add_progression(self, first: int, stride: int, count: int, value: int) -> None:
        """``value`` added to bins ``first, first + stride, …`` (``count`` of them)."""
        if count <= 0 or first >= self.n:
            return
        diff = self.strided.get(stride)
        if diff is None:
            diff = self.strided[stride] = [0] * (self.n + stride)
        diff[first] += value
        stop = first + count * stride
        if stop < len(diff):
            diff[stop] -= value

    def counts(self) -> list[int]:
        out = self.dense
        for stride, diff in self.strided.items():
            acc = diff[: self.n]
            for r in range(stride):  # a running sum along each residue class of the stride
                acc[r::stride] = accumulate(acc[r::stride])
            out = [a + b for a, b in zip(out, acc, strict=True)]
        return out


def _interval_bins(
    bins: _Bins,
    schedule: IntervalSchedule,
    first: datetime,
    start: datetime,
    end: datetime,
    times: int,
    window_ms: tuple[int, int],
) -> bool:
    """Add ``times`` times the schedule's fire counts to ``bins`` in constant time when its interval
    is a whole number of minutes or divides one (whole milliseconds, as
    :func:`core.schedule.next_run_after` steps ``t + every``); False for another interval.
    ``window_ms``: ``start`` and ``end`` in epoch milliseconds."""
    step_ms = round(schedule.every_seconds * 1000)
    if step_ms <= 0 or (step_ms % BIN_MS and BIN_MS % step_ms):
        return False
    t: datetime | None = first
    if t is not None and t < start:
        t = schedules.next_run_from_now(schedule, t, start - timedelta(milliseconds=1))
    if t is None:
        return True
    (origin_ms, end_ms), first_ms = window_ms, to_epoch_ms(t)
    last_ms = end_ms - 1
    if schedule.end_at is not None:
        last_ms = min(last_ms, to_epoch_ms(schedule.end_at))
    if first_ms > last_ms:
        return True
    n = (last_ms - first_ms) // step_ms + 1
    b0 = (first_ms - origin_ms) // BIN_MS
    if step_ms % BIN_MS == 0:
        bins.add_progression(b0, step_ms // BIN_MS, n, times)
        return True
    per_bin = BIN_MS // step_ms
    in_first = min(n, (origin_ms + (b0 + 1) * BIN_MS - first_ms + step_ms - 1) // step_ms)
    bins.add_progression(b0, 1, 1, in_first * times)
    rest = n - in_first
    full = rest // per_bin
    bins.add_progression(b0 + 1, 1, full, per_bin * times)
    if rest % per_bin:
        bins.add_progression(b0 + 1 + full, 1, 1, (rest % per_bin) * times)
    return True


def _interval_fires(
    schedule: IntervalSchedule, first: datetime, start: datetime, end: datetime
) -> _Fires:
    """Any other interval: every fire time, in whole milliseconds."""
    t: datetime | None = first
    if t is not None and t < start:
        t = schedules.next_run_from_now(schedule, t, start - timedelta(milliseconds=1))
    counts: Counter[int] = Counter()
    if t is None:
        return _Fires(counts, [], truncated=False)
    step_ms = round(schedule.every_seconds * 1000)
    last_ms = to_epoch_ms(end) - 1
    if schedule.end_at is not None:
        last_ms = min(last_ms, to_epoch_ms(schedule.end_at))
    origin_ms = to_epoch_ms(start)
    first_ms = to_epoch_ms(t)
    stop_ms = min(last_ms + 1, first_ms + step_ms * MAX_FIRES_PER_SCHEDULE)
    for fire_ms in range(first_ms, stop_ms, step_ms):
        counts[(fire_ms - origin_ms) // BIN_MS] += 1
    return _Fires(counts, [], truncated=stop_ms <= last_ms)


def _cron_fires(
    schedule: CronSchedule, first: datetime, start: datetime, end: datetime, *, fast: bool = True
) -> _Fires:
    """From the cron expression's own iterator (:meth:`core.cron.CronExpression.next_after`,
    which :func:`core.schedule.next_run_after` wraps), DST marks near the zone's transitions;
    or (``fast``, the zone's offset constant over the window and ``first`` in it) from its
    matching wall times (:func:`_wall_fires`: the same answer without an iterator step per fire
    time)."""
    counts: Counter[int] = Counter()
    marks: list[tuple[datetime, Kind, str, str]] = []
    expr = cron.parse_cron(schedule.expression)
    tz = cron.resolve_timezone(schedule.timezone)
    changes = [tr.at for tr in _transitions(schedule.timezone, start, end)]
    near = [(at - _NEAR, at + _NEAR) for at in changes] if expr.is_fixed_time else []
    origin = start.timestamp()
    bound = end if schedule.end_at is None else min(end, schedule.end_at + timedelta(seconds=1))
    if fast and not changes and first >= start:
        return _wall_fires(expr, _offset(tz, start), first, bound, origin)
    t = first
    n = 0
    while t < bound:
        if t >= start:
            counts[int((t.timestamp() - origin) * 1000) // BIN_MS] += 1
            if any(lo <= t <= hi for lo, hi in near):
                mark = dst_mark(schedule, t)
                if mark is not None:
                    marks.append((t, *mark, schedule.timezone))
        n += 1
        if n >= MAX_FIRES_PER_SCHEDULE:
            return _Fires(counts, marks, truncated=True)
        try:
            t = expr.next_after(t, tz, gap=schedule.gap, fold=schedule.fold)
        except (OverflowError, ValueError):
            break
    if schedule.gap == "skip" and changes:
        marks += [(at, "skipped", "gap: skip", schedule.timezone)
                  for at in skipped_in_gaps(schedule, max(first, start), end)]  # fmt: skip
    return _Fires(counts, marks, truncated=False)


def _wall_fires(
    expr: cron.CronExpression, offset_seconds: int, first: datetime, bound: datetime, origin: float
) -> _Fires:
    """The fire times from ``first`` (>= the window's start) to ``bound`` when the zone's offset
    is ``offset_seconds`` all along: the expression's matching wall times
    (:meth:`core.cron.CronExpression.wall_times`) shifted by the offset — the iterator's fire
    times, since without a transition no DST rule applies — counted up to
    :data:`MAX_FIRES_PER_SCHEDULE` as the iterator's are (``first`` included)."""
    first_s, bound_s = first.timestamp(), bound.timestamp()
    counts: Counter[int] = Counter()
    if first >= bound:
        return _Fires(counts, [], truncated=False)
    counts[int((first_s - origin) * 1000) // BIN_MS] += 1
    n = 1
    lo = int(first_s) + 1 + offset_seconds  # strictly after ``first`` (whole seconds)
    hi = math.ceil(bound_s) + offset_seconds
    origin_s, bin_s = int(origin), BIN_MS // 1000
    for wall in expr.wall_times(lo, hi):
        at = wall - offset_seconds
        if at >= bound_s:
            break
        if n >= MAX_FIRES_PER_SCHEDULE:
            return _Fires(counts, [], truncated=True)
        counts[(at - origin_s) // bin_s] += 1
        n += 1
    return _Fires(counts, [], truncated=n >= MAX_FIRES_PER_SCHEDULE)


_NEAR = timedelta(hours=3)
"""A fire time further than this from a transition is not moved by it (no zone's DST shift
exceeds two hours)."""


@lru_cache(maxsize=1024)
def _transitions(zone: str, start: datetime, end: datetime) -> tuple[Transition, ...]:
    return tuple(transitions(cron.resolve_timezone(zone), start, end))


def dst_mark(schedule: CronSchedule, t: datetime) -> tuple[Kind, str] | None:
    """``(kind, rule)`` when a DST transition changes the fire time ``t`` of ``schedule``
    (see :class:`DstMark`), else None."""
    expr = cron.parse_cron(schedule.expression)
    if not expr.is_fixed_time:
        return None  # cronie: the DST rules apply to fixed-time expressions only
    tz = cron.resolve_timezone(schedule.timezone)
    wall = t.astimezone(tz)
    other = wall.replace(fold=1 - wall.fold)
    if other.utcoffset() != wall.utcoffset():
        return ("fold-second" if wall.fold else "fold-first"), f"fold: {schedule.fold}"
    before = (t - timedelta(seconds=1)).astimezone(tz).utcoffset()
    if schedule.gap == "shift" and before is not None and before < (wall.utcoffset() or before):
        # at a spring-forward instant: shifted unless the expression names this wall time
        exact = expr.next_after(t - timedelta(seconds=1), tz, gap="skip", fold=schedule.fold)
        if exact != t:
            return "shifted", "gap: shift"
    return None


def skipped_in_gaps(schedule: CronSchedule, start: datetime, end: datetime) -> list[datetime]:
    """The spring-forward instants in ``[start, end)`` at which ``schedule`` (``gap: skip``)
    drops an occurrence: those at which ``gap: shift`` would have fired."""
    expr = cron.parse_cron(schedule.expression)
    if not expr.is_fixed_time:
        return []
    tz = cron.resolve_timezone(schedule.timezone)
    out = []
    for tr in transitions(tz, start, end):
        if tr.offset_after_seconds <= tr.offset_before_seconds:
            continue
        just_before = tr.at - timedelta(seconds=1)
        shifted = expr.next_after(just_before, tz, gap="shift", fold=schedule.fold)
        exact = expr.next_after(just_before, tz, gap="skip", fold=schedule.fold)
        if shifted == tr.at and exact != tr.at:
            out.append(tr.at)
    return out


def transitions(tz: ZoneInfo, start: datetime, end: datetime) -> list[Transition]:
    """The UTC-offset changes of ``tz`` in ``[start, end)``, to the second (hourly probes, then
    a bisection: no zone changes its offset twice within an hour)."""
    out = []
    step = timedelta(hours=1)
    t = start
    before = _offset(tz, t)
    while t < end:
        nxt = min(t + step, end)
        after = _offset(tz, nxt)
        if after != before:
            lo, hi = int(t.timestamp()), int(nxt.timestamp())  # offset(lo) = before
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset(tz, datetime.fromtimestamp(mid, start.tzinfo)) == before:
                    lo = mid
                else:
                    hi = mid
            at = datetime.fromtimestamp(hi, start.tzinfo)
            if at < end:
                out.append(
                    Transition(at=at, offset_before_seconds=before, offset_after_seconds=after)
                )
            before = after
        t = nxt
    return out


def _offset(tz: ZoneInfo, t: datetime) -> int:
    delta = t.astimezone(tz).utcoffset()
    return int(delta.total_seconds()) if delta is not None else 0


def _days(
    counts: list[int], start: datetime, end: datetime, tz: ZoneInfo
) -> tuple[list[HeatDay], tuple[datetime | None, int]]:
    """Minute counts placed in the local (date, hour) cells of ``tz`` (read once per quarter
    hour: every zone's offset is a multiple of 15 minutes); and the busiest UTC hour."""
    cells: dict[str, list[int]] = {}
    per_quarter = 15
    for q in range(0, len(counts), per_quarter):
        local = (start + timedelta(minutes=q)).astimezone(tz)
        row = cells.setdefault(local.date().isoformat(), [0] * 24)
        row[local.hour] += sum(counts[q : q + per_quarter])
    cells.setdefault((end - timedelta(seconds=1)).astimezone(tz).date().isoformat(), [0] * 24)
    per_hour = [sum(counts[i : i + 60]) for i in range(0, len(counts), 60)]
    busiest: tuple[datetime | None, int] = (None, 0)
    if per_hour and max(per_hour) > 0:
        top = max(per_hour)
        hour = per_hour.index(top)
        busiest = (start + timedelta(hours=hour), top)
    return [HeatDay(date=d, hours=h) for d, h in cells.items()], busiest


def marks_of(schedule: Schedule, times: Sequence[datetime]) -> list[DstMark]:
    """The DST marks of a job's listed fire times (the Job page's next 10)."""
    if not isinstance(schedule, CronSchedule):
        return []
    out = []
    for t in times:
        mark = dst_mark(schedule, t)
        if mark is not None:
            out.append(DstMark(at=t, kind=mark[0], rule=mark[1], timezone=schedule.timezone))
    if schedule.gap == "skip" and times:
        out += [
            DstMark(at=at, kind="skipped", rule="gap: skip", timezone=schedule.timezone)
            for at in skipped_in_gaps(schedule, times[0], times[-1])
        ]
    return sorted(out, key=lambda m: m.at)
