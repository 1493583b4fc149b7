"""The Overview, Upcoming and Cluster pages in headless chromium against a real stack: they
load without console errors, show the numbers the API gives (the caller's only), follow the
live feed, and the Cluster page is an admin's only."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from playwright.async_api import Browser, BrowserContext, expect

from core.access import Role
from core.clock import FakeClock
from gateway.auth import mint_token
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.support import Stack, start_stack, wait_job
from tests.ui.conftest import TIMEOUT_MS, SignIn, Tab, sign_in

NIGHTLY_BERLIN = {"type": "cron", "expression": "30 2 * * *", "timezone": "Europe/Berlin"}
BEFORE_SPRING = datetime(2026, 3, 27, 12, 15, tzinfo=UTC)


async def test_the_overview_shows_the_last_hour_of_the_users_runs(
    signed_in: SignIn, stack: Stack
) -> None:
    alice, bob = stack.client(), stack.client("bob")
    done = await alice.create_job({"taskId": "noop"})
    failed = await bob.create_job({"taskId": "fail", "parameters": {"times": 5}, "maxAttempts": 1})
    await wait_job(alice, done.id, ["SUCCEEDED"])
    await wait_job(bob, failed.id, ["FAILED"])

    tab = await signed_in()
    page = tab.page
    await page.get_by_role("link", name="Overview").click()
    await expect(page).to_have_url(f"{stack.url}/ui/overview")
    await expect(page.locator("#tile-finished .tile-value")).to_have_text("1")
    await expect(page.locator("#tile-failure-rate .tile-value")).to_have_text("0.0 %")
    await expect(page.locator("#tile-delay .tile-value")).not_to_have_text("—")
    chart = page.get_by_role("img", name=re.compile("Runs per minute by final status"))
    await expect(chart).to_be_visible()
    await expect(page.locator("#per-minute rect.bar-succeeded")).to_have_count(1)
    await expect(page.locator("#per-minute rect.bar-failed")).to_have_count(0)  # bob's
    await page.get_by_text("1 minute with finished runs, as a table").press("Enter")
    await expect(page.locator("#per-minute-table tbody tr")).to_have_count(1)
    await tab.live()

    second = await alice.create_job({"taskId": "noop"})  # a run that ends while the page is open
    await wait_job(alice, second.id, ["SUCCEEDED"])
    await expect(page.locator("#tile-finished .tile-value")).to_have_text("2", timeout=TIMEOUT_MS)
    await tab.screenshot("overview")
    tab.assert_clean()


@pytest.fixture
async def spring_stack(make_settings: SettingsFactory) -> AsyncIterator[Stack]:
    """A gateway alone whose clock stands two days before Europe/Berlin's spring-forward night."""
    async with start_stack(
        make_settings(), Roles(gateway=True), clock=FakeClock(BEFORE_SPRING)
    ) as s:
        yield s


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context(viewport={"width": 1360, "height": 860})
    yield ctx
    await ctx.close()


async def test_upcoming_shows_a_week_by_local_hour_with_the_dst_gap_marked(
    context: BrowserContext, spring_stack: Stack
) -> None:
    job = await spring_stack.client().create_job({"taskId": "noop", "schedule": NIGHTLY_BERLIN})
    await spring_stack.client("bob").create_job({"taskId": "noop", "schedule": NIGHTLY_BERLIN})
    tab = await sign_in(context, spring_stack, "alice")
    page = tab.page
    await tab.open("/ui/upcoming?timezone=Europe/Berlin")
    await expect(page.locator("#upcoming-status")).to_contain_text("7 fire times of 1 job")
    night = page.locator('#heatmap tr[data-date="2026-03-28"] td[data-hour="2"]')
    await expect(night).to_have_attribute("data-fires", "1")  # bob's job is not counted
    shifted = page.locator('#heatmap tr[data-date="2026-03-29"] td[data-hour="3"]')
    await expect(shifted).to_have_class(re.compile(r"\bdst\b"))
    await expect(page.locator("#dst-marks tbody tr")).to_have_count(1)
    await expect(page.locator("#dst-marks")).to_contain_text("gap: shift")
    await expect(page.locator("#transitions")).to_contain_text("UTC+1 → UTC+2")
    await night.focus()  # the heatmap by keyboard: one tab stop, arrow keys between the hours
    await expect(page.locator("#heat-cell")).to_contain_text(
        "2026-03-28 02:00 Europe/Berlin: 1 fire time"
    )
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("ArrowRight")
    await expect(shifted).to_be_focused()
    await expect(page.locator("#heat-cell")).to_contain_text("DST: shifted")
    await tab.screenshot("upcoming")

    await page.get_by_label("Time zone").fill("UTC")  # the zone lives in the URL
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(f"{spring_stack.url}/ui/upcoming?timezone=UTC")
    await expect(
        page.locator('#heatmap tr[data-date="2026-03-29"] td[data-hour="1"]')
    ).to_have_attribute("data-fires", "1")

    await page.get_by_role("link", name=job.id[:12] + "…").click()  # the mark links its job
    await expect(page).to_have_url(f"{spring_stack.url}/ui/jobs/{job.id}")
    row = page.locator('#upcoming tbody tr[data-dst="shifted"]')
    await expect(row).to_contain_text("2026-03-29 01:00:00 UTC")
    await expect(row).to_contain_text("gap: shift")
    # the marked table fits the 1360-pixel window: no column past its right edge
    assert await page.evaluate(
        "document.querySelector('#upcoming').getBoundingClientRect().right <= innerWidth"
        " && document.querySelector('main').scrollWidth <= document.querySelector('main').clientWidth"
    )
    await tab.screenshot("job-dst-marks")
    tab.assert_clean()


