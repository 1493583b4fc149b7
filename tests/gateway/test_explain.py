"""``GET /jobs/{id}/explain`` through real HTTP on a real SQLite store, without NATS: tenant
scoping, bad input, the store's part of the answer (runs, quota), and the bus checks reported
unavailable rather than guessed. The checks through NATS are in tests/e2e/test_explain.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp.test_utils import TestServer

from core.access import READ, Role
from core.clock import FakeClock
from core.explain import LeaseView, QueueState
from core.quotas import Quotas, TokenRequest, runs_key
from core.settings import GatewayConfig
from gateway.app import GatewayDeps, create_app
from gateway.auth import mint_token
from gateway.openapi import openapi_document
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.conftest import TEST_SECRET
from tests.fakes import FakeBus, FakeInspector, FakeLeases

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
HOURLY = {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 3600}}


class RecordingInspector(FakeInspector):
    """:class:`tests.fakes.FakeInspector` (what the bus would answer) that records each look:
    every partition leased by ``sched-1``, the ``default`` queue's consumer bound, no other."""

    def __init__(self) -> None:
        bus, leases = FakeBus(), FakeLeases()
        bus.work_queue("default")
        for partition in range(8):
            leases.steal(partition, "sched-1")
        super().__init__(bus, leases)
        self.asked: list[tuple[str, object]] = []

    async def queue_state(self, queue: str) -> QueueState:
        self.asked.append(("queue", queue))
        return await super().queue_state(queue)

    async def partition_lease(self, partition: int) -> LeaseView:
        self.asked.append(("lease", partition))
        return await super().partition_lease(partition)


