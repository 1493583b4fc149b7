"""CORS over real HTTP: none by default; for an allowed origin, preflights are answered without a
token and responses (problems included) carry the CORS headers; other origins get none."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp.test_utils import TestServer

from core.clock import SystemClock
from core.settings import GatewayConfig, load_settings
from gateway.app import GatewayDeps, create_app
from gateway.auth import mint_token
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.conftest import TEST_SECRET

APP = "https://app.example.com"
EVIL = "https://evil.example.net"


async def serve(tmp_path: Path, **cors: tuple[str, ...]) -> AsyncIterator[str]:
    store = SqliteStore(tmp_path / "cors.db")
    await store.open()
    config = msgspec.structs.replace(GatewayConfig(auth_secret=TEST_SECRET, partitions=8), **cors)
    deps = GatewayDeps(store, None, builtin_catalog(), SystemClock(), config)
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
        await store.close()


@pytest.fixture
async def allowed(tmp_path: Path) -> AsyncIterator[str]:
    async for url in serve(tmp_path, cors_allowed_origins=(APP, "https://other.example.com")):
        yield url


@pytest.fixture
async def closed(tmp_path: Path) -> AsyncIterator[str]:
    async for url in serve(tmp_path):
        yield url


def token() -> str:
    return mint_token(TEST_SECRET, "alice", ttl=timedelta(hours=1))


PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def test_a_preflight_of_an_allowed_origin_is_answered_without_a_token(allowed: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.options(f"{allowed}/jobs", headers=PREFLIGHT) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.headers["Access-Control-Allow-Origin"] == APP
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
        allowed_headers = r.headers["Access-Control-Allow-Headers"].lower()
        assert "authorization" in allowed_headers and "content-type" in allowed_headers
        assert r.headers["Access-Control-Max-Age"] == "600"
        assert "Access-Control-Allow-Credentials" not in r.headers


async def test_a_request_of_an_allowed_origin_may_read_the_answer(allowed: str) -> None:
    headers = {"Origin": APP, "Authorization": f"Bearer {token()}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{allowed}/jobs", headers=headers) as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == APP
            assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]
            assert "Origin" in r.headers["Vary"]
        async with http.get(f"{allowed}/jobs", headers={"Origin": APP}) as r:  # no token
            assert r.status == 401  # the problem is readable by the page too
            assert r.headers["Access-Control-Allow-Origin"] == APP


async def test_another_origin_gets_no_cors_headers(allowed: str) -> None:
    evil = {**PREFLIGHT, "Origin": EVIL}
    async with aiohttp.ClientSession() as http:
        async with http.options(f"{allowed}/jobs", headers=evil) as r:
            assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
        headers = {"Origin": EVIL, "Authorization": f"Bearer {token()}"}
        async with http.get(f"{allowed}/jobs", headers=headers) as r:
            assert "Access-Control-Allow-Origin" not in r.headers


async def test_a_method_that_is_not_allowed_fails_its_preflight(allowed: str) -> None:
    put = {**PREFLIGHT, "Access-Control-Request-Method": "PUT"}
    async with aiohttp.ClientSession() as http, http.options(f"{allowed}/jobs", headers=put) as r:
        assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers


async def test_no_origin_is_allowed_by_default(closed: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.options(f"{closed}/jobs", headers=PREFLIGHT) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
            assert r.status in (401, 405)  # not a preflight the gateway answers
        headers = {"Origin": APP, "Authorization": f"Bearer {token()}"}
        async with http.get(f"{closed}/jobs", headers=headers) as r:
            assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers


def test_the_settings_reach_the_gateway() -> None:
    settings = load_settings(
        {"JOBSCHED_CORS_ALLOWED_ORIGINS": f"{APP}, {EVIL}", "JOBSCHED_CORS_ALLOWED_METHODS": "GET"}
    )
    assert settings.gateway.cors_allowed_origins == (APP, EVIL)
    assert settings.gateway.cors_allowed_methods == ("GET",)
    assert load_settings({}).gateway.cors_allowed_origins == ()
