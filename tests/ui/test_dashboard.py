"""The dashboard in headless chromium against a real stack (gateway, scheduler, recorder, worker
on real NATS and SQLite): every page loads without console errors, filters live in the URL, rows
follow the WebSocket feed, the job controls act through the API, and a user sees only their jobs.
"""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

from core.model import ExecutionStatus, JobStatus
from jobsched.client import ApiError
from tests.support import Stack
from tests.ui.conftest import TIMEOUT_MS, SignIn

CRON_BERLIN = {"type": "cron", "expression": "0 8 * * 1-5", "timezone": "Europe/Berlin"}


async def test_a_url_with_filters_shows_the_filtered_table(signed_in: SignIn, stack: Stack) -> None:
    alice = stack.client()
    paused = await alice.create_job({"taskId": "noop", "schedule": CRON_BERLIN})
    await alice.pause_job(paused.id)
    other_task = await alice.create_job(
        {"taskId": "sleep", "parameters": {"seconds": 0}, "schedule": CRON_BERLIN}
    )
    scheduled = await alice.create_job({"taskId": "noop", "schedule": CRON_BERLIN})
    bobs = await stack.client("bob").create_job({"taskId": "noop", "schedule": CRON_BERLIN})

    tab = await signed_in()
    page = tab.page
    rows = page.locator("#jobs-body tr")
    await expect(rows).to_have_count(3)
    await expect(page.locator(f"#job-{bobs.id}")).to_have_count(0)
    row = page.locator(f"#job-{scheduled.id}")
    await expect(row.locator(".schedule")).to_have_text("08:00 Mon\u2013Fri, Europe/Berlin")
    await expect(row.locator(".status")).to_have_text("SCHEDULED")
    await expect(row.locator(".next")).to_contain_text(re.compile(r"CES?T \(in \d+"))
    await tab.screenshot("jobs")

    await tab.open("/ui/?status=PAUSED&task=noop")
    await expect(rows).to_have_count(1)
    await expect(page.locator(f"#job-{paused.id} .status")).to_have_text("PAUSED")
    await expect(page.locator("#filter-status")).to_have_value("PAUSED")
    await expect(page.locator("#filter-task")).to_have_value("noop")
    await tab.screenshot("jobs-filtered")

    await page.locator("#filter-task").select_option("sleep")  # a filter changes the URL
    await expect(page).to_have_url(re.compile(r"/ui/\?status=PAUSED&task=sleep$"))
    await expect(page.locator("#jobs-status")).to_have_text("No jobs match these filters.")
    await page.locator("#filter-status").select_option("")
    await expect(rows).to_have_count(1)
    await expect(page.locator(f"#job-{other_task.id}")).to_be_visible()
    tab.assert_clean()


async def test_cursor_paging_follows_the_apis_cursors(signed_in: SignIn, stack: Stack) -> None:
    alice = stack.client()
    ids = [
        (await alice.create_job({"taskId": "noop", "schedule": CRON_BERLIN})).id for _ in range(3)
    ]
    tab = await signed_in()
    await tab.open("/ui/?limit=2")
    rows = tab.page.locator("#jobs-body tr")
    await expect(rows).to_have_count(2)
    await tab.page.get_by_role("link", name="Next page »").click()
    await expect(rows).to_have_count(1)
    await expect(tab.page.locator(f"#job-{ids[0]}")).to_be_visible()  # the oldest, last
    await tab.page.go_back()
    await expect(rows).to_have_count(2)
    tab.assert_clean()