async def test_the_heatmap_shades_full_hours_so_a_clash_stands_out(
    context: BrowserContext, spring_stack: Stack
) -> None:
    alice = spring_stack.client()
    tab = await sign_in(context, spring_stack, "alice")
    page = tab.page
    await tab.open("/ui/upcoming?timezone=UTC")  # no job: nothing to shade, no scale to read
    await expect(page.locator("#heatmap caption")).to_contain_text("no fire time in these 7 days")

    await alice.create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "* * * * *"}}
    )
    await alice.create_job(
        {
            "taskId": "noop",
            "schedule": {"type": "cron", "expression": "0 8 * * *", "timezone": "UTC"},
        }
    )
    await tab.open("/ui/upcoming?timezone=UTC")
    # the window starts now (12:15): its first hour has 44 fire times, every full hour 60 or 61
    first = page.locator('#heatmap tr[data-date="2026-03-27"] td[data-hour="12"]')
    await expect(first).to_have_attribute("data-fires", "44")
    await expect(page.locator("#heatmap caption")).to_contain_text("lightest = 60, darkest = 61")
    clash = page.locator('#heatmap tr[data-date="2026-03-28"] td[data-hour="8"]')
    await expect(clash).to_have_attribute("data-fires", "61")
    await expect(clash).to_have_class("l5")
    for hour in ("7", "9"):  # the hours around it: the lightest shade, not all but as dark
        cell = page.locator(f'#heatmap tr[data-date="2026-03-28"] td[data-hour="{hour}"]')
        await expect(cell).to_have_class("l1")
    await expect(first).to_have_class("l1")
    await tab.screenshot("upcoming-clash")
    tab.assert_clean()


