"""A real headless browser on the dashboard: Debian's chromium driven by Playwright.

The browser is the system's (``/usr/bin/chromium``, or ``$JOBSCHED_CHROMIUM``); Playwright never
downloads one (never run ``playwright install``). Without chromium or Playwright the tests are
skipped with the reason — except under CI (``CI=true``), where ``.ci/run`` installs chromium, so a
missing browser fails instead of hiding the tests.

Screenshots go to ``test-artifacts/ui/`` at the repository root (``$JOBSCHED_TEST_ARTIFACTS``
overrides the folder; gitignored).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip(
        "playwright.async_api",
        reason="Playwright is not installed (it is in the dev extra: pip install -e '.[dev]')",
    )
from playwright.async_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Error,
    Page,
    async_playwright,
    expect,
)

from tests.support import Stack

CHROMIUM = Path(os.environ.get("JOBSCHED_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(
    os.environ.get(
        "JOBSCHED_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"
    )
)
TIMEOUT_MS = 10_000
"""How long an expectation waits for what a run does (its status, its records)."""


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        reason = f"no chromium at {CHROMIUM}: apt-get install chromium (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class Tab:
    """One signed-in browser tab and what its console reported."""

    page: Page
    url: str
    token: str
    problems: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    async def open(self, path: str) -> None:
        await self.page.goto(self.url + path)

    async def live(self) -> None:
        """Wait until the page's WebSocket subscription is confirmed."""
        await expect(self.page.locator("body")).to_have_attribute(
            "data-live", "subscribed", timeout=TIMEOUT_MS
        )

    async def screenshot(self, name: str) -> Path:
        ARTIFACTS.joinpath("ui").mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / "ui" / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        return path

    def assert_clean(self) -> None:
        """No console error, no uncaught exception, and the token in no URL the page opened
        (requests and WebSockets)."""
        assert self.problems == [], "console errors or uncaught exceptions"
        assert [u for u in self.urls if self.token in u] == []
        assert any(u.endswith("/ws") for u in self.urls), "the page opened its live feed"


SignIn = Callable[..., Awaitable[Tab]]


@pytest.fixture
async def signed_in(browser: Browser, stack: Stack) -> AsyncIterator[SignIn]:
    """``await signed_in(user="alice")``: a new tab signed in as ``user``. Its browser context
    closes before the stack stops (an open WebSocket would hold up the gateway's shutdown)."""
    contexts: list[BrowserContext] = []

    async def open_tab(user: str = "alice") -> Tab:
        context = await browser.new_context(viewport={"width": 1360, "height": 860})
        contexts.append(context)
        return await sign_in(context, stack, user)

    yield open_tab
    for context in contexts:
        await context.close()


async def sign_in(context: BrowserContext, stack: Stack, user: str) -> Tab:
    """A new tab in ``context``, signed in as ``user`` through the sign-in form."""
    context.set_default_timeout(TIMEOUT_MS)
    page = await context.new_page()
    tab = Tab(page, stack.url, stack.token(user))

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            tab.problems.append(f"console: {message.text}")

    def on_error(error: Error) -> None:
        tab.problems.append(f"uncaught: {error}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    page.on("request", lambda request: tab.urls.append(request.url))
    page.on("websocket", lambda ws: tab.urls.append(ws.url))
    await tab.open("/ui/")
    await page.get_by_label("Bearer token").fill(tab.token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#jobs")).to_be_visible()
    await expect(page.locator("#who")).to_have_text(f"signed in as {user}")
    return tab