async def test_a_new_job_appears_live_and_follows_its_run(signed_in: SignIn, stack: Stack) -> None:
    tab = await signed_in()
    await tab.live()
    bobs = await stack.client("bob").create_job({"taskId": "noop"})
    job = await stack.client().create_job({"taskId": "sleep", "parameters": {"seconds": 2}})

    row = tab.page.locator(f"#job-{job.id}")
    await expect(row).to_be_visible(timeout=1000)  # no reload, no polling: the WebSocket feed
    await expect(row.locator(".status")).to_have_text("RUNNING", timeout=TIMEOUT_MS)
    await tab.screenshot("jobs-live-running")
    await expect(row.locator(".status")).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)
    await expect(row.locator(".last")).to_contain_text("SUCCEEDED")
    await expect(row.locator(".count")).to_have_text("1")
    await expect(tab.page.locator(f"#job-{bobs.id}")).to_have_count(0)
    assert (await stack.client().get_job(job.id)).status is JobStatus.SUCCEEDED
    tab.assert_clean()


async def test_the_job_page_controls_act_through_the_api(signed_in: SignIn, stack: Stack) -> None:
    alice = stack.client()
    job = await alice.create_job({"taskId": "noop", "schedule": CRON_BERLIN, "maxAttempts": 2})
    tab = await signed_in()
    page = tab.page
    await page.get_by_role("link", name="noop").click()
    await expect(page).to_have_url(f"{stack.url}/ui/jobs/{job.id}")
    await expect(page.locator("#upcoming tbody tr")).to_have_count(10)
    await expect(page.locator("#upcoming tbody tr").first).to_contain_text(
        re.compile(r"^\d{4}-\d\d-\d\d (06|07):00:00 UTC\d{4}-\d\d-\d\d 08:00:00 CES?T$")
    )
    await tab.live()

    async def act(name: str) -> None:
        await page.get_by_role("button", name=name, exact=True).click()
        dialog = page.get_by_role("dialog")
        await expect(dialog).to_be_visible()
        # an unnamed job: its task and short id, as the Jobs table shows it
        await expect(dialog.get_by_role("heading")).to_have_text(f"{name}: noop · {job.id[:12]}…")
        await dialog.get_by_role("button", name=name, exact=True).click()
        await expect(dialog).to_be_hidden()

    await act("Pause")
    await expect(page.locator("#job-status")).to_have_text("PAUSED")
    assert (await alice.get_job(job.id)).status is JobStatus.PAUSED
    await expect(page.get_by_role("button", name="Pause", exact=True)).to_be_disabled()
    # the keyboard focus stays on the controls: the first one that can still be used
    await expect(page.get_by_role("button", name="Resume", exact=True)).to_be_focused()

    await page.get_by_role("button", name="Resume").click()  # "Back" leaves it as it is
    await page.get_by_role("dialog").get_by_role("button", name="Back").click()
    assert (await alice.get_job(job.id)).status is JobStatus.PAUSED

    await act("Resume")
    await expect(page.locator("#job-status")).to_have_text("SCHEDULED")
    assert (await alice.get_job(job.id)).status is JobStatus.SCHEDULED

    await act("Trigger now")
    run_row = page.locator("#runs tbody tr").first
    await expect(run_row).to_contain_text("manual")
    await expect(run_row.locator(".status")).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)
    # live updates (the run's events reloaded the job) leave the focus where it was
    await expect(page.get_by_role("button", name="Trigger now", exact=True)).to_be_focused()
    [run] = (await alice.list_executions(job.id)).items
    assert (run.trigger, run.status) == ("manual", ExecutionStatus.SUCCEEDED)
    await expect(page.locator("#job-summary")).to_contain_text("SUCCEEDED")  # its last run
    await tab.screenshot("job")

    await act("Cancel")
    await expect(page.locator("#job-status")).to_have_text("CANCELLED")
    assert (await alice.get_job(job.id)).status is JobStatus.CANCELLED
    await act("Delete")
    await expect(page).to_have_url(f"{stack.url}/ui/")
    await expect(page.locator(f"#job-{job.id}")).to_have_count(0)
    with pytest.raises(ApiError) as deleted:
        await alice.get_job(job.id)
    assert deleted.value.status == 404
    tab.assert_clean()


