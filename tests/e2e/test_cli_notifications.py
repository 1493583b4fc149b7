"""The CLI's notification commands against a running stack: ``submit --notify-*``,
``notifications JOB EXECUTION`` (table and JSON), ``notify-default``; secrets never printed."""

from __future__ import annotations

from tests.e2e.test_cli_jobs import cli, cli_json
from tests.e2e.test_notifications import SECRET, Receiver, running_notifier
from tests.support import Stack, executions, wait_job


async def test_submit_sets_the_webhook_and_never_prints_the_secret(stack: Stack) -> None:
    result = await cli(
        stack,
        "submit", "noop", "--every", "3600",
        "--notify-url", "https://hooks.example/x",
        "--notify-on", "success", "--notify-on", "failure",
        "--notify-secret", SECRET,
    )  # fmt: skip
    assert SECRET not in result.output
    job = await cli_json(stack, "get", result.output.split('"id": "')[1].split('"')[0])
    assert job["notify"] == {
        "url": "https://hooks.example/x",
        "on": ["failure", "success"],
        "hasSecret": True,
    }


async def test_patch_changes_keeps_the_secret_of_and_removes_the_webhook(stack: Stack) -> None:
    job = await cli_json(
        stack, "submit", "noop", "--every", "3600",
        "--notify-url", "https://hooks.example/x", "--notify-secret", SECRET,
    )  # fmt: skip
    changed = await cli(
        stack, "patch", job["id"], "--notify-url", "https://hooks.example/y",
        "--notify-on", "success",
    )  # fmt: skip
    assert SECRET not in changed.output
    assert (await cli_json(stack, "get", job["id"]))["notify"] == {
        "url": "https://hooks.example/y",
        "on": ["success"],
        "hasSecret": True,
    }
    assert (await cli_json(stack, "patch", job["id"], "--no-notify"))["notify"] is None
    both = await cli(
        stack, "patch", job["id"], "--no-notify", "--notify-url", "https://h.example/", code=2
    )
    assert "--no-notify goes without --notify-url" in both.output


async def test_notify_on_without_a_url_is_a_usage_error(stack: Stack) -> None:
    result = await cli(stack, "submit", "noop", "--notify-on", "failure", code=2)
    assert "--notify-on goes with --notify-url" in result.output


async def test_notifications_lists_a_runs_attempts(stack: Stack) -> None:
    client = stack.client()
    async with Receiver(statuses=[502]) as receiver, running_notifier(stack.settings) as store:
        job = await client.create_job(
            {
                "taskId": "fail",
                "maxAttempts": 1,
                "parameters": {"times": 1},
                "notify": {"url": receiver.url()},
            }
        )
        await store.wait(lambda a: any(x.ok for x in a))
        await wait_job(client, job.id, {"FAILED"})
        [run] = await executions(client, job.id)

    table = (await cli(stack, "notifications", job.id, run.id)).output.splitlines()
    assert table[0].split() == ["ATTEMPT", "AT", "RESULT", "STATUS", "DURATION", "ERROR"]
    rows = [line.split() for line in table[1:]]
    assert [(r[0], r[2], r[3]) for r in rows] == [("1", "failed", "502"), ("2", "ok", "200")]
    items = (await cli_json(stack, "notifications", job.id, run.id))["items"]
    assert [(a["attempt"], a["statusCode"], a["ok"]) for a in items] == [
        (1, 502, False), (2, 200, True)
    ]  # fmt: skip


async def test_notify_default_shows_sets_and_clears(stack: Stack) -> None:
    assert await cli_json(stack, "notify-default") == {"notify": None}
    shown = await cli_json(
        stack, "notify-default", "--notify-url", "https://d.example/", "--notify-secret", SECRET
    )
    assert shown == {"notify": {"url": "https://d.example/", "on": ["failure"], "hasSecret": True}}
    assert await cli_json(stack, "notify-default") == shown
    assert await cli_json(stack, "notify-default", "--clear") == {"notify": None}
