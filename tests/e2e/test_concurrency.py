"""Concurrency limits through real processes: two worker processes, one nats-server, the bound
observed in the status events (issue 17), a killed worker's slot reclaimed, ``skip``, and 422s."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.model import ExecutionStatus, StatusEvent
from jobsched.client import ApiError
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.e2e.limited_tasks import TASK_KEY, TASK_MAX, TASKS
from tests.e2e.test_cli_jobs import cli, cli_json
from tests.e2e.test_explain import explained
from tests.e2e.test_nats_api import nats_client
from tests.support import (
    Child,
    EventLog,
    Stack,
    env_for,
    problem_fields,
    start_stack,
    wait_executions,
)

pytestmark = pytest.mark.slow

ENDED = {ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.SKIPPED}


def most_running_at_once(events: list[StatusEvent], job_ids: set[str]) -> int:
    """The most runs of these jobs that were RUNNING at once, replaying the events in the order
    the status stream has them (a worker reports a run's outcome before it frees the slot, and
    the next run reports RUNNING after it took the slot, so that order is causal)."""
    running: set[str] = set()
    most = 0
    for e in events:
        if e.job_id not in job_ids:
            continue
        if e.status == ExecutionStatus.RUNNING:
            running.add(e.execution_id)
        elif e.status in ENDED or e.status == ExecutionStatus.RETRYING:
            running.discard(e.execution_id)
        most = max(most, len(running))
    return most


def workers(settings_env: dict[str, str], tmp_path: Path, n: int) -> list[Child]:
    return [
        Child(["worker"], {**settings_env, "JOBSCHED_WORKER_ID": f"w{i}"}, tmp_path / f"w{i}.log")
        for i in range(1, n + 1)
    ]


async def test_at_most_max_concurrent_runs_of_a_key_run_across_workers(
    make_settings: SettingsFactory, prefix: str, tmp_path: Path
) -> None:
    settings = make_settings()
    async with (
        start_stack(settings, Roles(gateway=True, scheduler=True)) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        # two runs at a time per worker and no look-ahead: the eight runs spread over all three
        children = workers(
            env_for(settings, JOBSCHED_WORKER_CONCURRENCY="2", JOBSCHED_WORKER_PREFETCH="0"),
            tmp_path,
            3,
        )
        try:
            client = stack.client()
            limited = [
                await client.create_job(
                    {
                        "taskId": "sleep",
                        "parameters": {"seconds": 0.6},
                        "concurrencyKey": "tenant-acme",
                        "maxConcurrent": 2,
                    }
                )
                for _ in range(8)
            ]
            free = await client.create_job({"taskId": "sleep", "parameters": {"seconds": 0.6}})
            ids = {j.id for j in limited}
            await log.wait_for(
                lambda evs: sum(e.job_id in ids and e.status in ENDED for e in evs) == 8,
                timeout_seconds=60,
                what="every limited run ended",
            )
            await log.wait_status(free.id, ExecutionStatus.SUCCEEDED, timeout_seconds=30)
        finally:
            for c in children:
                c.close()
        ended = [e for e in log.events if e.job_id in ids and e.status in ENDED]
        assert {e.status for e in ended} == {ExecutionStatus.SUCCEEDED}
        assert most_running_at_once(log.events, ids) == 2
        assert len({e.worker_id for e in ended}) >= 2  # the limit held across processes


async def test_a_tasks_default_limit_holds_across_workers_unless_a_job_sets_its_own(
    make_settings: SettingsFactory, prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(tasks=TASKS)  # the gateway and both workers load tenant_sleep
    async with (
        start_stack(settings, Roles(gateway=True, scheduler=True)) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        children = workers(
            env_for(settings, JOBSCHED_WORKER_CONCURRENCY="2", JOBSCHED_WORKER_PREFETCH="0"),
            tmp_path,
            2,
        )
        try:
            client = stack.client()
            [task] = [t for t in await client.tasks() if t["taskId"] == "tenant_sleep"]
            assert task["concurrency"] == {
                "key": TASK_KEY,
                "maxConcurrent": TASK_MAX,
                "policy": "queue",
            }
            body = {"taskId": "tenant_sleep", "parameters": {"seconds": 0.6, "tenant": "acme"}}
            limited = [await client.create_job(body) for _ in range(6)]
            own = await client.create_job({**body, "concurrencyKey": "solo-{tenant}"})
            with pytest.raises(ApiError) as missing:  # the task's key names tenant, unset here
                await client.create_job({"taskId": "tenant_sleep", "parameters": {"seconds": 0}})
            ids = {j.id for j in limited}
            await log.wait_for(
                lambda evs: sum(e.job_id in ids and e.status in ENDED for e in evs) == 6,
                timeout_seconds=60,
                what="every run under the task's limit ended",
            )
            await log.wait_status(own.id, ExecutionStatus.SUCCEEDED, timeout_seconds=30)
        finally:
            for c in children:
                c.close()
        assert {(j.concurrency_key, j.max_concurrent) for j in limited} == {(TASK_KEY, TASK_MAX)}
        assert (own.concurrency_key, own.max_concurrent) == ("solo-{tenant}", 1)
        assert (missing.value.status, problem_fields(missing.value)) == (422, ["concurrencyKey"])
        ended = [e for e in log.events if e.job_id in ids and e.status in ENDED]
        assert {e.status for e in ended} == {ExecutionStatus.SUCCEEDED}
        assert most_running_at_once(log.events, ids) == TASK_MAX
        assert len({e.worker_id for e in ended}) == 2  # the limit held across processes


async def test_a_killed_workers_slot_is_reclaimed_after_its_lease(
    make_settings: SettingsFactory, prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(ack_wait_seconds=30.0)  # no redelivery helps: the lease must expire
    async with (
        start_stack(settings, Roles(gateway=True, scheduler=True)) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        env = env_for(settings, JOBSCHED_WORKER_SLOT_LEASE_SECONDS="2")
        [first] = workers(env, tmp_path, 1)
        second: Child | None = None
        try:
            client = stack.client()
            body = {"taskId": "sleep", "concurrencyKey": "one", "maxConcurrent": 1}
            holder = await client.create_job({**body, "parameters": {"seconds": 300}})
            await log.wait_status(holder.id, ExecutionStatus.RUNNING, timeout_seconds=20)
            first.kill()
            second = Child(["worker"], {**env, "JOBSCHED_WORKER_ID": "w2"}, tmp_path / "w2.log")
            waiter = await client.create_job({**body, "parameters": {"seconds": 0}})
            await log.wait_status(waiter.id, ExecutionStatus.SUCCEEDED, timeout_seconds=30)
        finally:
            first.close()
            if second is not None:
                second.close()
        [done] = [e for e in log.of(waiter.id) if e.status == ExecutionStatus.SUCCEEDED]
        assert done.worker_id == "w2"


async def test_skip_policy_records_skipped_with_the_reason(
    make_settings: SettingsFactory, prefix: str, tmp_path: Path
) -> None:
    settings = make_settings()
    async with (
        start_stack(settings, Roles(gateway=True, scheduler=True)) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        [child] = workers(env_for(settings), tmp_path, 1)
        try:
            client = stack.client()
            body = {"taskId": "sleep", "concurrencyKey": "k", "concurrencyPolicy": "skip"}
            holder = await client.create_job({**body, "parameters": {"seconds": 300}})
            await log.wait_status(holder.id, ExecutionStatus.RUNNING, timeout_seconds=20)
            skipped = await client.create_job({**body, "parameters": {"seconds": 0}})
            await log.wait_status(skipped.id, ExecutionStatus.SKIPPED, timeout_seconds=20)
            [run] = await wait_executions(
                client, skipped.id, lambda rs: bool(rs) and rs[0].status == "SKIPPED"
            )
            await client.cancel_job(holder.id)
        finally:
            child.close()
        [event] = [e for e in log.of(skipped.id) if e.status == ExecutionStatus.SKIPPED]
        assert event.error is not None and event.error.startswith("concurrency:")
        assert run.error == event.error
        assert run.skip_reason == event.error  # as an overlap skip's


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"concurrencyKey": "tenant-{customer}"}, "concurrencyKey"),
        ({"concurrencyKey": "{seconds}"}, "concurrencyKey"),  # a float is no key
        ({"concurrencyKey": "x{"}, "concurrencyKey"),
        ({"maxConcurrent": 2}, "maxConcurrent"),
        ({"concurrencyKey": "k", "maxConcurrent": 0}, "maxConcurrent"),
        ({"concurrencyKey": "k", "concurrencyPolicy": "drop"}, "concurrencyPolicy"),
    ],
)
async def test_an_invalid_limit_is_a_422_naming_the_field(
    make_settings: SettingsFactory, extra: dict[str, object], field: str
) -> None:
    async with start_stack(make_settings(), Roles(gateway=True)) as stack:
        client = stack.client()
        with pytest.raises(ApiError) as e:
            await client.create_job({"taskId": "sleep", "parameters": {"seconds": 1.5}, **extra})
        assert e.value.status == 422
        assert problem_fields(e.value) == [field]
        job = await client.create_job({"taskId": "sleep", "parameters": {"seconds": 1}})
        with pytest.raises(ApiError) as e:
            await client.patch_job(job.id, {"concurrencyKey": "{nope}"})
        assert (e.value.status, problem_fields(e.value)) == (422, ["concurrencyKey"])


async def test_the_cli_sets_and_removes_a_limit(stack: Stack) -> None:
    job = await cli_json(
        stack, "submit", "generate_report", "--param", "reportType=sales", "--param", "region=eu",
        "--every", "3600", "--concurrency-key", "region-{region}", "--max-concurrent", "2",
        "--concurrency-policy", "skip",
    )  # fmt: skip
    assert (job["concurrencyKey"], job["maxConcurrent"], job["concurrencyPolicy"]) == (
        "region-{region}",
        2,
        "skip",
    )
    shown = (await cli(stack, "get", job["id"], "-o", "table")).stdout
    assert "region-{region} (max 2, skip)" in shown
    patched = await cli_json(stack, "patch", job["id"], "--concurrency-key", "")
    assert patched["concurrencyKey"] is None
    bad = await cli(stack, "patch", job["id"], "--concurrency-key", "{nope}", code=1)
    assert "422" in bad.output and "concurrencyKey" in bad.output


async def test_the_nats_api_takes_the_same_fields(stack: Stack) -> None:
    async with nats_client(stack) as api:
        job = await api.create_job(
            {
                "taskId": "sleep",
                "parameters": {"seconds": 0},
                "concurrencyKey": "k",
                "maxConcurrent": 3,
            }
        )
        assert (job.concurrency_key, job.max_concurrent) == ("k", 3)
        with pytest.raises(ApiError) as e:
            await api.create_job(
                {"taskId": "sleep", "parameters": {"seconds": 0}, "maxConcurrent": 3}
            )
        assert (e.value.status, problem_fields(e.value)) == (422, ["maxConcurrent"])
        patched = await api.patch_job(job.id, {"maxConcurrent": 1})
        assert (patched.concurrency_key, patched.max_concurrent) == ("k", 1)
        with pytest.raises(ApiError) as bad:
            await api.patch_job(job.id, {"concurrencyKey": "{nope}"})
        assert (bad.value.status, problem_fields(bad.value)) == (422, ["concurrencyKey"])
        async with nats_client(stack, "bob") as bob:
            with pytest.raises(ApiError) as other:
                await bob.patch_job(job.id, {"maxConcurrent": 2})
            assert other.value.status == 404


async def test_explain_says_a_run_waits_on_a_key_held_by_another_run(
    make_settings: SettingsFactory, prefix: str, tmp_path: Path
) -> None:
    settings = make_settings()
    async with (
        start_stack(settings, Roles(gateway=True, scheduler=True)) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        [worker] = workers(env_for(settings), tmp_path, 1)
        try:
            client = stack.client()
            body = {"taskId": "sleep", "concurrencyKey": "tenant-a", "maxConcurrent": 1}
            holder = await client.create_job({**body, "parameters": {"seconds": 300}})
            await log.wait_status(holder.id, ExecutionStatus.RUNNING, timeout_seconds=20)
            [held] = [e for e in log.of(holder.id) if e.status == ExecutionStatus.RUNNING]
            waiter = await client.create_job({**body, "parameters": {"seconds": 0}})
            answer = await explained(  # a warning until its run is dispatched, then blocking
                client, waiter.id, lambda a: a.reasons[0].severity == "blocking"
            )
            reason = answer.reasons[0]
            assert reason.code == "concurrency_waiting"
            assert reason.details["concurrencyKey"] == "tenant-a"
            assert reason.details["runningExecutionIds"] == held.execution_id
            assert reason.details["position"] == 0
            async with nats_client(stack) as api:
                over_nats = await api.explain(waiter.id)
            assert over_nats.reasons[0].code == "concurrency_waiting"
            # the holder itself is not waiting
            mine = await client.explain(holder.id)
            assert "concurrency_waiting" not in [r.code for r in mine.reasons]
            await client.cancel_job(holder.id)
            await log.wait_status(waiter.id, ExecutionStatus.SUCCEEDED, timeout_seconds=30)
        finally:
            worker.close()