async def admin_tab(context: BrowserContext, stack: Stack) -> Tab:
    """A tab signed in with an admin token (the sign-in form, as a person would)."""
    token = mint_token(stack.settings.gateway.auth_secret, "root", role=Role.ADMIN)
    page = await context.new_page()
    tab = Tab(page, stack.url, token)
    page.on("console", lambda m: tab.problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: tab.problems.append(str(e)))
    page.on("request", lambda r: tab.urls.append(r.url))
    page.on("websocket", lambda ws: tab.urls.append(ws.url))
    await tab.open("/ui/")
    await page.get_by_label("Bearer token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).to_have_text("signed in as root")
    return tab


async def test_the_overview_of_every_user_is_an_admins(
    context: BrowserContext, stack: Stack, signed_in: SignIn
) -> None:
    await wait_job(
        stack.client("bob"),
        (await stack.client("bob").create_job({"taskId": "noop"})).id,
        ["SUCCEEDED"],
    )
    tab = await admin_tab(context, stack)
    await tab.open("/ui/overview?allUsers=true")
    await expect(tab.page.locator("#tile-finished .tile-value")).to_have_text("1")
    await expect(tab.page.locator("#overview-status")).to_have_text("Every user's runs.")
    user = await signed_in()  # alice, who has no run: the admin's view is not hers
    await user.open("/ui/overview?allUsers=true")
    await expect(user.page.locator("#all-users-note")).to_be_visible()
    await expect(user.page.locator("#overview-status")).to_have_text("Your runs.")
    await expect(user.page.locator("#tile-finished .tile-value")).to_have_text("0")
    user.assert_clean()
    tab.assert_clean()


async def test_the_cluster_page_shows_the_leases_queues_and_workers_to_an_admin(
    context: BrowserContext, stack: Stack, signed_in: SignIn
) -> None:
    job = await stack.client().create_job({"taskId": "sleep", "parameters": {"seconds": 60}})
    await wait_job(stack.client(), job.id, ["RUNNING"])
    tab = await admin_tab(context, stack)
    page = tab.page
    await page.get_by_role("link", name="Cluster").click()
    await expect(page).to_have_url(f"{stack.url}/ui/cluster")
    partitions = stack.settings.scheduler.partitions
    scheduler = page.locator("#schedulers section")
    await expect(scheduler).to_have_count(1)
    await expect(scheduler).to_contain_text(f"{partitions} of {partitions} partitions")
    await expect(page.locator("#unleased")).to_have_text("Every partition is leased.")
    await expect(page.locator("#leases tbody tr")).to_have_count(partitions)
    await expect(page.locator('#cluster-queues tr[data-queue="default"]')).to_be_visible()
    await expect(page.locator("#cluster-queues-legend")).to_contain_text("waiting for a worker")
    worker = page.locator(f'#workers tr[data-worker="{stack.settings.worker.resolved_worker_id}"]')
    await expect(worker).to_contain_text("heartbeat")  # live by its presence key
    await expect(worker.locator(".in-flight")).to_have_text(
        f"1 of {stack.settings.worker.concurrency}"
    )
    await expect(page.locator("#in-flight tbody tr")).to_contain_text("sleep")
    await tab.screenshot("cluster")
    await stack.client().cancel_job(job.id)
    await expect(worker.locator(".in-flight")).to_have_text(  # its next heartbeat says so
        f"0 of {stack.settings.worker.concurrency}", timeout=TIMEOUT_MS
    )
    await expect(page.locator("#in-flight")).to_have_text("No run is running now.")
    tab.assert_clean()

    user = await signed_in()  # a user: no link to it, and no request if opened anyway
    await expect(user.page.get_by_role("link", name="Cluster")).to_be_hidden()
    await user.open("/ui/cluster")
    await expect(user.page.locator("#cluster-status")).to_contain_text("Admins only")
    await expect(user.page.locator("#cluster")).to_have_count(0)
    assert [u for u in user.urls if u == f"{stack.url}/cluster"] == []  # the API: not asked
    await user.screenshot("cluster-not-admin")
    user.assert_clean()  # no console error: no 403 was asked for


async def test_jobs_by_creation_day_by_id_and_an_admins_all_users_switch(
    context: BrowserContext, stack: Stack, signed_in: SignIn
) -> None:
    mine = await stack.client().create_job({"taskId": "noop", "schedule": NIGHTLY_BERLIN})
    bobs = await stack.client("bob").create_job({"taskId": "noop", "schedule": NIGHTLY_BERLIN})
    today = datetime.now(UTC).date()
    tab = await signed_in()
    page = tab.page
    await tab.open(f"/ui/?createdFrom={today.isoformat()}")  # a shared link: the same view
    await expect(page.locator("#filter-createdFrom")).to_have_value(today.isoformat())
    await expect(page.locator(f"#job-{mine.id}")).to_be_visible()
    await tab.open(f"/ui/?createdFrom={(today + timedelta(days=1)).isoformat()}")
    await expect(page.locator("#jobs-status")).to_have_text("No jobs match these filters.")
    await expect(page.locator("#filter-allUsers")).to_have_count(0)  # a user has no such switch

    await page.get_by_label("Go to job").fill(bobs.id)  # another user's id: not found
    await page.keyboard.press("Enter")
    await expect(page.locator("#job-search-result")).to_have_text(
        f"No job of yours has the id or idempotency key {bobs.id}."
    )
    await page.get_by_label("Go to job").fill(mine.id)
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(f"{stack.url}/ui/jobs/{mine.id}")
    tab.problems.clear()  # the browser logs the 404 answer itself as a console error

    admin = await admin_tab(context, stack)
    await expect(admin.page.locator(f"#job-{bobs.id}")).to_have_count(0)
    await admin.page.get_by_label("All users").check()
    await expect(admin.page).to_have_url(f"{stack.url}/ui/?allUsers=true")
    await expect(admin.page.locator(f"#job-{bobs.id}")).to_contain_text("owner bob")
    await expect(admin.page.locator(f"#job-{mine.id}")).to_be_visible()
    await admin.screenshot("jobs-all-users")
    admin.assert_clean()


async def create_keyed(stack: Stack, user: str, key: str) -> str:
    """A job created through the HTTP API with ``Idempotency-Key: key``; its id."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.url}/jobs",
            json={"taskId": "noop", "schedule": NIGHTLY_BERLIN},
            headers={"Authorization": f"Bearer {stack.token(user)}", "Idempotency-Key": key},
        ) as resp,
    ):
        assert resp.status == 201
        return str((await resp.json())["id"])


async def test_the_search_box_finds_a_job_by_its_idempotency_key(
    stack: Stack, signed_in: SignIn
) -> None:
    mine = await create_keyed(stack, "alice", "invoice-2026-06")
    await create_keyed(stack, "bob", "invoice-2026-07")
    tab = await signed_in()
    page = tab.page
    await page.get_by_label("Go to job").fill("invoice-2026-07")  # bob's key: not found
    await page.keyboard.press("Enter")
    await expect(page.locator("#job-search-result")).to_have_text(
        "No job of yours has the id or idempotency key invoice-2026-07."
    )
    await page.get_by_label("Go to job").fill(mine[:12] + "\u2026")  # the id as the table shows it
    await page.keyboard.press("Enter")
    await expect(page.locator("#job-search-result")).to_have_text(
        f"No job of yours has the id or idempotency key {mine[:12]}\u2026."
        " A job id has 32 hex digits; the table shows its first 12."
    )
    await page.get_by_label("Go to job").fill("invoice-2026-06")
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(f"{stack.url}/ui/jobs/{mine}")
    await tab.live()
    # a key is looked up by a list (200, empty when nothing matches), never by GET /jobs/<key>,
    # whose 404 the browser logs as a console error
    assert not [u for u in tab.urls if "/jobs/invoice-" in u]
    tab.assert_clean()
