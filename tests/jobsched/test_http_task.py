"""The ``http`` task against real HTTP servers on loopback addresses.

The servers listen on 127.0.0.2 (allowed in most tests by the ``allowed_networks`` of the run's
context, as a deployment's ``http_allowed_networks`` setting would) and 127.0.0.1 (never
allowed): what the default policy refuses, the guard must refuse after DNS resolution and on
every redirect, and the refused server must see no request at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.tasks import SecretNotFound, TaskContext, TaskError
from jobsched.http_task import BODY_EXCERPT_BYTES, MAX_REDIRECTS, HttpParams, call_url, redact

ALLOWED = "127.0.0.2"
FORBIDDEN = "127.0.0.1"


@dataclass
class Target:
    """A server that records what reached it and answers with ``respond``."""

    server: TestServer
    seen: list[web.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    def url(self, path: str = "/hook") -> str:
        return str(self.server.make_url(path))


Handler = Callable[[web.Request], web.StreamResponse]


@asynccontextmanager
async def target(host: str, respond: Handler | None = None) -> AsyncIterator[Target]:
    t: Target

    async def handle(request: web.Request) -> web.StreamResponse:
        t.seen.append(request)
        t.bodies.append(await request.read())
        return respond(request) if respond else web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    t = Target(TestServer(app, host=host))
    await t.server.start_server()
    try:
        yield t
    finally:
        await t.server.close()


def ctx(tmp_path: Path, *, allowed: tuple[str, ...] = (f"{ALLOWED}/32",)) -> TaskContext:
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "api-token").write_text("s3cr3t-value\n")
    return TaskContext(
        idempotency_key="exec-42",
        job_id="job-1",
        attempt=1,
        scheduled_for=datetime(2026, 12, 2, tzinfo=UTC),
        data_dir=str(tmp_path),
        secrets_dir=str(secrets),
        allowed_networks=allowed,
    )


def params(url: str, **fields: Any) -> HttpParams:
    return HttpParams(url=url, **fields)


def as_sent(**raw: Any) -> HttpParams:
    """The parameters as a client sends them (JSON shapes, camelCase)."""
    return msgspec.convert(raw, HttpParams)


async def test_a_call_sends_the_idempotency_key_and_stores_the_answer(tmp_path: Path) -> None:
    async with target(ALLOWED) as t:
        url = t.url()
        result = await call_url(params(url, method="POST", json={"a": 1}), ctx(tmp_path))

    assert result["status"] == 200 and result["body"] == '{"ok": true}'
    assert result["bodyTruncated"] is False and result["redirects"] == 0
    assert result["elapsedMs"] >= 0 and result["url"] == url
    [request] = t.seen
    assert request.method == "POST" and request.headers["Idempotency-Key"] == "exec-42"
    assert t.bodies == [b'{"a": 1}']


async def test_a_secret_header_is_filled_in_at_run_time_and_never_stored(tmp_path: Path) -> None:
    headers: dict[str, Any] = {"Authorization": {"secret": "api-token", "prefix": "Bearer "}}
    async with target(ALLOWED) as t:
        result = await call_url(as_sent(url=t.url(), headers=headers), ctx(tmp_path))

    assert t.seen[0].headers["Authorization"] == "Bearer s3cr3t-value"
    assert "s3cr3t" not in repr(result)


def echo_headers(request: web.Request) -> web.StreamResponse:
    """What httpbin.org/headers does: the request's headers in the body."""
    return web.json_response(dict(request.headers))


async def test_a_secret_echoed_by_the_target_is_not_stored(tmp_path: Path) -> None:
    headers: dict[str, Any] = {"X-Api-Key": {"secret": "api-token"}}
    async with target(ALLOWED, echo_headers) as t:
        result = await call_url(as_sent(url=t.url(), headers=headers), ctx(tmp_path))
        assert t.seen[0].headers["X-Api-Key"] == "s3cr3t-value"
        assert '"X-Api-Key": "[secret]"' in result["body"] and "s3cr3t" not in repr(result)

    def refuse(request: web.Request) -> web.StreamResponse:
        return web.json_response(dict(request.headers), status=403)

    async with target(ALLOWED, refuse) as t:
        with pytest.raises(TaskError) as e:
            await call_url(as_sent(url=t.url(), headers=headers), ctx(tmp_path))
    assert "[secret]" in str(e.value) and "s3cr3t" not in str(e.value)


