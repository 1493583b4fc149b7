"""The ``store`` fixture of the contract suite: one opened :class:`core.ports.JobStore` per backend.

Every test of ``test_contract.py`` runs once per entry of :data:`BACKENDS`; adding a backend is
adding one entry. A factory gets the test's temporary directory and returns an opened store, or
None when the backend cannot run here (the test is then skipped with the backend's reason).

A contract test that a backend is known to fail carries ``@backend_bug("<id>", reason="BUG: …")``;
it runs as a strict xfail on that backend only, so a fix shows up as an XPASS failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.ports import JobStore
from store.sqlite import SqliteStore


@dataclass(frozen=True, slots=True)
class Backend:
    """A store implementation under test.

    Attributes:
        id: the test id suffix (``test_x[sqlite]``).
        open: returns an opened store on a database of its own, or None if unavailable here.
        unavailable: why the test is skipped when ``open`` returns None.
    """

    id: str
    open: Callable[[Path], Awaitable[JobStore | None]]
    unavailable: str = ""


async def _sqlite(tmp_path: Path) -> JobStore:
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    return store


async def _mongo_fake(tmp_path: Path) -> JobStore:
    from tests.store.backends import fake_mongo_store

    return await fake_mongo_store()


async def _mongo(tmp_path: Path) -> JobStore | None:
    from tests.store.backends import real_mongo_store

    return await real_mongo_store()


BACKENDS = [
    Backend("sqlite", _sqlite),
    Backend("mongo-fake", _mongo_fake),
    Backend("mongo", _mongo, unavailable="set JOBSCHED_TEST_MONGODB_URL to a replica set"),
]


def backend_bug(*backend_ids: str, reason: str) -> pytest.MarkDecorator:
    """Mark a contract test as a known bug (strict xfail) of the named backends only."""
    return pytest.mark.backend_bug(*backend_ids, reason=reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backend_bug(*ids, reason): strict xfail of a contract test on these backends"
    )


@pytest.fixture(params=BACKENDS, ids=[b.id for b in BACKENDS])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    backend: Backend = request.param
    for mark in request.node.iter_markers("backend_bug"):
        if backend.id in mark.args:
            request.applymarker(pytest.mark.xfail(strict=True, reason=mark.kwargs["reason"]))
    opened = await backend.open(tmp_path)
    if opened is None:
        pytest.skip(f"{backend.id}: {backend.unavailable}")
    try:
        yield opened
    finally:
        await opened.close()
