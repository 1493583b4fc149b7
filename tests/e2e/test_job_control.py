"""Job control through the API on the real stack: pause, resume, cancel, trigger, delete, PATCH,
Idempotency-Key, overlap policies, jitter, start/end, upcoming."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import pytest

from core.clock import FakeClock
from core.model import Execution, ExecutionStatus, IntervalSchedule, JobStatus
from jobsched.client import ApiError
from tests.conftest import SettingsFactory
from tests.support import (
    EventLog,
    Stack,
    problem_fields,
    start_stack,
    succeeded,
    wait_executions,
    wait_job,
)


async def api_error(call: Awaitable[object]) -> ApiError:
    try:
        await call
    except ApiError as e:
        return e
    raise AssertionError("the call succeeded")


async def test_pause_stops_runs_and_resume_continues_from_now(
    make_settings: SettingsFactory,
) -> None:
    clock = FakeClock(datetime(2026, 6, 1, 10, 0, 30, tzinfo=UTC))
    async with start_stack(make_settings(), clock=clock) as stack:
        client = stack.client()
        job = await client.create_job(
            {"taskId": "noop", "schedule": {"type": "cron", "expression": "* * * * *"}}
        )
        await clock.set(datetime(2026, 6, 1, 10, 1, tzinfo=UTC))
        await wait_executions(client, job.id, lambda rs: [r.status for r in rs] == ["SUCCEEDED"])

        paused = await client.pause_job(job.id)
        assert (paused.status, paused.next_run_at) == (JobStatus.PAUSED, None)
        assert await client.upcoming(job.id) == []
        assert (await api_error(client.pause_job(job.id))).status == 409

        await clock.set(datetime(2026, 6, 1, 10, 30, 20, tzinfo=UTC))
        resumed = await client.resume_job(job.id)
        assert resumed.status == JobStatus.SCHEDULED
        assert resumed.next_run_at == datetime(2026, 6, 1, 10, 31, tzinfo=UTC), "from now: no storm"
        await clock.set(datetime(2026, 6, 1, 10, 31, tzinfo=UTC))
        runs = await wait_executions(
            client, job.id, lambda rs: len(rs) == 2 and rs[0].status == "SUCCEEDED"
        )
        assert [r.scheduled_for.minute for r in runs] == [31, 1]


async def test_cancel_stops_a_running_run_and_every_later_one(stack: Stack, prefix: str) -> None:
    client = stack.client()
    async with EventLog(stack.settings.nats.url, prefix) as log:
        job = await client.create_job(
            {
                "taskId": "sleep",
                "parameters": {"seconds": 60},
                "schedule": {"type": "interval", "everySeconds": 1},
            }
        )
        await log.wait_status(job.id, ExecutionStatus.RUNNING, timeout_seconds=10)
        cancelled = await client.cancel_job(job.id)
        assert (cancelled.status, cancelled.next_run_at) == (JobStatus.CANCELLED, None)
        await log.wait_status(job.id, ExecutionStatus.CANCELLED, timeout_seconds=10)
    runs = await wait_executions(
        client,
        job.id,
        lambda rs: (
            any(r.status == "CANCELLED" for r in rs)
            and not any(r.status in ("QUEUED", "RUNNING", "RETRYING") for r in rs)
        ),
    )
    assert (await client.get_job(job.id)).status == JobStatus.CANCELLED
    assert (await api_error(client.resume_job(job.id))).status == 409
    assert (await api_error(client.trigger_job(job.id))).status == 409
    assert all(r.status in ("CANCELLED", "SKIPPED") for r in runs)


async def test_trigger_runs_once_now_and_keeps_the_schedule(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}
    )
    run = await client.trigger_job(job.id)
    assert run.trigger == "manual" and run.status == ExecutionStatus.QUEUED
    [done] = await wait_executions(
        client, job.id, lambda rs: len(rs) == 1 and rs[0].status == "SUCCEEDED"
    )
    assert done.id == run.id
    again = await client.get_job(job.id)
    assert again.next_run_at == job.next_run_at
    assert again.last_run_status == ExecutionStatus.SUCCEEDED


async def test_concurrent_triggers_each_get_their_own_run(stack: Stack) -> None:
    """Triggers within one millisecond are still distinct runs: every 201 is a stored run."""
    client = stack.client()
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}
    )
    runs = await asyncio.gather(*(client.trigger_job(job.id) for _ in range(12)))
    assert len({r.id for r in runs}) == 12
    done = await wait_executions(
        client, job.id, lambda rs: len(rs) == 12 and all(r.status == "SUCCEEDED" for r in rs)
    )
    assert {r.id for r in done} == {r.id for r in runs}


async def test_delete_removes_the_job_and_cancels_its_run(stack: Stack, prefix: str) -> None:
    client = stack.client()
    async with EventLog(stack.settings.nats.url, prefix) as log:
        job = await client.create_job({"taskId": "sleep", "parameters": {"seconds": 60}})
        await log.wait_status(job.id, ExecutionStatus.RUNNING, timeout_seconds=10)
        await client.delete_job(job.id)
        await log.wait_status(job.id, ExecutionStatus.CANCELLED, timeout_seconds=10)
    assert (await api_error(client.get_job(job.id))).status == 404
    assert (await api_error(client.delete_job(job.id))).status == 404


async def test_patch_changes_the_schedule_and_validates(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {
            "taskId": "generate_report",
            "parameters": {"reportType": "sales", "region": "eu"},
            "schedule": {"type": "cron", "expression": "0 3 * * *"},
        }
    )
    changed = await client.patch_job(
        job.id,
        {
            "schedule": {"type": "interval", "everySeconds": 3600},
            "maxAttempts": 5,
            "overlapPolicy": "allow",
        },
    )
    assert isinstance(changed.schedule, IntervalSchedule)
    assert changed.schedule.every_seconds == 3600
    assert changed.max_attempts == 5 and changed.overlap_policy == "allow"
    assert changed.next_run_at != job.next_run_at
    assert changed.parameters == job.parameters
    bad = await api_error(
        client.patch_job(job.id, {"parameters": {"reportType": "nope", "region": "eu"}})
    )
    assert bad.status == 422 and problem_fields(bad)[:1] == ["parameters.reportType"]
    unknown = await api_error(client.patch_job(job.id, {"taskId": "noop"}))
    assert unknown.status == 422 and problem_fields(unknown)[:1] == ["taskId"]
    await client.cancel_job(job.id)
    assert (await api_error(client.patch_job(job.id, {"maxAttempts": 2}))).status == 409


async def test_idempotency_key_returns_the_original_job(stack: Stack) -> None:
    client = stack.client()
    body = {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2099-01-01T00:00:00Z"}}
    first, replayed1 = await client.create_job_idempotent(body, "order-42")
    second, replayed2 = await client.create_job_idempotent(body, "order-42")
    assert (replayed1, replayed2) == (False, True)
    assert second.id == first.id
    other = await api_error(
        client.create_job_idempotent({**body, "parameters": {}, "maxAttempts": 2}, "order-42")
    )
    assert other.status == 409 and other.problem and other.problem.code == "idempotency_key_reused"
    for same_instant in ("2099-01-01T01:00:00+01:00", "2098-12-31T19:00:00.000-05:00"):
        again, replayed = await client.create_job_idempotent(
            {**body, "schedule": {"type": "once", "executeAt": same_instant}}, "order-42"
        )
        assert (again.id, replayed) == (first.id, True), same_instant
    later = await api_error(
        client.create_job_idempotent(
            {**body, "schedule": {"type": "once", "executeAt": "2099-01-01T00:00:00.001Z"}},
            "order-42",
        )
    )
    assert later.status == 409
    assert len((await client.list_jobs()).items) == 1
    bob_job, _ = await stack.client("bob").create_job_idempotent(body, "order-42")
    assert bob_job.id != first.id


async def overlapping(stack: Stack, prefix: str, policy: str, *, runs: int) -> list[Execution]:
    """An interval job every 1 s whose task takes 2.5 s, until ``runs`` runs finished."""
    client = stack.client()
    async with EventLog(stack.settings.nats.url, prefix) as log:
        job = await client.create_job(
            {
                "taskId": "sleep",
                "parameters": {"seconds": 2.5},
                "schedule": {"type": "interval", "everySeconds": 1},
                "overlapPolicy": policy,
            }
        )
        await log.wait_for(
            lambda evs: (
                sum(1 for e in evs if e.job_id == job.id and e.status in ("SUCCEEDED", "CANCELLED"))
                >= runs
            ),
            timeout_seconds=30,
            what=f"{runs} finished runs",
        )
        await client.pause_job(job.id)
    return await wait_executions(
        client, job.id, lambda rs: sum(r.status in ("SUCCEEDED", "CANCELLED") for r in rs) >= runs
    )


def started_at(run: Execution) -> datetime:
    assert run.started_at is not None, f"run {run.id} never started"
    return run.started_at


def finished_at(run: Execution) -> datetime:
    assert run.finished_at is not None, f"run {run.id} never finished"
    return run.finished_at


@pytest.mark.slow
async def test_overlap_forbid_skips_occurrences_while_a_run_is_running(
    stack: Stack, prefix: str
) -> None:
    runs = await overlapping(stack, prefix, "forbid", runs=2)
    skipped = [r for r in runs if r.status == "SKIPPED"]
    assert skipped and all(r.skip_reason and r.skip_reason.startswith("overlap") for r in skipped)
    done = sorted((r for r in runs if r.status == "SUCCEEDED"), key=lambda r: r.scheduled_for)
    assert (
        done[0].finished_at
        and done[1].started_at
        and done[1].started_at >= done[0].finished_at - timedelta(milliseconds=50)
    )


@pytest.mark.slow
async def test_overlap_allow_runs_concurrently(stack: Stack, prefix: str) -> None:
    runs = await overlapping(stack, prefix, "allow", runs=2)
    assert not [r for r in runs if r.status == "SKIPPED"]
    done = sorted((r for r in runs if r.started_at), key=started_at)
    assert done[0].finished_at and done[1].started_at and done[1].started_at < done[0].finished_at


@pytest.mark.slow
async def test_overlap_buffer_one_runs_right_after_the_current_one(
    stack: Stack, prefix: str
) -> None:
    runs = await overlapping(stack, prefix, "bufferOne", runs=2)
    done = sorted((r for r in runs if r.status == "SUCCEEDED"), key=started_at)
    gap = (started_at(done[1]) - finished_at(done[0])).total_seconds()
    assert -0.05 <= gap < 1.0, f"the buffered run starts right after the previous one ({gap:.2f} s)"


@pytest.mark.slow
async def test_overlap_replace_cancels_the_running_run(stack: Stack, prefix: str) -> None:
    runs = await overlapping(stack, prefix, "replace", runs=2)
    assert any(r.status == "CANCELLED" for r in runs)


async def test_jitter_delays_runs_within_the_bound(make_settings: SettingsFactory) -> None:
    clock = FakeClock(datetime(2026, 6, 1, 10, 0, 0, tzinfo=UTC))
    async with start_stack(make_settings(), clock=clock) as stack:
        client = stack.client()
        job = await client.create_job(
            {
                "taskId": "noop",
                "schedule": {"type": "interval", "everySeconds": 60, "jitterSeconds": 30},
            }
        )
        await clock.set(datetime(2026, 6, 1, 10, 1, 0, tzinfo=UTC))
        await clock.set(datetime(2026, 6, 1, 10, 1, 31, tzinfo=UTC))
        [run] = await wait_executions(
            client, job.id, lambda rs: len(rs) == 1 and rs[0].status == "SUCCEEDED"
        )
    assert 0 <= run.jitter_ms <= 30_000
    assert run.published_at is not None
    assert run.published_at >= run.scheduled_for + timedelta(milliseconds=run.jitter_ms)


async def test_start_and_end_bound_the_runs(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {
            "taskId": "noop",
            "schedule": {
                "type": "cron",
                "expression": "0 * * * *",
                "timezone": "Europe/Berlin",
                "startAt": "2099-03-01T00:00:00+01:00",
                "endAt": "2099-03-01T03:30:00+01:00",
            },
        }
    )
    assert job.next_run_at == datetime(2099, 2, 28, 23, 0, tzinfo=UTC)
    assert await client.upcoming(job.id, count=10) == [
        datetime(2099, 2, 28, 23 + h, 0, tzinfo=UTC)
        if h == 0
        else datetime(2099, 3, 1, h - 1, 0, tzinfo=UTC)
        for h in range(4)
    ]
    bad = await api_error(
        client.create_job(
            {
                "taskId": "noop",
                "schedule": {
                    "type": "interval",
                    "everySeconds": 60,
                    "startAt": "2099-03-01T00:00:00Z",
                    "endAt": "2099-02-01T00:00:00Z",
                },
            }
        )
    )
    assert bad.status == 422 and problem_fields(bad)[:1] == ["schedule.endAt"]


async def test_a_job_whose_schedule_ends_finishes_with_its_last_outcome(
    make_settings: SettingsFactory,
) -> None:
    clock = FakeClock(datetime(2026, 6, 1, 10, 0, 0, tzinfo=UTC))
    async with start_stack(make_settings(), clock=clock) as stack:
        client = stack.client()
        job = await client.create_job(
            {
                "taskId": "noop",
                "schedule": {
                    "type": "interval",
                    "everySeconds": 60,
                    "endAt": "2026-06-01T10:02:30Z",
                },
            }
        )
        for minute in (1, 2):
            await clock.set(datetime(2026, 6, 1, 10, minute, tzinfo=UTC))
            await wait_executions(client, job.id, succeeded(minute))
        done = await wait_job(client, job.id, {"SUCCEEDED"})
        assert done.next_run_at is None


async def test_resume_keeps_an_interval_jobs_phase(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 600}}
    )
    await client.pause_job(job.id)
    resumed = await client.resume_job(job.id)
    assert resumed.next_run_at == job.next_run_at, "the grid through the creation time is kept"
