"""``GET /stats/overview`` over real HTTP on both stores (SQLite, the MongoDB fake): the page's
numbers, tenant isolation (a user never sees another's counts), admins' all-users view, bad
input as problems."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp.test_utils import TestServer

from core.access import Role
from core.clock import FakeClock
from core.cluster import BusView, Lease, Member, QueueInfo, WorkerHeartbeat, WorkerPresence
from core.model import TERMINAL_RANK, ExecutionStatus, state_rank
from core.ports import JobStore
from core.settings import GatewayConfig
from gateway.app import GatewayDeps, create_app
from gateway.auth import mint_token
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.conftest import TEST_SECRET
from tests.store.test_contract import make_execution, make_job

NOW = datetime(2026, 6, 1, 10, 30, 20, tzinfo=UTC)
S = ExecutionStatus


@dataclass
class Gateway:
    url: str
    store: JobStore
    clock: FakeClock
    session: aiohttp.ClientSession

    async def get(self, path: str, user: str = "alice", role: Role = Role.USER) -> tuple[int, Any]:
        token = mint_token(TEST_SECRET, user, role=role)
        async with self.session.get(
            self.url + path, headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            return resp.status, await resp.json(content_type=None)


async def _open_store(kind: str, tmp_path: Path) -> JobStore:
    if kind == "sqlite":
        store = SqliteStore(tmp_path / "stats.db")
        await store.open()
        return store
    from tests.store.backends import fake_mongo_store

    return await fake_mongo_store()


@pytest.fixture(params=["sqlite", "mongo-fake"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Gateway]:
    store = await _open_store(request.param, tmp_path)
    clock = FakeClock(NOW)
    deps = GatewayDeps(
        store=store,
        bus=None,
        catalog=builtin_catalog(),
        clock=clock,
        config=GatewayConfig(auth_secret=TEST_SECRET, partitions=8, max_body_bytes=4096),
    )
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield Gateway(str(server.make_url("")).rstrip("/"), store, clock, session)
    await server.close()
    await store.close()


async def record(
    store: JobStore,
    n: int,
    status: ExecutionStatus,
    *,
    owner: str = "alice",
    queue: str = "default",
    ago_seconds: float = 60,
    delay_ms: int = 0,
) -> None:
    """A run of ``owner`` scheduled ``ago_seconds`` before NOW: started ``delay_ms`` later,
    finished a second after it started if ``status`` is final."""
    scheduled = NOW - timedelta(seconds=ago_seconds)
    job = make_job(f"{owner}-{n}", owner=owner, queue=queue)
    ex = make_execution(job, scheduled)
    final = status in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.SKIPPED)
    started = scheduled + timedelta(milliseconds=delay_ms) if status != S.QUEUED else None
    fields: dict[str, Any] = {
        "status": status,
        "attempt": 1,
        "state_rank": TERMINAL_RANK if final else state_rank(status, 1),
        "started_at": started,
        "finished_at": started + timedelta(seconds=1) if final and started else None,
    }
    assert await store.insert_execution(msgspec.structs.replace(ex, **fields))


async def test_overview_counts_the_last_hour_of_the_callers_runs(gateway: Gateway) -> None:
    store = gateway.store
    await record(store, 1, S.SUCCEEDED, ago_seconds=120, delay_ms=10)
    await record(store, 2, S.SUCCEEDED, ago_seconds=120, delay_ms=20)
    await record(store, 3, S.FAILED, ago_seconds=600, delay_ms=30)
    await record(store, 4, S.SUCCEEDED, ago_seconds=7200, delay_ms=40)  # before the window
    await record(store, 5, S.QUEUED)
    await record(store, 6, S.RUNNING, queue="reports", delay_ms=50)
    for n in range(5):  # bob's: never in alice's numbers
        await record(store, n, S.FAILED, owner="bob", queue="bulk", ago_seconds=120, delay_ms=9000)

    status, body = await gateway.get("/stats/overview")
    assert status == 200, body
    assert body["windowEnd"] == "2026-06-01T10:31:00Z"
    assert body["windowStart"] == "2026-06-01T09:31:00Z"
    assert len(body["minutes"]) == 60 and body["bucketSeconds"] == 60
    assert body["totals"] == {"SUCCEEDED": 2, "FAILED": 1, "CANCELLED": 0, "SKIPPED": 0}
    assert body["failureRate"] == pytest.approx(1 / 3, abs=1e-4)
    at_minute = {m["at"]: m for m in body["minutes"]}
    assert at_minute["2026-06-01T10:28:00Z"]["succeeded"] == 2
    assert at_minute["2026-06-01T10:20:00Z"]["failed"] == 1
    assert body["delay"] == {"runs": 4, "p50Ms": 20, "p95Ms": 50, "p99Ms": 50, "maxMs": 50}
    assert body["queues"] == [
        {"queue": "default", "queued": 1, "running": 0, "retrying": 0},
        {"queue": "reports", "queued": 0, "running": 1, "retrying": 0},
    ]

    _, bobs = await gateway.get("/stats/overview", user="bob")
    assert bobs["totals"]["FAILED"] == 5 and bobs["totals"]["SUCCEEDED"] == 0
    assert [q["queue"] for q in bobs["queues"]] == []
    assert bobs["delay"]["p50Ms"] == 9000


async def test_only_an_admin_sees_another_users_or_everyones_counts(gateway: Gateway) -> None:
    await record(gateway.store, 1, S.SUCCEEDED, ago_seconds=120)
    await record(gateway.store, 2, S.FAILED, owner="bob", ago_seconds=120)

    for query in ("?owner=bob", "?allUsers=true"):
        status, body = await gateway.get(f"/stats/overview{query}", user="alice")
        assert (status, body["code"]) == (403, "forbidden"), body
    _, everyone = await gateway.get("/stats/overview?allUsers=true", user="root", role=Role.ADMIN)
    assert (everyone["totals"]["SUCCEEDED"], everyone["totals"]["FAILED"]) == (1, 1)
    _, bobs = await gateway.get("/stats/overview?owner=bob", user="root", role=Role.ADMIN)
    assert (bobs["totals"]["SUCCEEDED"], bobs["totals"]["FAILED"]) == (0, 1)
    _, own = await gateway.get("/stats/overview", user="root", role=Role.ADMIN)
    assert own["totals"]["FAILED"] == 0  # an admin's default view is their own, as for /jobs


async def test_an_empty_window_has_no_rate_and_no_percentiles(gateway: Gateway) -> None:
    status, body = await gateway.get("/stats/overview")
    assert status == 200
    assert body["failureRate"] is None
    assert body["delay"] == {"runs": 0, "p50Ms": None, "p95Ms": None, "p99Ms": None, "maxMs": None}
    assert all(m["succeeded"] == 0 for m in body["minutes"])


@pytest.mark.parametrize(
    ("query", "field"), [("?allUsers=yes", "allUsers"), ("?window=2h", "window")]
)
async def test_bad_parameters_are_problems_naming_the_field(
    gateway: Gateway, query: str, field: str
) -> None:
    status, body = await gateway.get(f"/stats/overview{query}")
    assert status == 422, body
    assert [e["field"] for e in body["errors"]] == [field]


async def test_no_token_no_stats(gateway: Gateway) -> None:
    async with gateway.session.get(gateway.url + "/stats/overview") as resp:
        assert resp.status == 401


BEFORE_SPRING = datetime(2026, 3, 27, 12, 15, tzinfo=UTC)
NIGHTLY_BERLIN = {
    "taskId": "noop",
    "schedule": {"type": "cron", "expression": "30 2 * * *", "timezone": "Europe/Berlin"},
}


async def create(gateway: Gateway, body: dict[str, Any], user: str = "alice") -> str:
    token = mint_token(TEST_SECRET, user)
    async with gateway.session.post(
        gateway.url + "/jobs", json=body, headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        assert resp.status == 201, await resp.text()
        return str((await resp.json())["id"])


async def test_upcoming_is_a_week_of_the_callers_fire_times_by_local_hour(
    gateway: Gateway,
) -> None:
    await gateway.clock.set(BEFORE_SPRING)
    job_id = await create(gateway, NIGHTLY_BERLIN)
    for _ in range(3):  # bob's: never in alice's heatmap
        await create(
            gateway, {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 60}}, "bob"
        )

    status, body = await gateway.get("/stats/upcoming?timezone=Europe/Berlin")
    assert status == 200, body
    assert (body["windowStart"], body["windowEnd"]) == (
        "2026-03-27T12:00:00Z",
        "2026-04-03T12:00:00Z",
    )
    assert (body["jobs"], body["fires"], body["truncated"]) == (1, 7, False)
    hours = {d["date"]: d["hours"] for d in body["days"]}
    assert hours["2026-03-28"][2] == 1 and hours["2026-03-29"][3] == 1
    assert body["marks"] == [
        {"at": "2026-03-29T01:00:00Z", "kind": "shifted", "rule": "gap: shift",
         "timezone": "Europe/Berlin", "jobIds": [job_id], "jobs": 1}
    ]  # fmt: skip
    assert [t["at"] for t in body["transitions"]] == ["2026-03-29T01:00:00Z"]

    _, bobs = await gateway.get("/stats/upcoming", user="bob")
    assert bobs["jobs"] == 3 and bobs["marks"] == [] and bobs["timezone"] == "UTC"
    status, body = await gateway.get("/stats/upcoming?allUsers=true", user="bob")
    assert (status, body["code"]) == (403, "forbidden")
    _, everyone = await gateway.get("/stats/upcoming?allUsers=true", user="root", role=Role.ADMIN)
    assert everyone["jobs"] == 4


async def test_upcoming_names_a_bad_time_zone(gateway: Gateway) -> None:
    status, body = await gateway.get("/stats/upcoming?timezone=Mars/Olympus")
    assert status == 422, body
    assert [e["field"] for e in body["errors"]] == ["timezone"]


async def test_a_jobs_next_fire_times_carry_their_dst_marks(gateway: Gateway) -> None:
    await gateway.clock.set(BEFORE_SPRING)
    job_id = await create(gateway, NIGHTLY_BERLIN)
    status, body = await gateway.get(f"/jobs/{job_id}/upcoming?count=3")
    assert status == 200, body
    assert body["fireTimes"] == [
        "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"
    ]  # fmt: skip
    assert body["marks"] == [
        {"at": "2026-03-29T01:00:00Z", "kind": "shifted", "rule": "gap: shift",
         "timezone": "Europe/Berlin", "jobIds": [], "jobs": 1}
    ]  # fmt: skip
    _, other = await gateway.get(f"/jobs/{job_id}/upcoming", user="bob")
    assert other["code"] == "job_not_found"


class FakeCluster:
    """A :class:`core.cluster.ClusterSource` with a fixed answer."""

    async def bus_view(self) -> BusView:
        leases = [Lease(partition=p, owner="s1", renewed_at=NOW, expires_at=NOW, revision=p)
                  for p in (0, 2)]  # fmt: skip
        return BusView(
            lease_ttl_seconds=3.0,
            partitions=4,
            leases=leases,
            members=[Member(scheduler="s1", heartbeat_at=NOW, expires_at=NOW, partitions=[0, 2])],
            queues=[QueueInfo(queue="default", pending=2, in_flight=1, waiting_pulls=1)],
            workers=[WorkerPresence(heartbeat=IDLE, heartbeat_at=NOW, expires_at=NOW)],
        )


IDLE = WorkerHeartbeat(worker_id="w-idle", queues=["default"], concurrency=4, in_flight=0,
                       started_at=NOW, version="0.1.0")  # fmt: skip


async def test_the_cluster_is_an_admins_with_the_stores_running_runs(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "cluster.db")
    await store.open()
    deps = GatewayDeps(
        store=store,
        bus=None,
        catalog=builtin_catalog(),
        clock=FakeClock(NOW),
        config=GatewayConfig(auth_secret=TEST_SECRET, partitions=4, max_body_bytes=4096),
        cluster=FakeCluster(),
    )
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            gateway = Gateway(str(server.make_url("")).rstrip("/"), store, FakeClock(NOW), session)
            await record(store, 1, S.RUNNING, delay_ms=5)
            await record(store, 2, S.RUNNING, owner="bob", delay_ms=5)
            await record(store, 3, S.QUEUED)

            status, body = await gateway.get("/cluster", user="alice")
            assert (status, body["code"]) == (403, "forbidden")
            status, body = await gateway.get("/cluster", user="root", role=Role.ADMIN)
            assert status == 200, body
            assert body["unleased"] == [1, 3]
            assert [m["partitions"] for m in body["bus"]["members"]] == [[0, 2]]
            assert body["bus"]["queues"][0]["inFlight"] == 1
            busy, idle = body["workers"]  # every live worker, and every one a run names
            assert sorted(r["owner"] for r in busy["runs"]) == ["alice", "bob"]
            assert busy["presence"] is None  # no heartbeat: known by its runs only
            assert (idle["workerId"], idle["runs"]) == ("w-idle", [])
            assert idle["presence"]["heartbeat"]["concurrency"] == 4
            status, body = await gateway.get("/cluster?x=1", user="root", role=Role.ADMIN)
            assert (status, [e["field"] for e in body["errors"]]) == (422, ["x"])
    finally:
        await server.close()
        await store.close()
