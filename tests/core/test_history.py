"""core.history: a run's attempts from its status events, in any order, duplicates included;
which retention applies to a job."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from core.history import (
    ATTEMPT_ERROR_CHARS,
    MAX_ATTEMPT_RECORDS,
    Retention,
    prune_target,
    record_attempts,
    retention_of,
)
from core.model import Attempt, ExecutionStatus, IntervalSchedule, Job, StatusEvent
from core.ports import PruneTarget
from core.settings import Settings

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
RUNNING = ExecutionStatus.RUNNING
RETRYING = ExecutionStatus.RETRYING
SUCCEEDED = ExecutionStatus.SUCCEEDED
FAILED = ExecutionStatus.FAILED
CANCELLED = ExecutionStatus.CANCELLED


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(status: ExecutionStatus, attempt: int, when: float, **fields: Any) -> StatusEvent:
    return StatusEvent(
        execution_id="job-1:2026-06-01T08:00:00.000Z",
        job_id="job-1",
        owner="alice",
        partition=0,
        task_id="noop",
        status=status,
        attempt=attempt,
        at=at(when),
        scheduled_for=T0,
        **fields,
    )


def started(status: ExecutionStatus, attempt: int, start: float, when: float, worker: str,
            **fields: Any) -> StatusEvent:  # fmt: skip
    """An event of an attempt that ``worker`` started at ``start``, as the worker reports it."""
    finished = {"finished_at": at(when)} if status in (SUCCEEDED, FAILED, CANCELLED) else {}
    return ev(status, attempt, when, started_at=at(start), worker_id=worker, **finished, **fields)


# A run whose worker A died during attempt 1; B ran attempt 2, which failed; C ran attempt 3.
LOST_RETRIED_SUCCEEDED = [
    started(RUNNING, 1, 1, 1, "worker-a"),
    started(RUNNING, 2, 40, 40, "worker-b"),
    started(RETRYING, 2, 40, 41, "worker-b", error="ValueError: boom"),
    started(RUNNING, 3, 43, 43, "worker-c"),
    started(SUCCEEDED, 3, 43, 44, "worker-c"),
]
EXPECTED = [
    Attempt(attempt=1, started_at=at(1), worker_id="worker-a"),
    Attempt(
        attempt=2,
        started_at=at(40),
        worker_id="worker-b",
        finished_at=at(41),
        outcome=RETRYING,
        error="ValueError: boom",
        redelivered=True,
    ),
    Attempt(
        attempt=3, started_at=at(43), worker_id="worker-c", finished_at=at(44), outcome=SUCCEEDED
    ),
]


def test_each_attempt_has_its_own_start_worker_and_outcome() -> None:
    assert record_attempts([], LOST_RETRIED_SUCCEEDED) == EXPECTED


def test_the_history_does_not_depend_on_the_order_or_batching_of_the_events() -> None:
    for order in itertools.permutations(LOST_RETRIED_SUCCEEDED):
        assert record_attempts([], order) == EXPECTED
        one_by_one: list[Attempt] = []
        for event in order:
            one_by_one = record_attempts(one_by_one, [event])
        assert one_by_one == EXPECTED


def test_duplicates_change_nothing() -> None:
    history = record_attempts([], LOST_RETRIED_SUCCEEDED)

    assert record_attempts(history, LOST_RETRIED_SUCCEEDED) == history
    assert record_attempts(history, []) == history
    assert record_attempts([], LOST_RETRIED_SUCCEEDED * 3) == history


def test_a_late_retry_report_turns_a_presumed_redelivery_into_a_retry() -> None:
    """Attempt 2's RUNNING recorded before attempt 1's RETRYING: until that report arrives,
    attempt 2 looks like a redelivery; afterwards it is a retry — what really happened."""
    first = started(RUNNING, 1, 1, 1, "worker-a")
    second = started(RUNNING, 2, 3, 3, "worker-b")
    retry = started(RETRYING, 1, 1, 2, "worker-a", error="boom")

    before = record_attempts([], [first, second])
    after = record_attempts(before, [retry])

    assert [a.redelivered for a in before] == [False, True]
    assert [a.redelivered for a in after] == [False, False]
    assert (after[0].outcome, after[0].finished_at) == (RETRYING, at(2))


def test_a_late_start_report_does_not_replace_the_outcome() -> None:
    done = started(SUCCEEDED, 1, 1, 2, "worker-a")
    late_running = started(RUNNING, 1, 1, 1, "worker-a")

    assert record_attempts(record_attempts([], [done]), [late_running]) == [
        Attempt(
            attempt=1, started_at=at(1), worker_id="worker-a", finished_at=at(2), outcome=SUCCEEDED
        )
    ]


def test_a_give_up_keeps_the_start_and_worker_of_the_lost_attempt() -> None:
    """Attempt 3 of 3 lost with worker A; worker B, delivered the run a fourth time, gives up
    and reports FAILED for attempt 3 without a start."""
    events = [
        started(RUNNING, 3, 10, 10, "worker-a"),
        ev(FAILED, 3, 50, finished_at=at(50), worker_id="worker-b", error="gave up after 3"),
    ]

    [attempt] = record_attempts([], events)

    assert (attempt.started_at, attempt.worker_id) == (at(10), "worker-a")
    assert (attempt.outcome, attempt.finished_at, attempt.error) == (
        FAILED,
        at(50),
        "gave up after 3",
    )


def test_an_attempt_cancelled_before_it_started_names_the_worker_that_reported_it() -> None:
    events = [
        started(RETRYING, 1, 1, 2, "worker-a", error="boom"),
        ev(CANCELLED, 2, 5, finished_at=at(5), worker_id="worker-b", error="cancelled"),
    ]

    history = record_attempts([], events)

    assert history[1] == Attempt(
        attempt=2, worker_id="worker-b", finished_at=at(5), outcome=CANCELLED, error="cancelled"
    )


def test_two_reports_of_one_attempt_keep_the_earliest_start_and_the_earliest_outcome() -> None:
    """A zombie: worker A still ran attempt 1 when B got it again under the same number (a
    re-dispatch); whatever the order, the earliest start and outcome win."""
    events = [
        started(RUNNING, 1, 5, 5, "worker-b"),
        started(RUNNING, 1, 1, 1, "worker-a"),
        started(SUCCEEDED, 1, 5, 7, "worker-b"),
        started(FAILED, 1, 1, 9, "worker-a", error="late"),
    ]
    expected = Attempt(
        attempt=1, started_at=at(1), worker_id="worker-a", finished_at=at(7), outcome=SUCCEEDED
    )

    for order in itertools.permutations(events):
        assert record_attempts([], order) == [expected]


def test_events_that_observe_no_attempt_are_ignored() -> None:
    events = [
        ev(ExecutionStatus.QUEUED, 0, 0),
        ev(ExecutionStatus.SKIPPED, 0, 0, finished_at=at(0), error="overlap"),
        ev(CANCELLED, 0, 3, finished_at=at(3), error="cancelled: the job was cancelled"),
    ]

    assert record_attempts([], events) == []


def test_an_attempt_error_is_bounded_and_a_success_has_none() -> None:
    events = [
        started(RETRYING, 1, 1, 2, "w", error="x" * 5000),
        started(SUCCEEDED, 2, 3, 4, "w", error="ignored"),
    ]

    first, second = record_attempts([], events)

    assert first.error == "x" * ATTEMPT_ERROR_CHARS
    assert second.error is None


def test_the_history_keeps_the_latest_attempts() -> None:
    events = [started(RETRYING, n, n, n + 0.5, "w") for n in range(1, MAX_ATTEMPT_RECORDS + 6)]

    history = record_attempts([], events)

    assert [a.attempt for a in history] == list(range(6, MAX_ATTEMPT_RECORDS + 6))


def test_random_interleavings_of_many_runs_of_events_agree() -> None:
    rng = random.Random(7)
    events = [e for n in range(1, 6) for e in (started(RUNNING, n, 10 * n, 10 * n, f"w{n}"),
              started(RETRYING, n, 10 * n, 10 * n + 1, f"w{n}", error=f"e{n}"))]  # fmt: skip
    events = [e for e in events if rng.random() < 0.8]
    expected = record_attempts([], events)
    for _ in range(200):
        shuffled = events * rng.randint(1, 2)
        rng.shuffle(shuffled)
        cut = rng.randint(0, len(shuffled))
        assert record_attempts(record_attempts([], shuffled[:cut]), shuffled[cut:]) == expected


# --- retention -----------------------------------------------------------------------------------


def a_job(**fields: Any) -> Job:
    return Job(
        id="job-1",
        owner="alice",
        task_id="noop",
        schedule=IntervalSchedule(every_seconds=1),
        created_at=T0,
        updated_at=T0,
        last_execution_id="job-1:2026-06-01T07:59:59.000Z",
        **fields,
    )


DEFAULT = Retention(keep_last=1000, max_age_seconds=86400)


def test_a_job_without_its_own_retention_follows_the_deployment() -> None:
    assert retention_of(a_job(), DEFAULT) == DEFAULT
    assert prune_target(a_job(), DEFAULT, T0) == PruneTarget(
        "job-1",
        keep_last=1000,
        finished_before=T0 - timedelta(days=1),
        keep_id="job-1:2026-06-01T07:59:59.000Z",
    )


def test_a_job_s_own_values_win_one_by_one() -> None:
    own_limit = a_job(history_limit=5)
    own_age = a_job(history_max_age_seconds=120.0)

    assert retention_of(own_limit, DEFAULT) == Retention(keep_last=5, max_age_seconds=86400)
    assert retention_of(own_age, DEFAULT) == Retention(keep_last=1000, max_age_seconds=120.0)
    target = prune_target(own_age, Retention(keep_last=None, max_age_seconds=None), T0)
    assert target is not None
    assert (target.keep_last, target.finished_before) == (None, T0 - timedelta(minutes=2))


def test_no_rule_means_nothing_to_prune() -> None:
    assert prune_target(a_job(), Retention(keep_last=None, max_age_seconds=None), T0) is None


def test_the_deployment_default_reads_zero_as_no_limit() -> None:
    assert Retention.of_settings(0, 0) == Retention(keep_last=None, max_age_seconds=None)
    assert Retention.of_settings(100, 3600) == Retention(keep_last=100, max_age_seconds=3600)
    settings = Settings()
    assert Retention.of_settings(
        settings.retention.history_limit, settings.retention.history_max_age_seconds
    ) == (Retention(keep_last=1000, max_age_seconds=30 * 86400))
