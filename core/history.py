"""A run's attempt history and the retention of finished runs, decided without I/O.

**Attempts.**

Each execution keeps a list of its attempts (:class:`core.model.Attempt`), which the recorder
derives from the run's status events. :func:`record_attempts` is the one rule both stores apply:
an event is an *observation* of one attempt (RUNNING: its start; RETRYING, SUCCEEDED, FAILED,
CANCELLED: its outcome, with the start it carries), and observations of one attempt are merged
field by field with rules that do not depend on their order:

- its start is the earliest start observed, with the worker that reported it;
- its outcome is the earliest outcome observed (the time of a RETRYING report, the
  ``finishedAt`` of a terminal one), with its error;
- ``redelivered`` is derived: attempt *n* > 1 was a redelivery unless attempt *n - 1* ended
  RETRYING (a reported failure, handed back for a retry with backoff).

So the history is a function of the set of events ever recorded: duplicates change nothing, and
a late event (a RETRYING report that arrives after the next attempt's RUNNING, a redelivered
batch, two recorders racing) fills in what it knows without rewriting anything it does not.

**Retention.** A job keeps its ``historyLimit`` most recently finished runs and those finished
less than ``historyMaxAgeSeconds`` ago — a finished run goes when either rule says so; a job
without its own value follows the deployment's (``JOBSCHED_HISTORY_LIMIT``,
``JOBSCHED_HISTORY_MAX_AGE_SECONDS``). Unfinished runs and the job's latest run
(``lastExecutionId``) are always kept. :func:`prune_target` turns a job into what the store
deletes (:class:`core.ports.PruneTarget`); the pruner actor (``actors/retention.py``) decides
when.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import msgspec

from core.model import MAX_ATTEMPTS, Attempt, ExecutionStatus, Job, StatusEvent
from core.ports import PruneTarget

ATTEMPT_ERROR_CHARS = 500
"""An attempt's error is cut to this many characters (the execution's ``error`` keeps more)."""

MAX_ATTEMPT_RECORDS = MAX_ATTEMPTS
"""Attempts kept per execution (the latest ones): as many as a run may have."""

OUTCOMES = frozenset(
    {
        ExecutionStatus.RETRYING,
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.CANCELLED,
    }
)
"""Statuses whose event reports how an attempt ended."""


NEVER_RAN = ExecutionStatus.SKIPPED
"""A record in this status is of an occurrence that never ran: it keeps no attempts, whatever
events claim about it."""


def observes_attempt(event: StatusEvent) -> bool:
    """Whether ``event`` tells something about one attempt (a start or an outcome).

    QUEUED and SKIPPED records, and events of attempt 0 (a run closed before any attempt
    started), do not.
    """
    return event.attempt >= 1 and (
        event.status == ExecutionStatus.RUNNING or event.status in OUTCOMES
    )


def observed(event: StatusEvent) -> Attempt:
    """What ``event`` says about its attempt, as an attempt record of its own."""
    ended = event.status in OUTCOMES
    error = event.error if ended and event.status != ExecutionStatus.SUCCEEDED else None
    return Attempt(
        attempt=event.attempt,
        started_at=event.started_at,
        worker_id=event.worker_id,
        finished_at=(event.finished_at or event.at) if ended else None,
        outcome=event.status if ended else None,
        error=None if error is None else error[:ATTEMPT_ERROR_CHARS],
    )


def _start_key(a: Attempt) -> tuple[datetime, str]:
    assert a.started_at is not None
    return a.started_at, a.worker_id or ""


def _outcome_key(a: Attempt) -> tuple[datetime, str, str]:
    assert a.finished_at is not None and a.outcome is not None
    return a.finished_at, a.outcome.value, a.error or ""


def merge_attempt(a: Attempt, b: Attempt) -> Attempt:
    """Two records of one attempt as one (commutative, associative, idempotent).

    The earliest start wins with its worker, the earliest outcome with its error; an attempt
    that never started names the worker of the outcome that won.
    """
    assert a.attempt == b.attempt
    starts = [x for x in (a, b) if x.started_at is not None]
    outcomes = [x for x in (a, b) if x.outcome is not None and x.finished_at is not None]
    start = min(starts, key=_start_key) if starts else None
    outcome = min(outcomes, key=_outcome_key) if outcomes else None
    if start is not None:
        worker = start.worker_id
    elif outcome is not None:
        worker = outcome.worker_id
    else:
        worker = min(a.worker_id or "", b.worker_id or "") or None
    return Attempt(
        attempt=a.attempt,
        started_at=None if start is None else start.started_at,
        worker_id=worker,
        finished_at=None if outcome is None else outcome.finished_at,
        outcome=None if outcome is None else outcome.outcome,
        error=None if outcome is None else outcome.error,
    )


def record_attempts(attempts: Sequence[Attempt], events: Iterable[StatusEvent]) -> list[Attempt]:
    """The attempt history of a run after ``events``.

    Args:
        attempts: the history so far, as stored (any order).
        events: status events of this run (the caller groups them by execution), in any order,
            duplicates allowed; those that observe no attempt are ignored.

    Returns:
        The history, oldest attempt first, at most :data:`MAX_ATTEMPT_RECORDS` (the latest),
        ``redelivered`` derived as the module docstring says. Applying the same events again
        returns it unchanged.
    """
    by_number: dict[int, Attempt] = {}
    for a in attempts:
        known = by_number.get(a.attempt)
        by_number[a.attempt] = a if known is None else merge_attempt(known, a)
    for event in events:
        if not observes_attempt(event):
            continue
        seen = observed(event)
        known = by_number.get(seen.attempt)
        by_number[seen.attempt] = seen if known is None else merge_attempt(known, seen)
    history: list[Attempt] = []
    for number in sorted(by_number)[-MAX_ATTEMPT_RECORDS:]:
        previous = by_number.get(number - 1)
        retried = previous is not None and previous.outcome == ExecutionStatus.RETRYING
        a = by_number[number]
        redelivered = number > 1 and not retried
        if a.redelivered != redelivered:
            a = msgspec.structs.replace(a, redelivered=redelivered)
        history.append(a)
    return history


# --- retention -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Retention:
    """How many finished runs of a job are kept, and for how long.

    Attributes:
        keep_last: the most recently finished runs kept per job (None: no count limit).
        max_age_seconds: a finished run is deleted this many seconds after it finished (None: no age
            limit).
    """

    keep_last: int | None = 1000
    max_age_seconds: float | None = 30 * 86400.0

    @classmethod
    def of_settings(cls, history_limit: int, history_max_age_seconds: float) -> Retention:
        """The deployment's default from its settings, where 0 means "no limit"."""
        return cls(keep_last=history_limit or None, max_age_seconds=history_max_age_seconds or None)


def retention_of(job: Job, default: Retention) -> Retention:
    """The retention that applies to ``job``: its own values, else the deployment's."""
    return Retention(
        keep_last=default.keep_last if job.history_limit is None else job.history_limit,
        max_age_seconds=(
            default.max_age_seconds
            if job.history_max_age_seconds is None
            else job.history_max_age_seconds
        ),
    )


def prune_target(job: Job, default: Retention, now: datetime) -> PruneTarget | None:
    """What to delete of ``job``'s history at ``now`` (aware), or None when no rule applies."""
    rule = retention_of(job, default)
    if rule.keep_last is None and rule.max_age_seconds is None:
        return None
    return PruneTarget(
        job_id=job.id,
        keep_last=rule.keep_last,
        finished_before=None
        if rule.max_age_seconds is None
        else now - timedelta(seconds=rule.max_age_seconds),
        keep_id=job.last_execution_id,
    )
