"""core/model JobSpec: one list of a job's options, which a Job extends, a POST body fills and a
PATCH body changes; the JSON shape of a job stays as the API and the dashboards know it."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from core.model import (
    SPEC_FIELDS,
    CronSchedule,
    CronScheduleIn,
    ImmediateSchedule,
    Job,
    JobCreate,
    JobPatch,
    JobSpec,
    MisfirePolicy,
    OverlapPolicy,
    patched_spec,
    requested_spec,
    spec_values,
)

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
SPEC = JobSpec(
    task_id="noop",
    schedule=CronSchedule(expression="0 8 * * *", timezone="Europe/Berlin"),
    parameters={"a": 1},
    queue="reports",
    max_attempts=5,
    timeout_seconds=60.0,
    misfire_policy=MisfirePolicy.SKIP,
    max_catch_up=3,
    overlap_policy=OverlapPolicy.BUFFER_ONE,
    history_limit=25,
    history_max_age_seconds=3600.0,
)
JOB_KEYS = {
    "id", "owner", "taskId", "schedule", "parameters", "queue", "maxAttempts", "timeoutSeconds",
    "misfirePolicy", "misfireGraceSeconds", "maxCatchUp", "overlapPolicy", "historyLimit",
    "historyMaxAgeSeconds", "status", "partition", "createdAt", "updatedAt", "nextRunAt",
    "lastRunAt", "lastRunStatus", "lastError", "lastExecutionId", "lastScheduledFor",
    "lastDispatchedFor", "runCount", "idempotencyKey", "name", "labels", "notify",
    "concurrencyKey", "maxConcurrent", "concurrencyPolicy",
}  # fmt: skip


def a_job(spec: JobSpec = SPEC) -> Job:
    return Job(**spec_values(spec), id="j1", owner="alice", created_at=T0, updated_at=T0)


def test_a_job_is_its_spec_and_its_state_in_one_flat_object() -> None:
    job = a_job()

    assert job.spec == SPEC
    assert set(msgspec.to_builtins(job)) == JOB_KEYS
    assert msgspec.json.decode(msgspec.json.encode(job), type=Job) == job


def test_a_spec_alone_encodes_only_what_differs_from_the_defaults() -> None:
    spec = JobSpec(task_id="noop", schedule=ImmediateSchedule(), queue="reports")

    assert msgspec.json.decode(msgspec.json.encode(spec)) == {
        "taskId": "noop",
        "schedule": {"type": "immediate"},
        "queue": "reports",
    }


def test_a_post_body_gives_every_option_with_what_the_gateway_resolved() -> None:
    body = JobCreate(task_id="noop", schedule=CronScheduleIn(expression="* * * * *"), queue="q")
    normalized = CronSchedule(expression="* * * * *")

    spec = requested_spec(body, schedule=normalized, max_attempts=4, timeout_seconds=9.0)

    assert spec.schedule == normalized and type(spec.schedule) is CronSchedule
    assert (spec.queue, spec.max_attempts, spec.timeout_seconds) == ("q", 4, 9.0)
    assert spec_values(spec).keys() == set(SPEC_FIELDS)


def test_a_patch_changes_only_what_it_sets() -> None:
    assert patched_spec(SPEC, JobPatch()) == SPEC

    changed = patched_spec(SPEC, JobPatch(queue="other", max_catch_up=7, parameters={}))

    assert (changed.queue, changed.max_catch_up, changed.parameters) == ("other", 7, {})
    assert spec_values(changed) == {**spec_values(SPEC), **spec_values(changed)}
    assert changed.history_limit == 25 and changed.overlap_policy == OverlapPolicy.BUFFER_ONE


def test_a_patch_null_history_goes_back_to_the_deployment_default() -> None:
    cleared = patched_spec(SPEC, JobPatch(history_limit=None))

    assert cleared.history_limit is None
    assert cleared.history_max_age_seconds == 3600.0


def test_a_patch_takes_the_schedule_the_gateway_normalized() -> None:
    normalized = CronSchedule(expression="5 8 * * *", timezone="UTC")
    patch = JobPatch(schedule=CronScheduleIn(expression="5 8 * * *"))

    assert patched_spec(SPEC, patch, schedule=normalized).schedule == normalized
