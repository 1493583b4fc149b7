"""core/runs: the one builder of each run shape (record, message, event) that the scheduler,
the manual trigger and the worker share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from core.ids import execution_id, parse_execution_id
from core.model import (
    CronSchedule,
    ExecutionStatus,
    Job,
    RunTrigger,
    StatusEvent,
)
from core.runs import (
    MANUAL_DISPATCHER,
    manual_run,
    poison_event,
    queued_run,
    recorded_event,
    run_event,
    run_message,
    skipped_run,
)

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
JOB = Job(
    id="j1",
    owner="alice",
    task_id="noop",
    schedule=CronSchedule(expression="* * * * *", jitter_seconds=30),
    parameters={"n": 1},
    queue="reports",
    max_attempts=4,
    timeout_seconds=12.5,
    partition=7,
    created_at=T0 - timedelta(hours=1),
    updated_at=T0,
    next_run_at=T0,
)


def test_a_scheduled_run_and_its_message_carry_the_job_options() -> None:
    run = queued_run(JOB, T0, T0 - timedelta(seconds=1), "s1", RunTrigger.CATCH_UP)
    message = run_message(JOB, run, T0)

    assert run.id == execution_id(JOB.id, T0)
    assert (run.status, run.dispatched_by, run.trigger) == (
        ExecutionStatus.QUEUED,
        "s1",
        RunTrigger.CATCH_UP,
    )
    assert 0 <= run.jitter_ms <= 30_000
    assert message.msg_id == run.id
    assert (message.queue, message.partition, message.max_attempts) == ("reports", 7, 4)
    assert (message.timeout_seconds, message.parameters, message.trigger) == (
        12.5,
        {"n": 1},
        RunTrigger.CATCH_UP,
    )
    assert (message.scheduled_for, message.published_at) == (T0, T0)


def test_a_manual_run_is_built_like_a_scheduled_one_with_its_own_id() -> None:
    now = T0 + timedelta(seconds=3)
    manual = manual_run(JOB, now)
    scheduled = queued_run(JOB, now, now, MANUAL_DISPATCHER, RunTrigger.MANUAL)

    assert manual.id != scheduled.id and parse_execution_id(manual.id) == (JOB.id, now)
    assert manual.id != manual_run(JOB, now).id
    assert manual.jitter_ms == 0
    same = {"id", "jitter_ms"}
    for field in manual.__struct_fields__:
        if field not in same:
            assert getattr(manual, field) == getattr(scheduled, field), field
    assert run_message(JOB, manual, now).trigger == RunTrigger.MANUAL


def test_a_redispatch_changes_the_msg_id_and_counts_spent_attempts() -> None:
    run = queued_run(JOB, T0, T0, "s1", RunTrigger.SCHEDULE)

    message = run_message(JOB, run, T0, attempt_offset=2, redispatched_at_ms=1780308000123)

    assert message.attempt_offset == 2
    assert message.msg_id == f"{run.id}|r1780308000123"


def test_the_event_of_a_record_and_of_its_message_are_the_same_run() -> None:
    run = queued_run(JOB, T0, T0, "s1", RunTrigger.SCHEDULE)
    message = run_message(JOB, run, T0)

    by_record = run_event(run, ExecutionStatus.RUNNING, attempt=1, at=T0)
    by_message = run_event(message, ExecutionStatus.RUNNING, attempt=1, at=T0)

    assert by_record == by_message
    assert (by_record.execution_id, by_record.owner, by_record.partition) == (run.id, "alice", 7)


def test_a_recorded_run_announces_its_status_and_skip_reason() -> None:
    queued = recorded_event(queued_run(JOB, T0, T0, "s1", RunTrigger.SCHEDULE))
    skipped = recorded_event(skipped_run(JOB, T0, T0, "s1", "overlap: busy", None))

    assert (queued.status, queued.attempt, queued.error) == (ExecutionStatus.QUEUED, 0, None)
    assert (skipped.status, skipped.finished_at, skipped.error) == (
        ExecutionStatus.SKIPPED,
        T0,
        "overlap: busy",
    )


def test_a_poison_message_fails_its_run_when_its_msg_id_names_one() -> None:
    for run_id in (execution_id("j1", T0), manual_run(JOB, T0).id):
        event = poison_event(run_id, attempt=2, at=T0, worker_id="w", error="undecodable")
        assert isinstance(event, StatusEvent)
        assert (event.job_id, event.scheduled_for, event.status) == (
            "j1",
            T0,
            ExecutionStatus.FAILED,
        )
        assert (event.attempt, event.finished_at, event.worker_id) == (2, T0, "w")
        assert (event.owner, event.partition, event.task_id) == ("", 0, "")  # not in the id
    assert poison_event("x", attempt=1, at=T0, worker_id="w", error="e") is None
