"""Values no store can hold are refused at the API with a 422 naming the field, on every store.

msgspec accepts integers of any size and NUL in object keys; BSON holds neither, and SQLite took
them. So a task whose schema allows them answered 201 on SQLite and 500 on MongoDB. The range
is core/values.py's, the same for both stores; these tests run the real HTTP gateway over SQLite
and over the MongoDB store on its in-process fake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp.test_utils import TestServer

from core.clock import SystemClock
from core.errors import StoreRejected
from core.ports import JobQuery, JobStore
from core.settings import GatewayConfig
from core.tasks import TaskContext
from core.values import MAX_DEPTH, MAX_INT, MIN_INT
from gateway.app import GatewayDeps, create_app
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.gateway.conftest import Api
from tests.store.backends import fake_mongo_store


class FreeParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A schema that bounds nothing: whatever JSON the user sends reaches the store."""

    n: int = 0
    data: dict[str, Any] = {}


def catalog() -> Any:
    tasks = builtin_catalog()

    @tasks.task("free", params=FreeParams)
    async def free(params: FreeParams, ctx: TaskContext) -> None:
        return None

    return tasks


async def open_store(kind: str, tmp_path: Path) -> JobStore:
    if kind == "sqlite":
        store = SqliteStore(tmp_path / "x.db")
        await store.open()
        return store
    return await fake_mongo_store()


@pytest.fixture(params=["sqlite", "mongo-fake"])
async def api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    store = await open_store(request.param, tmp_path)
    deps = GatewayDeps(
        store=store,
        bus=None,
        catalog=catalog(),
        clock=SystemClock(),
        config=GatewayConfig(auth_secret="s" * 32, partitions=8, max_body_bytes=1 << 20),
    )
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield Api(str(server.make_url("")).rstrip("/"), store, session)
    await server.close()
    await store.close()


def auth() -> dict[str, str]:
    from datetime import timedelta

    from gateway.auth import mint_token

    return {"Authorization": f"Bearer {mint_token('s' * 32, 'alice', ttl=timedelta(hours=1))}"}


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


OUTSIDE = [
    pytest.param({"n": 2**64}, "parameters.n", id="int-2^64"),
    pytest.param({"n": MIN_INT - 1}, "parameters.n", id="int-below"),
    pytest.param({"data": {"rows": [1, 2**63]}}, "parameters.data.rows[1]", id="nested-int"),
    pytest.param({"data": {"a\u0000b": 1}}, "parameters.data.a\\u0000b", id="nul-in-key"),
    pytest.param(
        {"data": deep(MAX_DEPTH)}, "parameters.data" + ".a" * (MAX_DEPTH - 1), id="too-deep"
    ),
]


async def post(api: Api, body: Any, **headers: str) -> tuple[int, Any]:
    raw = msgspec.json.encode(body)
    async with api.session.post(
        f"{api.url}/jobs",
        data=raw,
        headers={**auth(), "Content-Type": "application/json", **headers},
    ) as resp:
        return resp.status, await resp.json(content_type=None)


async def stored_jobs(api: Api) -> int:
    page = await api.store.list_jobs("alice", JobQuery(), limit=10, cursor=None)
    return len(page.items)


@pytest.mark.parametrize(("parameters", "field"), OUTSIDE)
async def test_a_value_no_store_can_hold_is_422_naming_the_field(
    api: Api, parameters: dict[str, Any], field: str
) -> None:
    status, problem = await post(api, {"taskId": "free", "parameters": parameters})

    assert status == 422, problem
    assert problem["code"] == "validation_error"
    assert problem["errors"][0]["field"] == field
    assert await stored_jobs(api) == 0


@pytest.mark.parametrize(("parameters", "field"), OUTSIDE)
async def test_a_patch_outside_the_range_is_422_and_changes_nothing(
    api: Api, parameters: dict[str, Any], field: str
) -> None:
    status, job = await post(api, {"taskId": "free", "parameters": {"n": 1}})
    assert status == 201, job
    async with api.session.patch(
        f"{api.url}/jobs/{job['id']}", json={"parameters": parameters}, headers=auth()
    ) as resp:
        problem = await resp.json(content_type=None)
        assert resp.status == 422, problem
    assert problem["errors"][0]["field"] == field
    assert (await api.store.get_job("alice", job["id"])).parameters == {"n": 1}


async def test_the_edges_of_the_range_are_stored_and_read_back_equal(api: Api) -> None:
    parameters = {
        "n": MAX_INT,
        "data": {"min": MIN_INT, "$dollar": {"dot.ted": [1.5, None, True]}, "deep": deep(28)},
    }
    status, job = await post(api, {"taskId": "free", "parameters": parameters})

    assert status == 201, job
    assert job["parameters"] == parameters
    assert (await api.store.get_job("alice", job["id"])).parameters == parameters


async def test_an_idempotency_key_that_is_not_utf8_is_422(api: Api) -> None:
    """aiohttp hands the bytes of a header that is not UTF-8 over as lone surrogates, which
    neither store can encode (a 500 on both before)."""
    host, port = api.url.removeprefix("http://").split(":")
    body = b'{"taskId": "noop"}'
    token = auth()["Authorization"]
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Authorization: {token}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\n".encode()
            + b"Idempotency-Key: key-\xff\xfe\r\n\r\n"
            + body
        )
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()
    finally:
        writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 422"), answer[:200]
    assert msgspec.json.decode(payload)["errors"][0]["field"] == "Idempotency-Key"
    assert await stored_jobs(api) == 0


class RejectingStore(SqliteStore):
    async def create_job(
        self, job: Any, *, request_hash: str | None = None, audit: Any = None
    ) -> Any:
        raise StoreRejected("the store refuses this write (test): DocumentValidationFailure")


async def test_a_write_the_store_refuses_for_good_is_a_logged_500_problem_never_a_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not "unavailable" (a client would retry forever); not hidden either: it means the
    validation let through something the store refuses (or an operator's validator did)."""
    store = RejectingStore(tmp_path / "x.db")
    await store.open()
    deps = GatewayDeps(
        store=store,
        bus=None,
        catalog=catalog(),
        clock=SystemClock(),
        config=GatewayConfig(auth_secret="s" * 32, partitions=8, max_body_bytes=4096),
    )
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            with caplog.at_level(logging.ERROR, logger="gateway.app"):
                async with session.post(
                    f"{str(server.make_url('')).rstrip('/')}/jobs",
                    json={"taskId": "noop"},
                    headers=auth(),
                ) as resp:
                    problem = await resp.json(content_type=None)
                    assert resp.status == 500 and "Retry-After" not in resp.headers
    finally:
        await server.close()
        await store.close()
    assert problem["code"] == "store_rejected" and problem["title"] == "Internal error"
    assert [
        r
        for r in caplog.records
        if "store_rejected" in r.getMessage() or "refuses" in r.getMessage()
    ]
