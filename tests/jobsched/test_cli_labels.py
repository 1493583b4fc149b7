"""The CLI's name and label options against a real gateway on HTTP and SQLite (click's runner
in a thread: the command's own ``asyncio.run`` gets a loop of its own)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gateway.auth import mint_token
from jobsched.cli import main
from tests.conftest import TEST_SECRET
from tests.gateway.conftest import start_api


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    server, store = await start_api(tmp_path)
    yield str(server.make_url("")).rstrip("/")
    await server.close()
    await store.close()


async def cli(url: str, *args: str, code: int = 0) -> Result:
    token = mint_token(TEST_SECRET, "alice", ttl=timedelta(hours=1))
    env = {"JOBSCHED_URL": url, "JOBSCHED_TOKEN": token}
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)
    assert result.exit_code == code, (args, result.output, result.exception)
    return result


async def cli_json(url: str, *args: str) -> Any:
    return json.loads((await cli(url, *args, "-o", "json")).stdout)


async def test_submit_patch_and_list_by_name_and_labels(url: str) -> None:
    job = await cli_json(
        url, "submit", "noop", "--every", "3600", "--name", "nightly",
        "--label", "team=billing", "--label", "env=dev",
    )  # fmt: skip
    assert (job["name"], job["labels"]) == ("nightly", {"team": "billing", "env": "dev"})
    other = await cli_json(url, "submit", "noop", "--every", "3600", "--label", "team=search")

    changed = await cli_json(
        url, "patch", job["id"], "--label", "tier=gold", "--remove-label", "env",
        "--name", "nightly-2",
    )  # fmt: skip
    assert (changed["name"], changed["labels"]) == (
        "nightly-2",
        {"team": "billing", "tier": "gold"},
    )

    page = await cli_json(url, "list", "-l", "team=billing,!env")
    assert [j["id"] for j in page["items"]] == [job["id"]]
    page = await cli_json(url, "list", "--selector", "team in (billing,search)", "--task", "noop")
    assert [j["id"] for j in page["items"]] == [other["id"], job["id"]]
    page = await cli_json(url, "list", "--name", "nightly-2")
    assert [j["id"] for j in page["items"]] == [job["id"]]

    lines = (await cli(url, "list")).stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "NAME", "TASK"]
    [row] = [line for line in lines if line.startswith(job["id"])]
    assert row.split()[1] == "nightly-2"

    cleared = await cli_json(url, "patch", job["id"], "--clear-name")
    assert cleared["name"] is None and cleared["labels"]["tier"] == "gold"


async def test_name_and_label_errors(url: str) -> None:
    await cli(url, "submit", "noop", "--every", "60", "--name", "taken")
    taken = await cli(url, "submit", "noop", "--every", "60", "--name", "taken", code=1)
    assert "409" in taken.output and "name" in taken.output
    bad = await cli(url, "submit", "noop", "--label", "no-equals-sign", code=2)
    assert "KEY=VALUE" in bad.output
    selector = await cli(url, "list", "-l", "team in (a", code=1)
    assert "422" in selector.output and "labels" in selector.output
    both = await cli(url, "patch", "x", "--label", "a=b", "--remove-label", "a", code=2)
    assert "both name 'a'" in both.output
