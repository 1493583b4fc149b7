"""Roles, scopes, quotas and the audit trail through real HTTP on a real SQLite store.

Tokens carry ``role`` and ``scope``; the quotas' buckets and counts live in the store, so two
gateways on one database share them. The clock is fake, so token refills are exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import aiohttp
import jwt
import pytest
from aiohttp.test_utils import TestServer

from core.access import READ, SCOPES, Role
from core.clock import FakeClock
from core.quotas import UNLIMITED, Quotas
from core.settings import GatewayConfig
from gateway.app import GatewayDeps, create_app
from gateway.auth import mint_token
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.conftest import TEST_SECRET

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
CRON = {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}


class Caller(TypedDict):
    """Who :meth:`Gateway.call` mints the token for."""

    user: str
    role: Role
    scopes: NotRequired[frozenset[str]]


@dataclass
class Gateway:
    url: str
    store: SqliteStore
    session: aiohttp.ClientSession

    async def call(
        self,
        method: str,
        path: str,
        *,
        user: str = "alice",
        role: Role = Role.USER,
        scopes: frozenset[str] = SCOPES,
        body: Any = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        token = mint_token(TEST_SECRET, user, role=role, scopes=scopes)
        async with self.session.request(
            method,
            self.url + path,
            json=body,
            params=params,
            headers={"Authorization": f"Bearer {token}"},
        ) as resp:
            data = await resp.json(content_type=None) if resp.status != 204 else None
            return resp.status, data, dict(resp.headers)

    async def create(self, user: str = "alice", body: Any = None) -> dict[str, Any]:
        status, job, _ = await self.call("POST", "/jobs", user=user, body=body or CRON)
        assert status == 201, job
        return dict(job)


@dataclass
class Deployment:
    clock: FakeClock
    gateways: list[Gateway]

    @property
    def gw(self) -> Gateway:
        return self.gateways[0]


async def deployment(
    tmp_path: Path, quotas: Quotas, *, gateways: int = 1
) -> AsyncIterator[Deployment]:
    clock = FakeClock(T0)
    servers: list[TestServer] = []
    stores: list[SqliteStore] = []
    async with aiohttp.ClientSession() as session:
        out: list[Gateway] = []
        for _ in range(gateways):  # each with its own store connection, as separate processes
            store = SqliteStore(tmp_path / "shared.db")
            await store.open()
            deps = GatewayDeps(
                store=store,
                bus=None,
                catalog=builtin_catalog(),
                clock=clock,
                config=GatewayConfig(auth_secret=TEST_SECRET, partitions=8, quotas=quotas),
            )
            server = TestServer(create_app(deps), host="127.0.0.1")
            await server.start_server()
            servers.append(server)
            stores.append(store)
            out.append(Gateway(str(server.make_url("")).rstrip("/"), store, session))
        try:
            yield Deployment(clock, out)
        finally:
            for server in servers:
                await server.close()
            for store in stores:
                await store.close()


@pytest.fixture
async def open_deployment(tmp_path: Path) -> AsyncIterator[Deployment]:
    """No quota limits: roles and the audit trail only."""
    async for d in deployment(tmp_path, UNLIMITED):
        yield d


# --- roles and scopes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"role": "superuser"}, "unknown role"),
        ({"scope": "jobs:read jobs:delete"}, "unknown scope"),
        ({"scope": ""}, "no scope"),
        ({"role": ["admin"]}, "unknown role"),
    ],
)
async def test_a_token_with_an_unknown_role_or_scope_is_unauthorized(
    open_deployment: Deployment, claims: dict[str, Any], reason: str
) -> None:
    exp = datetime.now(UTC) + timedelta(hours=1)
    token = jwt.encode({"sub": "alice", "exp": exp, **claims}, TEST_SECRET, algorithm="HS256")
    async with open_deployment.gw.session.get(
        open_deployment.gw.url + "/jobs", headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        body = await resp.json(content_type=None)
    assert resp.status == 401 and body["code"] == "unauthorized"
    assert reason in body["detail"]


async def test_a_token_without_role_or_scope_is_a_user_with_every_scope(
    open_deployment: Deployment,
) -> None:
    exp = datetime.now(UTC) + timedelta(hours=1)
    token = jwt.encode({"sub": "alice", "exp": exp}, TEST_SECRET, algorithm="HS256")
    async with open_deployment.gw.session.post(
        open_deployment.gw.url + "/jobs", json=CRON, headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        assert resp.status == 201


async def test_a_read_only_token_reads_but_changes_nothing(open_deployment: Deployment) -> None:
    gw = open_deployment.gw
    job = await gw.create()
    reader = frozenset({READ})
    for path in (f"/jobs/{job['id']}", "/jobs", f"/jobs/{job['id']}/executions",
                 f"/jobs/{job['id']}/audit", f"/jobs/{job['id']}/upcoming"):  # fmt: skip
        status, _, _ = await gw.call("GET", path, scopes=reader)
        assert status == 200, path
    changes = [("POST", "/jobs", CRON), ("PATCH", f"/jobs/{job['id']}", {"queue": "q2"})]
    changes += [("POST", f"/jobs/{job['id']}/{a}", None) for a in ("pause", "trigger", "cancel")]
    changes += [("DELETE", f"/jobs/{job['id']}", None)]
    for method, path, body in changes:
        status, problem, _ = await gw.call(method, path, scopes=reader, body=body)
        assert (status, problem["code"]) == (403, "forbidden"), (method, path)
        assert "read-only" in problem["detail"]
    status, now, _ = await gw.call("GET", f"/jobs/{job['id']}")
    assert now["status"] == "SCHEDULED" and now["queue"] == "default"
    status, page, _ = await gw.call("GET", "/jobs")
    assert len(page["items"]) == 1


async def test_a_user_sees_and_changes_only_their_own_jobs(open_deployment: Deployment) -> None:
    gw = open_deployment.gw
    bobs = await gw.create("bob")
    for method, path in [("GET", f"/jobs/{bobs['id']}"), ("POST", f"/jobs/{bobs['id']}/pause"),
                         ("GET", f"/jobs/{bobs['id']}/audit")]:  # fmt: skip
        status, problem, _ = await gw.call(method, path)
        assert (status, problem["code"]) == (404, "job_not_found"), path
    for params in ({"owner": "bob"}, {"allUsers": "true"}):
        status, problem, _ = await gw.call("GET", "/jobs", params=params)
        assert (status, problem["code"]) == (403, "forbidden")
        status, problem, _ = await gw.call("GET", "/audit", params=params)
        assert (status, problem["code"]) == (403, "forbidden")
    status, page, _ = await gw.call("GET", "/jobs", params={"owner": "alice"})
    assert status == 200 and page["items"] == []


async def test_an_admin_lists_and_acts_on_every_users_jobs_under_their_own_name(
    open_deployment: Deployment,
) -> None:
    gw = open_deployment.gw
    alices = await gw.create("alice")
    await open_deployment.clock.advance(1)
    bobs = await gw.create("bob")
    admin = Caller(user="root", role=Role.ADMIN)
    status, page, _ = await gw.call("GET", "/jobs", params={"allUsers": "true"}, **admin)
    assert status == 200 and [j["id"] for j in page["items"]] == [bobs["id"], alices["id"]]
    status, page, _ = await gw.call("GET", "/jobs", params={"owner": "bob"}, **admin)
    assert [j["id"] for j in page["items"]] == [bobs["id"]]
    status, page, _ = await gw.call("GET", "/jobs", **admin)
    assert page["items"] == [], "without a filter an admin lists their own jobs"
    status, job, _ = await gw.call("GET", f"/jobs/{bobs['id']}", **admin)
    assert status == 200 and job["owner"] == "bob"
    await open_deployment.clock.advance(1)
    status, job, _ = await gw.call("POST", f"/jobs/{bobs['id']}/pause", **admin)
    assert status == 200 and job["status"] == "PAUSED" and job["owner"] == "bob"
    await open_deployment.clock.advance(1)
    status, run, _ = await gw.call("POST", f"/jobs/{bobs['id']}/trigger", **admin)
    assert status == 201 and run["owner"] == "bob"
    status, trail, _ = await gw.call("GET", f"/jobs/{bobs['id']}/audit", user="bob")
    assert [(r["action"], r["actor"], r["actorRole"], r["owner"]) for r in trail["items"]] == [
        ("triggered", "root", "admin", "bob"),
        ("paused", "root", "admin", "bob"),
        ("created", "bob", "user", "bob"),
    ]
    assert trail["items"][0]["executionId"] == run["id"]
    status, done, _ = await gw.call(
        "GET", "/audit", params={"actor": "root", "allUsers": "true"}, **admin
    )
    assert [r["action"] for r in done["items"]] == ["triggered", "paused"]
    await open_deployment.clock.advance(1)
    status, _, _ = await gw.call("DELETE", f"/jobs/{bobs['id']}", **admin)
    assert status == 204
    status, trail, _ = await gw.call("GET", "/audit", user="bob")
    assert trail["items"][0]["action"] == "deleted" and trail["items"][0]["actor"] == "root"


async def test_a_read_only_admin_reads_everything_and_changes_nothing(
    open_deployment: Deployment,
) -> None:
    gw = open_deployment.gw
    bobs = await gw.create("bob")
    viewer = Caller(user="dash", role=Role.ADMIN, scopes=frozenset({READ}))
    status, page, _ = await gw.call("GET", "/jobs", params={"allUsers": "true"}, **viewer)
    assert status == 200 and len(page["items"]) == 1
    status, problem, _ = await gw.call("POST", f"/jobs/{bobs['id']}/cancel", **viewer)
    assert (status, problem["code"]) == (403, "forbidden")


# --- the audit trail ---------------------------------------------------------------------------


async def test_every_change_of_a_job_is_in_its_audit_trail(open_deployment: Deployment) -> None:
    gw, clock = open_deployment.gw, open_deployment.clock
    body = {**CRON, "parameters": {}}
    job = await gw.create(body=body)
    path = f"/jobs/{job['id']}"
    steps = [
        ("PATCH", path, {"schedule": {"type": "cron", "expression": "0 4 * * *"}}),
        ("POST", path + "/pause", None),
        ("POST", path + "/resume", None),
        ("POST", path + "/trigger", None),
        ("POST", path + "/cancel", None),
        ("DELETE", path, None),
    ]
    for method, p, b in steps:
        await clock.advance(1)
        status, _, _ = await gw.call(method, p, body=b)
        assert status in (200, 201, 204), (method, p)
    status, trail, _ = await gw.call("GET", path + "/audit")
    assert status == 200
    records = trail["items"]
    assert [r["action"] for r in records] == [
        "deleted", "cancelled", "triggered", "resumed", "paused", "changed", "created",
    ]  # fmt: skip
    assert [r["at"] for r in records] == [
        (T0 + timedelta(seconds=s)).isoformat().replace("+00:00", "Z") for s in range(6, -1, -1)
    ]
    assert all(r["actor"] == "alice" and r["owner"] == "alice" for r in records)
    changed = {c["field"]: c for c in records[5]["changes"]}
    assert changed["schedule"]["old"]["expression"] == "0 3 * * *"
    assert changed["schedule"]["new"]["expression"] == "0 4 * * *"
    cancelled = {c["field"]: (c["old"], c["new"]) for c in records[1]["changes"]}
    assert cancelled["status"] == ("SCHEDULED", "CANCELLED")
    status, page, _ = await gw.call("GET", path + "/audit", params={"limit": "2"})
    assert len(page["items"]) == 2 and page["nextCursor"]
    status, rest, _ = await gw.call(
        "GET", path + "/audit", params={"limit": "10", "cursor": page["nextCursor"]}
    )
    assert [r["action"] for r in rest["items"]] == [r["action"] for r in records[2:]]
    status, problem, _ = await gw.call("GET", "/jobs/nope/audit")
    assert (status, problem["code"]) == (404, "job_not_found")
    status, problem, _ = await gw.call("GET", "/audit", params={"allUsers": "maybe"})
    assert (status, problem["errors"][0]["field"]) == (422, "allUsers")


# --- quotas ------------------------------------------------------------------------------------


async def test_creations_per_second_are_limited_across_gateways(tmp_path: Path) -> None:
    quotas = Quotas(creates_per_second=2, creates_burst=3, active_jobs=0, runs_per_minute=0)
    async for d in deployment(tmp_path, quotas, gateways=2):
        a, b = d.gateways
        for gw in (a, b, a):
            await gw.create()
        for gw in (b, a):
            status, problem, headers = await gw.call("POST", "/jobs", body=CRON)
            assert (status, problem["code"]) == (429, "quota_exceeded")
            assert problem["limit"] == {"name": "createsPerSecond", "value": 2.0}
            assert headers["Retry-After"] == "1"
            assert "2 job creations per second" in problem["detail"]
        await b.create("bob")  # another user's bucket
        await d.clock.advance(0.5)
        await b.create()
        status, _, _ = await a.call("POST", "/jobs", body=CRON)
        assert status == 429
        status, page, _ = await a.call("GET", "/jobs")
        assert len(page["items"]) == 4, "a refused creation stores nothing"


async def test_active_jobs_are_limited_and_freed_by_cancelling(tmp_path: Path) -> None:
    quotas = Quotas(active_jobs=2, creates_per_second=0, runs_per_minute=0)
    async for d in deployment(tmp_path, quotas, gateways=2):
        a, b = d.gateways
        first = await a.create()
        second = await b.create()
        status, _, _ = await a.call("POST", f"/jobs/{second['id']}/pause")
        assert status == 200, "a paused job still counts"
        status, problem, headers = await b.call("POST", "/jobs", body=CRON)
        assert (status, problem["code"]) == (429, "quota_exceeded")
        assert problem["limit"] == {"name": "activeJobs", "value": 2.0}
        assert "Retry-After" not in headers, "waiting does not free a job"
        await b.create("bob")
        status, _, _ = await a.call("POST", f"/jobs/{first['id']}/cancel")
        assert status == 200
        await b.create()


async def test_an_interval_below_the_smallest_is_invalid_on_create_and_patch(
    tmp_path: Path,
) -> None:
    async for d in deployment(tmp_path, Quotas(min_interval_seconds=5)):
        gw = d.gw
        fast = {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 0.001}}
        status, problem, _ = await gw.call("POST", "/jobs", body=fast)
        assert (status, problem["code"]) == (422, "validation_error")
        assert problem["errors"][0]["field"] == "schedule.everySeconds"
        assert "at least 5 s" in problem["errors"][0]["reason"]
        job = await gw.create(body={**fast, "schedule": {"type": "interval", "everySeconds": 5}})
        status, problem, _ = await gw.call(
            "PATCH", f"/jobs/{job['id']}", body={"schedule": fast["schedule"]}
        )
        assert (status, problem["errors"][0]["field"]) == (422, "schedule.everySeconds")
        seconds_cron = {"taskId": "noop", "schedule": {"type": "cron", "expression": "* * * * * *"}}
        status, problem, _ = await gw.call("POST", "/jobs", body=seconds_cron)
        assert (status, problem["errors"][0]["field"]) == (422, "schedule.expression")
        status, page, _ = await gw.call("GET", "/jobs")
        assert len(page["items"]) == 1


async def test_manual_runs_count_against_the_owners_runs_per_minute(tmp_path: Path) -> None:
    quotas = Quotas(runs_per_minute=2, active_jobs=0, creates_per_second=0)
    async for d in deployment(tmp_path, quotas, gateways=2):
        a, b = d.gateways
        job = await a.create("bob")
        path = f"/jobs/{job['id']}/trigger"
        for gw in (a, b):
            status, _, _ = await gw.call("POST", path, user="bob")
            assert status == 201
        status, problem, headers = await a.call("POST", path, user="root", role=Role.ADMIN)
        assert (status, problem["code"]) == (429, "quota_exceeded"), "bob's quota, whoever asks"
        assert problem["limit"] == {"name": "runsPerMinute", "value": 2.0}
        assert headers["Retry-After"] == "30"
        await d.clock.advance(30)
        status, _, _ = await b.call("POST", path, user="bob")
        assert status == 201


async def test_active_jobs_hold_across_gateways_that_count_only_when_it_can_matter(
    tmp_path: Path,
) -> None:
    """A gateway recounts when the shared creation rate could have filled the quota since its
    last count — so another gateway's creations are never missed."""
    quotas = Quotas(active_jobs=3, creates_per_second=1, creates_burst=1, runs_per_minute=0)
    async for d in deployment(tmp_path, quotas, gateways=2):
        a, b = d.gateways
        for gw in (a, b, a):
            await gw.create()
            await d.clock.advance(1)
        status, problem, _ = await b.call("POST", "/jobs", body=CRON)
        assert (status, problem["limit"]["name"]) == (429, "activeJobs")
        await d.clock.advance(1)
        status, problem, _ = await a.call("POST", "/jobs", body=CRON)
        assert (status, problem["limit"]["name"]) == (429, "activeJobs")
