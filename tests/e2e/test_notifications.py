"""Run notifications through real parts: the HTTP and NATS APIs, scheduler, worker, recorder,
NATS JetStream (the notifier's durable consumer, its own NATS user), SQLite, and a real HTTP
receiver on 127.0.0.2, allowed by the notifier's ``http_allowed_networks`` (127.0.0.1 is not).

The notifier runs next to the stack on its own connection and store handle (as ``jobsched
notifier`` does), with short retry delays, so a test can stop it and start another.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import pytest
import standardwebhooks
from aiohttp import web
from aiohttp.test_utils import TestServer

from actors.notifier import Notifier
from bus.notifier import NotifierStream
from core.egress import EgressPolicy
from core.notifications import NotificationAttempt
from core.ports import JobStore
from core.retry import RetryPolicy
from core.settings import Settings
from jobsched.client import ApiError
from jobsched.runtime import Connection, Roles, connected_bus, opened_store
from jobsched.webhooks import AiohttpSender
from tests.conftest import SettingsFactory
from tests.e2e.test_nats_api import nats_client
from tests.support import Stack, executions, problem_fields, start_stack, wait_job

SECRET = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()
FAST = RetryPolicy(first_seconds=0.05, max_seconds=0.2, jitter=0.2)
ALLOWED = EgressPolicy.parse("127.0.0.2/32")
WAIT_SECONDS = 20.0


class Receiver:
    """A webhook receiver: records each request, answers the queued statuses (then 200)."""

    def __init__(self, host: str = "127.0.0.2", statuses: list[int] | None = None) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses = list(statuses or [])
        self.arrived = asyncio.Event()
        self._url = ""
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.server = TestServer(app, host=host)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read()))
        self.arrived.set()
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)

    async def __aenter__(self) -> Receiver:
        await self.server.start_server()
        self._url = str(self.server.make_url("/hook"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()

    def url(self) -> str:
        return self._url


class Recorded:
    """The store, as the notifier uses it, that wakes tests when an attempt is recorded."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self.attempts: list[NotificationAttempt] = []
        self.changed = asyncio.Condition()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def record_notification_attempt(self, attempt: NotificationAttempt) -> None:
        await self._store.record_notification_attempt(attempt)
        async with self.changed:
            self.attempts.append(attempt)
            self.changed.notify_all()

    async def wait(self, done: Callable[[list[NotificationAttempt]], bool]) -> None:
        async with asyncio.timeout(WAIT_SECONDS), self.changed:
            await self.changed.wait_for(lambda: done(self.attempts))


@asynccontextmanager
async def running_notifier(
    settings: Settings, policy: EgressPolicy = ALLOWED, retry: RetryPolicy = FAST
) -> AsyncIterator[Recorded]:
    async with AsyncExitStack() as stack:
        bus = await stack.enter_async_context(connected_bus(settings, Connection.NOTIFIER))
        store = Recorded(await stack.enter_async_context(opened_store(settings)))
        sender = AiohttpSender(policy, timeout_seconds=5.0)
        stack.push_async_callback(sender.close)
        notifier = Notifier(NotifierStream(bus), cast(JobStore, store), sender, retry=retry)
        task = asyncio.create_task(notifier.run(), name="test notifier")
        try:
            async with asyncio.timeout(WAIT_SECONDS):
                await asyncio.wait(
                    {task, asyncio.ensure_future(notifier.ready.wait())},
                    return_when=asyncio.FIRST_COMPLETED,
                )
            if task.done():
                task.result()
            yield store
        finally:
            notifier.stop()
            async with asyncio.timeout(WAIT_SECONDS):
                await task


@pytest.fixture
async def stack(make_settings: SettingsFactory) -> AsyncIterator[Stack]:
    async with start_stack(make_settings()) as s:
        yield s


def failing_job(url: str, **notify: Any) -> dict[str, Any]:
    return {
        "taskId": "fail",
        "maxAttempts": 1,
        "parameters": {"times": 1},
        "notify": {"url": url, **notify},
    }


async def test_a_failed_run_posts_its_final_record_signed_as_standard_webhooks(
    stack: Stack,
) -> None:
    client = stack.client()
    async with Receiver() as receiver, running_notifier(stack.settings) as store:
        job = await client.create_job(failing_job(receiver.url(), secret=SECRET))
        await wait_job(client, job.id, {"FAILED"})
        await store.wait(lambda a: len(a) == 1)
        [run] = await executions(client, job.id)

    [(headers, body)] = receiver.requests
    verified = standardwebhooks.Webhook(SECRET).verify(body, headers)
    assert verified["type"] == "execution.failed"
    assert verified["data"]["id"] == run.id and verified["data"]["status"] == "FAILED"
    assert verified["data"]["error"] == run.error and verified["data"]["attempt"] == 1
    [attempt] = await client.notification_attempts(job.id, run.id)
    assert (attempt.attempt, attempt.ok, attempt.status_code) == (1, True, 200)
    assert attempt.webhook_id == headers["webhook-id"] and attempt.url == receiver.url()
    async with nats_client(stack) as over_nats:
        assert await over_nats.notification_attempts(job.id, run.id) == [attempt]