class Gateway:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def call(
        self,
        method: str,
        path: str,
        user: str = "alice",
        *,
        role: Role = Role.USER,
        scopes: frozenset[str] | None = None,
        body: Any = None,
    ) -> tuple[int, Any]:
        kw: dict[str, Any] = {"role": role} | ({"scopes": scopes} if scopes else {})
        token = mint_token(TEST_SECRET, user, ttl=timedelta(hours=1), **kw)
        async with self.session.request(
            method, self.url + path, json=body, headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            return resp.status, await resp.json()


async def start(
    tmp_path: Path, inspector: RecordingInspector | None, quotas: Quotas | None = None
) -> tuple[TestServer, SqliteStore]:
    store = SqliteStore(tmp_path / "gateway.db")
    await store.open()
    config = GatewayConfig(auth_secret=TEST_SECRET, partitions=8)
    if quotas is not None:
        config = msgspec.structs.replace(config, quotas=quotas)
    deps = GatewayDeps(
        store=store,
        bus=None,
        catalog=builtin_catalog(),
        clock=FakeClock(T0),
        config=config,
        inspector=inspector,
    )
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    return server, store


async def explain_with(
    tmp_path: Path, inspector: RecordingInspector | None, quotas: Quotas | None = None
) -> tuple[Gateway, TestServer, SqliteStore, aiohttp.ClientSession]:
    server, store = await start(tmp_path, inspector, quotas)
    session = aiohttp.ClientSession()
    return Gateway(str(server.make_url("")).rstrip("/"), session), server, store, session


async def close(server: TestServer, store: SqliteStore, session: aiohttp.ClientSession) -> None:
    await session.close()
    await server.close()
    await store.close()


async def test_a_user_explains_only_their_own_jobs_and_an_admin_any(tmp_path: Path) -> None:
    gw, server, store, session = await explain_with(tmp_path, RecordingInspector())
    try:
        status, job = await gw.call("POST", "/jobs", body=HOURLY)
        assert status == 201
        status, answer = await gw.call("GET", f"/jobs/{job['id']}/explain")
        assert status == 200
        assert (answer["jobId"], answer["status"], answer["at"]) == (
            job["id"],
            "SCHEDULED",
            "2026-06-01T10:00:00Z",
        )
        [healthy] = answer["reasons"]
        assert (healthy["code"], healthy["details"]["owner"]) == ("scheduled", "sched-1")

        status, problem = await gw.call("GET", f"/jobs/{job['id']}/explain", "bob")
        assert (status, problem["code"]) == (404, "job_not_found"), "as GET /jobs/{id}"
        status, missing = await gw.call("GET", "/jobs/no-such-job/explain")
        assert (status, missing["code"]) == (404, "job_not_found")
        assert problem["detail"] == missing["detail"].replace("no-such-job", job["id"]), (
            "another user's job and no job look alike"
        )
        status, seen = await gw.call("GET", f"/jobs/{job['id']}/explain", "root", role=Role.ADMIN)
        assert status == 200 and seen["jobId"] == job["id"]
        status, _ = await gw.call("GET", f"/jobs/{job['id']}/explain", scopes=frozenset({READ}))
        assert status == 200, "a read-only token may explain"
    finally:
        await close(server, store, session)


async def test_bad_input_is_a_problem_naming_it(tmp_path: Path) -> None:
    gw, server, store, session = await explain_with(tmp_path, RecordingInspector())
    try:
        _, job = await gw.call("POST", "/jobs", body=HOURLY)
        status, problem = await gw.call("GET", f"/jobs/{job['id']}/explain?verbose=1")
        assert (status, problem["errors"][0]["field"]) == (422, "verbose")
        async with session.get(f"{gw.url}/jobs/{job['id']}/explain") as resp:
            assert resp.status == 401
        status, problem = await gw.call("POST", f"/jobs/{job['id']}/explain")
        assert (status, problem["code"]) == (405, "method_not_allowed")
    finally:
        await close(server, store, session)


async def test_without_nats_the_bus_checks_are_said_to_be_unavailable(tmp_path: Path) -> None:
    gw, server, store, session = await explain_with(tmp_path, None)
    try:
        _, job = await gw.call("POST", "/jobs", body=HOURLY)
        _, answer = await gw.call("GET", f"/jobs/{job['id']}/explain")
        assert [r["code"] for r in answer["reasons"]] == [
            "scheduled",
            "check_unavailable",
            "check_unavailable",
        ]
        assert [r["details"]["check"] for r in answer["reasons"][1:]] == ["lease", "queue"]
    finally:
        await close(server, store, session)


async def test_a_paused_job_is_explained_by_its_pause(tmp_path: Path) -> None:
    inspector = RecordingInspector()
    gw, server, store, session = await explain_with(tmp_path, inspector)
    try:
        _, job = await gw.call("POST", "/jobs", body=HOURLY)
        await gw.call("POST", f"/jobs/{job['id']}/pause")
        _, answer = await gw.call("GET", f"/jobs/{job['id']}/explain")
        assert [r["code"] for r in answer["reasons"]] == ["paused"]
        assert ("lease", job["partition"]) in inspector.asked
    finally:
        await close(server, store, session)


async def test_a_cancelled_job_needs_no_bus_check(tmp_path: Path) -> None:
    inspector = RecordingInspector()
    gw, server, store, session = await explain_with(tmp_path, inspector)
    try:
        _, job = await gw.call("POST", "/jobs", body=HOURLY)
        await gw.call("POST", f"/jobs/{job['id']}/cancel")
        _, answer = await gw.call("GET", f"/jobs/{job['id']}/explain")
        assert [r["code"] for r in answer["reasons"]] == ["cancelled"]
        assert inspector.asked == []
    finally:
        await close(server, store, session)


async def test_the_runs_quota_is_read_from_the_store_without_taking_a_token(
    tmp_path: Path,
) -> None:
    quotas = Quotas(runs_per_minute=2)
    gw, server, store, session = await explain_with(tmp_path, RecordingInspector(), quotas)
    try:
        _, job = await gw.call(
            "POST", "/jobs", body={"taskId": "noop", "schedule": {"type": "immediate"}}
        )
        rate = quotas.runs
        assert rate is not None
        await store.take_tokens([TokenRequest(runs_key("alice"), 2, rate)], now=T0)
        before = await store.read_tokens([runs_key("alice")])
        _, answer = await gw.call("GET", f"/jobs/{job['id']}/explain")
        reason = answer["reasons"][0]
        assert (reason["code"], reason["severity"]) == ("quota_reached", "blocking")
        assert reason["details"]["retryAfterSeconds"] == 30.0, "1 token at 2 per minute"
        assert await store.read_tokens([runs_key("alice")]) == before, "explaining took nothing"
        _, other = await gw.call(
            "POST", "/jobs", "bob", body={"taskId": "noop", "schedule": {"type": "immediate"}}
        )
        _, bobs = await gw.call("GET", f"/jobs/{other['id']}/explain", "bob")
        assert "quota_reached" not in [r["code"] for r in bobs["reasons"]], "a quota per user"
    finally:
        await close(server, store, session)


async def test_a_queue_without_consumer_is_named_for_a_queued_run(tmp_path: Path) -> None:
    inspector = RecordingInspector()  # no worker of queue gpu
    gw, server, store, session = await explain_with(tmp_path, inspector)
    try:
        _, job = await gw.call("POST", "/jobs", body={"taskId": "noop", "queue": "gpu", **HOURLY})
        status, run = await gw.call("POST", f"/jobs/{job['id']}/trigger")
        assert status == 201
        _, answer = await gw.call("GET", f"/jobs/{job['id']}/explain")
        first = answer["reasons"][0]
        assert (first["code"], first["details"]["executionId"]) == ("queue_no_consumer", run["id"])
        assert ("queue", "gpu") in inspector.asked
    finally:
        await close(server, store, session)


async def test_a_bus_that_does_not_answer_is_reported_not_a_failure(tmp_path: Path) -> None:
    inspector = RecordingInspector()
    inspector.failures = 2  # the queue and the lease look both fail
    gw, server, store, session = await explain_with(tmp_path, inspector)
    try:
        _, job = await gw.call("POST", "/jobs", body=HOURLY)
        status, answer = await gw.call("GET", f"/jobs/{job['id']}/explain")
        assert status == 200
        unavailable = [r["details"]["check"] for r in answer["reasons"]
                       if r["code"] == "check_unavailable"]  # fmt: skip
        assert unavailable == ["lease", "queue"]
        assert answer["reasons"][0]["code"] == "scheduled"
        _, again = await gw.call("GET", f"/jobs/{job['id']}/explain")
        assert [r["code"] for r in again["reasons"]] == ["scheduled"], "answered again"
    finally:
        await close(server, store, session)


def test_the_openapi_document_describes_explain() -> None:
    doc = openapi_document()
    op = doc["paths"]["/jobs/{job_id}/explain"]["get"]
    assert (op["operationId"], op["tags"]) == ("explainJob", ["diagnostics"])
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Explanation"
    }
    reason = doc["components"]["schemas"]["Reason"]
    # always in the answer, so required (a generated client types them without Unset)
    assert set(reason["required"]) == {"code", "severity", "message", "details"}
    assert set(reason["properties"]["severity"]["enum"]) == {"blocking", "warning", "info"}
    assert "diagnostics" in {t["name"] for t in doc["tags"]}
