"""The CLI's API commands against a running stack, in this process (click's runner in a thread,
so the command's own ``asyncio.run`` gets a loop of its own): every option reaches the API,
both output formats, exit statuses. tests/e2e/test_cli.py runs the real command as a child."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from click.testing import CliRunner, Result

from core.model import Job
from jobsched.cli import main
from tests.support import Stack, wait_job


async def cli(stack: Stack, *args: str, code: int = 0, user: str = "alice") -> Result:
    env = {"JOBSCHED_URL": stack.url, "JOBSCHED_TOKEN": stack.token(user)}
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)
    assert result.exit_code == code, (args, result.output, result.exception)
    return result


async def cli_json(stack: Stack, *args: str) -> Any:
    return json.loads((await cli(stack, *args, "-o", "json")).stdout)


async def test_submit_takes_every_policy_and_schedule_option(stack: Stack) -> None:
    job = await cli_json(
        stack,
        "submit", "noop",
        "--cron", "0 8 * * 1-5", "--timezone", "Europe/Berlin", "--gap", "skip", "--fold", "both",
        "--start-at", "2030-01-01T00:00:00Z", "--end-at", "2031-01-01T00:00:00Z",
        "--jitter", "5",
        "--misfire-policy", "skip", "--misfire-grace", "30", "--overlap-policy", "bufferOne",
        "--max-attempts", "4", "--timeout", "20", "--queue", "default",
    )  # fmt: skip
    assert job["schedule"] == {
        "type": "cron",
        "expression": "0 8 * * 1-5",
        "timezone": "Europe/Berlin",
        "gap": "skip",
        "fold": "both",
        "startAt": "2030-01-01T00:00:00Z",
        "endAt": "2031-01-01T00:00:00Z",
        "jitterSeconds": 5.0,
    }
    assert (job["misfirePolicy"], job["misfireGraceSeconds"], job["overlapPolicy"]) == (
        "skip",
        30.0,
        "bufferOne",
    )
    assert (job["maxAttempts"], job["timeoutSeconds"]) == (4, 20.0)
    assert job["nextRunAt"].startswith("2030-01-01T07:00:00")  # 08:00 Berlin, first weekday


async def test_submit_with_an_idempotency_key_creates_one_job(stack: Stack) -> None:
    first = await cli_json(stack, "submit", "noop", "--every", "3600", "--idempotency-key", "k1")
    again = await cli_json(stack, "submit", "noop", "--every", "3600", "--idempotency-key", "k1")
    assert first["id"] == again["id"]
    other = await cli(stack, "submit", "noop", "--every", "60", "--idempotency-key", "k1", code=1)
    assert "409" in other.output


async def test_submit_wait_exits_non_zero_unless_the_run_succeeded(stack: Stack) -> None:
    ok = await cli(stack, "submit", "fail", "--param", "times=0", "--wait", "20")
    assert json.loads(ok.stdout)["status"] == "SUCCEEDED"
    flag = await cli(stack, "submit", "fail", "--param", "times=0", "--wait")  # alone: 60 s
    assert json.loads(flag.stdout)["status"] == "SUCCEEDED"
    failed = await cli(
        stack, "submit", "fail", "--param", "times=5", "--max-attempts", "1", "--wait", "20",
        code=1,
    )  # fmt: skip
    assert "ended FAILED" in failed.output and '"status": "FAILED"' in failed.stdout


async def test_submit_wait_says_the_job_is_still_running_on_timeout(stack: Stack) -> None:
    later = "2099-01-01T00:00:00Z"
    slow = await cli(stack, "submit", "noop", "--at", later, "--wait", "0.5", code=1)
    assert "still SCHEDULED after 0.5 s" in slow.output
    assert "cannot reach" not in slow.output


async def test_submit_wait_refuses_a_recurring_job(stack: Stack) -> None:
    result = await cli(stack, "submit", "noop", "--every", "60", "--wait", "5", code=2)
    assert "one-time" in result.output


async def test_window_options_need_a_recurring_schedule(stack: Stack) -> None:
    result = await cli(stack, "submit", "noop", "--jitter", "5", code=2)
    assert "--cron or --every" in result.output
    result = await cli(
        stack, "submit", "noop", "--at", "2030-01-01T00:00:00Z", "--end-at", "x", code=2
    )
    assert "--cron or --every" in result.output


async def test_patch_changes_one_parameter_and_keeps_the_others(stack: Stack) -> None:
    job = await cli_json(
        stack, "submit", "generate_report", "--param", "reportType=sales",
        "--param", "region=eu", "--every", "3600",
    )  # fmt: skip
    patched = await cli_json(stack, "patch", job["id"], "--param", "region=us", "--timeout", "9")
    assert patched["parameters"] == {"reportType": "sales", "region": "us"}
    assert patched["timeoutSeconds"] == 9.0
    replaced = await cli_json(
        stack, "patch", job["id"], "--params-json", '{"reportType": "usage", "region": "x"}'
    )
    assert replaced["parameters"] == {"reportType": "usage", "region": "x"}
    rescheduled = await cli_json(stack, "patch", job["id"], "--cron", "30 2 * * *")
    assert rescheduled["schedule"]["expression"] == "30 2 * * *"
    assert (await stack.client().get_job(job["id"])).schedule == rescheduled_schedule(rescheduled)


def rescheduled_schedule(job: dict[str, Any]) -> Any:

    return msgspec.convert(job, Job, from_attributes=False).schedule


async def test_patch_without_a_change_is_a_usage_error(stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 60}}
    )
    result = await cli(stack, "patch", job.id, code=2)
    assert "nothing to change" in result.output


async def test_a_bad_patch_names_the_field(stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 60}}
    )
    result = await cli(stack, "patch", job.id, "--cron", "61 * * * *", code=1)
    assert "422" in result.output and "minute" in result.output


async def test_list_shows_times_and_statuses_in_their_own_columns(stack: Stack) -> None:
    job = await stack.client().create_job({"taskId": "noop"})
    await wait_job(stack.client(), job.id, {"SUCCEEDED"})
    lines = (await cli(stack, "list")).stdout.splitlines()
    header = lines[0].split("  ")
    assert [h.strip() for h in header if h.strip()] == [
        "ID", "NAME", "TASK", "SCHEDULE", "STATUS", "LAST RUN", "LAST STATUS", "NEXT RUN",
    ]  # fmt: skip
    [row] = [line for line in lines if line.startswith(job.id)]
    assert "SUCCEEDED" in row and " ago)" in row and "immediate" in row
    page = await cli_json(stack, "list")
    assert [j["id"] for j in page["items"]] == [job.id]


async def test_executions_pages_through_the_runs(stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 3600}}
    )
    for _ in range(3):
        await stack.client().trigger_job(job.id)
    first = await cli_json(stack, "executions", job.id, "--limit", "2")
    assert len(first["items"]) == 2 and first["nextCursor"]
    rest = await cli_json(
        stack, "executions", job.id, "--limit", "2", "--cursor", first["nextCursor"]
    )
    ids = [e["id"] for e in first["items"] + rest["items"]]
    assert len(ids) == len(set(ids)) == 3
    table = (await cli(stack, "executions", job.id, "--limit", "2")).stdout
    assert table.splitlines()[0].startswith("EXECUTION") and "more: --cursor" in table
    assert "manual" in table


async def test_every_command_has_a_table_and_a_json_output(stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}
    )
    commands: list[tuple[str, ...]] = [
        ("get", job.id),
        ("get", job.id, "-e"),
        ("pause", job.id),
        ("resume", job.id),
        ("trigger", job.id),
        ("upcoming", job.id, "--count", "2"),
        ("preview", "0 3 * * *", "--count", "2"),
        ("tasks",),
        ("executions", job.id),
        ("list",),
    ]
    for args in commands:
        table = (await cli(stack, *args, "-o", "table")).stdout
        assert table.strip() and not table.lstrip().startswith("{"), args
    for args in commands:  # pause and resume again: each pass leaves the job as it found it
        json.loads((await cli(stack, *args, "-o", "json")).stdout)
    tasks = (await cli(stack, "tasks")).stdout
    [http] = [line for line in tasks.splitlines() if line.startswith("http ")]
    assert "url" in http and "method" in http  # the task's own parameters, not a nested type's


async def test_completion_prints_clicks_script() -> None:
    result = await asyncio.to_thread(CliRunner().invoke, main, ["completion", "bash"])
    assert result.exit_code == 0 and "_JOBSCHED_COMPLETE=bash_complete" in result.stdout


async def test_list_filters_by_task_and_creation_time(stack: Stack) -> None:
    noop = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 3600}}
    )
    sleep = await stack.client().create_job(
        {
            "taskId": "sleep",
            "parameters": {"seconds": 0},
            "schedule": {"type": "interval", "everySeconds": 3600},
        }
    )
    only_noop = await cli_json(stack, "list", "--task", "noop")
    assert [j["id"] for j in only_noop["items"]] == [noop.id]
    at = sleep.created_at.isoformat()
    from_then = await cli_json(stack, "list", "--created-after", at)
    before_then = await cli_json(stack, "list", "--created-before", at)
    assert sleep.id in [j["id"] for j in from_then["items"]]
    assert sleep.id not in [j["id"] for j in before_then["items"]]
    bad = await cli(stack, "list", "--created-after", "yesterday", code=2)
    assert "--created-after" in bad.output
