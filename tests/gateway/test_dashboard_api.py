"""The API additions the dashboard needs: ``GET /jobs?taskId=``, ``GET /jobs?idempotencyKey=``
and one run by its id."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from core.model import Job
from core.runs import manual_run
from tests.gateway.conftest import Api

CRON = {"schedule": {"type": "cron", "expression": "0 3 * * *"}}
PARAMETERS = {"noop": {}, "generate_report": {"reportType": "sales", "region": "ACME-42"}}


async def create(api: Api, task_id: str, user: str = "alice") -> Job:
    async with api.session.post(
        f"{api.url}/jobs",
        json={"taskId": task_id, "parameters": PARAMETERS[task_id], **CRON},
        headers=api.auth(user),
    ) as resp:
        assert resp.status == 201
        return msgspec.json.decode(await resp.read(), type=Job)


async def get(api: Api, path: str, user: str = "alice") -> tuple[int, dict[str, object]]:
    async with api.session.get(f"{api.url}{path}", headers=api.auth(user)) as resp:
        body: dict[str, object] = await resp.json(content_type=None)
        return resp.status, body


async def test_jobs_filter_by_task(api: Api) -> None:
    noop = await create(api, "noop")
    report = await create(api, "generate_report")
    await create(api, "noop", user="bob")

    status, page = await get(api, "/jobs?taskId=noop")
    assert status == 200
    assert [j["id"] for j in page["items"]] == [noop.id]  # type: ignore[attr-defined]
    _, page = await get(api, "/jobs?taskId=generate_report&status=SCHEDULED")
    assert [j["id"] for j in page["items"]] == [report.id]  # type: ignore[attr-defined]
    _, page = await get(api, "/jobs?taskId=no_such_task")
    assert page["items"] == []


async def test_one_run_by_id_is_the_owners_only(api: Api) -> None:
    job = await create(api, "noop")
    other = await create(api, "noop")
    run = manual_run(job, datetime.now(UTC).replace(microsecond=0))
    assert await api.store.insert_execution(run)

    status, body = await get(api, f"/jobs/{job.id}/executions/{run.id}")
    assert status == 200
    assert (body["id"], body["jobId"], body["status"]) == (run.id, job.id, "QUEUED")
    assert body["attempts"] == []

    status, body = await get(api, f"/jobs/{other.id}/executions/{run.id}")
    assert (status, body["code"]) == (404, "execution_not_found")
    status, body = await get(api, f"/jobs/{job.id}/executions/no-such-run")
    assert (status, body["code"]) == (404, "execution_not_found")
    status, body = await get(api, f"/jobs/{job.id}/executions/{run.id}", user="bob")
    assert (status, body["code"]) == (404, "job_not_found")


async def test_jobs_filter_by_idempotency_key(api: Api) -> None:
    async def keyed(key: str, user: str = "alice") -> str:
        async with api.session.post(
            f"{api.url}/jobs",
            json={"taskId": "noop", **CRON},
            headers={**api.auth(user), "Idempotency-Key": key},
        ) as resp:
            assert resp.status == 201
            return str((await resp.json())["id"])

    mine = await keyed("order-42")
    await keyed("order-421")
    await keyed("order-42", user="bob")

    status, page = await get(api, "/jobs?idempotencyKey=order-42")
    assert status == 200
    assert [j["id"] for j in page["items"]] == [mine]  # type: ignore[attr-defined]
    _, page = await get(api, "/jobs?idempotencyKey=order-42&status=PAUSED")
    assert page["items"] == []
    _, page = await get(api, "/jobs?idempotencyKey=order")
    assert page["items"] == []
    status, problem = await get(api, "/jobs?idempotencyKey=a&idempotencyKey=b")
    fields = [e["field"] for e in problem["errors"]]  # type: ignore[attr-defined]
    assert (status, fields) == (422, ["idempotencyKey"])
