"""The CLI covers every operation of the API: ``execution`` (one run with its attempts), ``audit``
(a job's or all your jobs' records), ``list --owner/--all-users`` (admins), and the history and
catch-up options of ``submit``/``patch``; a table lists which command serves each operation."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from click.testing import CliRunner, Result

from core.access import Role
from core.model import ExecutionStatus
from gateway.auth import mint_token
from gateway.openapi import openapi_document
from jobsched.cli import main
from tests.support import Stack, wait_executions

COMMAND_OF = {
    "createJob": "submit",
    "listJobs": "list",
    "getJob": "get",
    "patchJob": "patch",
    "deleteJob": "delete",
    "pauseJob": "pause",
    "resumeJob": "resume",
    "cancelJob": "cancel",
    "triggerJob": "trigger",
    "listExecutions": "executions",
    "getExecution": "execution",
    "listJobAudit": "audit",
    "listAudit": "audit",
    "listUpcoming": "upcoming",
    "previewSchedule": "preview",
    "listTasks": "tasks",
    "explainJob": "explain",
    "getNotificationDefault": "notify-default",
    "setNotificationDefault": "notify-default",
    "listNotificationAttempts": "notifications",
    "listRuns": "dead-letters",
    "replayRun": "replay",
    "backfillJob": "backfill",
    "bulkReplay": "bulk",
    "bulkCancel": "bulk",
    "getBulk": "bulk",
    "getStatsOverview": "stats",
    "getStatsUpcoming": "stats",
    "getCluster": "cluster",
}
"""The command serving each operation (health and readiness are for probes, not people)."""
PROBES = {"getHealth", "getReadiness"}


async def cli(
    stack: Stack, *args: str, code: int = 0, user: str = "alice", role: Role = Role.USER
) -> Result:
    secret = stack.settings.gateway.auth_secret
    token = mint_token(secret, user, ttl=timedelta(hours=1), role=role)
    env = {"JOBSCHED_URL": stack.url, "JOBSCHED_TOKEN": token}
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)
    assert result.exit_code == code, (args, result.output, result.exception)
    return result


async def cli_json(stack: Stack, *args: str, **kwargs: Any) -> Any:
    return json.loads((await cli(stack, *args, "-o", "json", **kwargs)).stdout)


def test_every_operation_has_a_command() -> None:
    doc = openapi_document()
    operations = {op["operationId"] for ops in doc["paths"].values() for op in ops.values()}
    assert operations - PROBES == set(COMMAND_OF)
    assert set(COMMAND_OF.values()) <= set(main.commands)


async def test_execution_shows_one_run_with_its_attempts(stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "fail", "parameters": {"times": 1}, "maxAttempts": 2}
    )
    [run] = await wait_executions(
        stack.client(), job.id, lambda rs: [r.status for r in rs] == [ExecutionStatus.SUCCEEDED]
    )
    shown = await cli_json(stack, "execution", job.id, run.id)
    assert shown["id"] == run.id and [a["attempt"] for a in shown["attempts"]] == [1, 2]
    table = (await cli(stack, "execution", job.id, run.id)).stdout
    assert "ATTEMPT" in table and "RETRYING" in table and "SUCCEEDED" in table
    missing = await cli(stack, "execution", job.id, f"{job.id}:2001-01-01T00:00:00Z", code=1)
    assert "404" in missing.output


async def test_audit_of_a_job_and_of_all_jobs(stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}
    )
    await cli(stack, "pause", job.id)
    await stack.client("bob").create_job({"taskId": "noop"})
    records = await cli_json(stack, "audit", job.id)
    assert [r["action"] for r in records["items"]] == ["paused", "created"]
    mine = await cli_json(stack, "audit", "--actor", "alice")
    assert {r["jobId"] for r in mine["items"]} == {job.id}
    table = (await cli(stack, "audit", job.id)).stdout
    assert table.splitlines()[0].split() == ["AT", "JOB", "ACTION", "ACTOR", "CHANGED"]
    assert "paused" in table
    await cli(stack, "audit", "--all-users", code=1)  # 403 for a user
    everyone = await cli_json(stack, "audit", "--all-users", user="root", role=Role.ADMIN)
    assert {r["owner"] for r in everyone["items"]} == {"alice", "bob"}


async def test_list_another_users_or_everyones_jobs_as_an_admin(stack: Stack) -> None:
    alices = await stack.client().create_job({"taskId": "noop"})
    bobs = await stack.client("bob").create_job({"taskId": "noop"})
    page = await cli_json(stack, "list", "--owner", "bob", user="root", role=Role.ADMIN)
    assert [j["id"] for j in page["items"]] == [bobs.id]
    page = await cli_json(stack, "list", "--all-users", user="root", role=Role.ADMIN)
    assert {j["id"] for j in page["items"]} == {alices.id, bobs.id}
    refused = await cli(stack, "list", "--owner", "bob", code=1)
    assert "403" in refused.output


async def test_submit_and_patch_take_catch_up_and_history_options(stack: Stack) -> None:
    job = await cli_json(
        stack,
        "submit", "noop", "--every", "3600", "--misfire-policy", "runAll",
        "--max-catch-up", "3", "--history-limit", "5", "--history-max-age", "86400",
    )  # fmt: skip
    assert (job["maxCatchUp"], job["historyLimit"], job["historyMaxAgeSeconds"]) == (3, 5, 86400.0)
    patched = await cli_json(
        stack, "patch", job["id"], "--max-catch-up", "7", "--history-limit", "9"
    )
    assert (patched["maxCatchUp"], patched["historyLimit"]) == (7, 9)
    assert patched["historyMaxAgeSeconds"] == 86400.0


async def test_list_shows_a_once_schedule_in_milliseconds_utc(stack: Stack) -> None:
    await cli(stack, "submit", "noop", "--at", "2030-12-01T08:00:00+01:00")
    table = (await cli(stack, "list")).stdout
    assert "once 2030-12-01T07:00:00.000Z" in table, table