async def test_a_500_is_retried_with_backoff_until_it_is_delivered(stack: Stack) -> None:
    client = stack.client()
    async with Receiver(statuses=[500, 503]) as receiver, running_notifier(stack.settings) as store:
        job = await client.create_job(failing_job(receiver.url()))
        await store.wait(lambda a: any(x.ok for x in a))
        [run] = await executions(client, job.id)

    attempts = await client.notification_attempts(job.id, run.id)
    assert [(a.attempt, a.status_code, a.ok) for a in attempts] == [
        (1, 500, False), (2, 503, False), (3, 200, True)
    ]  # fmt: skip
    assert all(a.next_attempt_at is not None for a in attempts[:2])
    assert attempts[2].next_attempt_at is None
    assert len({h["webhook-id"] for h, _ in receiver.requests}) == 1
    assert "webhook-signature" not in receiver.requests[0][0]  # no secret: unsigned


async def test_loopback_is_refused_by_default_as_one_recorded_attempt_without_retry(
    stack: Stack,
) -> None:
    client = stack.client()
    async with (
        Receiver("127.0.0.1") as inside,
        running_notifier(stack.settings, EgressPolicy()) as store,
    ):
        job = await client.create_job(failing_job(inside.url()))
        await store.wait(lambda a: len(a) == 1)
        [run] = await executions(client, job.id)

    [attempt] = await client.notification_attempts(job.id, run.id)
    assert (attempt.attempt, attempt.ok, attempt.status_code) == (1, False, None)
    assert "loopback" in (attempt.error or ""), attempt.error
    assert attempt.next_attempt_at is None  # given up: a retry cannot help
    assert inside.requests == []


async def test_a_notifier_restart_loses_no_notification(stack: Stack) -> None:
    client = stack.client()
    async with Receiver(statuses=[500]) as receiver:
        job = await client.create_job(failing_job(receiver.url()))
        await wait_job(client, job.id, {"FAILED"})  # no notifier running yet: it waits
        slow = RetryPolicy(first_seconds=1.0, max_seconds=1.0)  # stopped before the retry
        async with running_notifier(stack.settings, retry=slow) as first:
            await first.wait(lambda a: len(a) == 1)
        assert [a.ok for a in first.attempts] == [False]
        async with running_notifier(stack.settings) as second:
            await second.wait(lambda a: any(x.ok for x in a))
        [run] = await executions(client, job.id)

    attempts = await client.notification_attempts(job.id, run.id)
    assert [(a.attempt, a.ok) for a in attempts] == [(1, False), (2, True)]
    assert len(receiver.requests) == 2


async def test_the_users_default_notifies_on_success_for_jobs_without_their_own(
    stack: Stack,
) -> None:
    client = stack.client()
    async with Receiver() as receiver, running_notifier(stack.settings) as store:
        shown = await client.set_notification_default(
            {"url": receiver.url(), "on": ["success"], "secret": SECRET}
        )
        job = await client.create_job({"taskId": "noop"})
        await store.wait(lambda a: len(a) == 1)

    assert shown.notify is not None and shown.notify.has_secret and shown.notify.secret is None
    [(headers, body)] = receiver.requests
    verified = standardwebhooks.Webhook(SECRET).verify(body, headers)
    assert verified["type"] == "execution.succeeded" and verified["data"]["jobId"] == job.id
    assert (await client.notification_default()) == shown
    cleared = await client.set_notification_default(None)
    assert cleared.notify is None and (await client.notification_default()).notify is None


async def test_a_secret_is_never_shown_by_the_api(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 3600},
         "notify": {"url": "https://hooks.example/x", "on": ["failure"], "secret": SECRET}}
    )  # fmt: skip
    patched = await client.patch_job(job.id, {"notify": {"url": "https://hooks.example/y"}})
    answers = [
        await client._request("GET", f"/jobs/{job.id}"),
        await client._request("GET", "/jobs"),
        await client._request("POST", f"/jobs/{job.id}/pause"),
    ]
    audit = await client._request("GET", f"/jobs/{job.id}/audit")  # old and new values
    async with nats_client(stack) as over_nats:
        nats_job = await over_nats.get_job(job.id)
        nats_patched = await over_nats.patch_job(
            job.id, {"notify": {"url": "https://hooks.example/y", "on": ["failure", "success"]}}
        )
    assert nats_patched.notify is not None and nats_patched.notify.on == ["failure", "success"]

    for shown in (job, patched, nats_job, nats_patched):
        assert shown.notify is not None and shown.notify.has_secret and shown.notify.secret is None
    assert patched.notify is not None and patched.notify.url == "https://hooks.example/y"
    for raw in answers:
        assert SECRET not in raw.decode() and SECRET[6:20] not in raw.decode()
        assert '"hasSecret":true' in raw.decode()
    assert SECRET not in audit.decode() and SECRET[6:20] not in audit.decode()
    assert '"field":"notify.secret","old":null,"new":null,"redacted":true' in audit.decode()
    async with AsyncExitStack() as s:  # the PATCH without a secret kept it
        store = await s.enter_async_context(opened_store(stack.settings))
        stored = await store.get_job("alice", job.id)
    assert stored.notify is not None and stored.notify.secret == SECRET
    removed = await client.patch_job(job.id, {"notify": None})
    assert removed.notify is None


