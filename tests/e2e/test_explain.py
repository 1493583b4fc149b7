"""``GET /jobs/{id}/explain`` and the NATS API's ``explain`` on the real stack (real nats-server
under the roles' permissions, SQLite, HTTP): healthy, paused, waiting on the overlap policy, no
scheduler owning the partition, a queue without consumer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from core.explain import Explanation
from jobsched.client import ApiError, JobschedClient
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.e2e.test_cli_jobs import cli
from tests.e2e.test_nats_api import nats_client
from tests.support import Stack, start_stack, wait_executions


def codes(answer: Explanation) -> list[str]:
    return [r.code for r in answer.reasons]


async def explained(
    client: JobschedClient,
    job_id: str,
    predicate: Callable[[Explanation], bool],
    *,
    timeout_seconds: float = 15.0,
) -> Explanation:
    """Ask until the explanation satisfies ``predicate`` (the stack's state settles)."""
    answer: Explanation | None = None
    try:
        async with asyncio.timeout(timeout_seconds):
            while True:
                answer = await client.explain(job_id)
                if predicate(answer):
                    return answer
                await asyncio.sleep(0.05)
    except TimeoutError:
        got = answer.reasons if answer is not None else None
        raise TimeoutError(f"explain of {job_id} never matched; last: {got}") from None


async def test_healthy_then_paused_over_http_and_nats(stack: Stack) -> None:
    client = stack.client()
    scheduler = stack.settings.scheduler.resolved_scheduler_id
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 3600}}
    )
    answer = await explained(
        client, job.id, lambda a: a.reasons[0].details.get("owner") is not None
    )
    [healthy] = answer.reasons
    assert healthy.code == "scheduled"
    assert healthy.details["owner"] == scheduler, "the lease holder, read from the bucket"
    assert healthy.details["partition"] == job.partition
    assert f"owned by scheduler {scheduler}" in healthy.message

    async with nats_client(stack) as api, nats_client(stack, "bob") as bob:
        over_nats = await api.explain(job.id)
        assert codes(over_nats) == ["scheduled"]
        with pytest.raises(ApiError) as other:
            await bob.explain(job.id)
        assert other.value.status == 404
        assert other.value.problem is not None and other.value.problem.code == "job_not_found"
        await api.pause_job(job.id)
        assert codes(await api.explain(job.id)) == ["paused"]
    assert codes(await client.explain(job.id)) == ["paused"]
    with pytest.raises(ApiError) as http_other:
        await stack.client("bob").explain(job.id)
    assert http_other.value.status == 404


async def test_a_run_waiting_on_buffer_one_names_the_active_run(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {
            "taskId": "sleep",
            "parameters": {"seconds": 60},
            "schedule": {"type": "interval", "everySeconds": 1},
            "overlapPolicy": "bufferOne",
        }
    )
    [active] = await wait_executions(
        client, job.id, lambda rs: [r.status for r in rs] == ["RUNNING"]
    )
    answer = await explained(
        client,
        job.id,
        lambda a: (a.reasons[0].code, a.reasons[0].severity) == ("overlap_waiting", "blocking"),
    )
    first = answer.reasons[0]
    assert first.details["executionId"] == active.id and active.id in first.message
    assert first.details["overlapPolicy"] == "bufferOne"
    assert "running" in codes(answer), "and the run it waits for"
    await client.cancel_job(job.id)
    await wait_executions(client, job.id, lambda rs: rs[0].status == "CANCELLED")


async def test_without_a_scheduler_nobody_owns_the_partition(
    make_settings: SettingsFactory,
) -> None:
    async with start_stack(make_settings(), Roles(gateway=True)) as stack:
        client = stack.client()
        job = await client.create_job(
            {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 3600}}
        )
        answer = await client.explain(job.id)
        assert codes(answer)[0] == "no_owner"
        assert answer.reasons[0].details == {"partition": job.partition}
        no_consumer = next(r for r in answer.reasons if r.code == "queue_no_consumer")
        assert no_consumer.severity == "warning", "no run of the job waits in it yet"
        assert "check_unavailable" not in codes(answer), "every check was made"
        run = await client.trigger_job(job.id)
        answer = await client.explain(job.id)
        waiting = next(r for r in answer.reasons if r.code == "queue_no_consumer")
        assert (waiting.severity, waiting.details["executionId"]) == ("blocking", run.id)
        assert codes(answer)[:2] == ["no_owner", "queue_no_consumer"]


async def test_the_cli_explains_in_sentences_or_json(stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 3600}}
    )
    await stack.client().pause_job(job.id)
    table = await cli(stack, "explain", job.id)
    lines = table.stdout.splitlines()
    assert lines[0] == f"job {job.id} is PAUSED; next run: -"
    assert lines[1].startswith("- BLOCKING (paused): the job is paused: no run starts until")
    answer = json.loads((await cli(stack, "explain", job.id, "-o", "json")).stdout)
    assert (answer["jobId"], answer["status"], answer["nextRunAt"]) == (job.id, "PAUSED", None)
    assert [r["code"] for r in answer["reasons"]] == ["paused"]
    other = await cli(stack, "explain", job.id, user="bob", code=1)
    assert "404" in other.output
