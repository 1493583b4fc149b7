"""``/healthz`` and ``/readyz`` of scheduler and worker processes (their metrics port), the
endpoints the Kubernetes probes of ``deploy/kubernetes/`` call: the readiness rule on fakes, then
the real server over HTTP, wired by ``jobsched.runtime.serve`` on a real nats-server and SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from actors.health import Check, readiness, started
from actors.metrics import MetricsServer
from core.errors import BusUnavailable, StoreUnavailable
from jobsched.natsserver import NatsServer
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.support import free_port, start_stack


async def ok() -> None:
    return None


async def nats_down() -> None:
    raise BusUnavailable("NATS: ping failed: TimeoutError")


async def test_readiness_is_ok_only_when_every_check_passes() -> None:
    assert (await readiness({"nats": ok, "store": ok})).status == "ok"
    health = await readiness({"nats": nats_down, "store": ok})
    assert health.status == "unavailable"
    assert health.checks == {"nats": "NATS: ping failed: TimeoutError", "store": "ok"}
    assert (await readiness({})).status == "ok"


async def test_readiness_runs_the_checks_concurrently() -> None:
    # Each check waits for the other to have started: run one after the other, they never end.
    a_started, b_started = asyncio.Event(), asyncio.Event()

    async def a() -> None:
        a_started.set()
        await b_started.wait()

    async def b() -> None:
        b_started.set()
        await a_started.wait()
        raise StoreUnavailable("store: no primary")

    async with asyncio.timeout(5):
        health = await readiness({"nats": a, "store": b})
    assert health.checks == {"nats": "ok", "store": "store: no primary"}


async def test_a_bug_in_a_check_is_not_reported_as_unavailable() -> None:
    async def broken() -> None:
        raise KeyError("oops")

    with pytest.raises(KeyError):
        await readiness({"nats": ok, "bug": broken})


class Peer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = asyncio.Event()


async def test_the_startup_check_names_the_actors_not_ready_yet() -> None:
    peers = [Peer("scheduler"), Peer("recorder")]
    check = started(peers)
    assert (await readiness({"startup": check})).checks == {
        "startup": "starting: scheduler, recorder"
    }
    peers[0].ready.set()
    late = Peer("worker")
    peers.append(late)  # read at each call
    assert (await readiness({"startup": check})).checks == {"startup": "starting: recorder, worker"}
    peers[1].ready.set()
    late.ready.set()
    assert (await readiness({"startup": check})).status == "ok"


async def get(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        body: dict[str, Any] = await resp.json()
        return resp.status, body


@pytest.fixture
async def metrics_server() -> AsyncIterator[tuple[MetricsServer, dict[str, Check]]]:
    checks: dict[str, Check] = {"nats": ok}
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, checks=checks)
    task = asyncio.create_task(server.run(), name="metrics-server")
    async with asyncio.timeout(10):
        await server.ready.wait()
    try:
        yield server, checks
    finally:
        server.stop()
        await task


async def test_the_metrics_server_answers_the_probes(
    metrics_server: tuple[MetricsServer, dict[str, Check]],
) -> None:
    server, checks = metrics_server
    base = server.url.removesuffix("/metrics")
    assert await get(f"{base}/healthz") == (200, {"status": "ok"})
    assert await get(f"{base}/readyz") == (200, {"status": "ok", "checks": {"nats": "ok"}})
    checks["nats"] = nats_down
    status, body = await get(f"{base}/readyz")
    assert (status, body["status"], body["checks"]["nats"]) == (
        503,
        "unavailable",
        "NATS: ping failed: TimeoutError",
    )
    assert await get(f"{base}/healthz") == (200, {"status": "ok"})  # liveness ignores NATS


@pytest.mark.parametrize(
    ("roles", "checks"),
    [
        (Roles(worker=True), {"startup", "nats"}),
        (Roles(scheduler=True), {"startup", "nats", "store"}),
    ],
    ids=["worker", "scheduler"],
)
async def test_scheduler_and_worker_processes_serve_the_probes_on_the_metrics_port(
    make_settings: SettingsFactory, roles: Roles, checks: set[str]
) -> None:
    port = free_port()
    settings = make_settings(metrics_port=port)
    async with start_stack(settings, Roles(scheduler=True, recorder=False)):
        pass  # the streams, which a worker waits for
    async with start_stack(settings, roles):
        assert await get(f"http://127.0.0.1:{port}/healthz") == (200, {"status": "ok"})
        status, body = await get(f"http://127.0.0.1:{port}/readyz")
    assert (status, body["status"]) == (200, "ok")
    assert body["checks"] == dict.fromkeys(checks, "ok")


async def wait_ready(url: str, ready: bool, timeout_seconds: float = 20.0) -> dict[str, Any]:
    """Poll ``url`` (``/readyz``) until it answers 200 (``ready``) or 503 (not), bounded; a
    server not listening yet counts as no answer."""
    want = 200 if ready else 503
    async with asyncio.timeout(timeout_seconds):
        while True:
            with contextlib.suppress(aiohttp.ClientConnectorError):
                status, body = await get(url)
                if status == want:
                    return body
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_a_worker_is_unready_while_nats_is_down_and_ready_again_after(
    make_settings: SettingsFactory, own_nats: NatsServer
) -> None:
    port = free_port()
    settings = make_settings(nats_url=own_nats.url, metrics_port=port)
    readyz = f"http://127.0.0.1:{port}/readyz"
    async with start_stack(settings, Roles(worker=True), ready=False):
        body = await wait_ready(readyz, False)  # no scheduler has created the streams yet
        assert body["checks"]["startup"] != "ok", body
        assert await get(f"http://127.0.0.1:{port}/healthz") == (200, {"status": "ok"})
        scheduler = settings.changed(metrics_port=0)
        async with start_stack(scheduler, Roles(scheduler=True, recorder=False)):
            await wait_ready(readyz, True)
        own_nats.stop()
        body = await wait_ready(readyz, False)
        assert body["checks"]["startup"] == "ok"
        assert body["checks"]["nats"].startswith("NATS: ping failed"), body
        assert await get(f"http://127.0.0.1:{port}/healthz") == (200, {"status": "ok"})
        own_nats.start()
        await wait_ready(readyz, True)