async def test_bad_notify_input_is_a_422_naming_the_field_and_nothing_is_written(
    stack: Stack,
) -> None:
    client = stack.client()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"url": "ftp://h/x"}, "notify.url"),
        ({"url": "http://0x7f000001:9/x"}, "notify.url"),  # 127.0.0.1 in a legacy form
        ({"url": "https://h/x", "on": ["sometimes"]}, "notify.on[0]"),
        ({"url": "https://h/x", "secret": "hunter2"}, "notify.secret"),
        ({"url": "https://h/x", "extra": 1}, "notify.extra"),
    ]
    for notify, field in cases:
        with pytest.raises(ApiError) as e:
            await client.create_job({"taskId": "noop", "notify": notify})
        assert e.value.status == 422 and problem_fields(e.value) == [field], notify
        with pytest.raises(ApiError) as e:
            await client.set_notification_default(notify)
        assert e.value.status == 422 and problem_fields(e.value) == [field], notify
    assert (await client.list_jobs()).items == []
    assert (await client.notification_default()).notify is None


async def test_attempts_and_defaults_are_the_callers_own(stack: Stack) -> None:
    alice, mallory = stack.client("alice"), stack.client("mallory")
    async with Receiver() as receiver, running_notifier(stack.settings) as store:
        job = await alice.create_job(failing_job(receiver.url()))
        await alice.set_notification_default({"url": receiver.url(), "secret": SECRET})
        await store.wait(lambda a: len(a) == 1)
        [run] = await executions(alice, job.id)

    with pytest.raises(ApiError) as e:
        await mallory.notification_attempts(job.id, run.id)
    assert e.value.status == 404
    with pytest.raises(ApiError) as e:
        await alice.notification_attempts(job.id, "another-job:2026-01-01T00:00:00.000Z")
    assert e.value.status == 404
    assert (await mallory.notification_default()).notify is None
    async with nats_client(stack, "mallory") as over_nats:
        with pytest.raises(ApiError) as e:
            await over_nats.notification_attempts(job.id, run.id)
        assert e.value.status == 404
        mine = await over_nats.set_notification_default({"url": "https://m.example/"})
        assert mine == await over_nats.notification_default()
        with pytest.raises(ApiError) as e:
            await over_nats.set_notification_default({"url": "gopher://m/"})
        assert e.value.status == 422 and problem_fields(e.value) == ["notify.url"]
    alices = (await alice.notification_default()).notify
    assert alices is not None and alices.url == receiver.url() and alices.has_secret


async def test_the_notifier_role_delivers_to_what_the_allowlist_setting_allows(
    make_settings: SettingsFactory,
) -> None:
    """As ``jobsched dev`` and ``jobsched notifier`` run it: the notifier of ``serve``, its
    SSRF guard set by ``JOBSCHED_HTTP_ALLOWED_NETWORKS``."""
    settings = make_settings(http_allowed_networks="127.0.0.2/32")
    roles = Roles(gateway=True, scheduler=True, worker=True, notifier=True)
    async with Receiver() as receiver, start_stack(settings, roles) as s:
        client = s.client()
        job = await client.create_job(failing_job(receiver.url(), secret=SECRET))
        async with asyncio.timeout(WAIT_SECONDS):
            await receiver.arrived.wait()
        [run] = await executions(client, job.id)
        [(headers, body)] = receiver.requests
        assert standardwebhooks.Webhook(SECRET).verify(body, headers)["data"]["id"] == run.id


async def test_a_url_aiohttp_cannot_use_is_one_final_attempt() -> None:
    """A webhook stored before legacy IPv4 forms were refused: one final attempt, not 8."""
    sender = AiohttpSender(EgressPolicy.parse(""), timeout_seconds=5.0)
    try:
        result = await sender.post("http://2130706433:9/hook", {}, b"{}")
    finally:
        await sender.close()
    assert result.final and result.status_code is None
    assert result.error is not None and "invalid URL" in result.error
