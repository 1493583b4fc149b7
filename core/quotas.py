"""Per-user quotas, decided without I/O: the limits, the token bucket, the interval floor.

Four limits hold for every user (README "Security model"), each set by an operator:

- **active jobs**: jobs that are SCHEDULED, RUNNING or PAUSED (a paused job can be resumed at any
  time, so pausing does not make room). Checked when a job is created; counted in the store, so
  it holds across gateways.
- **smallest interval**: an interval job's ``everySeconds`` (and a cron expression's smallest gap
  between fire times) may not be shorter. A property of the request body, so it is a 422 naming
  the field, like ``maxAttempts`` beyond the deployment's limit.
- **creations per second**: a token bucket per user (rate and burst) in the store, taken by
  every gateway before it creates a job.
- **runs started per minute**: a token bucket per user in the store, taken by the scheduler
  before it records runs (a run over the quota is held back, never dropped) and by a gateway
  for a manual trigger.

A bucket (:class:`Bucket`) is a level of tokens at an instant; it refills continuously at
``rate`` tokens per second up to ``capacity``. :func:`take` is the one rule every store applies
under its compare-and-set.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from core import cron
from core.errors import FieldError, InvalidRequest, QuotaExceeded
from core.model import CronSchedule, IntervalSchedule, JobStatus, Schedule

ACTIVE_JOB_STATUSES = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.PAUSED})
"""The statuses that count against the active-jobs quota."""

EPSILON = 1e-9
"""Tokens: a level this close to the need is enough (a refill of ``n / rate`` seconds yields ``n``
tokens even in floating point)."""

CRON_GAP_SAMPLE = 512
"""How many fire times of a cron expression are checked against the smallest interval."""


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket's refill rate (tokens per second) and capacity (tokens)."""

    per_second: float
    capacity: float


