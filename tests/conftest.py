"""Shared fixtures: a real nats-server per session (and per test where a test restarts it),
real SQLite files in tmp dirs, and a full jobsched stack on real HTTP.

Every test gets its own subject prefix, so its streams and consumers never meet another test's,
and its own NATS users for that prefix: jobsched runs under its roles' permissions, which must
cover everything it does (tests/natsauth.py).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.auth import role_users
from core.settings import Settings, load_settings
from jobsched.natsserver import NatsServer, find_nats_server
from tests.natsauth import AuthedNatsServer, plain_url, server_at
from tests.support import Stack, start_stack

HEAVY = (
    "tests/ui/",
    "tests/e2e/test_noisy_neighbour.py",
    "tests/test_bench_smoke.py",
    "tests/faults/test_nats_cluster.py",
)
"""Test modules that load both cores for long stretches (browsers, every benchmark at once, a
3-node cluster, 400 stalled WebSocket clients). Two of them at once on the two pytest-xdist
workers starved each other's nats-server of CPU for seconds (lease renewals timed out), which is
not what any of them tests: :func:`_heavy_tests_one_at_a_time` runs their tests one at a time.
(pytest-xdist's ``--dist loadgroup`` would do it, but with pytest 9 it groups nothing: it
renames ``item._nodeid``, which pytest 9 no longer reads.)"""

HEAVY_TIMEOUT_SECONDS = 900
"""pytest-timeout for a heavy test: it may first wait for another worker's heavy test to end."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give heavy tests their timeout and move them to the front, in their order.

    pytest-xdist's ``worksteal`` hands the first worker the first half of the collection and
    steals from the end of a worker's queue, so with the heavy tests first one worker runs them
    one after another while the other runs the light ones, instead of the two meeting at the
    lock of :func:`_heavy_tests_one_at_a_time` with one of them idle. Without xdist the order
    changes nothing a test depends on: no test depends on another's having run.
    """
    heavy = [item for item in items if item.nodeid.startswith(HEAVY)]
    for item in heavy:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(HEAVY_TIMEOUT_SECONDS))
    light = [item for item in items if not item.nodeid.startswith(HEAVY)]
    items[:] = heavy + light


@pytest.fixture(autouse=True)
def _heavy_tests_one_at_a_time(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Hold an exclusive ``flock`` shared by every worker of this run (a file in the base temp
    dir's parent, which xdist's workers share) while a :data:`HEAVY` test runs. Per test, not
    per module: a worker holds it only while it runs a test, never while it idles waiting for
    work (xdist keeps a module's fixtures until it knows the next test), so a worker blocked on
    it cannot hold up the one holding it."""
    if not request.node.nodeid.startswith(HEAVY):
        yield
        return
    path = tmp_path_factory.getbasetemp().parent / "jobsched-heavy-tests.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


TEST_SECRET = "test-secret-0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="session")
def nats_binary() -> str:
    return find_nats_server(os.environ)


@pytest.fixture(scope="session")
def nats_server(nats_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server for the session; tests isolate themselves by subject prefix."""
    root = tmp_path_factory.mktemp("nats-session")
    server = AuthedNatsServer(nats_binary, root / "store", log_file=root / "nats.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_nats(nats_binary: str, tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test alone (to kill or restart it)."""
    server = AuthedNatsServer(
        nats_binary, tmp_path / "own-nats", log_file=tmp_path / "own-nats.log"
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(
    tmp_path: Path, prefix: str, nats_server: NatsServer
) -> Iterator[SettingsFactory]:
    """Settings for a test: its own data dir and prefix, short ack waits and backoffs, and its
    own NATS users (one per connection, ``JOBSCHED_NATS_CREDENTIALS_DIR``) on the servers its
    URL names. At the end, the test fails if any of them hit a permission violation."""
    creds = tmp_path / "nats-creds"
    granted: dict[tuple[AuthedNatsServer, str], int] = {}  # (server, prefix): log offset

    def factory(**overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "data_dir": str(tmp_path / "data"),
            "nats_url": nats_server.url,
            "subject_prefix": prefix,
            "auth_secret": TEST_SECRET,
            "http_port": 0,
            "partitions": 8,
            "ack_wait_seconds": 2.0,
            "retry_backoff_seconds": 0.3,
            "retry_backoff_max_seconds": 5.0,
            "scan_interval_seconds": 1.0,
            "lookahead_seconds": 5.0,
            "redispatch_after_seconds": 6.0,
            "drain_timeout_seconds": 5.0,
            "worker_cpu_slots": 1,
            # every attempt reports RUNNING, which most tests observe; the default (0.5 s, a
            # short attempt reports its outcome alone) is tested where it is said
            "worker_running_grace_seconds": 0.0,
            "nats_credentials_dir": str(creds),
        }
        base.update(overrides)
        base["nats_url"] = plain_url(base["nats_url"])
        settings = load_settings({}, **base)
        role_users(creds, settings.nats.subject_prefix, settings.worker.queues)  # the files, always
        for url in settings.nats.url.split(","):
            server = server_at(url)
            if server is not None:
                server.grant(settings.nats.subject_prefix, settings.worker.queues, creds)
                granted.setdefault((server, settings.nats.subject_prefix), server.log_offset())
        return settings

    yield factory
    found = []
    for (server, granted_prefix), offset in granted.items():
        found += server.violations(granted_prefix, offset)
        server.revoke(granted_prefix)
    assert not found, "NATS permission violations:\n" + "\n".join(found)


@pytest.fixture
async def stack(make_settings: SettingsFactory) -> AsyncIterator[Stack]:
    """Gateway, scheduler, recorder and worker in this process, on real NATS, SQLite and HTTP."""
    async with start_stack(make_settings()) as s:
        yield s
