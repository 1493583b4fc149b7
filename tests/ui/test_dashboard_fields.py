"""The dashboard's Jobs, Job and Run pages show what the API gained: job names and labels (with
a label-selector filter in the URL), notifications without secrets, concurrency, backfill,
replays linked both ways, and a run's webhook delivery attempts. Headless chromium against a real
stack (gateway, scheduler, recorder, worker on real NATS and SQLite; a real notifier and webhook
receiver where a test needs them); a user sees only their own jobs and runs throughout.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import aiohttp
import msgspec
from playwright.async_api import expect

from core.model import Execution, ExecutionStatus
from tests.e2e.test_notifications import Receiver, running_notifier
from tests.support import Stack, executions, wait_job
from tests.ui.conftest import TIMEOUT_MS, SignIn, Tab

CRON_DAILY = {"type": "cron", "expression": "0 8 * * *", "timezone": "Europe/Berlin"}
SECRET = "whsec_" + base64.b64encode(bytes(range(40, 72))).decode()
URI_COMPONENT = "!*'()"
"""What ``encodeURIComponent`` leaves as it is besides letters, digits and ``-_.~``."""
REFUSED_422 = "Failed to load resource: the server responded with a status of 422"


def drop_logged_422(tab: Tab) -> None:
    """Chromium itself logs every 4xx answer of a fetch as a console error; a 422 the page
    asked for on purpose is dropped, anything else stays."""
    tab.problems[:] = [p for p in tab.problems if REFUSED_422 not in p]


def run_href(job_id: str, execution_id: str) -> str:
    """The page's link to a run (its id encoded as JavaScript's ``encodeURIComponent``)."""
    return f"/ui/jobs/{quote(job_id, safe=URI_COMPONENT)}/runs/{quote(execution_id, safe=URI_COMPONENT)}"


async def replay(stack: Stack, user: str, job_id: str, execution_id: str) -> Execution:
    """``POST /jobs/{id}/executions/{eid}/replay`` as ``user`` (201: the new run)."""
    headers = {"Authorization": f"Bearer {stack.token(user)}"}
    url = f"{stack.url}/jobs/{job_id}/executions/{execution_id}/replay"
    async with aiohttp.ClientSession() as http, http.post(url, headers=headers) as resp:
        assert resp.status == 201, await resp.text()
        return msgspec.json.decode(await resp.read(), type=Execution)


async def test_names_and_labels_show_and_a_url_selector_filters_the_table(
    signed_in: SignIn, stack: Stack
) -> None:
    alice = stack.client()
    billing = await alice.create_job(
        {
            "taskId": "noop",
            "schedule": CRON_DAILY,
            "name": "nightly-billing",
            "labels": {"team": "billing", "env": "prod"},
        }
    )
    dev = await alice.create_job(
        {"taskId": "noop", "schedule": CRON_DAILY, "labels": {"team": "billing", "env": "dev"}}
    )
    plain = await alice.create_job({"taskId": "noop", "schedule": CRON_DAILY})
    bobs = await stack.client("bob").create_job(
        {
            "taskId": "noop",
            "schedule": CRON_DAILY,
            "name": "nightly-billing",
            "labels": {"team": "billing", "env": "prod"},
        }
    )

    tab = await signed_in()
    page = tab.page
    rows = page.locator("#jobs-body tr")
    await expect(rows).to_have_count(3)
    row = page.locator(f"#job-{billing.id}")
    await expect(row.locator("td.job a")).to_have_text("nightly-billing")
    await expect(row.locator("td.job .task")).to_have_text("task noop")
    await expect(row.locator(".chip")).to_have_text(["env=prod", "team=billing"])
    await expect(page.locator(f"#job-{plain.id} td.labels")).to_have_text("—")
    await expect(page.locator(f"#job-{plain.id} td.job a")).to_have_text("noop")
    await tab.screenshot("jobs-names-labels")

    await tab.open("/ui/?labels=team%3Dbilling%2Cenv!%3Ddev")  # a shared link
    await expect(rows).to_have_count(1)
    await expect(row).to_be_visible()
    await expect(page.locator("#filter-labels")).to_have_value("team=billing,env!=dev")
    await expect(page.locator(f"#job-{bobs.id}")).to_have_count(0)
    await tab.live()
    # a job created meanwhile joins the filtered table only if the selector selects it
    later_dev = await alice.create_job(
        {"taskId": "noop", "schedule": CRON_DAILY, "labels": {"team": "billing", "env": "dev"}}
    )
    later = await alice.create_job(
        {"taskId": "noop", "schedule": CRON_DAILY, "labels": {"team": "billing"}}
    )
    await expect(page.locator(f"#job-{later.id}")).to_be_visible(timeout=TIMEOUT_MS)
    await expect(page.locator(f"#job-{later_dev.id}")).to_have_count(0)
    await expect(page.locator(f"#job-{dev.id}")).to_have_count(0)
    await tab.screenshot("jobs-label-selector")

    await page.locator("#filter-labels").fill("env in (dev)")  # typed, Enter: into the URL
    await page.locator("#filter-labels").press("Enter")
    await expect(page).to_have_url(re.compile(r"/ui/\?labels=env\+in\+%28dev%29$"))
    await expect(rows).to_have_count(2)
    await expect(page.locator("#filter-labels")).to_be_focused()  # focus stays where it was
    await expect(page.locator(f"#job-{dev.id}")).to_be_visible()

    await page.locator("#filter-labels").fill("")
    await page.locator("#filter-name").fill("nightly-billing")
    await page.locator("#filter-name").press("Enter")
    await expect(page).to_have_url(re.compile(r"/ui/\?name=nightly-billing$"))
    await expect(rows).to_have_count(1)
    await expect(row).to_be_visible()

    await page.locator(f"#job-{billing.id} .chip a", has_text="env=prod").click()  # a chip
    await expect(page).to_have_url(re.compile(r"/ui/\?labels=env%3Dprod$"))
    await expect(rows).to_have_count(1)
    tab.assert_clean()


async def test_an_invalid_selector_shows_the_apis_problem_inline(
    signed_in: SignIn, stack: Stack
) -> None:
    await stack.client().create_job({"taskId": "noop", "schedule": CRON_DAILY})
    tab = await signed_in()
    page = tab.page
    await tab.open("/ui/?labels=team%20in%20(a")
    error = page.locator("#filter-labels-error")
    await expect(error).to_have_text("labels: '(' without ')'")
    await expect(page.locator("#filter-labels")).to_have_attribute("aria-invalid", "true")
    await expect(page.locator("#jobs-body tr")).to_have_count(0)
    await expect(page.locator("#jobs-status")).to_have_text("No jobs shown: fix the filter.")
    await tab.screenshot("jobs-label-selector-invalid")
    await page.locator("#filter-labels").fill("team")
    await page.locator("#filter-labels").press("Enter")
    await expect(page.locator("#jobs-status")).to_have_text("No jobs match these filters.")
    await expect(error).to_have_text("")
    await expect(page.locator("#filter-labels")).not_to_have_attribute("aria-invalid", "true")
    await tab.live()
    drop_logged_422(tab)
    tab.assert_clean()


async def test_the_job_page_shows_name_labels_notify_and_concurrency_without_secrets(
    signed_in: SignIn, stack: Stack
) -> None:
    hook = "https://ops.example.com/services/T0001/B0002/tokenpart?key=querysecret"
    job = await stack.client().create_job(
        {
            "taskId": "noop",
            "schedule": CRON_DAILY,
            "name": "nightly-billing",
            "labels": {"team": "billing"},
            "notify": {"url": hook, "on": ["failure", "success"], "secret": SECRET},
            "concurrencyKey": "tenant-acme",
            "maxConcurrent": 2,
            "concurrencyPolicy": "skip",
        }
    )
    tab = await signed_in()
    page = tab.page
    await tab.open(f"/ui/jobs/{job.id}")
    await expect(page.locator("h1")).to_contain_text("nightly-billing")
    spec = page.locator("#spec-body")
    await expect(spec.locator(".chip")).to_have_text(["team=billing"])
    await expect(spec).to_contain_text(
        "on failure and success → https://ops.example.com/… · signed (the secret is never shown)"
    )
    await expect(spec).to_contain_text("key tenant-acme, at most 2 at once, policy skip")
    await tab.live()
    # a confirmation names the job as its page does, by its name (not its task, noop, which
    # many jobs share)
    await page.get_by_role("button", name="Pause", exact=True).click()
    dialog = page.get_by_role("dialog")
    await expect(dialog.get_by_role("heading")).to_have_text("Pause: nightly-billing")
    await dialog.get_by_role("button", name="Back").click()
    await expect(dialog).to_be_hidden()
    html = await page.content()
    for secret in (SECRET, SECRET.removeprefix("whsec_"), "tokenpart", "querysecret"):
        assert secret not in html
    await tab.screenshot("job-fields")
    tab.assert_clean()


async def test_backfill_previews_then_creates_runs_marked_as_backfill(
    signed_in: SignIn, stack: Stack
) -> None:
    alice = stack.client()
    job = await alice.create_job({"taskId": "noop", "schedule": CRON_DAILY, "name": "daily"})
    now = datetime.now(UTC)
    start = (now - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    end = (now - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M")
    tab = await signed_in()
    page = tab.page
    await tab.open(f"/ui/jobs/{job.id}")
    await tab.live()
    await page.locator("#backfill-from").fill(start)
    await page.locator("#backfill-to").fill(end)
    await page.get_by_role("button", name="Preview").click()
    counts = page.locator("#backfill-counts")
    await expect(counts).to_contain_text(re.compile(r"^Preview \(nothing created\): 3 fire times"))
    assert await executions(alice, job.id) == []  # a preview creates nothing
    await expect(counts).to_contain_text("overlap policy forbid")  # the job's, by default
    await expect(page.locator("#backfill-policy option").first).to_have_text("the job's (forbid)")
    await page.locator("#backfill-policy").select_option("allow")
    await page.get_by_role("button", name="Create runs").click()
    dialog = page.get_by_role("dialog")
    await expect(dialog).to_contain_text("Backfill: daily")
    await dialog.get_by_role("button", name="Create runs").click()
    await expect(counts).to_contain_text("Done: 3 fire times in the range: 3 were queued")
    await expect(page.locator("#runs tbody tr")).to_have_count(3)
    await expect(page.locator("#runs tbody tr .kind-backfill")).to_have_count(3)
    await tab.screenshot("job-backfill")
    runs = await executions(alice, job.id)
    assert len(runs) == 3 and all(r.backfill for r in runs)
    await page.locator("#backfill-runs tbody a").first.click()
    await expect(page.locator("#backfill-mark")).to_contain_text("backfill")
    tab.assert_clean()


async def test_a_replays_page_links_to_its_original_and_the_original_lists_it(
    signed_in: SignIn, stack: Stack
) -> None:
    alice = stack.client()
    job = await alice.create_job({"taskId": "noop"})
    await wait_job(alice, job.id, {"SUCCEEDED"})
    [original] = await executions(alice, job.id)
    again = await replay(stack, "alice", job.id, original.id)
    bobs = await stack.client("bob").create_job({"taskId": "noop"})
    await wait_job(stack.client("bob"), bobs.id, {"SUCCEEDED"})
    [bobs_run] = await executions(stack.client("bob"), bobs.id)
    await replay(stack, "bob", bobs.id, bobs_run.id)

    tab = await signed_in()
    page = tab.page
    await tab.open(f"/ui/jobs/{job.id}")
    replay_row = page.locator(f'[id="run-{again.id}"]')
    await expect(replay_row.locator(".kind-replay")).to_have_text("replay")
    await replay_row.locator("a").click()
    summary = page.locator("#run-summary")
    await expect(summary).to_contain_text("SUCCEEDED", timeout=TIMEOUT_MS)
    link = page.locator("#replay-of a")
    await expect(link).to_have_attribute("href", run_href(job.id, original.id))
    await tab.live()
    await tab.screenshot("run-replay")
    await link.click()
    await expect(page).to_have_url(stack.url + run_href(job.id, original.id))
    await expect(page.locator("#replays a")).to_have_count(1)
    await expect(page.locator("#replays a")).to_have_attribute("href", run_href(job.id, again.id))
    await expect(page.locator("#replay-of")).to_have_count(0)
    await tab.screenshot("run-original")
    tab.assert_clean()

    await tab.open(f"/ui/jobs/{bobs.id}/runs/{bobs_run.id}")  # bob's run, by its id
    await expect(page.locator("h1")).to_have_text("Run not found")
    assert bobs_run.id not in await page.locator("main").inner_text()


async def test_the_run_page_lists_its_webhook_delivery_attempts(
    signed_in: SignIn, stack: Stack
) -> None:
    alice = stack.client()
    async with Receiver(statuses=[500]) as receiver, running_notifier(stack.settings) as store:
        job = await alice.create_job(
            {
                "taskId": "fail",
                "maxAttempts": 1,
                "parameters": {"times": 1},
                "notify": {"url": receiver.url(), "secret": SECRET},
            }
        )
        await store.wait(lambda attempts: any(a.ok for a in attempts))
    [run] = await executions(alice, job.id)
    assert run.status is ExecutionStatus.FAILED

    tab = await signed_in()
    page = tab.page
    await tab.open(f"/ui/jobs/{job.id}/runs/{run.id}")
    rows = page.locator("#notifications tbody tr")
    await expect(rows).to_have_count(2)
    first = rows.nth(0)
    await expect(first.locator("td").nth(0)).to_have_text("1")
    await expect(first.locator("td").nth(2)).to_have_text("failed")
    await expect(first.locator("td").nth(3)).to_have_text("500")
    await expect(first.locator("td").nth(4)).to_contain_text("500")
    await expect(first.locator("td").nth(6)).to_contain_text(re.compile(r"\d\d:\d\d:\d\d"))
    second = rows.nth(1)
    await expect(second.locator("td").nth(2)).to_have_text("delivered")
    await expect(second.locator("td").nth(3)).to_have_text("200")
    await expect(second.locator("td").nth(6)).to_have_text("—")
    await expect(second.locator("td").nth(7)).to_have_text(
        re.compile(r"^http://127\.0\.0\.2:\d+/…$")
    )
    await tab.live()
    assert SECRET.removeprefix("whsec_") not in await page.content()
    await tab.screenshot("run-notifications")
    tab.assert_clean()

    bob = await signed_in(user="bob")  # another user: the run and its attempts are not theirs
    await bob.open(f"/ui/jobs/{job.id}/runs/{run.id}")
    await expect(bob.page.locator("h1")).to_have_text("Run not found")
    await expect(bob.page.locator("#notifications")).to_have_count(0)
