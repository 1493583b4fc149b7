"""Ambiguous input is refused before any handler acts (gateway/inputs.py), over real HTTP: a body
that is not declared JSON (415), a duplicate JSON key (422 naming it), a repeated query parameter
(422 naming it); and a ``startTime`` after ``endTime`` (422). Nothing is stored."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import Api
from tests.gateway.test_bad_input import assert_problem, stored_jobs

NOOP = json.dumps({"taskId": "noop"}).encode()


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "application/json; charset=latin-1",
        "application/jsonx",
    ],
)
async def test_a_body_not_declared_json_is_415_and_nothing_is_stored(
    api: Api, content_type: str
) -> None:
    headers = {**api.auth(), "Content-Type": content_type}
    async with api.session.post(f"{api.url}/jobs", data=NOOP, headers=headers) as resp:
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, 415, "unsupported_media_type")
        assert "application/json" in problem["detail"]
    assert await stored_jobs(api) == 0


async def test_a_patch_not_declared_json_is_415_and_json_variants_pass(api: Api) -> None:
    headers = {**api.auth(), "Content-Type": "application/json; charset=UTF-8"}
    async with api.session.post(f"{api.url}/jobs", data=NOOP, headers=headers) as resp:
        assert resp.status == 201
        job = await resp.json()
    patch = json.dumps({"maxAttempts": 2}).encode()
    url = f"{api.url}/jobs/{job['id']}"
    form = {**api.auth(), "Content-Type": "text/plain"}
    async with api.session.patch(url, data=patch, headers=form) as resp:
        assert resp.status == 415
    merge = {**api.auth(), "Content-Type": "application/merge-patch+json"}
    async with api.session.patch(url, data=patch, headers=merge) as resp:
        assert resp.status == 200 and (await resp.json())["maxAttempts"] == 2


async def test_an_unauthenticated_body_is_401_before_its_media_type(api: Api) -> None:
    headers = {"Content-Type": "text/plain"}
    async with api.session.post(f"{api.url}/jobs", data=NOOP, headers=headers) as resp:
        assert resp.status == 401


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"taskId": "noop", "taskId": "fail"}', "taskId"),
        (b'{"taskId": "noop", "parameters": {"a": 1, "b": 2, "a": 3}}', "parameters.a"),
        (b'{"taskId": "noop", "parameters": {"l": [1, {"x": 1, "x": 1}]}}', "parameters.l[1].x"),
        (
            b'{"taskId": "noop", "schedule": {"type": "cron", "expression": "* * * * *", '
            b'"expression": "0 8 * * *"}}',
            "schedule.expression",
        ),
    ],
)
async def test_a_duplicate_json_key_is_422_naming_it(api: Api, raw: bytes, field: str) -> None:
    headers = {**api.auth(), "Content-Type": "application/json"}
    async with api.session.post(f"{api.url}/jobs", data=raw, headers=headers) as resp:
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, 422, "validation_error")
    assert [e["field"] for e in problem["errors"]] == [field]
    assert await stored_jobs(api) == 0


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("/jobs?status=FAILED&status=SCHEDULED", "status"),
        ("/jobs?limit=1&taskId=noop&limit=2", "limit"),
        ("/schedules/preview?expression=*+*+*+*+*&expression=0+8+*+*+*", "expression"),
        ("/audit?actor=a&actor=b", "actor"),
    ],
)
async def test_a_repeated_query_parameter_is_422_naming_it(
    api: Api, query: str, field: str
) -> None:
    async with api.session.get(f"{api.url}{query}", headers=api.auth()) as resp:
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, 422, "validation_error")
    assert [e["field"] for e in problem["errors"]] == [field]


async def test_a_start_time_after_the_end_time_is_422(api: Api) -> None:
    later, earlier = "2026-06-02T00:00:00Z", "2026-06-01T00:00:00Z"
    url = f"{api.url}/jobs?startTime={later}&endTime={earlier}"
    async with api.session.get(url, headers=api.auth()) as resp:
        problem = await resp.json(content_type=None)
        assert_problem(resp.status, resp.content_type, problem, 422, "validation_error")
    assert [e["field"] for e in problem["errors"]] == ["startTime"]
    url = f"{api.url}/jobs?startTime={earlier}&endTime={earlier}"  # empty, not contradictory
    async with api.session.get(url, headers=api.auth()) as resp:
        assert resp.status == 200 and (await resp.json())["items"] == []
