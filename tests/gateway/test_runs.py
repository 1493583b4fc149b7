"""Dead letters, replays, backfills and bulk actions through real HTTP on a real SQLite store
(fake clock, no NATS: runs are recorded, not published), and the bulk runner's crash-resume on
the store alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp.test_utils import TestServer

from core.access import READ, SCOPES, Principal, Role
from core.audit import AuditAction, AuditQuery
from core.backfill import BackfillRequest
from core.bulk import AlreadyReplayed, BulkCreate, BulkKind, BulkStatus, RunQuery
from core.clock import FakeClock
from core.errors import InvalidRequest
from core.model import (
    CronSchedule,
    Execution,
    ExecutionStatus,
    Job,
    OverlapPolicy,
    RunTrigger,
)
from core.quotas import Quotas
from core.runs import queued_run, run_event
from core.settings import GatewayConfig
from gateway.app import GatewayDeps, create_app
from gateway.auth import mint_token
from gateway.bulk import BulkRunner
from gateway.runs import RunService
from gateway.service import JobService
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.conftest import TEST_SECRET
from tests.fakes import FakeCancelSignals

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
FAILED = ExecutionStatus.FAILED
CRON = {"taskId": "noop", "schedule": {"type": "cron", "expression": "*/10 * * * *"}}


@dataclass
class Gateway:
    url: str
    store: SqliteStore
    session: aiohttp.ClientSession
    clock: FakeClock

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
            return resp.status, await resp.json(content_type=None), dict(resp.headers)

    async def job(self, user: str = "alice", body: Any = None) -> Job:
        status, job, _ = await self.call("POST", "/jobs", user=user, body=body or CRON)
        assert status == 201, job
        return msgspec.convert(job, Job)

    async def failed(self, job: Job, minutes: float, error: str = "boom") -> Execution:
        """A run of ``job`` that failed its last attempt, as the recorder stores it."""
        run = queued_run(job, T0 - timedelta(minutes=minutes), T0, "s", RunTrigger.SCHEDULE)
        await self.store.insert_execution(run)
        await self.store.apply_events(
            [run_event(run, ExecutionStatus.FAILED, attempt=1, at=T0, finished_at=T0, error=error)]
        )
        return run


@asynccontextmanager
async def serving(store: SqliteStore) -> AsyncIterator[Gateway]:
    """A gateway over HTTP on ``store`` (opened here, closed after)."""
    clock = FakeClock(T0)
    await store.open()
    deps = GatewayDeps(
        store=store,
        bus=None,
        catalog=builtin_catalog(),
        clock=clock,
        config=GatewayConfig(auth_secret=TEST_SECRET, partitions=8),
    )
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield Gateway(str(server.make_url("")).rstrip("/"), store, session, clock)
    finally:
        await server.close()
        await store.close()


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with serving(SqliteStore(tmp_path / "runs.db")) as gateway:
        yield gateway


def ids(page: Any) -> list[str]:
    return [r["id"] for r in page["items"]]


def fields(problem: Any) -> list[str]:
    return [e["field"] for e in problem.get("errors") or ()]


# --- dead letters --------------------------------------------------------------------------


async def test_dead_letters_are_the_callers_own_failed_runs_across_jobs(gw: Gateway) -> None:
    a1, a2, b1 = await gw.job(), await gw.job(), await gw.job("bob")
    r1 = await gw.failed(a1, 30, "HTTP 503 upstream")
    r2 = await gw.failed(a2, 20, "timeout")
    rb = await gw.failed(b1, 10, "HTTP 503 upstream")
    status, page, _ = await gw.call("GET", "/executions")
    assert status == 200 and ids(page) == [r2.id, r1.id]
    _, page, _ = await gw.call("GET", "/executions", user="bob")
    assert ids(page) == [rb.id]
    _, page, _ = await gw.call(
        "GET", "/executions", params={"allUsers": "true"}, user="root", role=Role.ADMIN
    )
    assert ids(page) == [rb.id, r2.id, r1.id]
    status, _, _ = await gw.call("GET", "/executions", params={"allUsers": "true"})
    assert status == 403
    status, _, _ = await gw.call("GET", "/executions", params={"owner": "bob"})
    assert status == 403
    _, page, _ = await gw.call("GET", "/executions", params={"error": "503"})
    assert ids(page) == [r1.id]
    _, page, _ = await gw.call("GET", "/executions", params={"limit": "1"})
    assert ids(page) == [r2.id] and page["nextCursor"]
    _, page, _ = await gw.call("GET", "/executions", params={"cursor": page["nextCursor"]})
    assert ids(page) == [r1.id]
    to = (T0 - timedelta(minutes=25)).isoformat()
    _, page, _ = await gw.call("GET", "/executions", params={"to": to, "taskId": "noop"})
    assert ids(page) == [r1.id]
    _, page, _ = await gw.call("GET", "/executions", params={"status": "SUCCEEDED"})
    assert ids(page) == []


async def test_dead_letters_and_a_bulk_replay_select_by_a_label_selector(gw: Gateway) -> None:
    billing = await gw.job(body={**CRON, "labels": {"team": "billing", "env": "prod"}})
    dev = await gw.job(body={**CRON, "labels": {"team": "billing", "env": "dev"}})
    other = await gw.job(body={**CRON, "labels": {"team": "search"}})
    bobs = await gw.job("bob", body={**CRON, "labels": {"team": "billing"}})
    r1 = await gw.failed(billing, 30)
    r2 = await gw.failed(dev, 20)
    await gw.failed(other, 10)
    await gw.failed(bobs, 5)
    _, page, _ = await gw.call("GET", "/executions", params={"labels": "team=billing"})
    assert ids(page) == [r2.id, r1.id]  # never bob's
    _, page, _ = await gw.call("GET", "/executions", params={"labels": "team=billing,env!=dev"})
    assert ids(page) == [r1.id]
    status, action, _ = await gw.call("POST", "/bulk/replay", body={"labels": "team = billing"})
    assert status == 202, action
    assert action["filter"]["labels"] == "team=billing"
    done = await wait_bulk(gw, action["id"])
    assert (done["status"], done["done"], done["skipped"], done["failed"]) == ("SUCCEEDED", 2, 0, 0)
    replays = await gw.store.list_runs(
        None, RunQuery(status=ExecutionStatus.QUEUED), limit=100, cursor=None
    )
    assert sorted(r.replay_of or "" for r in replays.items) == sorted([r1.id, r2.id])
    status, action, _ = await gw.call("POST", "/bulk/cancel", body={"labels": "team=search"})
    done = await wait_bulk(gw, action["id"])
    assert (done["status"], done["done"]) == ("SUCCEEDED", 0)  # the replays are billing's


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "DEAD"}, "status"),
        ({"error": "x" * 201}, "error"),
        ({"from": "yesterday"}, "from"),
        ({"labels": "team in ("}, "labels"),
        ({"cursor": "nope"}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"from": "2026-12-02T00:00:00Z", "to": "2026-12-01T00:00:00Z"}, "to"),
        ({"from": "2026-12-02T00:00:00Z", "to": "2026-12-02T00:00:00Z"}, "to"),
    ],
)
async def test_bad_dead_letter_queries_name_the_field(
    gw: Gateway, params: dict[str, str], field: str
) -> None:
    status, problem, _ = await gw.call("GET", "/executions", params=params)
    assert status == 422 and fields(problem) == [field], problem


# --- replay --------------------------------------------------------------------------------


async def test_a_replay_is_a_new_queued_run_pointing_to_the_original(gw: Gateway) -> None:
    job = await gw.job()
    original = await gw.failed(job, 10)
    await gw.clock.advance(timedelta(seconds=1))
    status, run, headers = await gw.call("POST", f"/jobs/{job.id}/executions/{original.id}/replay")
    assert status == 201, run
    assert run["replayOf"] == original.id and run["id"] != original.id
    assert (run["status"], run["trigger"], run["jobId"]) == ("QUEUED", "manual", job.id)
    assert headers["Location"] == f"/jobs/{job.id}/executions/{run['id']}"
    stored = await gw.store.get_execution(run["id"])
    assert stored is not None and stored.replay_of == original.id
    [record] = (
        await gw.store.list_audit(AuditQuery(job_id=job.id, actor="alice"), limit=1, cursor=None)
    ).items
    assert (record.action, record.replay_of, record.execution_id) == (
        AuditAction.REPLAYED,
        original.id,
        run["id"],
    )


async def fail_run(gw: Gateway, run_id: str, error: str = "boom again") -> Execution:
    """Fail a recorded run (a replay) as the recorder would."""
    [run] = await gw.store.get_executions([run_id])
    at = gw.clock.now()
    await gw.store.apply_events(
        [run_event(run, ExecutionStatus.FAILED, attempt=1, at=at, finished_at=at, error=error)]
    )
    return run


async def test_a_run_replayed_already_is_a_409_naming_its_replay_unless_forced(
    gw: Gateway,
) -> None:
    job = await gw.job()
    original = await gw.failed(job, 10)
    path = f"/jobs/{job.id}/executions/{original.id}/replay"
    status, first, _ = await gw.call("POST", path)
    assert status == 201, first
    status, problem, _ = await gw.call("POST", path)
    assert (status, problem["code"], problem["replayId"]) == (409, "already_replayed", first["id"])
    assert first["id"] in problem["detail"]
    status, forced, _ = await gw.call("POST", path, params={"force": "true"})
    assert status == 201 and forced["replayOf"] == original.id and forced["id"] != first["id"]
    status, problem, _ = await gw.call("POST", path)
    assert (status, problem["replayId"]) == (409, max(first["id"], forced["id"]))
    status, problem, _ = await gw.call("POST", path, params={"force": "yes"})
    assert (status, fields(problem)) == (422, ["force"])
    # the replay failed in its turn: a dead letter of its own, replayed as itself
    await gw.clock.advance(timedelta(minutes=1))
    await fail_run(gw, first["id"])
    status, again, _ = await gw.call("POST", f"/jobs/{job.id}/executions/{first['id']}/replay")
    assert status == 201 and again["replayOf"] == first["id"]


class RacingStore(SqliteStore):
    """A real SQLite store whose first ``racers`` calls of ``replays_of`` (the gateway's own
    check before it takes a quota token) all answer only once every one of them has read:
    each concurrent request then passes that check before any dispatches, the interleaving
    that the race needs, made certain. Later calls are not held."""

    def __init__(self, path: Path, racers: int) -> None:
        super().__init__(path)
        self.racers = racers
        self.checked = 0
        self._all_checked = asyncio.Event()

    async def replays_of(self, execution_ids: Collection[str]) -> dict[str, list[str]]:
        found = await super().replays_of(execution_ids)
        if self.checked < self.racers:
            self.checked += 1
            if self.checked == self.racers:
                self._all_checked.set()
            async with asyncio.timeout(10):
                await self._all_checked.wait()
        return found


RACERS = 6


async def test_of_concurrent_replays_of_a_run_one_is_created_the_others_409_naming_it(
    tmp_path: Path,
) -> None:
    async with serving(RacingStore(tmp_path / "race.db", RACERS)) as gw:
        job = await gw.job()
        original = await gw.failed(job, 10)
        path = f"/jobs/{job.id}/executions/{original.id}/replay"
        answers = await asyncio.gather(*(gw.call("POST", path) for _ in range(RACERS)))
        assert isinstance(gw.store, RacingStore) and gw.store.checked == RACERS
        assert sorted(status for status, _, _ in answers) == [201] + [409] * (RACERS - 1)
        [winner] = [body for status, body, _ in answers if status == 201]
        losers = [(body, headers) for status, body, headers in answers if status == 409]
        for problem, headers in losers:
            assert headers["Content-Type"].startswith("application/problem+json")
            assert (problem["code"], problem["status"], problem["replayId"]) == (
                "already_replayed",
                409,
                winner["id"],
            )
            assert winner["id"] in problem["detail"]
        assert await gw.store.replays_of([original.id]) == {original.id: [winner["id"]]}
        trail = await gw.store.list_audit(AuditQuery(job_id=job.id), limit=50, cursor=None)
        replays = [r.execution_id for r in trail.items if r.action == AuditAction.REPLAYED]
        assert replays == [winner["id"]]
        # the sequential refusal is the same problem (but for its request id)
        status, sequential, _ = await gw.call("POST", path)
        assert status == 409

        def shape(problem: Any) -> Any:
            return {k: v for k, v in problem.items() if k not in ("instance", "requestId")}

        assert all(shape(problem) == shape(sequential) for problem, _ in losers)
        # force replays it again, concurrently too: every forced request is a replay
        forced = await asyncio.gather(
            *(gw.call("POST", path, params={"force": "true"}) for _ in range(3))
        )
        assert [status for status, _, _ in forced] == [201] * 3
        made = sorted([winner["id"], *(body["id"] for _, body, _ in forced)])
        assert await gw.store.replays_of([original.id]) == {original.id: made}
        status, problem, _ = await gw.call("POST", path)
        assert (status, problem["replayId"]) == (409, made[-1])


async def test_concurrent_bulk_replays_of_the_same_runs_replay_each_once(runs: Runs) -> None:
    """Two bulk actions over the same dead letters (two gateways' runners, each batch its own
    store call) and a one-by-one replay at once: each run gets one replay; the others skip it
    or are refused naming it."""
    seeded = await seed(runs, "alice", 4, ExecutionStatus.FAILED)
    by_id = {r.id: r for r in await runs.store.get_executions([r.id for r in seeded])}
    failed = [by_id[r.id] for r in seeded]  # as FAILED
    alice = Principal("alice")
    [job] = await runs.store.get_jobs({failed[0].job_id})
    actions = [await runs.service.create_bulk(alice, BulkKind.REPLAY, BulkCreate()) for _ in "ab"]
    pairs = [(job, r) for r in failed]
    now = runs.clock.now()
    one, first, second = await asyncio.gather(
        runs.service.replay(alice, job.id, failed[0].id),
        runs.service.replay_runs(alice, pairs, now, bulk=actions[0]),
        runs.service.replay_runs(alice, pairs, now, bulk=actions[1]),
        return_exceptions=True,
    )
    assert isinstance(first, list) and isinstance(second, list), (first, second)
    got = await runs.store.replays_of([r.id for r in failed])
    assert {k: len(v) for k, v in got.items()} == {r.id: 1 for r in failed}
    for i, run in enumerate(failed):
        [replay] = got[run.id]
        made = [x for x in (first[i], second[i]) if x.run is not None]
        skipped = [x for x in (first[i], second[i]) if x.run is None]
        if i == 0 and isinstance(one, Execution):
            assert one.id == replay and made == []
        else:
            assert [x.run.id for x in made if x.run] == [replay]
        assert all(
            (x.replayed_as, x.reason) == (replay, f"replayed already as {replay}") for x in skipped
        )
    if not isinstance(one, Execution):
        assert isinstance(one, AlreadyReplayed) and one.replay_id == got[failed[0].id][0]


async def test_a_second_bulk_replay_skips_what_was_replayed_and_replays_failed_replays(
    gw: Gateway,
) -> None:
    job = await gw.job()
    originals = [await gw.failed(job, m) for m in (10, 20, 30)]
    _, action, _ = await gw.call("POST", "/bulk/replay", body={})
    first = await wait_bulk(gw, action["id"])
    assert (first["done"], first["skipped"]) == (3, 0)
    [replayed] = (await gw.store.replays_of([originals[0].id]))[originals[0].id]
    await gw.clock.advance(timedelta(minutes=1))
    failed_replay = await fail_run(gw, replayed)
    late = await gw.failed(job, -0.5)  # failed after the first bulk replay
    _, action, _ = await gw.call("POST", "/bulk/replay", body={})
    second = await wait_bulk(gw, action["id"])
    assert (second["done"], second["skipped"], second["failed"]) == (2, 3, 0)
    again = await gw.store.replays_of([failed_replay.id, late.id, *(o.id for o in originals)])
    assert {k: len(v) for k, v in again.items()} == {
        **{o.id: 1 for o in originals},
        failed_replay.id: 1,
        late.id: 1,
    }
    await gw.clock.advance(timedelta(minutes=1))
    _, action, _ = await gw.call("POST", "/bulk/replay", body={})
    third = await wait_bulk(gw, action["id"])
    assert (third["done"], third["skipped"]) == (0, 5)


async def test_a_user_cannot_replay_another_users_run(gw: Gateway) -> None:
    alice_job, bob_job = await gw.job(), await gw.job("bob")
    original = await gw.failed(alice_job, 10)
    path = f"/jobs/{alice_job.id}/executions/{original.id}/replay"
    status, problem, _ = await gw.call("POST", path, user="bob")
    assert (status, problem["code"]) == (404, "job_not_found")
    # bob's own job id with alice's run: the run is no run of that job
    status, problem, _ = await gw.call(
        "POST", f"/jobs/{bob_job.id}/executions/{original.id}/replay", user="bob"
    )
    assert (status, problem["code"]) == (404, "execution_not_found")
    status, _, _ = await gw.call("POST", path, scopes=frozenset({READ}))
    assert status == 403
    queued = RunQuery(status=ExecutionStatus.QUEUED)
    assert (await gw.store.list_runs(None, queued, limit=10, cursor=None)).items == []
    status, _, _ = await gw.call(
        "POST", path, user="root", role=Role.ADMIN
    )  # an admin may, audited as the admin
    assert status == 201
    [record] = (await gw.store.list_audit(AuditQuery(actor="root"), limit=5, cursor=None)).items
    assert (record.owner, record.action) == ("alice", AuditAction.REPLAYED)


async def test_only_a_finished_run_of_a_live_job_is_replayed(gw: Gateway) -> None:
    job = await gw.job()
    queued = queued_run(job, T0, T0, "s", RunTrigger.SCHEDULE)
    await gw.store.insert_execution(queued)
    status, problem, _ = await gw.call("POST", f"/jobs/{job.id}/executions/{queued.id}/replay")
    assert (status, problem["code"]) == (409, "run_not_replayable")
    failed = await gw.failed(job, 10)
    assert (await gw.call("POST", f"/jobs/{job.id}/cancel"))[0] == 200
    status, problem, _ = await gw.call("POST", f"/jobs/{job.id}/executions/{failed.id}/replay")
    assert (status, problem["code"]) == (409, "job_state_conflict")


# --- backfill ------------------------------------------------------------------------------


def window(minutes_ago_from: float, minutes_ago_to: float) -> dict[str, str]:
    return {
        "from": (T0 - timedelta(minutes=minutes_ago_from)).isoformat(),
        "to": (T0 - timedelta(minutes=minutes_ago_to)).isoformat(),
    }


async def test_a_dry_run_lists_the_fire_times_and_creates_nothing(gw: Gateway) -> None:
    job = await gw.job()
    status, result, _ = await gw.call(
        "POST", f"/jobs/{job.id}/backfill", body={**window(60, 0), "dryRun": True}
    )
    assert status == 200, result
    expected = [
        (T0 - timedelta(minutes=m)).isoformat().replace("+00:00", "Z")
        for m in (60, 50, 40, 30, 20, 10)
    ]
    assert result["fireTimes"] == expected and result["dryRun"] is True
    assert [r["status"] for r in result["runs"]] == ["QUEUED"] + ["SKIPPED"] * 5  # forbid
    assert not any(r["created"] for r in result["runs"])
    _, page, _ = await gw.call("GET", f"/jobs/{job.id}/executions")
    assert page["items"] == []


async def test_a_backfill_creates_marked_runs_once_under_the_overlap_policy(gw: Gateway) -> None:
    job = await gw.job()
    await gw.clock.advance(timedelta(seconds=1))
    body = {**window(60, 0), "overlapPolicy": "allow"}
    status, result, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=body)
    assert status == 200, result
    assert (result["queued"], result["skipped"], result["existing"]) == (6, 0, 0)
    stored = await gw.store.get_executions([r["executionId"] for r in result["runs"]])
    assert len(stored) == 6 and all(r.backfill and r.status == "QUEUED" for r in stored)
    _, again, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=body)
    assert (again["queued"], again["existing"]) == (0, 6)  # every occurrence has its run
    _, forbid, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=window(120, 60))
    assert (forbid["overlapPolicy"], forbid["queued"], forbid["skipped"]) == ("forbid", 1, 5)
    trail = (await gw.store.list_audit(AuditQuery(job_id=job.id), limit=10, cursor=None)).items
    backfills = [r.runs for r in trail if r.action == AuditAction.BACKFILLED]
    assert sorted(n or 0 for n in backfills) == [0, 6, 6]


async def test_a_backfill_runs_on_a_paused_job_which_stays_paused_but_not_on_a_cancelled_one(
    gw: Gateway,
) -> None:
    job = await gw.job()
    await gw.clock.advance(timedelta(seconds=1))
    assert (await gw.call("POST", f"/jobs/{job.id}/pause"))[0] == 200
    body = {**window(30, 0), "overlapPolicy": "allow"}
    status, result, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=body)
    assert (status, result["queued"]) == (200, 3), result
    _, after, _ = await gw.call("GET", f"/jobs/{job.id}")
    assert after["status"] == "PAUSED"
    assert (await gw.call("POST", f"/jobs/{job.id}/cancel"))[0] == 200
    status, problem, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=window(60, 30))
    assert status == 409, problem


async def test_a_dry_run_counts_what_a_backfill_would_do_beside_the_runs_there_are(
    gw: Gateway,
) -> None:
    job = await gw.job()
    await gw.clock.advance(timedelta(seconds=1))
    first = {**window(60, 0), "overlapPolicy": "allow"}
    _, made, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=first)
    [one, *_] = made["runs"]
    [stored] = await gw.store.get_executions([one["executionId"]])
    await gw.store.apply_events(
        [run_event(stored, ExecutionStatus.SUCCEEDED, attempt=1, at=T0, finished_at=T0)]
    )
    body = {**window(90, 0), "overlapPolicy": "allow", "dryRun": True}
    status, plan, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=body)
    assert status == 200, plan
    assert (plan["queued"], plan["skipped"], plan["existing"]) == (3, 0, 6)
    by_id = {r["executionId"]: r["status"] for r in plan["runs"]}
    assert by_id[one["executionId"]] == "SUCCEEDED"  # the run it has, not a planned one
    assert list(by_id.values()).count("QUEUED") == 3 + 5
    _, done, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body={**body, "dryRun": False})
    assert (done["queued"], done["skipped"], done["existing"]) == (3, 0, 6)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (window(60, 70), 422, "to"),  # to before from
        ({**window(60, 0), "to": (T0 + timedelta(minutes=1)).isoformat()}, 422, "to"),
        (window(60 * 24 * 8, 0), 422, "to"),  # 1152 fire times > 1000
        ({**window(60, 0), "from": "2026-06-01T00:00:00"}, 422, "from"),  # no offset
        ({**window(60, 0), "extra": 1}, 422, "extra"),
        ({**window(60, 0), "overlapPolicy": "sometimes"}, 422, "overlapPolicy"),
    ],
)
async def test_bad_backfills_are_refused_naming_the_field(
    gw: Gateway, body: dict[str, Any], status: int, field: str
) -> None:
    job = await gw.job()
    got, problem, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=body)
    assert (got, fields(problem)) == (status, [field]), problem
    _, page, _ = await gw.call("GET", f"/jobs/{job.id}/executions")
    assert page["items"] == []


async def test_a_backfill_needs_a_recurring_job_of_the_caller(gw: Gateway) -> None:
    once = await gw.job(body={"taskId": "noop"})
    status, problem, _ = await gw.call("POST", f"/jobs/{once.id}/backfill", body=window(60, 0))
    assert (status, problem["code"]) == (409, "job_not_recurring")
    job = await gw.job()
    status, _, _ = await gw.call("POST", f"/jobs/{job.id}/backfill", body=window(60, 0), user="bob")
    assert status == 404
    body = window(60, 0)
    status, _, _ = await gw.call(
        "POST", f"/jobs/{job.id}/backfill", body=body, scopes=frozenset({READ})
    )
    assert status == 403


async def test_an_interval_backfill_keeps_the_jobs_phase(gw: Gateway) -> None:
    start = (T0 - timedelta(minutes=55)).isoformat()
    job = await gw.job(
        body={
            "taskId": "noop",
            "schedule": {"type": "interval", "everySeconds": 900, "startAt": start},
        }
    )
    _, result, _ = await gw.call(
        "POST", f"/jobs/{job.id}/backfill", body={**window(60, 0), "dryRun": True}
    )
    minutes = [
        int((T0 - msgspec.convert(t, datetime)) / timedelta(minutes=1)) for t in result["fireTimes"]
    ]
    assert minutes == [55, 40, 25, 10]  # from startAt, every 15 min


# --- bulk actions --------------------------------------------------------------------------


async def test_a_bulk_replay_counts_done_and_skipped_and_stays_in_its_tenant(gw: Gateway) -> None:
    jobs = [await gw.job() for _ in range(3)]
    bob_job = await gw.job("bob")
    mine = [await gw.failed(j, m) for j in jobs for m in (10, 20)]
    await gw.failed(bob_job, 5)
    await gw.failed(jobs[0], 30, "not this one: filtered by error text")
    cancelled = await gw.job()
    await gw.failed(cancelled, 40)
    assert (await gw.call("POST", f"/jobs/{cancelled.id}/cancel"))[0] == 200
    status, action, headers = await gw.call(
        "POST", "/bulk/replay", body={"error": "boom", "taskId": "noop"}
    )
    assert status == 202, action
    assert headers["Location"] == f"/bulk/{action['id']}"
    done = await wait_bulk(gw, action["id"])
    assert (done["status"], done["done"], done["skipped"], done["failed"]) == (
        "SUCCEEDED",
        len(mine),
        1,
        0,
    )
    assert done["filter"]["owner"] == "alice" and done["actor"] == "alice"
    replays = await gw.store.list_runs(
        None, RunQuery(status=ExecutionStatus.QUEUED), limit=100, cursor=None
    )
    assert sorted(r.replay_of or "" for r in replays.items) == sorted(r.id for r in mine)
    assert {r.owner for r in replays.items} == {"alice"}
    assert (await gw.call("GET", f"/bulk/{action['id']}", user="bob"))[0] == 404
    assert (await gw.call("GET", f"/bulk/{action['id']}", user="root", role=Role.ADMIN))[0] == 200
    trail = (await gw.store.list_audit(AuditQuery(owner="alice"), limit=100, cursor=None)).items
    assert sum(r.action == AuditAction.BULK_REPLAY for r in trail) == 1
    assert sum(r.action == AuditAction.REPLAYED and r.bulk_id == action["id"] for r in trail) == 6


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/bulk/replay", {"status": "RUNNING"}, 422, "status"),
        ("/bulk/cancel", {"status": "FAILED"}, 422, "status"),
        ("/bulk/replay", {"error": ""}, 422, "error"),
        ("/bulk/replay", {"labels": {"a": "b"}}, 422, "labels"),
        ("/bulk/replay", {"labels": "team in ("}, 422, "labels"),
        ("/bulk/cancel", {"labels": "=x"}, 422, "labels"),
        ("/bulk/replay", {"allUsers": True}, 403, None),
        ("/bulk/cancel", {"owner": "bob"}, 403, None),
    ],
)
async def test_bad_bulk_requests_are_refused(
    gw: Gateway, path: str, body: dict[str, Any], status: int, field: str | None
) -> None:
    got, problem, _ = await gw.call("POST", path, body=body)
    assert got == status, problem
    assert fields(problem) == ([field] if field else [])


async def wait_bulk(gw: Gateway, bulk_id: str, user: str = "alice") -> Any:
    async with asyncio.timeout(10):
        while True:
            _, action, _ = await gw.call("GET", f"/bulk/{bulk_id}", user=user)
            if action["status"] in ("SUCCEEDED", "FAILED"):
                return action
            await asyncio.sleep(0.02)


# --- the bulk runner on the store alone ----------------------------------------------------


@dataclass
class Runs:
    store: SqliteStore
    clock: FakeClock
    service: RunService
    markers: FakeCancelSignals


@pytest.fixture
async def runs(tmp_path: Path) -> AsyncIterator[Runs]:
    clock = FakeClock(T0)
    store = SqliteStore(tmp_path / "bulk.db")
    await store.open()
    markers = FakeCancelSignals()
    jobs = JobService(
        store, None, builtin_catalog(), clock, GatewayConfig(auth_secret=TEST_SECRET), markers
    )
    yield Runs(store, clock, RunService(jobs), markers)
    await store.close()


async def seed(r: Runs, owner: str, count: int, status: ExecutionStatus) -> list[Execution]:
    job = Job(
        id=f"job-{owner}",
        owner=owner,
        task_id="noop",
        schedule=CronSchedule(expression="*/10 * * * *"),
        created_at=T0 - timedelta(days=1),
        updated_at=T0,
    )
    await r.store.create_job(job)
    out = []
    for i in range(count):
        run = queued_run(job, T0 - timedelta(minutes=i + 1), T0, "s", RunTrigger.SCHEDULE)
        await r.store.insert_execution(run)
        if status != ExecutionStatus.QUEUED:
            await r.store.apply_events(
                [
                    run_event(
                        run,
                        status,
                        attempt=1,
                        at=T0,
                        error="boom",
                        finished_at=T0 if status == ExecutionStatus.FAILED else None,
                    )
                ]
            )
        out.append(run)
    return out


async def test_a_bulk_replay_resumes_after_its_gateway_crashed_without_replaying_twice(
    runs: Runs,
) -> None:
    failed = await seed(runs, "alice", 5, ExecutionStatus.FAILED)
    alice = Principal("alice")
    action = await runs.service.create_bulk(alice, BulkKind.REPLAY, BulkCreate())
    gw_a = BulkRunner(runs.service, holder="gw-a", batch=2)
    claimed = await runs.store.claim_bulk("gw-a", now=runs.clock.now(), lease_seconds=30)
    assert claimed is not None and claimed.id == action.id
    first = await gw_a.step(claimed)  # batch 1: 2 replays, saved
    assert first is not None and first.done == 2
    # gw-a replays batch 2, then dies before saving it
    page = await runs.store.list_runs("alice", RunQuery(), limit=2, cursor=first.cursor)
    jobs = {j.id: j for j in await runs.store.get_jobs({r.job_id for r in page.items})}
    await runs.service.replay_runs(
        alice, [(jobs[r.job_id], r) for r in page.items], runs.clock.now(), bulk=first
    )
    gw_b = BulkRunner(runs.service, holder="gw-b", batch=2)
    assert await runs.store.claim_bulk("gw-b", now=runs.clock.now(), lease_seconds=30) is None
    await runs.clock.advance(timedelta(seconds=31))  # gw-a's lease expires
    taken = await runs.store.claim_bulk("gw-b", now=runs.clock.now(), lease_seconds=30)
    assert taken is not None and (taken.cursor, taken.done) == (first.cursor, 2)
    final = await gw_b.process(taken)
    assert final is not None
    assert (final.status, final.done, final.skipped, final.failed) == (
        BulkStatus.SUCCEEDED,
        5,
        0,
        0,
    )
    queued = await runs.store.list_runs(
        "alice", RunQuery(status=ExecutionStatus.QUEUED), limit=100, cursor=None
    )
    assert sorted(r.replay_of or "" for r in queued.items) == sorted(r.id for r in failed)
    # gw-a comes back: its save is refused, the action stays as gw-b left it
    assert not await runs.store.save_bulk(first, holder="gw-a")
    assert await runs.store.get_bulk(action.id) == final


async def test_a_bulk_cancel_marks_only_the_callers_runs_in_progress(runs: Runs) -> None:
    mine = await seed(runs, "alice", 3, ExecutionStatus.RUNNING)
    await seed(runs, "bob", 2, ExecutionStatus.RUNNING)
    action = await runs.service.create_bulk(Principal("alice"), BulkKind.CANCEL, BulkCreate())
    runner = BulkRunner(runs.service, holder="gw", batch=2)
    claimed = await runs.store.claim_bulk("gw", now=runs.clock.now(), lease_seconds=30)
    assert claimed is not None
    final = await runner.process(claimed)
    assert final is not None and (final.status, final.done) == (BulkStatus.SUCCEEDED, 3)
    assert sorted(runs.markers.cancelled_runs) == sorted(r.id for r in mine)
    trail = (await runs.store.list_audit(AuditQuery(owner="alice"), limit=50, cursor=None)).items
    cancelled = [r for r in trail if r.action == AuditAction.RUN_CANCELLED]
    assert sorted(r.execution_id or "" for r in cancelled) == sorted(r.id for r in mine)
    assert all(r.bulk_id == action.id for r in cancelled)


async def test_the_runner_wakes_for_a_new_action_and_stops(runs: Runs) -> None:
    await seed(runs, "alice", 3, ExecutionStatus.FAILED)
    runner = BulkRunner(runs.service, holder="gw", scan_seconds=3600)
    task = asyncio.create_task(runner.run())
    await runner.ready.wait()
    action = await runs.service.create_bulk(Principal("alice"), BulkKind.REPLAY, BulkCreate())
    async with asyncio.timeout(10):
        while (got := await runs.store.get_bulk(action.id)) is None or got.status != "SUCCEEDED":
            await asyncio.sleep(0.01)
    assert got.done == 3
    runner.stop()
    async with asyncio.timeout(10):
        await task


@asynccontextmanager
async def quota_of_two(tmp_path: Path) -> AsyncIterator[tuple[SqliteStore, FakeClock, RunService]]:
    """A SQLite store, a fake clock and the run service of a gateway whose users may queue two
    runs per minute (``runsPerMinute`` 2)."""
    clock = FakeClock(T0)
    store = SqliteStore(tmp_path / "quota.db")
    await store.open()
    try:
        config = GatewayConfig(auth_secret=TEST_SECRET, quotas=Quotas(runs_per_minute=2))
        yield store, clock, RunService(JobService(store, None, builtin_catalog(), clock, config))
    finally:
        await store.close()


async def test_a_bulk_replay_waits_for_its_quota_and_then_goes_on(tmp_path: Path) -> None:
    async with quota_of_two(tmp_path) as (store, clock, service):
        r = Runs(store, clock, service, FakeCancelSignals())
        await seed(r, "alice", 3, ExecutionStatus.FAILED)
        await service.create_bulk(Principal("alice"), BulkKind.REPLAY, BulkCreate())
        runner = BulkRunner(service, holder="gw", batch=100, lease_seconds=30)
        claimed = await store.claim_bulk("gw", now=clock.now(), lease_seconds=30)
        assert claimed is not None
        first = await runner.step(claimed)  # 2 = the bucket's capacity, granted
        assert first is not None and (first.done, first.status) == (2, BulkStatus.RUNNING)
        runner.stop()  # the quota wait returns at once once stopped
        waiting = await runner.step(first)  # the bucket is empty: same page, lease extended
        assert waiting is not None and (waiting.done, waiting.cursor) == (2, first.cursor)
        await clock.advance(timedelta(seconds=30))  # one token back
        done = await runner.step(waiting)
        assert done is not None and (done.done, done.status) == (3, BulkStatus.SUCCEEDED)


async def test_a_bulk_replay_takes_a_run_token_only_for_the_runs_it_replays(
    tmp_path: Path,
) -> None:
    """Two of three failed runs have a replay already: a second bulk replay over all three
    takes one runsPerMinute token, not three (a bucket of two would have made it wait, and
    held back the owner's scheduled runs, for runs the store then skips)."""
    async with quota_of_two(tmp_path) as (store, clock, service):
        await seed(
            Runs(store, clock, service, FakeCancelSignals()), "alice", 3, ExecutionStatus.FAILED
        )
        runner = BulkRunner(service, holder="gw", batch=100, lease_seconds=30)
        newest = BulkCreate(scheduled_from=T0 - timedelta(minutes=2, seconds=30))
        await service.create_bulk(Principal("alice"), BulkKind.REPLAY, newest)
        first = await store.claim_bulk("gw", now=clock.now(), lease_seconds=30)
        assert first is not None
        first = await runner.step(first)  # the bucket's 2 tokens
        assert first is not None and (first.done, first.status) == (2, BulkStatus.SUCCEEDED)
        await clock.advance(timedelta(minutes=1))  # the bucket full again: 2 tokens
        await service.create_bulk(Principal("alice"), BulkKind.REPLAY, BulkCreate())
        second = await store.claim_bulk("gw", now=clock.now(), lease_seconds=30)
        assert second is not None
        runner.stop()  # a quota wait would return at once, leaving the page undone
        for _ in range(2):  # pages of the bucket's capacity: the 2 replayed runs, then the third
            second = await runner.step(second)
            assert second is not None
        assert (second.done, second.skipped, second.status) == (1, 2, BulkStatus.SUCCEEDED)


async def test_a_bulk_action_that_cannot_go_on_is_failed_with_the_reason(runs: Runs) -> None:
    await seed(runs, "alice", 2, ExecutionStatus.FAILED)
    action = await runs.service.create_bulk(Principal("alice"), BulkKind.REPLAY, BulkCreate())
    claimed = await runs.store.claim_bulk("gw", now=runs.clock.now(), lease_seconds=30)
    assert claimed is not None
    broken = msgspec.structs.replace(claimed, cursor="not-a-cursor")
    assert await runs.store.save_bulk(broken, holder="gw")
    await BulkRunner(runs.service, holder="gw")._process_or_fail(broken)
    stored = await runs.store.get_bulk(action.id)
    assert stored is not None and stored.status == BulkStatus.FAILED
    assert stored.error is not None and "cursor" in stored.error
    assert await runs.store.claim_bulk("gw2", now=T0 + timedelta(hours=1), lease_seconds=30) is None


async def test_a_backfill_beyond_the_run_quota_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    async with quota_of_two(tmp_path) as (store, clock, service):
        await seed(Runs(store, clock, service, FakeCancelSignals()), "alice", 0, FAILED)
        body = BackfillRequest(
            scheduled_from=T0 - timedelta(hours=1),
            scheduled_to=T0,
            overlap_policy=OverlapPolicy.ALLOW,
        )
        with pytest.raises(InvalidRequest) as refused:
            await service.backfill(Principal("alice"), "job-alice", body)
        assert [e.field for e in refused.value.errors] == ["to"]
        page = await store.list_executions("alice", "job-alice", limit=10, cursor=None)
        assert page.items == []
        planned = await service.backfill(
            Principal("alice"), "job-alice", msgspec.structs.replace(body, dry_run=True)
        )
        assert len(planned.fire_times) == 6
