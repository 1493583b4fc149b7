"""``/docs`` in headless chromium against a real stack: Swagger UI (served from the gateway, no
other site) shows each request body's fields, the status texts, the description rendered from
markdown, and sends a request with "Try it out" — under the page's CSP, without a console error.
"""

from __future__ import annotations

import json

from playwright.async_api import Browser, ConsoleMessage, Request, expect

from core.model import JobStatus
from tests.support import Stack
from tests.ui.conftest import ARTIFACTS, TIMEOUT_MS


async def test_docs_show_fields_status_texts_markdown_and_try_it_out(
    browser: Browser, stack: Stack
) -> None:
    context = await browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = await context.new_page()
    problems: list[str] = []
    requested: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    def on_request(request: Request) -> None:
        requested.append(request.url)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("request", on_request)
    try:
        await page.goto(f"{stack.url}/docs")
        # The description is markdown: its `code` spans and links are rendered, not shown raw.
        info = page.locator(".info .description")
        await expect(info.locator("code", has_text="Authorization: Bearer <JWT>")).to_be_visible()
        await expect(info.get_by_role("link", name="RFC 9457")).to_be_visible()
        await expect(info).not_to_contain_text("`")

        create = page.locator("#operations-jobs-createJob")
        await create.locator(".opblock-summary").click()
        await create.get_by_role("tab", name="Schema").first.click()
        body = create.locator(".opblock-section-request-body")
        for name in ("taskId", "schedule", "maxAttempts", "misfirePolicy", "overlapPolicy"):
            field = body.locator(".json-schema-2020-12-property .json-schema-2020-12__title")
            await expect(field.get_by_text(name, exact=True).first).to_be_visible()
        created = create.locator("tr.response[data-code='201']")
        await expect(created.locator(".response-col_description")).to_contain_text("Created")
        unprocessable = create.locator("tr.response[data-code='422']")
        await expect(unprocessable).to_contain_text("errors")

        await page.get_by_role("button", name="Authorize").first.click()
        dialog = page.locator(".dialog-ux")
        await dialog.get_by_label("auth-bearer-value").fill(stack.token("alice"))
        await dialog.get_by_role("button", name="Apply credentials").click()
        await dialog.get_by_role("button", name="Close").click()

        await create.get_by_role("button", name="Try it out").click()
        await body.locator("button[data-name='example']").click()
        await create.locator("textarea.body-param__text").fill(json.dumps({"taskId": "noop"}))
        await create.get_by_role("button", name="Execute").click()
        live = create.locator(".live-responses-table")
        await expect(live.locator("tr.response .response-col_status")).to_have_text("201")
        [job] = (await stack.client().list_jobs()).items
        assert job.task_id == "noop" and job.status in set(JobStatus)
        await expect(live).to_contain_text(job.id)

        ARTIFACTS.joinpath("ui").mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "ui" / "docs.png"), full_page=True)
    finally:
        await context.close()

    assert problems == [], "console errors (a CSP violation is one) or uncaught exceptions"
    assert all(url.startswith(stack.url) for url in requested), "nothing from another site"
