"""The one schema (core.model) on the wire: msgspec JSON round-trips, key names, nulls and
defaults, unknown-field policy, and the field paths of validation errors (core.tasks)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest

from core.errors import FieldError
from core.model import (
    CronSchedule,
    CronScheduleIn,
    Execution,
    ExecutionStatus,
    ImmediateSchedule,
    ImmediateScheduleIn,
    IntervalSchedule,
    Job,
    JobCreate,
    JobStatus,
    OnceSchedule,
    Page,
    RunMessage,
    Schedule,
    ScheduleIn,
    StatusEvent,
    state_rank,
)
from core.tasks import validation_field_error

T0 = datetime(2026, 6, 1, 10, 0, 0, 123_000, tzinfo=UTC)
SCHEDULES: list[Schedule] = [
    ImmediateSchedule(),
    OnceSchedule(execute_at=T0),
    CronSchedule(expression="30 2 * * 1-5", timezone="America/New_York"),
    IntervalSchedule(every_seconds=90.5),
]


def keys(raw: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(raw)
    return decoded


def make_job(schedule: Schedule = SCHEDULES[2]) -> Job:
    return Job(
        id="job-1",
        owner="alice",
        task_id="generate_report",
        schedule=schedule,
        parameters={"rows": 3, "nested": {"a": [1, None]}},
        created_at=T0,
        updated_at=T0,
        next_run_at=T0 + timedelta(minutes=1),
        last_run_status=ExecutionStatus.FAILED,
    )


def make_execution() -> Execution:
    return Execution(
        id="job-1:2026-06-01T10:00:00.123Z",
        job_id="job-1",
        owner="alice",
        task_id="noop",
        status=ExecutionStatus.RETRYING,
        state_rank=state_rank(ExecutionStatus.RETRYING, 1),
        attempt=1,
        scheduled_for=T0,
        created_at=T0,
        updated_at=T0,
        error="boom",
        result={"rows": [1, 2]},
    )


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: type(s).__name__)
def test_a_job_round_trips_through_json(schedule: Schedule) -> None:
    job = make_job(schedule)

    assert msgspec.json.decode(msgspec.json.encode(job), type=Job) == job


def test_an_execution_round_trips_through_json() -> None:
    ex = make_execution()

    assert msgspec.json.decode(msgspec.json.encode(ex), type=Execution) == ex


def test_messages_round_trip_through_json() -> None:
    run = RunMessage(
        execution_id="e",
        job_id="job-1",
        owner="alice",
        partition=3,
        task_id="noop",
        queue="default",
        parameters={"x": 1},
        scheduled_for=T0,
        published_at=T0,
        attempt_offset=2,
    )
    ev = StatusEvent(
        execution_id="e",
        job_id="job-1",
        owner="alice",
        partition=3,
        task_id="noop",
        status=ExecutionStatus.SUCCEEDED,
        attempt=2,
        at=T0,
        scheduled_for=T0,
        result=[1, "two"],
    )

    assert msgspec.json.decode(msgspec.json.encode(run), type=RunMessage) == run
    assert msgspec.json.decode(msgspec.json.encode(ev), type=StatusEvent) == ev


def test_instants_with_an_offset_decode_to_the_same_instant() -> None:
    raw = msgspec.json.encode(make_job())
    doc = keys(raw)
    doc["createdAt"] = "2026-06-01T12:00:00.123+02:00"

    job = msgspec.json.decode(json.dumps(doc), type=Job)

    assert job.created_at == T0


# --- key names, nulls and defaults ------------------------------------------------------------


def test_job_keys_are_camel_case_and_nulls_are_kept() -> None:
    doc = keys(msgspec.json.encode(make_job()))

    assert {"taskId", "createdAt", "nextRunAt", "lastRunStatus", "runCount", "maxAttempts"} <= set(
        doc
    )
    assert not [k for k in doc if "_" in k]
    assert doc["lastRunAt"] is None
    assert doc["lastError"] is None
    assert doc["schedule"] == {
        "type": "cron",
        "expression": "30 2 * * 1-5",
        "timezone": "America/New_York",
        "gap": "shift",
        "fold": "once",
        "startAt": None,
        "endAt": None,
        "jitterSeconds": 0.0,
    }
    assert (doc["status"], doc["runCount"], doc["queue"]) == ("SCHEDULED", 0, "default")


def test_execution_and_page_keep_every_field() -> None:
    doc = keys(msgspec.json.encode(make_execution()))
    page = keys(msgspec.json.encode(Page[Job](items=[])))

    assert {"jobId", "stateRank", "scheduledFor", "nextAttemptAt"} <= set(doc)
    assert (doc["startedAt"], doc["workerId"], doc["attempt"]) == (None, None, 1)
    assert page == {"items": [], "nextCursor": None}


def test_default_schedule_fields_are_kept() -> None:
    assert keys(msgspec.json.encode(ImmediateSchedule())) == {"type": "immediate"}
    assert keys(msgspec.json.encode(CronSchedule(expression="* * * * *"))) == {
        "type": "cron",
        "expression": "* * * * *",
        "timezone": "UTC",
        "gap": "shift",
        "fold": "once",
        "startAt": None,
        "endAt": None,
        "jitterSeconds": 0.0,
    }


def test_messages_omit_fields_at_their_defaults() -> None:
    run = RunMessage(
        execution_id="e",
        job_id="job-1",
        owner="alice",
        partition=3,
        task_id="noop",
        queue="default",
        scheduled_for=T0,
        published_at=T0,
    )
    ev = StatusEvent(
        execution_id="e",
        job_id="job-1",
        owner="alice",
        partition=3,
        task_id="noop",
        status=ExecutionStatus.RUNNING,
        at=T0,
        scheduled_for=T0,
    )

    run_doc = keys(msgspec.json.encode(run))
    ev_doc = keys(msgspec.json.encode(ev))

    assert {"parameters", "maxAttempts", "timeoutSeconds", "attemptOffset"}.isdisjoint(run_doc)
    assert {"executionId", "jobId", "scheduledFor", "publishedAt"} <= set(run_doc)
    assert {"error", "result", "startedAt", "workerId", "attempt", "queue"}.isdisjoint(ev_doc)
    assert None not in ev_doc.values()
    assert keys(msgspec.json.encode(msgspec.structs.replace(ev, error="x")))["error"] == "x"


# --- unknown fields --------------------------------------------------------------------------


def test_a_create_request_forbids_unknown_fields() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `bogus`"):
        msgspec.json.decode(b'{"taskId": "noop", "bogus": 1}', type=JobCreate)


@pytest.mark.parametrize(
    "schedule",
    [
        {"type": "immediate", "extra": 1},
        {"type": "once", "executeAt": "2026-06-01T10:00:00Z", "extra": 1},
        {"type": "cron", "expression": "* * * * *", "extra": 1},
        {"type": "interval", "everySeconds": 5, "extra": 1},
    ],
    ids=lambda s: s["type"],
)
def test_a_request_schedule_forbids_unknown_fields(schedule: dict[str, Any]) -> None:
    body = json.dumps({"taskId": "noop", "schedule": schedule})

    with pytest.raises(msgspec.ValidationError, match="unknown field `extra`"):
        msgspec.json.decode(body, type=JobCreate)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(schedule), type=ScheduleIn)


def test_a_create_request_defaults_to_an_immediate_schedule() -> None:
    req = msgspec.json.decode(b'{"taskId": "noop"}', type=JobCreate)

    assert req.schedule == ImmediateScheduleIn()
    assert (req.queue, req.max_attempts, req.parameters) == ("default", None, {})
    cron = msgspec.json.decode(
        b'{"taskId": "noop", "schedule": {"type": "cron", "expression": "0 * * * *"}}',
        type=JobCreate,
    )
    assert cron.schedule == CronScheduleIn(expression="0 * * * *")


def test_a_stored_job_tolerates_unknown_fields() -> None:
    """A document written by a newer release (rolling upgrade) still decodes."""
    doc = keys(msgspec.json.encode(make_job()))
    doc["priority"] = 5
    doc["schedule"]["someFutureOption"] = 3

    job = msgspec.json.decode(json.dumps(doc), type=Job)

    assert job == make_job()
    assert msgspec.json.decode(json.dumps(doc["schedule"]), type=Schedule) == SCHEDULES[2]


def test_messages_tolerate_unknown_fields() -> None:
    ev = {
        "executionId": "e",
        "jobId": "j",
        "owner": "o",
        "partition": 0,
        "taskId": "t",
        "status": "RUNNING",
        "at": "2026-06-01T10:00:00Z",
        "scheduledFor": "2026-06-01T10:00:00Z",
        "newField": {"x": 1},
    }

    decoded = msgspec.json.decode(json.dumps(ev), type=StatusEvent)

    assert decoded.status == ExecutionStatus.RUNNING
    assert decoded.rank == state_rank(ExecutionStatus.RUNNING, 0)


def test_a_stored_job_missing_a_newer_field_gets_its_default() -> None:
    doc = keys(msgspec.json.encode(make_job()))
    del doc["runCount"], doc["lastError"], doc["status"]

    job = msgspec.json.decode(json.dumps(doc), type=Job)

    assert (job.run_count, job.last_error, job.status) == (0, None, JobStatus.SCHEDULED)


# --- validation error paths ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"taskId": "x", "bogus": 1}, "bogus", "unknown field"),
        (
            {"taskId": "x", "schedule": {"type": "cron", "expression": "* * * * *", "zz": 1}},
            "schedule.zz",
            "unknown field",
        ),
        ({}, "taskId", "required field is missing"),
        ({"taskId": "x", "schedule": {"type": "cron"}}, "schedule.expression", "missing"),
        ({"taskId": "x", "maxAttempts": "3"}, "maxAttempts", "Expected `int | null`, got `str`"),
        ({"taskId": "x", "maxAttempts": 0}, "maxAttempts", ">= 1"),
        ({"taskId": "x", "maxAttempts": 21}, "maxAttempts", "<= 20"),
        ({"taskId": "x", "schedule": {"type": "weekly"}}, "schedule.type", "weekly"),
        (
            {"taskId": "x", "schedule": {"type": "interval", "everySeconds": 0}},
            "schedule.everySeconds",
            ">= 0.001",
        ),
        ({"taskId": "x", "queue": "Bad Queue"}, "queue", "regex"),
        ({"taskId": ""}, "taskId", "length"),
        ([], "body", "Expected `object`, got `array`"),
    ],
)
def test_validation_errors_name_the_field(body: Any, field: str, reason: str) -> None:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(json.dumps(body), type=JobCreate)

    err = validation_field_error(caught.value)

    assert err.field == field
    assert reason in err.reason
    assert "$" not in err.field


class Params(msgspec.Struct, forbid_unknown_fields=True):
    items: list[int]
    window: dict[str, int] = msgspec.field(default_factory=dict)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"items": [1, "a"]}, FieldError("parameters.items[1]", "Expected `int`, got `str`")),
        (
            {"items": [], "window": {"a": "b"}},
            FieldError("parameters.window[...]", "Expected `int`, got `str`"),
        ),
        ({"items": [], "x": 1}, FieldError("parameters.x", "unknown field")),
        ({}, FieldError("parameters.items", "required field is missing")),
        ("nope", FieldError("parameters", "Expected `object`, got `str`")),
    ],
)
def test_validation_errors_under_a_root(value: Any, expected: FieldError) -> None:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert(value, Params)

    err = validation_field_error(caught.value, root="parameters")

    assert err.field == expected.field
    assert expected.reason in err.reason


def test_non_utc_request_offsets_survive_decoding() -> None:
    body = (
        b'{"taskId": "x", "schedule": {"type": "once", "executeAt": "2026-06-01T12:00:00+02:00"}}'
    )

    req = msgspec.json.decode(body, type=JobCreate)

    assert isinstance(req.schedule, OnceSchedule)
    assert req.schedule.execute_at == datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
    assert req.schedule.execute_at.utcoffset() == timezone(timedelta(hours=2)).utcoffset(None)
