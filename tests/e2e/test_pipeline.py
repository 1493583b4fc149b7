"""The whole pipeline on real parts: HTTP gateway → SQLite → scheduler → JetStream → worker →
status stream → recorder → SQLite, observed through the API and the status events."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from core.model import ExecutionStatus, JobStatus, OnceSchedule
from tests.conftest import SettingsFactory
from tests.support import EventLog, Stack, start_stack, wait_executions, wait_job


async def test_immediate_job_reaches_succeeded(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job({"taskId": "noop"})
    assert job.status == JobStatus.SCHEDULED
    done = await wait_job(client, job.id, {"SUCCEEDED", "FAILED"})
    assert done.status == JobStatus.SUCCEEDED
    assert done.next_run_at is None
    assert done.last_run_status == ExecutionStatus.SUCCEEDED
    [run] = await wait_executions(client, job.id, lambda rs: len(rs) == 1, what="one run")
    assert run.status == ExecutionStatus.SUCCEEDED
    assert run.attempt == 1
    assert run.id == f"{job.id}:{run.scheduled_for.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z"
    assert (
        run.published_at is not None and run.started_at is not None and run.finished_at is not None
    )
    assert run.scheduled_for <= run.published_at <= run.started_at <= run.finished_at
    assert run.worker_id


async def test_once_job_starts_within_two_seconds_of_execute_at(stack: Stack) -> None:
    client = stack.client()
    at = datetime.now(UTC) + timedelta(seconds=2)
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": at.isoformat()}}
    )
    assert isinstance(job.schedule, OnceSchedule)
    assert job.next_run_at == job.schedule.execute_at
    await wait_job(client, job.id, {"SUCCEEDED"}, timeout_seconds=10)
    [run] = await wait_executions(client, job.id, lambda rs: len(rs) == 1)
    assert run.scheduled_for == job.next_run_at
    assert run.started_at is not None
    delay = (run.started_at - run.scheduled_for).total_seconds()
    assert 0 <= delay < 2.0, f"started {delay:.3f} s after executeAt"


async def test_interval_job_runs_repeatedly_from_its_scheduled_times(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 1}}
    )
    runs = await wait_executions(
        client,
        job.id,
        lambda rs: sum(r.status == ExecutionStatus.SUCCEEDED for r in rs) >= 3,
        what="3 succeeded runs",
    )
    times = sorted(r.scheduled_for for r in runs)
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(times)}
    assert gaps == {1.0}, "occurrences follow the previous scheduled time, not 'now'"
    current = await client.get_job(job.id)
    assert current.next_run_at is not None and current.next_run_at > times[0]
    assert current.last_run_status == ExecutionStatus.SUCCEEDED
    assert current.status in (JobStatus.SCHEDULED, JobStatus.RUNNING)


async def test_failing_task_retries_with_growing_delays_then_succeeds(
    stack: Stack, prefix: str
) -> None:
    client = stack.client()
    async with EventLog(stack.settings.nats.url, prefix) as log:
        job = await client.create_job(
            {"taskId": "fail", "parameters": {"times": 2}, "maxAttempts": 3}
        )
        await log.wait_status(job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=15)
    events = log.of(job.id)
    running = [e for e in events if e.status == ExecutionStatus.RUNNING]
    retrying = [e for e in events if e.status == ExecutionStatus.RETRYING]
    assert [e.attempt for e in running] == [1, 2, 3]
    assert [e.attempt for e in retrying] == [1, 2]
    waits = [(running[i + 1].at - retrying[i].at).total_seconds() for i in range(2)]
    assert waits[0] > 0.2 and waits[1] > waits[0], f"backoff must grow: {waits}"
    done = await wait_job(client, job.id, {"SUCCEEDED"})
    assert done.last_error is None
    [run] = await wait_executions(
        client, job.id, lambda rs: bool(rs) and rs[0].status == "SUCCEEDED"
    )
    assert run.attempt == 3
    assert run.error is None
    assert [(a.attempt, a.outcome, a.redelivered) for a in run.attempts] == [
        (1, ExecutionStatus.RETRYING, False),
        (2, ExecutionStatus.RETRYING, False),
        (3, ExecutionStatus.SUCCEEDED, False),
    ]
    assert [(a.started_at, a.worker_id) for a in run.attempts] == [
        (e.started_at, e.worker_id) for e in running
    ]
    assert [a.finished_at for a in run.attempts[:2]] == [e.at for e in retrying]
    assert all(a.error and "failing on purpose" in a.error for a in run.attempts[:2])
    assert run.started_at == run.attempts[0].started_at  # the run's first start


async def test_task_failing_every_attempt_ends_failed_with_the_error(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job({"taskId": "fail", "parameters": {"times": 5}, "maxAttempts": 3})
    done = await wait_job(client, job.id, {"FAILED"}, timeout_seconds=15)
    assert done.last_run_status == ExecutionStatus.FAILED
    assert done.last_error and "failing on purpose: attempt 3" in done.last_error
    [run] = await wait_executions(client, job.id, lambda rs: bool(rs) and rs[0].status == "FAILED")
    assert run.attempt == 3
    assert run.error and "TaskFailed" in run.error
    failed = await client.list_jobs(status="FAILED")
    assert [j.id for j in failed.items] == [job.id]


async def test_run_longer_than_ack_wait_runs_exactly_once(
    make_settings: SettingsFactory, prefix: str
) -> None:
    """Case S05: in-progress acks keep a long run from being redelivered."""
    settings = make_settings(ack_wait_seconds=1.0)
    async with start_stack(settings) as stack, EventLog(settings.nats.url, prefix) as log:
        client = stack.client()
        job = await client.create_job({"taskId": "sleep", "parameters": {"seconds": 3.5}})
        await log.wait_status(job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=15)
        done = await wait_job(client, job.id, {"SUCCEEDED"})
        runs = await wait_executions(client, job.id, lambda rs: len(rs) == 1)
    assert [(e.status, e.attempt) for e in log.of(job.id)] == [
        (ExecutionStatus.QUEUED, 0),
        (ExecutionStatus.RUNNING, 1),
        (ExecutionStatus.SUCCEEDED, 1),
    ]
    assert runs[0].attempt == 1
    assert done.status == JobStatus.SUCCEEDED


async def test_generate_report_writes_a_csv_in_the_data_dir(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {"taskId": "generate_report", "parameters": {"reportType": "sales", "region": "ACME-42"}}
    )
    await wait_job(client, job.id, {"SUCCEEDED"}, timeout_seconds=30)
    [run] = await wait_executions(client, job.id, lambda rs: len(rs) == 1)
    path = run.result["path"]
    assert (
        path.startswith(stack.settings.data_dir.rstrip("/").replace("./", "")) or "reports" in path
    )
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "account,reportType,amount"
    assert len(lines) == 1 + 1000 + 1
    assert lines[-1].startswith("TOTAL,sales,")


async def test_cleanup_export_deletes_the_export(stack: Stack) -> None:
    from pathlib import Path

    exports = Path(stack.settings.data_dir) / "exports"
    exports.mkdir(parents=True, exist_ok=True)
    (exports / "exp-1.csv").write_text("a,b\n")
    client = stack.client()
    job = await client.create_job({"taskId": "cleanup_export", "parameters": {"exportId": "exp-1"}})
    await wait_job(client, job.id, {"SUCCEEDED"})
    [run] = await wait_executions(client, job.id, lambda rs: len(rs) == 1)
    assert run.result == {"deleted": True}
    assert not (exports / "exp-1.csv").exists()


async def test_users_see_only_their_own_jobs(stack: Stack) -> None:
    alice, bob = stack.client("alice"), stack.client("bob")
    job = await alice.create_job({"taskId": "noop"})
    assert [j.id for j in (await alice.list_jobs()).items] == [job.id]
    assert (await bob.list_jobs()).items == []
    from jobsched.client import ApiError

    for call in (bob.get_job(job.id), bob.list_executions(job.id)):
        try:
            await call
        except ApiError as e:
            assert e.status == 404
            assert e.problem is not None and e.problem.code == "job_not_found"
        else:
            raise AssertionError("bob read alice's job")
