"""The Jobs page in Debian's ``firefox-esr`` (headless), driven through Firefox's own Marionette
protocol (https://firefox-source-docs.mozilla.org/testing/marionette/Protocol.html: TCP, each
message ``<length>:<JSON>``, commands ``[0, id, name, params]``, WebDriver's command names), with
the standard library only: Playwright's Firefox needs its own patched build and geckodriver is in
no package registry here. Skipped with the reason without ``/usr/bin/firefox-esr`` — except under
CI (``CI=true``), where ``.ci/run`` installs it as chromium, so a missing browser fails instead.

Two causes of its former 1-in-11 failure, both handled here: a new session waits for the browser's
first window, which on a loaded machine took longer than the 30 s a command may take (the session
gets :data:`START_SECONDS`); and the Jobs table is rendered again when the live feed subscribes
(the page reloads what changed before it), so an element found just before can be stale by the
time its text is read (the row is found again, :meth:`Marionette.text`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Stack

FIREFOX = Path(os.environ.get("JOBSCHED_FIREFOX", "/usr/bin/firefox-esr"))
WAIT_MS = 10_000
START_SECONDS = 120.0
"""How long Firefox may take to start and open its first window (a new session waits for it)."""
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
STALE_RETRIES = 5
"""How often an element gone stale (its table rendered again) is found again before failing."""


class StaleElement(AssertionError):
    """The element was replaced in the page since it was found."""


class Marionette:
    """One Marionette connection: :meth:`call` sends a command and returns its value."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_MS / 1000 * 3)
        self.next_id = 0
        try:
            self._read()  # the server's hello: {"applicationType": "gecko", "marionetteProtocol": 3}
        except BaseException:
            self.sock.close()  # a connection left open would hold Marionette's only client slot
            raise

    def _read(self) -> Any:
        head = b""
        while not head.endswith(b":"):
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("marionette closed the connection")
            head += chunk
        size = int(head[:-1])
        body = b""
        while len(body) < size:
            body += self.sock.recv(size - len(body))
        return json.loads(body)

    def call(
        self, name: str, params: dict[str, Any] | None = None, *, timeout_seconds: float = 30.0
    ) -> Any:
        self.next_id += 1
        message = json.dumps([0, self.next_id, name, params or {}]).encode()
        self.sock.settimeout(timeout_seconds)
        self.sock.sendall(str(len(message)).encode() + b":" + message)
        _, _, error, result = self._read()
        if error is not None:
            kind = (
                StaleElement if error.get("error") == "stale element reference" else AssertionError
            )
            raise kind(f"{name}: {error}")
        return result.get("value") if isinstance(result, dict) else result

    def text(self, css: str) -> str:
        """The text of the element ``css`` selects, found again if it went stale meanwhile."""
        for _ in range(STALE_RETRIES):
            try:
                return str(self.call("WebDriver:GetElementText", {"id": self.find(css)}))
            except StaleElement:
                continue
        raise AssertionError(f"{css}: stale {STALE_RETRIES} times in a row")

    def find(self, css: str) -> str:
        return str(
            self.call("WebDriver:FindElement", {"using": "css selector", "value": css})[ELEMENT]
        )

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def firefox(tmp_path: Path) -> Iterator[Marionette]:
    if not FIREFOX.exists():
        reason = f"no firefox at {FIREFOX}: apt-get install firefox-esr (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "user.js").write_text('user_pref("marionette.port", 0);\n')  # any free port
    proc = subprocess.Popen(
        [str(FIREFOX), "--headless", "--marionette", "--no-remote", "-profile", str(profile)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "MarionetteActivePort"
        client: Marionette | None = None
        for _ in range(600):  # until Marionette listens on the port it wrote (bounded wait)
            try:
                client = Marionette(int(port_file.read_text()))
                break
            except (OSError, ValueError):  # not written yet, half written, or not listening yet
                try:
                    proc.wait(timeout=0.1)
                    pytest.fail("firefox exited before Marionette listened")
                except subprocess.TimeoutExpired:
                    pass
        assert client is not None, "Marionette never listened"
        client.call("WebDriver:NewSession", {"capabilities": {}}, timeout_seconds=START_SECONDS)
        client.call("WebDriver:SetTimeouts", {"implicit": WAIT_MS})
        yield client
        client.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


async def test_the_jobs_page_in_firefox_signs_in_and_shows_a_job_of_the_api(
    firefox: Marionette, stack: Stack
) -> None:
    job = await stack.client().create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 3 * * *"}}
    )

    def browse() -> str:
        firefox.call("WebDriver:Navigate", {"url": f"{stack.url}/ui/"})
        token = firefox.find("#token")
        firefox.call("WebDriver:ElementSendKeys", {"id": token, "text": stack.token("alice")})
        firefox.call("WebDriver:ElementClick", {"id": firefox.find("form button[type=submit]")})
        firefox.find("#jobs")
        return firefox.text(f"#job-{job.id}")

    text = await asyncio.to_thread(browse)
    assert "noop" in text
