"""A gateway on real HTTP and a real SQLite store, without NATS (notices are optional)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.clock import Clock, SystemClock
from core.ports import JobStore
from core.settings import GatewayConfig
from gateway.app import GatewayDeps, create_app
from gateway.auth import mint_token
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.conftest import TEST_SECRET


@dataclass
class Api:
    url: str
    store: JobStore
    session: aiohttp.ClientSession

    def auth(self, user: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {mint_token(TEST_SECRET, user, ttl=timedelta(hours=1))}"}


async def start_api(tmp_path: Path, clock: Clock | None = None) -> tuple[TestServer, SqliteStore]:
    store = SqliteStore(tmp_path / "gateway.db")
    await store.open()
    deps = GatewayDeps(
        store=store,
        bus=None,
        catalog=builtin_catalog(),
        clock=clock or SystemClock(),
        config=GatewayConfig(auth_secret=TEST_SECRET, partitions=8, max_body_bytes=4096),
    )
    server = TestServer(create_app(deps), host="127.0.0.1")
    await server.start_server()
    return server, store


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    server, store = await start_api(tmp_path)
    async with aiohttp.ClientSession() as session:
        yield Api(str(server.make_url("")).rstrip("/"), store, session)
    await server.close()
    await store.close()
