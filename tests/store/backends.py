"""Store factories for the contract suite (``tests/store/test_contract.py``): MongoDB backends.

Each factory returns an opened store on a database of its own; the caller closes it.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any, cast

from store.mongo import MongoStore
from tests.store.mongo_fake import FakeAsyncMongoClient

if TYPE_CHECKING:
    from pymongo import AsyncMongoClient

MONGODB_URL_ENV = "JOBSCHED_TEST_MONGODB_URL"


def fake_client() -> AsyncMongoClient[dict[str, Any]]:
    """A fresh in-process fake client, typed as the real one for the store's constructor."""
    return cast("AsyncMongoClient[dict[str, Any]]", FakeAsyncMongoClient())


async def fake_mongo_store() -> MongoStore:
    """MongoStore on a fresh in-process fake (mongomock) database, opened."""
    store = MongoStore("mongodb://fake.invalid/jobsched", client=fake_client())
    await store.open()
    return store


class _DroppingMongoStore(MongoStore):
    """A MongoStore that drops its database when closed (a test database of its own)."""

    async def close(self) -> None:
        if self._client is not None:
            await self._client.drop_database(self.database_name)
        await super().close()


def with_database(url: str, name: str) -> str:
    """``url`` with its path (the database name) replaced by ``name``."""
    head, sep, query = url.partition("?")
    scheme, _, rest = head.partition("://")
    hosts = rest.split("/", 1)[0]
    return f"{scheme}://{hosts}/{name}{sep}{query}"


async def real_mongo_store() -> MongoStore | None:
    """MongoStore on a unique database of $JOBSCHED_TEST_MONGODB_URL (dropped on close), or None."""
    url = os.environ.get(MONGODB_URL_ENV)
    if not url:
        return None
    store = _DroppingMongoStore(with_database(url, f"jobsched_test_{uuid.uuid4().hex[:12]}"))
    await store.open()
    return store