def test_redaction_covers_a_secret_cut_by_the_excerpt() -> None:
    secrets = frozenset({"s3cr3t-value"})
    assert redact("key=s3cr3t-val", secrets, truncated=True) == "key=[secret]"
    assert redact("key=s3cr3t-val", secrets) == "key=s3cr3t-val"
    assert redact("a s3c", secrets, truncated=True) == "a s3c"  # under 4 characters: kept


async def test_a_missing_secret_fails_without_retry(tmp_path: Path) -> None:
    p = as_sent(url="https://example.com/", headers={"X-Key": {"secret": "nope"}})
    with pytest.raises(SecretNotFound) as e:
        await call_url(p, ctx(tmp_path))
    assert e.value.retryable is False


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",
        "http://localhost:9/",  # a name: refused on the address it resolves to
        "http://[::1]:9/",
        "http://[::ffff:127.0.0.1]:9/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://0.0.0.0:9/",
    ],
)
async def test_internal_addresses_are_refused_by_default(tmp_path: Path, url: str) -> None:
    with pytest.raises(TaskError, match="refused to connect") as e:
        await call_url(params(url), ctx(tmp_path, allowed=()))
    assert e.value.retryable is False


async def test_a_refused_server_sees_no_request(tmp_path: Path) -> None:
    async with target(FORBIDDEN) as t:
        with pytest.raises(TaskError, match="loopback"):
            await call_url(params(t.url()), ctx(tmp_path, allowed=()))
        by_name = t.url().replace(FORBIDDEN, "localhost")
        with pytest.raises(TaskError, match="refused to connect to localhost"):
            await call_url(params(by_name), ctx(tmp_path, allowed=()))
    assert t.seen == []


async def test_a_redirect_to_a_refused_address_is_not_followed(tmp_path: Path) -> None:
    async with target(FORBIDDEN) as inside:
        for location in (inside.url(), inside.url().replace(FORBIDDEN, "localhost")):
            async with target(ALLOWED, _redirecting(location)) as outside:
                with pytest.raises(TaskError, match="refused to connect"):
                    await call_url(params(outside.url()), ctx(tmp_path))
            assert len(outside.seen) == 1
    assert inside.seen == []


@pytest.mark.parametrize("host", ["2130706433", "0177.0.0.1", "0x7f000001", "127.1"])
def test_a_legacy_ipv4_form_is_refused_when_the_job_is_made(host: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="legacy form"):
        as_sent(url=f"http://{host}:9/")


async def test_a_redirect_to_a_legacy_ipv4_form_or_another_scheme_fails_without_retry(
    tmp_path: Path,
) -> None:
    async with target(FORBIDDEN) as inside:
        port = inside.server.port
        for location, error in (
            (f"http://2130706433:{port}/", "invalid URL"),
            (f"http://127.1:{port}/", "invalid URL"),
            ("file:///etc/passwd", "not http"),
        ):
            async with target(ALLOWED, _redirecting(location)) as outside:
                with pytest.raises(TaskError, match=error) as e:
                    await call_url(params(outside.url()), ctx(tmp_path))
            assert e.value.retryable is False and len(outside.seen) == 1
    assert inside.seen == []


async def test_a_redirect_to_another_origin_drops_the_credentials(tmp_path: Path) -> None:
    headers = {"Authorization": "Basic abc", "X-Key": {"secret": "api-token"}, "X-Plain": "kept"}
    async with target(ALLOWED) as other:
        landing = other.url("/landed")
        async with target(ALLOWED, lambda _: _redirect(landing)) as first:
            result = await call_url(as_sent(url=first.url(), headers=headers), ctx(tmp_path))

    assert result["redirects"] == 1 and result["url"] == landing
    assert first.seen[0].headers["X-Key"] == "s3cr3t-value"
    landed = other.seen[0].headers
    assert "Authorization" not in landed and "X-Key" not in landed
    assert landed["X-Plain"] == "kept" and landed["Idempotency-Key"] == "exec-42"


async def test_a_post_redirected_with_303_becomes_a_get(tmp_path: Path) -> None:
    async with target(ALLOWED) as other:
        landing = other.url()
        async with target(ALLOWED, lambda _: _redirect(landing, 303)) as first:
            await call_url(params(first.url(), method="POST", text="hi"), ctx(tmp_path))
    assert first.seen[0].method == "POST" and other.seen[0].method == "GET"
    assert other.bodies == [b""]


