"""Names, labels and the list filters over real HTTP and a real SQLite store; the input errors
of JSON bodies and query parameters (415, repeated parameters and keys, a reversed range)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.openapi import openapi_document
from tests.gateway.conftest import Api

CRON = {"schedule": {"type": "cron", "expression": "0 8 * * *"}}
JSON = {"Content-Type": "application/json"}


async def create(api: Api, user: str = "alice", **fields: Any) -> tuple[int, Any]:
    body = {"taskId": "noop", **CRON, **fields}
    async with api.session.post(f"{api.url}/jobs", json=body, headers=api.auth(user)) as resp:
        return resp.status, await resp.json(content_type=None)


async def patch(api: Api, job_id: str, body: Any) -> tuple[int, Any]:
    async with api.session.patch(f"{api.url}/jobs/{job_id}", json=body, headers=api.auth()) as resp:
        return resp.status, await resp.json(content_type=None)


async def listing(api: Api, user: str = "alice", **params: str) -> tuple[int, Any]:
    async with api.session.get(f"{api.url}/jobs", params=params, headers=api.auth(user)) as resp:
        return resp.status, await resp.json(content_type=None)


async def names(api: Api, **params: str) -> list[str | None]:
    status, page = await listing(api, **params)
    assert status == 200, page
    return [j["name"] for j in page["items"]]


def fields_of(problem: Any) -> list[str]:
    return [e["field"] for e in problem.get("errors") or []]


async def test_a_job_has_a_name_and_labels(api: Api) -> None:
    status, job = await create(api, name="nightly-report", labels={"team": "billing"})
    assert status == 201, job
    assert (job["name"], job["labels"]) == ("nightly-report", {"team": "billing"})
    status, unnamed = await create(api)
    assert status == 201 and (unnamed["name"], unnamed["labels"]) == (None, {})


async def test_a_second_job_of_the_same_name_is_409_naming_the_field(api: Api) -> None:
    await create(api, name="nightly")
    status, problem = await create(api, name="nightly")
    assert (status, problem["code"], fields_of(problem)) == (409, "name_taken", ["name"])
    status, _ = await create(api, user="bob", name="nightly")  # names are per user
    assert status == 201
    assert await names(api) == ["nightly"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"labels": {"bad key": "v"}}, "labels.bad key"),
        ({"labels": {"team": "-billing"}}, "labels.team"),
        ({"labels": {"Example.com/team": "x"}}, "labels.Example.com/team"),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, "labels"),
        ({"labels": {"team": 3}}, "labels[...]"),  # msgspec's path of a map's value
        ({"name": "has spaces"}, "name"),
        ({"name": ""}, "name"),
    ],
)
async def test_invalid_names_and_labels_are_422_naming_the_key(
    api: Api, fields: dict[str, Any], field: str
) -> None:
    status, problem = await create(api, **fields)
    assert status == 422, problem
    assert fields_of(problem) == [field]
    assert await names(api) == []


async def test_patch_merges_labels_and_sets_or_clears_the_name(api: Api) -> None:
    _, job = await create(api, name="a", labels={"team": "billing", "env": "dev"})
    status, changed = await patch(
        api, job["id"], {"labels": {"env": None, "tier": "gold"}, "name": "b"}
    )
    assert status == 200, changed
    assert (changed["name"], changed["labels"]) == ("b", {"team": "billing", "tier": "gold"})
    status, changed = await patch(api, job["id"], {"name": None})
    assert (status, changed["name"], changed["labels"]["tier"]) == (200, None, "gold")
    await create(api, name="taken")
    status, problem = await patch(api, job["id"], {"name": "taken", "labels": {"x": "y"}})
    assert (status, problem["code"], fields_of(problem)) == (409, "name_taken", ["name"])
    status, problem = await patch(api, job["id"], {"labels": {"ok": "fine", "-bad": "v"}})
    assert (status, fields_of(problem)) == (422, ["labels.-bad"])
    async with api.session.get(f"{api.url}/jobs/{job['id']}", headers=api.auth()) as resp:
        unchanged = await resp.json()
    assert unchanged["labels"] == {"team": "billing", "tier": "gold"}


async def test_list_filters_by_selector_name_and_task_with_status_and_cursor(api: Api) -> None:
    for name, labels in [
        ("j0", {}),
        ("j1", {"team": "billing", "env": "prod"}),
        ("j2", {"team": "billing", "env": "dev"}),
        ("j3", {"team": "search"}),
        ("j4", {"team": "billing"}),
    ]:
        status, _ = await create(api, name=name, labels=labels)
        assert status == 201
    await create(api, user="bob", name="j1", labels={"team": "billing"})
    assert await names(api, labels="team=billing,env!=dev") == ["j4", "j1"]
    assert await names(api, labels="team in (billing, search),!env") == ["j4", "j3"]
    assert await names(api, labels="env notin (dev)", status="SCHEDULED") == [
        "j4",
        "j3",
        "j1",
        "j0",
    ]
    assert await names(api, labels="team=billing", status="PAUSED") == []
    assert await names(api, name="j2") == ["j2"]
    assert await names(api, taskId="noop", labels="env") == ["j2", "j1"]
    seen, cursor = [], None
    while True:
        params = {"labels": "team==billing", "limit": "1", **({"cursor": cursor} if cursor else {})}
        status, page = await listing(api, **params)
        assert status == 200
        seen += [j["name"] for j in page["items"]]
        if (cursor := page["nextCursor"]) is None:
            break
    assert seen == ["j4", "j2", "j1"]


@pytest.mark.parametrize("selector", ["team=", "team in (a", "team>1", "a b", ",", "!"])
async def test_an_invalid_selector_is_422_naming_labels(api: Api, selector: str) -> None:
    if selector == "team=":  # an empty value is a valid requirement
        assert (await listing(api, labels=selector))[0] == 200
        return
    status, problem = await listing(api, labels=selector)
    assert (status, fields_of(problem)) == (422, ["labels"]), problem


# --- input errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/octet-stream",
     "multipart/form-data; boundary=x"],
)  # fmt: skip
@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_a_json_body_of_another_media_type_is_415(
    api: Api, content_type: str, method: str
) -> None:
    _, job = await create(api)
    url = f"{api.url}/jobs" if method == "POST" else f"{api.url}/jobs/{job['id']}"
    async with api.session.request(
        method,
        url,
        data=b'{"taskId": "noop"}',
        headers={**api.auth(), "Content-Type": content_type},
    ) as resp:
        problem = await resp.json(content_type=None)
        assert (resp.status, problem["code"]) == (415, "unsupported_media_type"), problem
        assert resp.content_type == "application/problem+json"
    assert len((await listing(api))[1]["items"]) == 1


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "application/merge-patch+json"],
)
async def test_json_media_types_are_accepted(api: Api, content_type: str) -> None:
    async with api.session.post(
        f"{api.url}/jobs",
        data=b'{"taskId": "noop"}',
        headers={**api.auth(), "Content-Type": content_type},
    ) as resp:
        assert resp.status == 201


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"taskId": "noop", "taskId": "echo"}', "taskId"),
        (b'{"taskId": "noop", "labels": {"team": "a", "team": "b"}}', "labels.team"),
        (b'{"taskId": "noop", "parameters": {"x": [{"k": 1, "k": 2}]}}', "parameters.x[0].k"),
    ],
)
async def test_a_duplicate_json_key_is_422_naming_its_path(
    api: Api, raw: bytes, field: str
) -> None:
    async with api.session.post(
        f"{api.url}/jobs", data=raw, headers={**api.auth(), **JSON}
    ) as resp:
        problem = await resp.json(content_type=None)
        assert (resp.status, fields_of(problem)) == (422, [field]), problem
    assert (await listing(api))[1]["items"] == []


@pytest.mark.parametrize(
    "query", ["status=SCHEDULED&status=PAUSED", "labels=a&labels=b", "limit=1&limit=2"]
)
async def test_a_repeated_query_parameter_is_422_naming_it(api: Api, query: str) -> None:
    async with api.session.get(f"{api.url}/jobs?{query}", headers=api.auth()) as resp:
        problem = await resp.json(content_type=None)
        assert (resp.status, fields_of(problem)) == (422, [query.split("=", maxsplit=1)[0]]), (
            problem
        )


async def test_start_time_after_end_time_is_422(api: Api) -> None:
    status, problem = await listing(
        api, startTime="2026-06-02T00:00:00Z", endTime="2026-06-01T00:00:00Z"
    )
    assert (status, fields_of(problem)) == (422, ["startTime"]), problem
    status, _ = await listing(api, startTime="2026-06-01T00:00:00Z", endTime="2026-06-01T00:00:00Z")
    assert status == 200


def test_the_openapi_document_has_the_filters_and_the_new_fields() -> None:
    doc = openapi_document()
    listing_params = {p["name"] for p in doc["paths"]["/jobs"]["get"]["parameters"]}
    assert {"taskId", "name", "labels", "idempotencyKey"} <= listing_params
    assert "415" in doc["paths"]["/jobs"]["post"]["responses"]
    assert "415" in doc["paths"]["/jobs/{job_id}"]["patch"]["responses"]
    schemas = doc["components"]["schemas"]
    assert schemas["JobCreate"]["properties"]["labels"]["additionalProperties"] == {
        "type": "string"
    }
    assert schemas["Job"]["properties"]["labels"]["additionalProperties"] == {"type": "string"}
    assert "pattern" in schemas["JobCreate"]["properties"]["name"]["anyOf"][0]
    assert "merge patch" in schemas["JobPatch"]["properties"]["labels"]["anyOf"][0]["description"]
