"""Every page of the dashboard against the split processes: a gateway, a scheduler and a worker,
each its own ``python -m jobsched <role>`` process on one nats-server and one SQLite file
(:class:`bench.common.Deployment`, layout ``split``), as a deployment runs them — not
``jobsched dev`` and not in this process. Each page loads with no console error; a job created
through the HTTP API appears in the open Jobs table and follows its run; the Cluster page lists
the worker process by its heartbeat."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, expect

from bench.common import Deployment, Layout
from core.access import Role
from gateway.auth import mint_token
from tests.ui.conftest import TIMEOUT_MS, Tab

pytestmark = pytest.mark.slow


@pytest.fixture
async def split() -> AsyncIterator[Deployment]:
    async with Deployment(Layout(kind="split"), name="ui-split") as d:
        yield d


async def create_job(d: Deployment, token: str, body: dict[str, Any]) -> str:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as s, s.post(d.url + "/jobs", json=body) as r:
        assert r.status == 201, await r.text()
        return str((await r.json())["id"])


async def test_every_page_against_the_split_processes(browser: Browser, split: Deployment) -> None:
    token = mint_token(split.secret, "root", role=Role.ADMIN)
    context = await browser.new_context(viewport={"width": 1360, "height": 860})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = await context.new_page()
        tab = Tab(page, split.url, token)
        page.on("console", lambda m: tab.problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: tab.problems.append(str(e)))
        page.on("request", lambda r: tab.urls.append(r.url))
        page.on("websocket", lambda ws: tab.urls.append(ws.url))
        await tab.open("/ui/")
        await page.get_by_label("Bearer token").fill(token)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#jobs")).to_be_visible()
        await tab.live()

        job_id = await create_job(split, token, {"taskId": "sleep", "parameters": {"seconds": 1}})
        row = page.locator(f"#job-{job_id}")
        await expect(row).to_be_visible(timeout=1000)  # the live feed, through the processes
        await expect(row.locator(".status")).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)
        await tab.screenshot("split-jobs")

        await tab.open(f"/ui/jobs/{job_id}")
        await expect(page.locator("#job-status")).to_have_text("SUCCEEDED")
        await tab.screenshot("split-job")
        await page.locator("#runs tbody tr a").first.click()
        await expect(page).to_have_url(re.compile(rf"/ui/jobs/{job_id}/runs/[^/]+$"))
        await expect(page.locator("#run-summary")).to_contain_text("SUCCEEDED")
        await expect(page.locator("#run-summary")).to_contain_text("worker1")  # the worker process
        await tab.screenshot("split-run")

        await tab.open("/ui/overview")
        await expect(page.locator("#tile-finished .tile-value")).to_have_text("1")
        await tab.screenshot("split-overview")

        nightly = {"type": "cron", "expression": "0 3 * * *", "timezone": "Europe/Berlin"}
        await create_job(split, token, {"taskId": "noop", "schedule": nightly})
        await tab.open("/ui/upcoming")
        await expect(page.locator("#upcoming-status")).to_contain_text("of 1 job")
        await tab.screenshot("split-upcoming")

        await tab.open("/ui/cluster")
        await expect(page.locator("#schedulers section")).to_have_count(1)
        await expect(page.locator("#unleased")).to_have_text("Every partition is leased.")
        worker = page.locator('#workers tr[data-worker="worker1"]')
        await expect(worker).to_contain_text("heartbeat")  # its presence key, across processes
        await tab.screenshot("split-cluster")
        tab.assert_clean()
    finally:
        await context.close()
