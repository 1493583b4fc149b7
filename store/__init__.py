"""Persistence adapters behind :class:`core.ports.JobStore`."""

from __future__ import annotations

from core.errors import ConfigError
from core.ports import JobStore


def create_store(url: str, *, timeout_seconds: float = 5.0) -> JobStore:
    """The store for ``url``: ``mongodb://`` / ``mongodb+srv://`` → MongoDB, else an SQLite file.

    The store is not opened; call ``await store.open()``. ``timeout_seconds`` bounds how long a call
    waits for the database (SQLite's busy timeout, MongoDB's server selection) before it fails
    with :class:`core.errors.StoreUnavailable`.

    Raises:
        ConfigError: for an unsupported URL scheme.
    """
    if url.startswith(("mongodb://", "mongodb+srv://")):
        from store.mongo import MongoStore

        return MongoStore(url, timeout_seconds=timeout_seconds)
    if "://" in url and not url.startswith("sqlite://"):
        raise ConfigError(f"unsupported store URL {url!r}: use sqlite:///path or mongodb://")
    from store.sqlite import SqliteStore, path_from_url

    return SqliteStore(path_from_url(url), busy_timeout_seconds=timeout_seconds)
