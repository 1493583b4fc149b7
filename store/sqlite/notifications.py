"""The SQLite store's part of :class:`core.notifications.NotificationStore`: the users' default
webhooks and the delivery attempts of notifications, each row's record as msgspec JSON."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import aiosqlite
import msgspec

from core.notifications import NotificationAttempt
from core.notify_spec import NotifyTarget

NOTIFICATION_SCHEMA = """
CREATE TABLE IF NOT EXISTS notification_defaults (
    owner TEXT PRIMARY KEY,
    target BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS notification_attempts (
    id TEXT PRIMARY KEY,
    execution_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS notification_attempts_run
    ON notification_attempts (execution_id, attempt);
"""
"""Tables created on open (after the others; nothing to migrate: new in this release)."""

_encoder = msgspec.json.Encoder()
_target = msgspec.json.Decoder(NotifyTarget)
_attempt = msgspec.json.Decoder(NotificationAttempt)


class _Store(Protocol):
    def _transaction(self) -> AbstractAsyncContextManager[aiosqlite.Connection]: ...

    async def _fetch(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> list[sqlite3.Row]: ...


class SqliteNotifications:
    """Mixed into :class:`store.sqlite.SqliteStore` (its transactions and reads)."""

    async def get_notification_default(self: _Store, owner: str) -> NotifyTarget | None:
        rows = await self._fetch(
            "SELECT target FROM notification_defaults WHERE owner = ?", [owner]
        )
        return _target.decode(rows[0]["target"]) if rows else None

    async def set_notification_default(
        self: _Store, owner: str, target: NotifyTarget | None
    ) -> None:
        async with self._transaction() as conn:
            if target is None:
                await conn.execute("DELETE FROM notification_defaults WHERE owner = ?", [owner])
            else:
                await conn.execute(
                    "INSERT INTO notification_defaults (owner, target) VALUES (?, ?) "
                    "ON CONFLICT(owner) DO UPDATE SET target = excluded.target",
                    [owner, _encoder.encode(target)],
                )

    async def record_notification_attempt(self: _Store, attempt: NotificationAttempt) -> None:
        async with self._transaction() as conn:
            await conn.execute(
                "INSERT OR REPLACE INTO notification_attempts "
                "(id, execution_id, owner, attempt, record) VALUES (?, ?, ?, ?, ?)",
                [
                    attempt.id,
                    attempt.execution_id,
                    attempt.owner,
                    attempt.attempt,
                    _encoder.encode(attempt),
                ],
            )

    async def notification_attempts(self: _Store, execution_id: str) -> list[NotificationAttempt]:
        rows = await self._fetch(
            "SELECT record FROM notification_attempts WHERE execution_id = ? ORDER BY attempt",
            [execution_id],
        )
        return [_attempt.decode(r["record"]) for r in rows]