async def test_redirects_are_bounded(tmp_path: Path) -> None:
    async with target(ALLOWED, lambda r: _redirect(str(r.url))) as loop:
        with pytest.raises(TaskError, match="redirects") as e:
            await call_url(params(loop.url()), ctx(tmp_path))
    assert len(loop.seen) == MAX_REDIRECTS + 1 and e.value.retryable is False


async def test_redirects_can_be_left_unfollowed(tmp_path: Path) -> None:
    async with target(ALLOWED, lambda _: _redirect("http://127.0.0.1:9/")) as t:
        result = await call_url(
            params(t.url(), follow_redirects=False, success_statuses=[302]), ctx(tmp_path)
        )
    assert result["status"] == 302


@pytest.mark.parametrize(
    ("status", "retry_after", "retryable", "after"),
    [
        (503, "7", True, 7.0),
        (429, None, True, None),
        (500, "not a date", True, None),
        (404, None, False, None),
        (400, "7", False, None),
    ],
)
async def test_an_unsuccessful_status_says_whether_to_retry(
    tmp_path: Path, status: int, retry_after: str | None, retryable: bool, after: float | None
) -> None:
    headers = {"Retry-After": retry_after} if retry_after else {}
    respond = lambda _: web.Response(status=status, text="sorry", headers=headers)  # noqa: E731
    async with target(ALLOWED, respond) as t:
        with pytest.raises(TaskError, match=rf"HTTP {status} from GET .*'sorry'") as e:
            await call_url(params(t.url()), ctx(tmp_path))
    assert (e.value.retryable, e.value.retry_after_seconds) == (retryable, after)


async def test_a_retry_after_date_is_seconds_from_now(tmp_path: Path) -> None:
    when = "Wed, 21 Oct 2099 07:28:00 GMT"
    respond = lambda _: web.Response(status=503, headers={"Retry-After": when})  # noqa: E731
    async with target(ALLOWED, respond) as t:
        with pytest.raises(TaskError) as e:
            await call_url(params(t.url()), ctx(tmp_path))
    assert e.value.retry_after_seconds is not None and e.value.retry_after_seconds > 365 * 86400


async def test_success_statuses_replace_the_2xx_default(tmp_path: Path) -> None:
    async with target(ALLOWED, lambda _: web.Response(status=404)) as gone:
        result = await call_url(params(gone.url(), success_statuses=[404]), ctx(tmp_path))
        with pytest.raises(TaskError, match="HTTP 404"):
            await call_url(params(gone.url()), ctx(tmp_path))
    async with target(ALLOWED) as ok:
        with pytest.raises(TaskError, match="HTTP 200"):
            await call_url(params(ok.url(), success_statuses=[404]), ctx(tmp_path))
    assert result["status"] == 404


async def test_a_long_body_is_stored_as_an_excerpt(tmp_path: Path) -> None:
    respond = lambda _: web.Response(body=b"x" * (BODY_EXCERPT_BYTES * 10))  # noqa: E731
    async with target(ALLOWED, respond) as t:
        result = await call_url(params(t.url()), ctx(tmp_path))
    assert result["body"] == "x" * BODY_EXCERPT_BYTES and result["bodyTruncated"] is True


async def test_a_connection_error_is_retried(tmp_path: Path) -> None:
    async with target(ALLOWED) as t:
        url = t.url()
    with pytest.raises(aiohttp.ClientConnectionError):  # not a TaskError: retried with backoff
        await call_url(params(url), ctx(tmp_path))


def test_the_context_crosses_to_a_cpu_task_whole(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    assert msgspec.json.decode(msgspec.json.encode(c), type=TaskContext) == c


def test_a_secret_is_read_from_its_file_by_name_only(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    assert c.secret("api-token") == "s3cr3t-value"
    for name in ("../secrets/api-token", "missing", ".", ""):
        with pytest.raises(SecretNotFound):
            c.secret(name)
    with pytest.raises(SecretNotFound):
        replace(c, secrets_dir="").secret("api-token")


def _redirect(location: str, status: int = 302) -> web.Response:
    return web.Response(status=status, headers={"Location": location})


def _redirecting(location: str) -> Handler:
    return lambda _: _redirect(location)
