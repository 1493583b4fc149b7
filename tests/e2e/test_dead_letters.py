"""Dead letters, replay, backfill and bulk actions on real parts: a `jobsched dev` child process
(its own nats-server, SQLite, scheduler, workers) where replayed and backfilled runs actually
execute; the NATS API and the CLI against the in-process stack."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from core.bulk import BulkAction, BulkFilter, BulkKind, BulkStatus, RunQuery
from core.model import Execution, ExecutionStatus, Job
from jobsched.cli import main
from jobsched.client import ApiError, JobschedClient
from store.sqlite import SqliteStore
from tests.conftest import SettingsFactory
from tests.e2e.test_nats_api import nats_client
from tests.e2e.test_processes import dev_env, read_dev_file
from tests.support import Child, Stack, wait_executions

FAILING = {
    "taskId": "fail",
    "parameters": {"times": 5},
    "maxAttempts": 1,
    "schedule": {"type": "cron", "expression": "0 0 1 1 *"},
}


async def dead_job(client: JobschedClient) -> tuple[Job, Execution]:
    """A yearly job whose triggered run failed its last attempt, then fixed (a replay would
    succeed)."""
    job = await client.create_job(FAILING)
    await client.trigger_job(job.id)
    [run] = await wait_executions(
        client, job.id, lambda rs: [r.status for r in rs] == ["FAILED"], what="a dead letter"
    )
    await client.patch_job(job.id, {"parameters": {"times": 0}})
    return job, run


def replay_of(original: Execution) -> Any:
    def done(runs: list[Execution]) -> bool:
        return any(r.replay_of == original.id and r.status == "SUCCEEDED" for r in runs)

    return done


async def test_replayed_and_backfilled_runs_execute_in_a_dev_process(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    data = tmp_path / "dev-data"
    dev = Child(
        ["dev", "--data-dir", str(data), "--port", "0"],
        dev_env(make_settings, data),
        tmp_path / "dev.log",
    )
    try:
        url, token = await read_dev_file(data, dev)
        async with JobschedClient(url, token) as client:
            job, original = await dead_job(client)
            dead = await client.dead_letters(task_id="fail")
            assert [r.id for r in dead.items] == [original.id]
            replay = await client.replay(job.id, original.id)
            assert (replay.replay_of, replay.status) == (original.id, "QUEUED")
            await wait_executions(client, job.id, replay_of(original), what="the replay")

            cron = await client.create_job(
                {"taskId": "noop", "schedule": {"type": "cron", "expression": "* * * * *"}}
            )
            now = datetime.now(UTC)
            end = now.replace(second=0, microsecond=0)
            start = end - timedelta(minutes=3)
            planned = await client.backfill(cron.id, start, end, dry_run=True)
            assert planned.fire_times == [start + timedelta(minutes=m) for m in range(3)]
            result = await client.backfill(cron.id, start, end, overlap_policy="allow")
            assert (result.queued, result.existing) == (3, 0)
            runs = await wait_executions(
                client,
                cron.id,
                lambda rs: sum(r.backfill and r.status == "SUCCEEDED" for r in rs) == 3,
                what="3 backfilled runs",
            )
            filled = sorted(r.scheduled_for for r in runs if r.backfill)
            assert filled == planned.fire_times

            others = [await dead_job(client) for _ in range(3)]
            action = await client.bulk_replay({"taskId": "fail", "error": "on purpose"})
            action = await client.wait_bulk(action.id, timeout_seconds=30)
            # the first dead letter is still FAILED but has its replay: skipped, 3 replayed
            assert (action.status, action.done, action.skipped, action.failed) == (
                "SUCCEEDED",
                3,
                1,
                0,
            )
            for other_job, other_run in others:
                await wait_executions(client, other_job.id, replay_of(other_run), what="replay")
        assert dev.terminate() == 0, dev.output()
    finally:
        dev.close()


async def test_the_nats_api_serves_dead_letters_replays_backfills_and_bulk_actions(
    stack: Stack,
) -> None:
    client = stack.client()
    job, original = await dead_job(client)
    async with nats_client(stack) as api, nats_client(stack, "bob") as bob:
        page = await api.dead_letters(task_id="fail")
        assert [r.id for r in page.items] == [original.id]
        # the HTTP client's keyword arguments (README: "the same methods"), datetimes included
        hour = timedelta(hours=1)
        ranged = await api.dead_letters(
            task_id="fail",
            error="purpose",
            scheduled_from=original.scheduled_for - hour,
            scheduled_to=original.scheduled_for + hour,
            limit=1,
        )
        assert [r.id for r in ranged.items] == [original.id]
        assert (
            await api.dead_letters(task_id="fail", scheduled_to=original.scheduled_for)
        ).items == []
        with pytest.raises(ApiError) as backwards:  # as over HTTP and as a bulk action's filter
            await api.dead_letters(
                scheduled_from=original.scheduled_for, scheduled_to=original.scheduled_for - hour
            )
        assert backwards.value.status == 422 and "to: must be after from" in str(backwards.value)
        assert (await bob.dead_letters()).items == []
        with pytest.raises(ApiError) as other:
            await bob.replay(job.id, original.id)
        assert (other.value.status, other.value.problem and other.value.problem.code) == (
            404,
            "job_not_found",
        )
        # concurrent replays: one is made, the others are the same 409 naming it
        answers = await asyncio.gather(
            *(api.replay(job.id, original.id) for _ in range(4)), return_exceptions=True
        )
        [run] = [a for a in answers if isinstance(a, Execution)]
        assert run.replay_of == original.id
        refused = [a for a in answers if isinstance(a, ApiError)]
        assert [
            (e.status, e.problem and (e.problem.code, e.problem.replay_id)) for e in refused
        ] == [(409, ("already_replayed", run.id))] * 3
        with pytest.raises(ApiError) as twice:
            await api.replay(job.id, original.id)
        problem = twice.value.problem
        assert problem is not None and (twice.value.status, problem.code, problem.replay_id) == (
            409,
            "already_replayed",
            run.id,
        )
        forced = await api.replay(job.id, original.id, force=True)
        assert forced.replay_of == original.id and forced.id != run.id
        await wait_executions(client, job.id, replay_of(original), what="the replay")
        cron = await api.create_job(
            {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 * * * *"}}
        )
        end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        planned = await api.backfill(cron.id, end - timedelta(hours=2), end, dry_run=True)
        assert planned.fire_times == [end - timedelta(hours=2), end - timedelta(hours=1)]
        with pytest.raises(ApiError) as bad:
            await api.backfill(cron.id, end, end - timedelta(hours=1))
        assert bad.value.status == 422
        action = await api.bulk_replay({"taskId": "fail"})
        assert (await api.get_bulk(action.id)).id == action.id
        finished = await api.wait_bulk(action.id, timeout_seconds=30)
        # the dead letter has replays already: skipped, not run a third time
        assert (finished.status, finished.done, finished.skipped) == ("SUCCEEDED", 0, 1)
        with pytest.raises(ApiError) as hidden:
            await bob.get_bulk(action.id)
        assert hidden.value.status == 404
        cancel = await api.bulk_cancel({"taskId": "sleep"})
        assert cancel.filter.statuses == ["QUEUED", "RUNNING", "RETRYING"]


async def cli(stack: Stack, *args: str, code: int = 0) -> Result:
    env = {"JOBSCHED_URL": stack.url, "JOBSCHED_TOKEN": stack.token()}
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)
    assert result.exit_code == code, (args, result.output, result.exception)
    return result


async def test_the_cli_lists_replays_backfills_and_runs_bulk_actions(stack: Stack) -> None:
    client = stack.client()
    job, original = await dead_job(client)
    table = (await cli(stack, "dead-letters", "--task", "fail", "--error", "PURPOSE")).stdout
    assert original.id in table and "FAILED" in table
    replayed = json.loads((await cli(stack, "replay", job.id, original.id, "-o", "json")).stdout)
    assert replayed["replayOf"] == original.id
    refused = await cli(stack, "replay", job.id, original.id, code=1)
    assert "409" in refused.output and replayed["id"] in refused.output
    forced = json.loads(
        (await cli(stack, "replay", job.id, original.id, "--force", "-o", "json")).stdout
    )
    assert forced["replayOf"] == original.id and forced["id"] != replayed["id"]
    cron = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 * * * *"}}
    )
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    args = ["--from", (end - timedelta(hours=3)).isoformat(), "--to", end.isoformat()]
    dry = (await cli(stack, "backfill", cron.id, *args, "--dry-run")).stdout
    assert "dry run: 3 fire times (forbid); nothing created" in dry
    made = json.loads((await cli(stack, "backfill", cron.id, *args, "-o", "json")).stdout)
    assert (made["queued"], made["skipped"]) == (1, 2)
    shown = json.loads(
        (await cli(stack, "bulk", "replay", "--task", "fail", "--wait", "-o", "json")).stdout
    )
    assert (shown["status"], shown["done"], shown["skipped"]) == ("SUCCEEDED", 0, 1)
    again = (await cli(stack, "bulk", "show", shown["id"])).stdout
    assert "SUCCEEDED" in again and "0 / 1 / 0" in again
    await cli(stack, "backfill", cron.id, "--from", "yesterday", "--to", end.isoformat(), code=2)
    await cli(stack, "bulk", "show", "nope", code=1)


async def test_a_bulk_replay_left_by_a_crashed_gateway_is_resumed_by_the_next_process(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """A gateway died mid-action: its lease expired, its progress (2 of 5 runs, the cursor after
    them) saved. The next `jobsched dev` process claims it and replays exactly the rest."""
    data = tmp_path / "dev-data"
    env = dev_env(make_settings, data)
    dev = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev1.log")
    try:
        url, token = await read_dev_file(data, dev)
        async with JobschedClient(url, token) as client:
            job = await client.create_job(FAILING)
            for _ in range(5):
                await client.trigger_job(job.id)
            await wait_executions(
                client, job.id, lambda rs: [r.status for r in rs] == ["FAILED"] * 5, what="5 dead"
            )
            await client.patch_job(job.id, {"parameters": {"times": 0}})
        stale = (data / "dev.json").read_text()
        dev.kill()  # SIGKILL: a crash
    finally:
        dev.close()

    store = SqliteStore(data / "jobsched.db")
    await store.open()
    try:
        first = await store.list_runs(job.owner, RunQuery(), limit=2, cursor=None)
        now = datetime.now(UTC)
        await store.create_bulk(
            BulkAction(
                id="left-by-a-crash",
                kind=BulkKind.REPLAY,
                status=BulkStatus.RUNNING,
                filter=BulkFilter(statuses=[ExecutionStatus.FAILED], owner=job.owner),
                actor=job.owner,
                done=2,
                cursor=first.next_cursor,
                created_at=now,
                updated_at=now,
                lease_owner="gw-crashed",
                lease_expires_at=now - timedelta(seconds=1),
            )
        )
        rest = await store.list_runs(job.owner, RunQuery(), limit=10, cursor=first.next_cursor)
    finally:
        await store.close()

    dev2 = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev2.log")
    try:
        url, token = await read_dev_file(data, dev2, previous=stale)
        async with JobschedClient(url, token) as client:
            action = await client.wait_bulk("left-by-a-crash", timeout_seconds=30)
            assert (action.status, action.done, action.skipped, action.failed) == (
                "SUCCEEDED",
                5,
                0,
                0,
            )
            assert action.lease_owner is None
            runs = await wait_executions(
                client,
                job.id,
                lambda rs: (
                    sum(r.replay_of is not None and r.status == "SUCCEEDED" for r in rs) == 3
                ),
                what="the 3 remaining replays",
            )
            replayed = sorted(r.replay_of or "" for r in runs if r.replay_of)
            assert replayed == sorted(r.id for r in rest.items)
        assert dev2.terminate() == 0, dev2.output()
    finally:
        dev2.close()


async def test_dead_letters_and_bulk_actions_by_label_selector_over_every_interface(
    stack: Stack,
) -> None:
    client = stack.client()
    billing = await client.create_job({**FAILING, "labels": {"team": "billing"}})
    search = await client.create_job({**FAILING, "labels": {"team": "search"}})
    for j in (billing, search):
        await client.trigger_job(j.id)
    [dead] = await wait_executions(
        client, billing.id, lambda rs: [r.status for r in rs] == ["FAILED"], what="a dead letter"
    )
    await wait_executions(
        client, search.id, lambda rs: [r.status for r in rs] == ["FAILED"], what="a dead letter"
    )
    page = await client.dead_letters(labels="team=billing")
    assert [r.id for r in page.items] == [dead.id]
    async with nats_client(stack) as api:
        assert [r.id for r in (await api.dead_letters(labels="team=billing")).items] == [dead.id]
        with pytest.raises(ApiError) as bad:
            await api.dead_letters(labels="team in (")
        assert bad.value.status == 422
        action = await api.bulk_replay({"labels": "team!=search"})
        assert action.filter.labels == "team!=search"
        finished = await api.wait_bulk(action.id, timeout_seconds=30)
        assert (finished.status, finished.done) == ("SUCCEEDED", 1)
    table = (await cli(stack, "dead-letters", "-l", "team=search")).stdout
    assert search.id in table and billing.id not in table
    shown = json.loads(
        (
            await cli(stack, "bulk", "cancel", "--selector", "team=search", "--wait", "-o", "json")
        ).stdout
    )
    assert (shown["status"], shown["filter"]["labels"]) == ("SUCCEEDED", "team=search")
    await cli(stack, "dead-letters", "-l", "team in (", code=1)
