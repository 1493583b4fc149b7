"""The NATS request-reply API: every operation round-trips; errors are the HTTP problems."""

from __future__ import annotations

import aiohttp
import msgspec
import nats
import pytest

from jobsched.client import ApiError, NatsJobschedClient
from tests.natsauth import api_credentials, observer_url
from tests.support import Stack, problem_fields, wait_job


def nats_client(stack: Stack, user: str = "alice", token: str | None = None) -> NatsJobschedClient:
    return NatsJobschedClient(
        stack.settings.nats.url,
        token or stack.token(user),
        prefix=stack.settings.nats.subject_prefix,
        credentials=api_credentials(stack.settings),
    )


async def test_every_operation_round_trips(stack: Stack) -> None:
    async with nats_client(stack) as api:
        job = await api.create_job(
            {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}
        )
        assert (await api.get_job(job.id)).id == job.id
        page = await api.list_jobs(status="SCHEDULED", limit=10)
        assert [j.id for j in page.items] == [job.id]
        assert (await api.pause_job(job.id)).status == "PAUSED"
        assert (await api.resume_job(job.id)).status == "SCHEDULED"
        run = await api.trigger_job(job.id)
        assert run.trigger == "manual"
        await wait_job(stack.client(), job.id, {"SCHEDULED"})
        page_of_runs = await api.list_executions(job.id, limit=5)
        assert [r.id for r in page_of_runs.items] == [run.id]
        assert (await api.get_execution(job.id, run.id)).id == run.id
        with pytest.raises(ApiError) as missing:
            await api.get_execution(job.id, "nope")
        assert missing.value.problem is not None
        assert (missing.value.status, missing.value.problem.code) == (404, "execution_not_found")
        assert (await api.cancel_job(job.id)).status == "CANCELLED"
        same, again = (
            await api.create_job({"taskId": "noop"}, idempotency_key="k1"),
            await api.create_job({"taskId": "noop"}, idempotency_key="k1"),
        )
        assert same.id == again.id
    http_view = await stack.client().get_job(job.id)
    assert http_view.status == "CANCELLED", "HTTP and NATS share one store"


@pytest.mark.parametrize("token", ["not-a-token", ""])
async def test_a_bad_token_is_refused(stack: Stack, token: str) -> None:
    async with nats_client(stack, token=token or "x") as api:
        with pytest.raises(ApiError) as info:
            await api.list_jobs()
    assert info.value.status == 401
    assert info.value.problem is not None and info.value.problem.code == "unauthorized"


async def test_errors_carry_the_http_codes(stack: Stack) -> None:
    async with nats_client(stack) as api, nats_client(stack, "bob") as bob:
        with pytest.raises(ApiError) as bad:
            await api.create_job({"taskId": "launch_rockets"})
        assert bad.value.problem is not None
        assert (bad.value.status, bad.value.problem.code) == (422, "validation_error")
        assert problem_fields(bad.value)[:1] == ["taskId"]
        job = await api.create_job(
            {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2099-01-01T00:00:00Z"}}
        )
        with pytest.raises(ApiError) as other:
            await bob.get_job(job.id)
        assert other.value.problem is not None
        assert (other.value.status, other.value.problem.code) == (404, "job_not_found")
        with pytest.raises(ApiError) as conflict:
            await api.resume_job(job.id)
        assert conflict.value.status == 409


async def test_an_empty_create_is_malformed_as_over_http(stack: Stack) -> None:
    nc = await nats.connect(observer_url(stack.settings.nats.url))
    try:
        msg = await nc.request(
            f"{stack.settings.nats.subject_prefix}.api.create",
            b"",
            timeout=5,
            headers={"Authorization": f"Bearer {stack.token()}"},
        )
    finally:
        await nc.close()
    problem = msgspec.json.decode(msg.data)
    assert msg.headers is not None and msg.headers["Nats-Service-Error-Code"] == "400"
    assert problem["code"] == "malformed_json"
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.url + "/jobs", data=b"", headers={"Authorization": f"Bearer {stack.token()}"}
        ) as http,
    ):
        assert http.status == 400
        assert (await http.json(content_type=None))["code"] == problem["code"]


