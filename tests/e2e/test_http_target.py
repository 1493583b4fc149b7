"""The ``http`` task through the whole pipeline: HTTP API, scheduler, NATS, worker, recorder,
store. Targets are real HTTP servers on loopback addresses: one allowed by the workers'
``http_allowed_networks`` (127.0.0.2), one not (127.0.0.1)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from jobsched.client import ApiError
from tests.conftest import SettingsFactory
from tests.e2e.test_cli_jobs import cli, cli_json
from tests.e2e.test_nats_api import nats_client
from tests.support import Stack, executions, start_stack, wait_job

SECRET = "tok-3f9a1c"


@pytest.fixture
async def http_stack(make_settings: SettingsFactory, tmp_path: Path) -> AsyncIterator[Stack]:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "hook-token").write_text(SECRET + "\n")
    settings = make_settings(http_allowed_networks="127.0.0.2/32", secrets_dir=str(secrets))
    async with start_stack(settings) as s:
        yield s


class Receiver:
    """An HTTP target that records each request and answers with the queued statuses."""

    def __init__(self, host: str, statuses: list[int] | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.statuses = list(statuses or [])
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = TestServer(app, host=host)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, dict(request.headers), await request.read()))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"received": len(self.requests)}, status=status)

    async def __aenter__(self) -> Receiver:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()

    def url(self) -> str:
        return str(self.server.make_url("/hook"))


async def test_a_scheduled_call_reaches_its_target_once_per_run(http_stack: Stack) -> None:
    client = http_stack.client()
    async with Receiver("127.0.0.2") as target:
        job = await client.create_job(
            {
                "taskId": "http",
                "parameters": {
                    "method": "POST",
                    "url": target.url(),
                    "headers": {"Authorization": {"secret": "hook-token", "prefix": "Bearer "}},
                    "json": {"account": "ACME-42"},
                },
            }
        )
        await wait_job(client, job.id, {"SUCCEEDED", "FAILED"})
        [run] = await executions(client, job.id)

    assert run.status == "SUCCEEDED" and run.attempt == 1
    assert run.result is not None and run.result["status"] == 200
    assert json.loads(run.result["body"]) == {"received": 1}
    [(method, headers, body)] = target.requests
    assert method == "POST" and json.loads(body) == {"account": "ACME-42"}
    assert headers["Idempotency-Key"] == run.id
    assert headers["Authorization"] == f"Bearer {SECRET}"
    stored = (await client.get_job(job.id)).parameters
    assert SECRET not in json.dumps(stored) and stored["headers"]["Authorization"] == {
        "secret": "hook-token",
        "prefix": "Bearer ",
    }


async def test_a_5xx_is_retried_with_the_same_idempotency_key(http_stack: Stack) -> None:
    client = http_stack.client()
    async with Receiver("127.0.0.2", [503, 502]) as target:
        job = await client.create_job(
            {"taskId": "http", "maxAttempts": 3, "parameters": {"url": target.url()}}
        )
        await wait_job(client, job.id, {"SUCCEEDED", "FAILED"})
        [run] = await executions(client, job.id)

    assert run.status == "SUCCEEDED" and run.attempt == 3
    keys = {headers["Idempotency-Key"] for _, headers, _ in target.requests}
    assert len(target.requests) == 3 and keys == {run.id}


async def test_a_4xx_fails_the_run_without_retry(http_stack: Stack) -> None:
    client = http_stack.client()
    async with Receiver("127.0.0.2", [404]) as target:
        job = await client.create_job(
            {"taskId": "http", "maxAttempts": 3, "parameters": {"url": target.url()}}
        )
        await wait_job(client, job.id, {"SUCCEEDED", "FAILED"})
        [run] = await executions(client, job.id)

    assert run.status == "FAILED" and run.attempt == 1 and len(target.requests) == 1
    assert run.error is not None and run.error.startswith("HTTP 404 from GET")


async def test_an_internal_target_is_refused_and_never_reached(http_stack: Stack) -> None:
    client = http_stack.client()
    async with Receiver("127.0.0.1") as inside:
        job = await client.create_job(
            {"taskId": "http", "maxAttempts": 3, "parameters": {"url": inside.url()}}
        )
        await wait_job(client, job.id, {"SUCCEEDED", "FAILED"})
        [run] = await executions(client, job.id)

    assert inside.requests == []
    assert run.status == "FAILED" and run.attempt == 1
    assert run.error is not None and "refused to connect to 127.0.0.1" in run.error


async def test_bad_parameters_are_a_422_naming_the_field(http_stack: Stack) -> None:
    client = http_stack.client()
    for parameters, field in (
        ({"url": "file:///etc/passwd"}, "parameters.url"),
        ({"url": "http://user:pw@example.com/"}, "parameters.url"),
        ({"url": "http://2130706433/"}, "parameters.url"),  # 127.0.0.1 in a legacy form
        ({"url": "https://example.com/", "json": {}, "text": "x"}, "parameters.text"),
        (
            {"url": "https://example.com/", "headers": {"Idempotency-Key": "x"}},
            "parameters.headers",
        ),
    ):
        with pytest.raises(ApiError) as e:
            await client.create_job({"taskId": "http", "parameters": parameters})
        assert e.value.status == 422 and field in str(e.value), e.value


async def test_the_cli_and_the_nats_api_create_http_jobs_that_reach_their_target(
    http_stack: Stack,
) -> None:
    client = http_stack.client()
    async with Receiver("127.0.0.2") as target, nats_client(http_stack) as api:
        parameters = json.dumps({"url": target.url(), "json": {"via": "cli"}, "method": "POST"})
        made = await cli_json(http_stack, "submit", "http", "--params-json", parameters)
        over_nats = await api.create_job(
            {"taskId": "http", "parameters": {"url": target.url(), "method": "GET"}}
        )
        for job_id in (made["id"], over_nats.id):
            await wait_job(client, job_id, {"SUCCEEDED", "FAILED"})
            [run] = await executions(client, job_id)
            assert run.status == "SUCCEEDED" and run.result is not None, run.error
        with pytest.raises(ApiError) as e:
            await api.create_job({"taskId": "http", "parameters": {"url": "file:///etc/passwd"}})
        assert e.value.status == 422 and "parameters.url" in str(e.value)
    bad = await cli(http_stack, "submit", "http", "--params-json", '{"url": "ftp://x/"}', code=1)
    assert "422" in bad.output and "parameters.url" in bad.output
    assert sorted(m for m, _, _ in target.requests) == ["GET", "POST"]
