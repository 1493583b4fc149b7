"""Roles and quotas through the NATS API and the whole stack (real nats-server, SQLite, HTTP):
the same answers as over HTTP, buckets shared between HTTP, NATS and the scheduler, and the
runs-per-minute quota holding runs back (never dropping them) while other users' runs go on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from core.access import READ, Role
from core.clock import FakeClock
from core.model import ExecutionStatus
from gateway.auth import mint_token
from jobsched.client import ApiError, JobschedClient, NatsJobschedClient
from tests.conftest import SettingsFactory
from tests.natsauth import api_credentials
from tests.support import Stack, start_stack, wait_executions

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
CRON = {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}


def token(stack: Stack, user: str, role: Role = Role.USER, read_only: bool = False) -> str:
    scopes = frozenset({READ}) if read_only else frozenset({READ, "jobs:write"})
    return mint_token(
        stack.settings.gateway.auth_secret, user, ttl=timedelta(hours=1), role=role, scopes=scopes
    )


def over_nats(stack: Stack, tok: str) -> NatsJobschedClient:
    return NatsJobschedClient(
        stack.settings.nats.url,
        tok,
        prefix=stack.settings.nats.subject_prefix,
        credentials=api_credentials(stack.settings),
    )


async def refused(call: Awaitable[object]) -> ApiError:
    with pytest.raises(ApiError) as info:
        await call
    return info.value


async def test_roles_and_scopes_hold_over_nats(stack: Stack) -> None:
    async with (
        over_nats(stack, token(stack, "alice")) as alice,
        over_nats(stack, token(stack, "alice", read_only=True)) as reader,
        over_nats(stack, token(stack, "bob")) as bob,
        over_nats(stack, token(stack, "root", Role.ADMIN)) as root,
    ):
        mine = await alice.create_job(CRON)
        bobs = await bob.create_job(CRON)
        assert (await reader.get_job(mine.id)).id == mine.id
        for call in (reader.create_job(CRON), reader.pause_job(mine.id)):
            error = await refused(call)
            assert error.status == 403 and error.problem is not None
            assert error.problem.code == "forbidden"
        error = await refused(alice.get_job(bobs.id))
        assert error.status == 404
        error = await refused(alice.list_jobs(allUsers=True))
        assert error.status == 403
        everyone = await root.list_jobs(allUsers=True)
        assert {j.id for j in everyone.items} == {mine.id, bobs.id}
        only_bob = await root.list_jobs(owner="bob")
        assert [j.id for j in only_bob.items] == [bobs.id]
        paused = await root.pause_job(bobs.id)
        assert paused.status == "PAUSED" and paused.owner == "bob"
        trail = await bob.audit(jobId=bobs.id)
        newest = trail.items[0]
        assert (newest.action, newest.actor, newest.owner) == ("paused", "root", "bob")
        error = await refused(alice.audit(owner="bob"))
        assert error.status == 403
    http = await stack.client("bob").list_audit()
    assert [r.action for r in http.items] == ["paused", "created"], "one trail for HTTP and NATS"


async def test_quotas_hold_over_nats_with_the_http_problem_and_retry_after(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(quota_creates_per_second=1, quota_creates_burst=2, quota_active_jobs=3)
    clock = FakeClock(T0)
    async with (
        start_stack(settings, clock=clock) as stack,
        over_nats(stack, token(stack, "alice")) as alice,
    ):
        await alice.create_job(CRON)
        await stack.client("alice").create_job(CRON)  # HTTP takes from the same bucket
        error = await refused(alice.create_job(CRON))
        assert error.status == 429 and error.problem is not None
        assert error.problem.code == "quota_exceeded"
        assert error.problem.limit is not None
        assert (error.problem.limit.name, error.problem.limit.value) == ("createsPerSecond", 1)
        assert error.retry_after == 1
        http = await refused(stack.client("alice").create_job(CRON))
        assert http.status == 429 and http.retry_after == 1
        await clock.advance(error.retry_after)  # the quota's own answer: wait, then retry
        await alice.create_job(CRON)
        await clock.advance(1)
        error = await refused(alice.create_job(CRON))
        assert error.problem is not None and error.problem.limit is not None
        assert error.problem.limit.name == "activeJobs" and error.retry_after is None


async def metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def wait_metric(url: str, name: str, at_least: float) -> None:
    async with asyncio.timeout(15):
        while await metric(url, name) < at_least:
            await asyncio.sleep(0.05)


async def test_runs_over_the_quota_are_held_back_then_run_while_others_run(
    make_settings: SettingsFactory,
) -> None:
    clock = FakeClock(T0)
    async with start_stack(make_settings(quota_runs_per_minute=2), clock=clock) as stack:
        alice, bob = stack.client("alice"), stack.client("bob")
        jobs = [await alice.create_job({"taskId": "noop"}) for _ in range(3)]
        await wait_metric(stack.url, "jobsched_quota_held_runs_total", 1)
        ran = await wait_succeeded(alice, [j.id for j in jobs], 2)
        [held] = [j for j in jobs if j.id not in ran]
        assert (await alice.list_executions(held.id)).items == [], "held: nothing recorded"
        still = await alice.get_job(held.id)
        assert still.status == "SCHEDULED" and still.next_run_at == T0, "not dropped"
        bobs = await bob.create_job({"taskId": "noop"})
        await wait_executions(bob, bobs.id, lambda rs: [r.status for r in rs] == ["SUCCEEDED"])
        error = await refused(alice.trigger_job(min(ran)))
        assert error.problem is not None and error.problem.limit is not None
        assert error.problem.limit.name == "runsPerMinute", "the scheduler's and API's bucket"
        await clock.advance(30)  # one token back (2 per minute)
        [run] = await wait_executions(
            alice, held.id, lambda rs: [r.status for r in rs] == ["SUCCEEDED"]
        )
    assert run.scheduled_for == T0 and run.trigger == "schedule", "its occurrence, late"


async def wait_succeeded(client: JobschedClient, job_ids: list[str], count: int) -> set[str]:
    """Wait until ``count`` of the jobs have a succeeded run; those jobs."""
    async with asyncio.timeout(15):
        while True:
            done = set()
            for job_id in job_ids:
                runs = (await client.list_executions(job_id)).items
                if any(r.status == ExecutionStatus.SUCCEEDED for r in runs):
                    done.add(job_id)
            if len(done) >= count:
                return done
            await asyncio.sleep(0.05)


async def test_a_job_held_past_its_grace_records_its_misfire_naming_the_quota(
    make_settings: SettingsFactory,
) -> None:
    clock = FakeClock(T0)
    async with start_stack(make_settings(quota_runs_per_minute=1), clock=clock) as stack:
        alice = stack.client("alice")
        first = await alice.create_job({"taskId": "noop"})  # takes the one token of the minute
        await wait_executions(alice, first.id, lambda rs: [r.status for r in rs] == ["SUCCEEDED"])
        every_10s = await alice.create_job(
            {
                "taskId": "noop",
                "schedule": {"type": "interval", "everySeconds": 10},
                "misfireGraceSeconds": 1,
                "misfirePolicy": "runOnce",
            }
        )
        await clock.set(T0 + timedelta(seconds=10))
        await wait_metric(stack.url, "jobsched_quota_held_runs_total", 1)
        assert (await alice.list_executions(every_10s.id)).items == []
        await clock.set(T0 + timedelta(seconds=60))
        runs = await wait_executions(
            alice,
            every_10s.id,
            lambda rs: sorted(r.status for r in rs) == ["SKIPPED", "SUCCEEDED"],
            what="a misfire record and the on-time run",
        )
    skipped = next(r for r in runs if r.status == "SKIPPED")
    assert skipped.skip_reason is not None and "runs-per-minute quota" in skipped.skip_reason
    assert skipped.missed is not None and skipped.missed.count == 5
    assert skipped.scheduled_for == T0 + timedelta(seconds=10)
    ran = next(r for r in runs if r.status == "SUCCEEDED")
    assert ran.scheduled_for == T0 + timedelta(seconds=60)