@pytest.mark.parametrize(
    "when", ["2026-06-01T00:00:00", "0001-01-01T00:00:00+01:00", "9999-12-31T23:00:00-02:00"]
)
async def test_list_time_bounds_are_checked_as_over_http(stack: Stack, when: str) -> None:
    async with nats_client(stack) as api:
        for field in ("startTime", "endTime"):
            with pytest.raises(ApiError) as bad:
                await api._call("list", {field: when})
            assert bad.value.status == 422
            assert problem_fields(bad.value)[:1] == [field]
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            stack.url + "/jobs",
            params={"startTime": when},
            headers={"Authorization": f"Bearer {stack.token()}"},
        ) as http,
    ):
        assert http.status == 422


async def test_the_service_is_discoverable(stack: Stack) -> None:
    """ADR-32: $SRV.INFO answers with the endpoints and their subjects (what `nats micro` shows)."""
    nc = await nats.connect(observer_url(stack.settings.nats.url))
    try:
        info = msgspec.json.decode((await nc.request("$SRV.INFO.jobsched", b"", timeout=5)).data)
    finally:
        await nc.close()
    subjects = {e["subject"] for e in info["endpoints"]}
    prefix = stack.settings.nats.subject_prefix
    assert {
        f"{prefix}.api.{op}"
        for op in ("create", "get", "list", "cancel", "pause", "resume", "trigger")
    } <= subjects


async def test_list_takes_the_name_task_and_label_filters(stack: Stack) -> None:
    cron = {"type": "cron", "expression": "0 3 * * *"}
    async with nats_client(stack) as api:
        billing = await api.create_job(
            {"taskId": "noop", "schedule": cron, "name": "nats-billing",
             "labels": {"team": "billing", "env": "prod"}}
        )  # fmt: skip
        search = await api.create_job(
            {"taskId": "noop", "schedule": cron, "labels": {"team": "search"}}
        )
        page = await api.list_jobs(labels="team=billing,env!=dev", taskId="noop")
        assert [j.id for j in page.items] == [billing.id]
        page = await api.list_jobs(labels="team in (billing,search)", limit=1)
        assert [j.id for j in page.items] == [search.id] and page.next_cursor
        page = await api.list_jobs(labels="team in (billing,search)", cursor=page.next_cursor)
        assert [j.id for j in page.items] == [billing.id]
        assert [j.id for j in (await api.list_jobs(name="nats-billing")).items] == [billing.id]
        with pytest.raises(ApiError) as taken:
            await api.create_job({"taskId": "noop", "name": "nats-billing"})
        assert taken.value.status == 409 and taken.value.problem is not None
        assert (taken.value.problem.code, problem_fields(taken.value)) == (
            "name_taken",
            ["name"],
        )
        with pytest.raises(ApiError) as bad:
            await api.list_jobs(labels="team in (a")
        assert bad.value.status == 422 and bad.value.problem is not None
        assert problem_fields(bad.value) == ["labels"]
        with pytest.raises(ApiError) as reversed_range:
            await api.list_jobs(startTime="2030-01-02T00:00:00Z", endTime="2030-01-01T00:00:00Z")
        assert problem_fields(reversed_range.value) == ["startTime"]
        with pytest.raises(ApiError) as repeated:  # raw bytes: a key twice in one object
            await api._call("list", msgspec.Raw(b'{"labels": "team=billing", "labels": "x"}'))
        assert (repeated.value.status, problem_fields(repeated.value)) == (422, ["labels"])
    http_view = await stack.client().list_jobs(labels="team=billing")
    assert [j.id for j in http_view.items] == [billing.id]


async def test_list_finds_the_job_of_an_idempotency_key(stack: Stack) -> None:
    async with nats_client(stack) as api, nats_client(stack, "bob") as bob_api:
        keyed = await api.create_job({"taskId": "noop"}, idempotency_key="nightly-2026-06-01")
        await api.create_job({"taskId": "noop"}, idempotency_key="nightly-2026-06-02")
        bobs = await bob_api.create_job({"taskId": "noop"}, idempotency_key="nightly-2026-06-01")
        page = await api.list_jobs(idempotencyKey="nightly-2026-06-01")
        assert [j.id for j in page.items] == [keyed.id]  # exact, and never bob's
        assert (await api.list_jobs(idempotencyKey="nightly-2026")).items == []
    http_view = await stack.client().list_jobs(idempotency_key="nightly-2026-06-01")
    assert [j.id for j in http_view.items] == [keyed.id]
    bob_view = await stack.client("bob").list_jobs(idempotency_key="nightly-2026-06-01")
    assert [j.id for j in bob_view.items] == [bobs.id]
