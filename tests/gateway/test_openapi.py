"""The OpenAPI document is valid OpenAPI 3.1, describes exactly the routes the gateway serves,
and is served with an HTML page."""

from __future__ import annotations

import re
from pathlib import Path

from openapi_spec_validator import validate

from core.clock import SystemClock
from core.settings import GatewayConfig
from gateway.app import GatewayDeps, create_app
from gateway.openapi import ROUTES, UNDOCUMENTED, openapi_document
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.conftest import TEST_SECRET
from tests.gateway.conftest import Api


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document(task_ids=["noop"])
    validate(doc)
    assert doc["openapi"] == "3.1.0"
    assert doc["components"]["schemas"]["JobCreate"]["properties"]["taskId"]["enum"] == ["noop"]


def test_the_document_describes_exactly_the_routes_served(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "never-opened.db")  # the routes are listed, none is called
    config = GatewayConfig(auth_secret=TEST_SECRET)
    app = create_app(GatewayDeps(store, None, builtin_catalog(), SystemClock(), config))
    served = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    documented = {(r.method, r.path.replace("{job_id}", "{job_id}")) for r in ROUTES}
    assert {s for s in served if s[1] not in UNDOCUMENTED} == documented
    paths = openapi_document()["paths"]
    assert {(m, p) for p, ops in paths.items() for m in ops} == documented


async def test_served_as_json_and_html(api: Api) -> None:
    async with api.session.get(f"{api.url}/openapi.json") as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert set(doc["components"]["schemas"]["JobCreate"]["properties"]["taskId"]["enum"]) >= {
        "noop",
        "generate_report",
    }
    async with api.session.get(f"{api.url}/docs") as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
        page = await resp.text()
    for path in doc["paths"]:
        assert path in page


def test_operations_have_readable_ids_and_tags() -> None:
    doc = openapi_document()
    ops = [op for ops in doc["paths"].values() for op in ops.values()]
    ids = [op["operationId"] for op in ops]
    assert len(ids) == len(set(ids)) == len(ROUTES)
    assert all(re.fullmatch(r"[a-z]+[A-Z][A-Za-z]*", i) for i in ids), ids
    assert {"createJob", "listJobs", "listExecutions", "previewSchedule"} <= set(ids)
    tags = {t["name"] for t in doc["tags"]}
    assert all(len(op["tags"]) == 1 and op["tags"][0] in tags for op in ops)


def test_every_instant_is_a_date_time() -> None:
    """Generated clients type a field by its format: an instant without it becomes a str."""
    schemas = openapi_document()["components"]["schemas"]
    instants = {
        ("Job", "createdAt"),
        ("Job", "nextRunAt"),
        ("Execution", "scheduledFor"),
        ("Execution", "startedAt"),
        ("AuditRecord", "at"),
    }
    for schema, field in instants:
        prop = schemas[schema]["properties"][field]
        variants = prop.get("anyOf", [prop])
        assert {"type": "string", "format": "date-time"} in variants, (schema, field, prop)
    times = schemas["FireTimes"]["properties"]["fireTimes"]["items"]
    assert times == {"type": "string", "format": "date-time"}
