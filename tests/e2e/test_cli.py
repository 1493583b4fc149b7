"""The jobsched CLI against a running stack (child processes of the real command)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from tests.support import REPO, Stack, wait_job


async def cli(stack: Stack, *args: str, ok: bool = True) -> str:
    env = {**os.environ, "JOBSCHED_URL": stack.url, "JOBSCHED_TOKEN": stack.token("alice")}
    env = {
        k: v
        for k, v in env.items()
        if not k.startswith("JOBSCHED_") or k in ("JOBSCHED_URL", "JOBSCHED_TOKEN")
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobsched",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert (proc.returncode == 0) == ok, (args, out.decode(), err.decode())
    return out.decode() if ok else err.decode()


async def test_submit_wait_list_get(stack: Stack) -> None:
    job = json.loads(await cli(stack, "submit", "fail", "--param", "times=0", "--wait", "20"))
    assert job["status"] == "SUCCEEDED"
    listed = await cli(stack, "list")
    assert job["id"] in listed and "fail" in listed
    shown = json.loads(await cli(stack, "get", job["id"], "--executions"))
    assert shown["job"]["id"] == job["id"]
    assert [e["status"] for e in shown["executions"]] == ["SUCCEEDED"]


async def test_control_commands(stack: Stack) -> None:
    job = json.loads(
        await cli(stack, "submit", "noop", "--cron", "0 3 * * *", "--timezone", "Europe/Berlin")
    )
    assert json.loads(await cli(stack, "pause", job["id"]))["status"] == "PAUSED"
    assert json.loads(await cli(stack, "resume", job["id"]))["status"] == "SCHEDULED"
    upcoming = (await cli(stack, "upcoming", job["id"], "--count", "3")).split()
    assert len(upcoming) == 3 and all(t.endswith("Z") for t in upcoming)
    run = json.loads(await cli(stack, "trigger", job["id"]))
    assert run["trigger"] == "manual"
    await wait_job(stack.client(), job["id"], {"SCHEDULED"})
    assert json.loads(await cli(stack, "cancel", job["id"]))["status"] == "CANCELLED"
    assert "deleted" in await cli(stack, "delete", job["id"])
    assert "404" in await cli(stack, "get", job["id"], ok=False)


async def test_preview_and_errors(stack: Stack) -> None:
    lines = (
        await cli(
            stack,
            "preview",
            "30 2 * * *",
            "--timezone",
            "America/New_York",
            "--after",
            "2026-03-07T12:00:00+00:00",
            "--count",
            "2",
        )
    ).splitlines()
    assert lines[0].startswith("2026-03-08T07:00:00Z") and "03:00:00-04:00" in lines[0]
    err = await cli(stack, "submit", "noop", "--cron", "61 * * * *", ok=False)
    assert "422" in err and "minute" in err
    err = await cli(stack, "submit", "nope", ok=False)
    assert "unknown task" in err


async def test_watch_follows_a_job(stack: Stack) -> None:
    job = await stack.client().create_job({"taskId": "noop"})
    await wait_job(stack.client(), job.id, {"SUCCEEDED"})
    lines = (await cli(stack, "watch", job.id, "--since", "0", "--count", "4")).splitlines()
    assert [line.split()[3] for line in lines] == [job.id, *[lines[1].split()[3]] * 3]
    assert "CREATED" in lines[0]
    assert [line.split()[4] for line in lines[1:]] == ["QUEUED", "RUNNING", "SUCCEEDED"]


async def test_the_demo_jobs_are_submitted_once_per_data_dir(stack: Stack) -> None:
    from jobsched.cli import submit_demo_jobs

    await submit_demo_jobs(stack.url, stack.token("dev"))
    await submit_demo_jobs(stack.url, stack.token("dev"))
    jobs = (await stack.client("dev").list_jobs()).items
    assert sorted(j.task_id for j in jobs) == [
        "cleanup_export",
        "generate_report",
        "generate_report",
    ]
