"""The OpenAPI document is valid OpenAPI 3.1, describes exactly the routes the gateway serves,
and is served with an HTML page."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

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


def validate_independently(doc: dict[str, Any]) -> None:
    """The second validator: schemathesis's loader checks the document against its own copy of
    the OpenAPI 3.1 schema with jsonschema_rs (a JSON Schema implementation in Rust), sharing no
    code with openapi-spec-validator (python-jsonschema and openapi-schema-validator)."""
    schemathesis.openapi.from_dict(doc).validate()


def test_a_second_independent_validator_accepts_the_document() -> None:
    validate_independently(openapi_document(task_ids=["noop"]))


DELETE = object()
BREAKAGES: dict[str, tuple[tuple[str | int, ...], str, Any]] = {
    "a parameter in an unknown place": (("/jobs", "get", "parameters", 0), "in", "querystring"),
    "a misspelt operation field": (("/jobs", "post"), "requestBodies", {}),
    "a response without description": (("/jobs", "get", "responses", "200"), "description", DELETE),
    "an optional path parameter": (("/jobs/{job_id}", "get", "parameters", 0), "required", False),
}
"""A document broken in one place: (the object's path under ``paths``, its key, the new value
or DELETE)."""


@pytest.mark.parametrize("breakage", BREAKAGES.values(), ids=BREAKAGES.keys())
def test_both_validators_reject_a_broken_document(
    breakage: tuple[tuple[str | int, ...], str, Any],
) -> None:
    """Each validator is a real check: the same document, broken in one place, fails both."""
    doc = copy.deepcopy(openapi_document())
    where, key, new = breakage
    target: Any = doc["paths"]
    for step in where:
        target = target[step]
    if new is DELETE:
        del target[key]
    else:
        target[key] = new
    with pytest.raises(OpenAPIValidationError):
        validate(doc)
    with pytest.raises(jsonschema_rs.ValidationError):
        validate_independently(doc)


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
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        page = await resp.text()
    for path in doc["paths"]:
        assert path in page  # the listing without JavaScript
    assert "<code>taskId</code></td><td>body, required</td>" in page
    assert "201 Created" in page and "<script src='/docs/assets/docs.js' defer>" in page
    for asset in ("docs.js", "swagger-ui-bundle.js", "swagger-ui.css"):
        async with api.session.get(f"{api.url}/docs/assets/{asset}") as resp:
            assert resp.status == 200, asset
            assert resp.headers["Content-Security-Policy"].startswith("default-src 'none'")
    for other in ("index.html", "swagger-editor.js", "..%2Fapidocs.py"):
        async with api.session.get(f"{api.url}/docs/assets/{other}") as resp:
            assert resp.status == 404, other


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


def test_descriptions_name_api_fields_in_markdown() -> None:
    """Docstrings become descriptions: no Sphinx role, no Python field name (``max_attempts``)
    is left for a reader of /docs, whose markdown renders code spans."""
    schemas = openapi_document()["components"]["schemas"]
    texts = [s["description"] for s in schemas.values() if "description" in s]
    assert "`maxAttempts` and `timeoutSeconds`" in schemas["JobCreate"]["description"]
    assert not [t for t in texts if re.search(r":class:|``[a-z]+_[a-z_]+``", t)]