async def test_the_keyboard_opens_a_job_and_confirms_an_action(
    signed_in: SignIn, stack: Stack
) -> None:
    job = await stack.client().create_job({"taskId": "noop", "schedule": CRON_BERLIN})
    tab = await signed_in()
    page = tab.page
    for _ in range(30):  # by keyboard: Tab to the job's link, Enter
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement.textContent") == "noop":
            break
    focused = page.locator(":focus")
    await expect(focused).to_have_attribute("href", f"/ui/jobs/{job.id}")
    await expect(focused).to_have_css("outline-style", "solid")  # focus is visible
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(f"{stack.url}/ui/jobs/{job.id}")
    await tab.live()
    pause = page.get_by_role("button", name="Pause", exact=True)
    await pause.focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("button", name="Back")).to_be_focused()  # the safe choice first
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")  # OK
    await expect(page.get_by_role("dialog")).to_be_hidden()
    await expect(page.locator("#job-status")).to_have_text("PAUSED")
    assert (await stack.client().get_job(job.id)).status is JobStatus.PAUSED
    tab.assert_clean()


async def test_skipped_runs_show_their_reason(signed_in: SignIn, stack: Stack) -> None:
    job = await stack.client().create_job(
        {
            "taskId": "sleep",
            "parameters": {"seconds": 2.5},
            "schedule": {"type": "interval", "everySeconds": 1},
        }
    )
    tab = await signed_in()
    await tab.open(f"/ui/jobs/{job.id}")
    skipped = tab.page.locator('#runs tbody tr[data-status="SKIPPED"]').first
    await expect(skipped).to_contain_text("overlap", timeout=TIMEOUT_MS)
    # the run it waited for is a link labelled with its time, not a 57-character id
    previous = skipped.locator(".reason").get_by_role(
        "link", name=re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
    )
    await expect(previous).to_have_attribute("href", re.compile(f"^/ui/jobs/{job.id}/runs/"))
    await expect(skipped).not_to_contain_text(job.id)
    await tab.screenshot("job-skipped")
    await stack.client().cancel_job(job.id)
    tab.assert_clean()


async def test_the_run_page_shows_every_attempt(signed_in: SignIn, stack: Stack) -> None:
    job = await stack.client().create_job(
        {"taskId": "fail", "parameters": {"times": 1}, "maxAttempts": 3}
    )
    tab = await signed_in()
    await tab.open(f"/ui/jobs/{job.id}")
    run_link = tab.page.locator("#runs tbody tr a").first
    await run_link.click()
    await expect(tab.page).to_have_url(re.compile(rf"/ui/jobs/{job.id}/runs/[^/]+$"))
    summary = tab.page.locator("#run-summary")
    await expect(summary).to_contain_text("SUCCEEDED", timeout=TIMEOUT_MS)
    attempts = tab.page.locator("#attempts tbody tr")
    await expect(attempts).to_have_count(2)
    await expect(attempts.nth(0)).to_contain_text("RETRYING")
    await expect(attempts.nth(0)).to_contain_text("failing on purpose: attempt 1")
    await expect(attempts.nth(1)).to_contain_text("SUCCEEDED")
    await expect(tab.page.locator("#timeline li")).to_have_count(
        6
    )  # scheduled, published, 2 starts, 2 ends
    # the wait between the failed attempt and its retry is marked as the backoff it is
    backoff = tab.page.locator("#timeline .backoff-gap")
    await expect(backoff).to_have_count(1)
    await expect(backoff).to_have_text(re.compile(r"^backoff \d+(\.\d+)? m?s before the retry$"))
    await expect(tab.page.locator("#timeline li.after-backoff")).to_contain_text(
        "attempt 2 started"
    )
    await tab.screenshot("run")
    tab.assert_clean()