class Quotas(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The per-user limits of a deployment; 0 turns a limit off.

    Attributes:
        active_jobs: most SCHEDULED, RUNNING or PAUSED jobs per user.
        min_interval_seconds: smallest interval between two runs of a job (seconds).
        creates_per_second / creates_burst: job creations per user and second, sustained and at
            once (a token bucket of ``creates_burst`` tokens).
        runs_per_minute: runs started per user and minute (a token bucket of that many tokens
            refilled at that many per minute: a minute's worth at once, then the rate).
    """

    active_jobs: Annotated[int, msgspec.Meta(ge=0)] = 10_000
    min_interval_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 1.0
    creates_per_second: Annotated[float, msgspec.Meta(ge=0)] = 50.0
    creates_burst: Annotated[int, msgspec.Meta(ge=1)] = 100
    runs_per_minute: Annotated[int, msgspec.Meta(ge=0)] = 6_000

    @property
    def creates(self) -> Rate | None:
        if self.creates_per_second <= 0:
            return None
        return Rate(self.creates_per_second, max(1.0, float(self.creates_burst)))

    @property
    def runs(self) -> Rate | None:
        if self.runs_per_minute <= 0:
            return None
        return Rate(self.runs_per_minute / 60.0, float(self.runs_per_minute))


UNLIMITED = Quotas(
    active_jobs=0,
    min_interval_seconds=0.0,
    creates_per_second=0.0,
    creates_burst=0,
    runs_per_minute=0,
)


def creates_key(owner: str) -> str:
    """The bucket of ``owner``'s job creations."""
    return f"creates:{owner}"


def runs_key(owner: str) -> str:
    """The bucket of ``owner``'s run starts."""
    return f"runs:{owner}"


@dataclass(frozen=True, slots=True)
class Bucket:
    """A bucket's level (tokens, may be negative after an overdraft) as of ``updated_at``."""

    tokens: float
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """Take ``cost`` tokens from the bucket ``key`` (see :func:`take`)."""

    key: str
    cost: int
    rate: Rate


def take(bucket: Bucket | None, rate: Rate, cost: int, now: datetime) -> tuple[Bucket, float]:
    """Take ``cost`` tokens at ``now``: ``(the bucket after, 0.0)`` when granted, else
    ``(the bucket unchanged, seconds until it can be granted)``.

    The bucket refills by ``rate.per_second`` per second since ``updated_at`` up to
    ``rate.capacity`` (a new bucket is full). A request is granted when the bucket holds
    ``min(cost, capacity)`` tokens; it then takes all of ``cost``, so a request larger than the
    bucket (a catch-up of many runs) is granted once the bucket is full and leaves a debt that
    the refill repays: every request is granted eventually and the long-run rate still holds.
    A bucket last written by a host whose clock is ahead is not refilled until ``now`` passes
    its ``updated_at`` (clock skew never mints tokens).
    """
    if bucket is None:
        level, since = rate.capacity, now
    else:
        elapsed = max(0.0, (now - bucket.updated_at).total_seconds())
        level = min(rate.capacity, bucket.tokens + elapsed * rate.per_second)
        since = max(now, bucket.updated_at)
    need = min(float(cost), rate.capacity)
    if level + EPSILON >= need:
        return Bucket(level - cost, since), 0.0
    unchanged = bucket if bucket is not None else Bucket(level, since)
    return unchanged, (need - level) / rate.per_second


def take_all(
    buckets: dict[str, Bucket], requests: list[TokenRequest], now: datetime
) -> tuple[dict[str, Bucket], list[float]]:
    """Apply ``requests`` in order to ``buckets`` (key → level; absent: new).

    Returns the buckets that changed and, per request, 0.0 (granted) or the seconds to wait.
    """
    state = dict(buckets)
    changed: dict[str, Bucket] = {}
    waits: list[float] = []
    for r in requests:
        after, wait = take(state.get(r.key), r.rate, r.cost, now)
        if wait == 0.0:
            state[r.key] = changed[r.key] = after
        waits.append(wait)
    return changed, waits


def check_active_jobs(quotas: Quotas, active: int) -> None:
    """Raises: QuotaExceeded: ``active`` jobs already reach ``quotas.active_jobs``."""
    if quotas.active_jobs and active >= quotas.active_jobs:
        raise QuotaExceeded(
            f"quota exceeded: at most {quotas.active_jobs} active (scheduled, running or paused) "
            "jobs per user; cancel or delete jobs first",
            limit="activeJobs",
            value=quotas.active_jobs,
        )


def must_count(quotas: Quotas, counted: tuple[int, datetime] | None, now: datetime) -> bool:
    """Whether a creation must count the owner's active jobs, given an earlier count
    ``(active jobs, when)`` (None: none).

    Only creations make a job active (resuming turns PAUSED into SCHEDULED, both active; a
    finished job never becomes active again), and the creations bucket — shared by every
    gateway — grants at most its capacity plus its rate per second since any instant. So while
    that bound stays below the quota, no count can reach it and none is needed. Without the
    creations quota there is no bound: every creation counts.
    """
    if not quotas.active_jobs:
        return False
    rate = quotas.creates
    if counted is None or rate is None:
        return True
    active, at = counted
    since = max(0.0, (now - at).total_seconds())
    return active + rate.capacity + rate.per_second * since >= quotas.active_jobs


def creates_exceeded(quotas: Quotas, wait_seconds: float) -> QuotaExceeded:
    return QuotaExceeded(
        f"quota exceeded: at most {quotas.creates_per_second:g} job creations per second "
        f"(bursts of {quotas.creates_burst}); retry in {wait_seconds:.2f} s",
        limit="createsPerSecond",
        value=quotas.creates_per_second,
        retry_after_seconds=wait_seconds,
    )


def runs_exceeded(quotas: Quotas, wait_seconds: float) -> QuotaExceeded:
    return QuotaExceeded(
        f"quota exceeded: at most {quotas.runs_per_minute} runs started per minute; "
        f"retry in {wait_seconds:.2f} s",
        limit="runsPerMinute",
        value=quotas.runs_per_minute,
        retry_after_seconds=wait_seconds,
    )


def check_schedule(quotas: Quotas, schedule: Schedule, now: datetime) -> None:
    """Check a normalized schedule against the smallest interval.

    An interval's ``everySeconds`` is checked; a cron expression's smallest gap between its
    next :data:`CRON_GAP_SAMPLE` fire times after ``now`` (only when the floor is above 1 s, the
    smallest gap a cron expression with a seconds field can have).

    Raises:
        InvalidRequest: on ``schedule.everySeconds`` or ``schedule.expression``.
    """
    floor = quotas.min_interval_seconds
    if floor <= 0:
        return
    reason = f"must be at least {floor:g} s apart in this deployment (its smallest interval)"
    match schedule:
        case IntervalSchedule(every_seconds=every) if every < floor:
            raise InvalidRequest(FieldError("schedule.everySeconds", reason))
        case CronSchedule() if floor > 1:
            gap = _smallest_cron_gap(schedule, now)
            if gap is not None and gap < timedelta(seconds=floor):
                raise InvalidRequest(
                    FieldError(
                        "schedule.expression",
                        f"fires {gap.total_seconds():g} s apart; runs {reason}",
                    )
                )


def _smallest_cron_gap(schedule: CronSchedule, now: datetime) -> timedelta | None:
    expr = cron.parse_cron(schedule.expression)
    tz = cron.resolve_timezone(schedule.timezone)
    start = max(now, schedule.start_at) if schedule.start_at else now
    times = expr.fire_times(start, tz, CRON_GAP_SAMPLE, gap=schedule.gap, fold=schedule.fold)
    if schedule.end_at is not None:
        times = [t for t in times if t <= schedule.end_at]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return min(gaps) if gaps else None
