"""Bad input gets a clear RFC 9457 problem naming the field, never a 500, and stores nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest

from core.ports import JobQuery
from tests.conftest import TEST_SECRET
from tests.gateway.conftest import Api

NOW = datetime.now(UTC)

# (label, body, status, code, field)
BAD_BODIES: list[tuple[str, Any, int, str, str | None]] = [
    (
        "unknown top-level field",
        {"taskId": "noop", "priority": 3},
        422,
        "validation_error",
        "priority",
    ),
    ("unknown taskId", {"taskId": "launch_rockets"}, 422, "validation_error", "taskId"),
    ("missing taskId", {"parameters": {}}, 422, "validation_error", "taskId"),
    ("empty taskId", {"taskId": ""}, 422, "validation_error", "taskId"),
    (
        "unknown schedule type",
        {"taskId": "noop", "schedule": {"type": "hourly"}},
        422,
        "validation_error",
        "schedule.type",
    ),
    (
        "unknown schedule field",
        {"taskId": "noop", "schedule": {"type": "immediate", "at": 1}},
        422,
        "validation_error",
        "schedule.at",
    ),
    (
        "invalid cron",
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "61 * * * *"}},
        422,
        "invalid_cron",
        "schedule.expression",
    ),
    (
        "cron wrong field count",
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "* * *"}},
        422,
        "invalid_cron",
        "schedule.expression",
    ),
    (
        "unknown time zone",
        {
            "taskId": "noop",
            "schedule": {"type": "cron", "expression": "0 8 * * *", "timezone": "Mars/Olympus"},
        },
        422,
        "validation_error",
        "schedule.timezone",
    ),
    (
        "executeAt without offset",
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2030-09-01T03:00:00"}},
        422,
        "validation_error",
        "schedule.executeAt",
    ),
    (
        "executeAt far in the past",
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2020-01-01T00:00:00Z"}},
        422,
        "validation_error",
        "schedule.executeAt",
    ),
    (
        "executeAt leap second",
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2030-12-31T23:59:60Z"}},
        422,
        "validation_error",
        "schedule.executeAt",
    ),
    (
        "executeAt impossible date",
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2030-02-30T00:00:00Z"}},
        422,
        "validation_error",
        "schedule.executeAt",
    ),
    (
        "executeAt year past 9999",
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "10000-01-01T00:00:00Z"}},
        422,
        "validation_error",
        "schedule.executeAt",
    ),
    (
        "interval of zero",
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 0}},
        422,
        "validation_error",
        "schedule.everySeconds",
    ),
    (
        "interval under a millisecond",
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 0.0001}},
        422,
        "validation_error",
        "schedule.everySeconds",
    ),
    (
        "executeAt before year 1 in UTC",
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "0001-01-01T00:00:00+01:00"}},
        422,
        "validation_error",
        "schedule.executeAt",
    ),
    (
        "executeAt past year 9999 in UTC",
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": "9999-12-31T23:59:59-01:00"}},
        422,
        "validation_error",
        "schedule.executeAt",
    ),
    (
        "startAt at the end of the calendar",
        {
            "taskId": "noop",
            "schedule": {
                "type": "cron",
                "expression": "* * * * *",
                "startAt": "9999-12-31T23:59:30Z",
            },
        },
        422,
        "validation_error",
        "schedule.startAt",
    ),
    (
        "interval startAt in year 1",
        {
            "taskId": "noop",
            "schedule": {"type": "interval", "everySeconds": 10, "startAt": "0001-01-01T00:00:00Z"},
        },
        422,
        "validation_error",
        "schedule.startAt",
    ),
    (
        "parameters missing a field",
        {"taskId": "generate_report", "parameters": {"region": "eu"}},
        422,
        "validation_error",
        "parameters.reportType",
    ),
    (
        "parameters of the wrong type",
        {"taskId": "generate_report", "parameters": {"reportType": "sales", "region": 42}},
        422,
        "validation_error",
        "parameters.region",
    ),
    (
        "parameters with an unknown field",
        {"taskId": "noop", "parameters": {"x": 1}},
        422,
        "validation_error",
        "parameters.x",
    ),
    (
        "parameters not an object",
        {"taskId": "noop", "parameters": [1, 2]},
        422,
        "validation_error",
        "parameters",
    ),
    (
        "path traversal in exportId",
        {"taskId": "cleanup_export", "parameters": {"exportId": "../../etc"}},
        422,
        "validation_error",
        "parameters.exportId",
    ),
    (
        "maxAttempts of zero",
        {"taskId": "noop", "maxAttempts": 0},
        422,
        "validation_error",
        "maxAttempts",
    ),
    (
        "maxAttempts too high",
        {"taskId": "noop", "maxAttempts": 21},
        422,
        "validation_error",
        "maxAttempts",
    ),
    (
        "negative timeout",
        {"taskId": "noop", "timeoutSeconds": -1},
        422,
        "validation_error",
        "timeoutSeconds",
    ),
    (
        "bad queue name",
        {"taskId": "noop", "queue": "Work Queue!"},
        422,
        "validation_error",
        "queue",
    ),
    ("history limit 0", {"taskId": "noop", "historyLimit": 0}, 422, "validation_error",
     "historyLimit"),
    ("history limit too big", {"taskId": "noop", "historyLimit": 100_001}, 422,
     "validation_error", "historyLimit"),
    ("history limit not an int", {"taskId": "noop", "historyLimit": 2.5}, 422,
     "validation_error", "historyLimit"),
    ("history max age under a minute", {"taskId": "noop", "historyMaxAgeSeconds": 59}, 422,
     "validation_error", "historyMaxAgeSeconds"),
    ("history max age a string", {"taskId": "noop", "historyMaxAgeSeconds": "1d"}, 422,
     "validation_error", "historyMaxAgeSeconds"),
    ("body is an array", [{"taskId": "noop"}], 422, "validation_error", "body"),
]  # fmt: skip


def assert_problem(
    resp_status: int, content_type: str, body: dict[str, Any], status: int, code: str
) -> None:
    assert resp_status == status, body
    assert content_type == "application/problem+json"
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"].endswith("/" + code)
    assert body["title"] and body["detail"]
    assert body["requestId"]


async def stored_jobs(api: Api, user: str = "alice") -> int:
    page = await api.store.list_jobs(user, JobQuery(), limit=500, cursor=None)
    return len(page.items)


@pytest.mark.parametrize(
    ("label", "body", "status", "code", "field"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES]
)
async def test_bad_job_bodies_are_rejected_and_nothing_is_stored(
    api: Api, label: str, body: Any, status: int, code: str, field: str | None
) -> None:
    async with api.session.post(f"{api.url}/jobs", json=body, headers=api.auth()) as resp:
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, status, code)
    if field is not None:
        assert [e["field"] for e in problem["errors"]] == [field], problem
        assert problem["errors"][0]["reason"]
    assert await stored_jobs(api) == 0


@pytest.mark.parametrize(
    ("label", "raw"),
    [
        ("truncated", b'{"taskId": "noop"'),
        ("not json", b"taskId=noop"),
        ("empty", b""),
        ("bad utf-8", b'{"taskId": "\xff"}'),
        (
            "arrays nested 2,000 deep",
            b'{"taskId": "noop", "parameters": {"a": ' + b"[" * 2000 + b"]" * 2000 + b"}}",
        ),
    ],
)
async def test_malformed_json_is_400(api: Api, label: str, raw: bytes) -> None:
    async with api.session.post(
        f"{api.url}/jobs", data=raw, headers={**api.auth(), "Content-Type": "application/json"}
    ) as resp:
        assert_problem(
            resp.status,
            resp.content_type,
            await resp.json(content_type=None),
            400,
            "malformed_json",
        )
    assert await stored_jobs(api) == 0


async def test_body_over_the_limit_is_413(api: Api) -> None:
    body = {"taskId": "noop", "parameters": {}, "pad": "x" * 10_000}
    async with api.session.post(
        f"{api.url}/jobs", data=json.dumps(body), headers=api.auth()
    ) as resp:
        assert_problem(
            resp.status,
            resp.content_type,
            await resp.json(content_type=None),
            413,
            "payload_too_large",
        )
    assert await stored_jobs(api) == 0


def far_future() -> datetime:
    return datetime.now(UTC) + timedelta(hours=2)


def expired_token() -> str:
    past = datetime.now(UTC) - timedelta(hours=2)
    return jwt.encode({"sub": "alice", "exp": past}, TEST_SECRET, algorithm="HS256")


@pytest.mark.parametrize(
    ("label", "headers"),
    [
        ("no header", {}),
        ("not bearer", {"Authorization": "Basic YWxpY2U6eA=="}),
        ("garbage token", {"Authorization": "Bearer not-a-jwt"}),
        (
            "wrong key",
            {
                "Authorization": "Bearer "
                + jwt.encode({"sub": "alice"}, "another-secret-" * 4, algorithm="HS256")
            },
        ),
        ("expired", {"Authorization": "Bearer " + expired_token()}),
        (
            "no sub",
            {
                "Authorization": "Bearer "
                + jwt.encode({"name": "alice"}, TEST_SECRET, algorithm="HS256")
            },
        ),
        (
            "sub longer than 256 characters",
            {
                "Authorization": "Bearer "
                + jwt.encode({"sub": "x" * 3000, "exp": far_future()}, TEST_SECRET, "HS256")
            },
        ),
        (
            "sub with a lone surrogate",
            {
                "Authorization": "Bearer "
                + jwt.encode({"sub": "\ud800", "exp": far_future()}, TEST_SECRET, "HS256")
            },
        ),
        (
            "no exp: it would never expire",
            {"Authorization": "Bearer " + jwt.encode({"sub": "alice"}, TEST_SECRET, "HS256")},
        ),
        (
            "alg none",
            {"Authorization": "Bearer " + jwt.encode({"sub": "alice"}, "", algorithm="none")},
        ),
    ],
)
async def test_missing_or_invalid_token_is_401(
    api: Api, label: str, headers: dict[str, str]
) -> None:
    for method, path in (
        ("POST", "/jobs"),
        ("GET", "/jobs"),
        ("GET", "/jobs/x"),
        ("GET", "/jobs/x/executions"),
    ):
        async with api.session.request(
            method, f"{api.url}{path}", json={"taskId": "noop"}, headers=headers
        ) as resp:
            assert_problem(
                resp.status,
                resp.content_type,
                await resp.json(content_type=None),
                401,
                "unauthorized",
            )
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert await stored_jobs(api) == 0


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=DONE", "status"),
        ("lastRunStatus=MAYBE", "lastRunStatus"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=ten", "limit"),
        ("startTime=2026-01-01T00:00:00", "startTime"),
        ("endTime=yesterday", "endTime"),
        ("cursor=%%%", "cursor"),
        ("cursor=eyJub3QiOiJhIGN1cnNvciJ9", "cursor"),
        ("state=FAILED", "state"),
    ],
)
async def test_bad_list_queries_are_422(api: Api, query: str, field: str) -> None:
    async with api.session.get(f"{api.url}/jobs?{query}", headers=api.auth()) as resp:
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, 422, "validation_error")
        assert problem["errors"][0]["field"] == field


@pytest.mark.parametrize(
    ("query", "field"),
    [("status=FAILED", "status"), ("limit=0", "limit"), ("cursor=%%%", "cursor")],
)
async def test_bad_run_history_queries_are_422(api: Api, query: str, field: str) -> None:
    async with api.session.post(
        f"{api.url}/jobs", json={"taskId": "noop"}, headers=api.auth()
    ) as created:
        job_id = (await created.json())["id"]
    url = f"{api.url}/jobs/{job_id}/executions?{query}"
    async with api.session.get(url, headers=api.auth()) as resp:
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, 422, "validation_error")
        assert problem["errors"][0]["field"] == field


async def test_unknown_routes_and_methods_are_problems(api: Api) -> None:
    async with api.session.get(f"{api.url}/nothing-here", headers=api.auth()) as resp:
        assert_problem(
            resp.status, resp.content_type, await resp.json(content_type=None), 404, "not_found"
        )
    async with api.session.delete(f"{api.url}/jobs", headers=api.auth()) as resp:
        assert_problem(
            resp.status,
            resp.content_type,
            await resp.json(content_type=None),
            405,
            "method_not_allowed",
        )
    async with api.session.get(f"{api.url}/jobs/0123", headers=api.auth()) as resp:
        assert_problem(
            resp.status, resp.content_type, await resp.json(content_type=None), 404, "job_not_found"
        )


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/jobs", "GET, HEAD, POST"),
        ("PUT", "/jobs/0123", "DELETE, GET, HEAD, PATCH"),
        ("GET", "/jobs/0123/pause", "POST"),
        ("OPTIONS", "/jobs", "GET, HEAD, POST"),
        ("POST", "/healthz", "GET, HEAD"),
    ],
)
async def test_a_405_lists_the_methods_of_the_path_in_allow(
    api: Api, method: str, path: str, allowed: str
) -> None:
    """RFC 9110 §15.5.6: a 405 carries ``Allow`` (HEAD comes with every GET route)."""
    async with api.session.request(method, f"{api.url}{path}", headers=api.auth()) as resp:
        assert resp.headers.get("Allow") == allowed
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, 405, "method_not_allowed")
        assert allowed in problem["detail"]


async def test_a_405_to_head_carries_allow_without_a_body(api: Api) -> None:
    async with api.session.head(f"{api.url}/jobs/0123/pause", headers=api.auth()) as resp:
        assert resp.status == 405
        assert resp.headers.get("Allow") == "POST"
        assert resp.content_type == "application/problem+json"
        assert await resp.read() == b""


async def test_health_needs_no_token(api: Api) -> None:
    async with api.session.get(f"{api.url}/healthz") as resp:
        assert resp.status == 200
        assert (await resp.json())["status"] == "ok"
    async with api.session.get(f"{api.url}/readyz") as resp:
        assert resp.status == 200
        assert (await resp.json())["checks"] == {"store": "ok"}


async def test_a_valid_job_is_201_with_location_and_echoes_utc(api: Api) -> None:
    body = {
        "taskId": "noop",
        "schedule": {"type": "once", "executeAt": "2099-09-01T05:00:00+02:00"},
    }
    async with api.session.post(f"{api.url}/jobs", json=body, headers=api.auth()) as resp:
        assert resp.status == 201
        job = await resp.json()
    assert resp.headers["Location"] == f"/jobs/{job['id']}"
    assert job["schedule"] == {"type": "once", "executeAt": "2099-09-01T03:00:00Z"}
    assert job["nextRunAt"] == "2099-09-01T03:00:00Z"
    assert job["status"] == "SCHEDULED"
    assert job["maxAttempts"] == 3 and job["timeoutSeconds"] == 60.0
    assert await stored_jobs(api) == 1


async def test_a_job_keeps_its_own_retention_and_patch_changes_or_clears_it(api: Api) -> None:
    body = {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 60},
            "historyLimit": 50, "historyMaxAgeSeconds": 7200}  # fmt: skip
    async with api.session.post(f"{api.url}/jobs", json=body, headers=api.auth()) as resp:
        assert resp.status == 201
        job = await resp.json()
    assert (job["historyLimit"], job["historyMaxAgeSeconds"]) == (50, 7200.0)
    url = f"{api.url}/jobs/{job['id']}"

    async def patch(change: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with api.session.patch(url, json=change, headers=api.auth()) as resp:
            return resp.status, await resp.json(content_type=None)

    status, changed = await patch({"historyLimit": 10})
    assert status == 200
    assert (changed["historyLimit"], changed["historyMaxAgeSeconds"]) == (10, 7200.0)
    status, changed = await patch({"maxAttempts": 2})  # absent: unchanged
    assert (changed["historyLimit"], changed["historyMaxAgeSeconds"]) == (10, 7200.0)
    status, changed = await patch({"historyMaxAgeSeconds": None})  # null: the default again
    assert (changed["historyLimit"], changed["historyMaxAgeSeconds"]) == (10, None)
    status, problem = await patch({"historyLimit": -3})
    assert status == 422 and [e["field"] for e in problem["errors"]] == ["historyLimit"]
    stored = await api.store.get_job("alice", job["id"])
    assert (stored.history_limit, stored.history_max_age_seconds) == (10, None)


async def test_a_job_without_its_own_retention_shows_null(api: Api) -> None:
    async with api.session.post(
        f"{api.url}/jobs", json={"taskId": "noop"}, headers=api.auth()
    ) as resp:
        job = await resp.json()
    assert (job["historyLimit"], job["historyMaxAgeSeconds"]) == (None, None)