async def test_another_users_job_never_shows(signed_in: SignIn, stack: Stack) -> None:
    bobs = await stack.client("bob").create_job({"taskId": "noop", "schedule": CRON_BERLIN})
    tab = await signed_in()
    await expect(tab.page.locator("#jobs-status")).to_contain_text("No jobs yet")
    await tab.open(f"/ui/jobs/{bobs.id}")
    await expect(tab.page.locator("h1")).to_have_text("Job not found")
    await tab.open(f"/ui/jobs/{bobs.id}/runs/anything")
    await expect(tab.page.locator("h1")).to_have_text("Run not found")
    # The browser logs those 404 answers as console errors, and may do so after the page shows
    # them: a new tab of the same user checks that the list itself loads clean.
    fresh = await signed_in()
    await expect(fresh.page.locator("#jobs-status")).to_contain_text("No jobs yet")
    await expect(fresh.page.locator("#jobs-body tr")).to_have_count(0)
    fresh.assert_clean()


@pytest.mark.parametrize("page", ["/ui/", "/ui/overview", "/ui/upcoming"])
async def test_a_user_opening_an_all_users_link_sees_their_own_without_an_error(
    signed_in: SignIn, stack: Stack, page: str
) -> None:
    await stack.client("bob").create_job({"taskId": "noop", "schedule": CRON_BERLIN})
    mine = await stack.client("alice").create_job({"taskId": "noop", "schedule": CRON_BERLIN})
    tab = await signed_in()
    await tab.open(f"{page}?allUsers=true")
    await expect(tab.page.locator("#all-users-note")).to_have_text(
        "All users is for admins: this page shows your own."
    )
    assert "allUsers" not in tab.page.url
    if page == "/ui/":
        await expect(tab.page.locator("#jobs-body tr")).to_have_count(1)
        await expect(tab.page.locator("#jobs-body")).to_contain_text(mine.id[:12])
    else:
        await expect(tab.page.locator("main")).not_to_contain_text("Cannot load")
    tab.assert_clean()


async def test_a_bad_token_is_refused_and_sign_out_forgets_it(
    signed_in: SignIn, stack: Stack
) -> None:
    tab = await signed_in()
    await tab.page.get_by_role("button", name="Sign out").click()
    await expect(tab.page.get_by_label("Bearer token")).to_be_focused()
    assert await tab.page.evaluate("sessionStorage.length") == 0
    await tab.page.get_by_label("Bearer token").fill("not-a-token")
    await tab.page.keyboard.press("Enter")  # the form works from the keyboard
    await expect(tab.page.get_by_role("alert")).to_contain_text("This token is not accepted")
    await expect(tab.page.get_by_role("navigation", name="Pages")).to_be_hidden()
    await tab.screenshot("sign-in")
    assert "not-a-token" not in tab.page.url


CRON_IN_WORDS = {
    "0 8 * * 1-5": "08:00 Mon\N{EN DASH}Fri",
    "30 2 * 3 0": "02:30 Sun in Mar",
    "0 9 1 JAN,JUL *": "09:00 on day 1 of Jan, Jul",
    "0 8,12,18 * * *": "08:00, 12:00, 18:00 every day",
    "15 */2 * * *": "every 2 hours at :15",
    "15 */2 * * 6,0": "every 2 hours at :15 Sat, Sun",
    "*/5 * * 11-12 *": "every 5 minutes in Nov\N{EN DASH}Dec",
    "0 0 29 2 *": "00:00 on day 29 of Feb",
    "0 8 * 13 *": None,  # no 13th month: shown as the expression itself
    "0 1,2,3,4,5 * * *": None,  # more than four times a day
    "0 8 1 * 1": None,  # day of month and of week together: cron's OR, said raw
}


async def test_cron_expressions_read_in_words_where_their_shape_is_common(
    signed_in: SignIn,
) -> None:
    tab = await signed_in()
    words = await tab.page.evaluate(
        """async (expressions) => {
            const { cronWords } = await import("/ui/assets/format.js");
            return Object.fromEntries(expressions.map((e) => [e, cronWords(e)]));
        }""",
        list(CRON_IN_WORDS),
    )
    assert words == CRON_IN_WORDS
