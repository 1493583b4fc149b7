"""The SQLite store's :class:`core.ports.RunStore` part: runs across jobs (dead letters), bulk
actions with their leases, and audit records of changes that are not a job's.

A mixin of :class:`store.sqlite.store.SqliteStore` (its connections and transactions); its
tables and indexes are :data:`RUNS_SCHEMA`, created on open. A bulk action is one row: its
filter fields as columns where a query needs them (status, lease), the record as msgspec JSON.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import aiosqlite
import msgspec

from core.audit import AuditEntry, audit_record
from core.bulk import OPEN_BULK_STATUSES, BulkAction, BulkStatus, RunQuery
from core.errors import Conflict
from core.model import Execution, Page
from core.timeutil import to_epoch_ms
from store.pages import Keyset
from store.sqlite.rows import audit_row, execution_from_row
from store.sqlite.schema import AUDIT_INSERT, EXECUTION_COLUMNS, REPLAYS_OF, in_chunks

RUNS_SCHEMA = """
CREATE INDEX IF NOT EXISTS executions_owner_status_scheduled
    ON executions (owner, status, scheduled_for DESC, id DESC);
CREATE INDEX IF NOT EXISTS executions_owner_status_task_scheduled
    ON executions (owner, status, task_id, scheduled_for DESC, id DESC);
CREATE INDEX IF NOT EXISTS executions_status_scheduled_id
    ON executions (status, scheduled_for DESC, id DESC);
CREATE INDEX IF NOT EXISTS executions_status_task_scheduled
    ON executions (status, task_id, scheduled_for DESC, id DESC);
CREATE TABLE IF NOT EXISTS bulk_actions (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    lease_owner TEXT,
    lease_expires_at INTEGER NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS bulk_actions_claim ON bulk_actions (status, lease_expires_at);
DROP INDEX IF EXISTS executions_owner_status;
"""
"""The indexes of ``list_runs`` (one user's or every user's runs by status, optionally of one
task, newest scheduled first) and the table of bulk actions, with the index of ``claim_bulk``.

``executions_owner_status`` (owner, status, scheduled_for DESC), of earlier releases, is dropped:
``executions_owner_status_scheduled`` starts with the same columns in the same order, so it
serves every query the shorter one did, and each run's insert and status changes then update
one index fewer."""

_bulk_encoder = msgspec.json.Encoder()
_bulk_decoder = msgspec.json.Decoder(BulkAction)
_OPEN = tuple(s.value for s in OPEN_BULK_STATUSES)


def _bulk_row(action: BulkAction) -> tuple[Any, ...]:
    return (
        action.status.value,
        action.lease_owner,
        to_epoch_ms(action.lease_expires_at),
        _bulk_encoder.encode(action),
        action.id,
    )


class SqliteRuns:
    """:class:`core.ports.RunStore` for :class:`store.sqlite.store.SqliteStore`."""

    if TYPE_CHECKING:

        async def _fetch(
            self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
        ) -> list[sqlite3.Row]: ...

        async def _fetch_page(
            self, select: str, where: list[str], params: list[Any], page: Keyset, sort: str
        ) -> list[sqlite3.Row]: ...

        def _transaction(self) -> AbstractAsyncContextManager[aiosqlite.Connection]: ...

    async def list_runs(
        self, owner: str | None, query: RunQuery, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        where: list[str] = [] if owner is None else ["owner = ?"]
        params: list[Any] = [] if owner is None else [owner]
        where.append("status = ?")
        params.append(query.status.value)
        if query.task_id is not None:
            where.append("task_id = ?")
            params.append(query.task_id)
        if query.scheduled_from is not None:
            where.append("scheduled_for >= ?")
            params.append(to_epoch_ms(query.scheduled_from))
        if query.scheduled_to is not None:
            where.append("scheduled_for < ?")
            params.append(to_epoch_ms(query.scheduled_to))
        if query.error is not None:
            where.append("instr(lower(error), lower(?)) > 0")
            params.append(query.error)
        for clause in query.labels.clauses() if query.labels else []:
            # probes of job_labels' primary key (job_id, term) for each run scanned
            where.append(
                f"{'NOT ' if clause.negated else ''}EXISTS (SELECT 1 FROM job_labels AS t "
                f"WHERE t.job_id = executions.job_id "
                f"AND t.term IN ({', '.join('?' * len(clause.terms))}))"
            )
            params.extend(clause.terms)
        page = Keyset.of(limit, cursor)
        rows = await self._fetch_page(
            f"SELECT {EXECUTION_COLUMNS} FROM executions", where, params, page, "scheduled_for"
        )
        return page.page(rows, execution_from_row, lambda e: (e.scheduled_for, e.id))

    async def replays_of(self, execution_ids: Collection[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for marks, chunk in in_chunks(list(dict.fromkeys(execution_ids))):
            rows = await self._fetch(REPLAYS_OF.format(marks), chunk)
            for row in rows:
                out.setdefault(row["replay_of"], []).append(row["id"])
        return out

    async def create_bulk(self, action: BulkAction, *, audit: AuditEntry | None = None) -> None:
        async with self._transaction() as conn:
            try:
                await conn.execute(
                    "INSERT INTO bulk_actions (status, lease_owner, lease_expires_at, record, id) "
                    "VALUES (?, ?, ?, ?, ?)",
                    _bulk_row(action),
                )
            except sqlite3.IntegrityError:
                raise Conflict(f"bulk action {action.id} exists") from None
            if audit is not None:
                await conn.execute(AUDIT_INSERT, audit_row(audit_record(audit, None, None)))

    async def get_bulk(self, bulk_id: str) -> BulkAction | None:
        rows = await self._fetch("SELECT record FROM bulk_actions WHERE id = ?", (bulk_id,))
        return _bulk_decoder.decode(rows[0]["record"]) if rows else None

    async def claim_bulk(
        self, holder: str, *, now: datetime, lease_seconds: float
    ) -> BulkAction | None:
        now_ms = to_epoch_ms(now)
        async with self._transaction() as conn:
            cur = await conn.execute(
                "SELECT record FROM bulk_actions WHERE status IN (?, ?) AND lease_expires_at <= ? "
                "ORDER BY lease_expires_at LIMIT 1",
                (*_OPEN, now_ms),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            action = msgspec.structs.replace(
                _bulk_decoder.decode(row["record"]),
                status=BulkStatus.RUNNING,
                lease_owner=holder,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                updated_at=now,
            )
            await conn.execute(
                "UPDATE bulk_actions SET status = ?, lease_owner = ?, lease_expires_at = ?, "
                "record = ? WHERE id = ?",
                _bulk_row(action),
            )
            return action

    async def save_bulk(self, action: BulkAction, *, holder: str) -> bool:
        async with self._transaction() as conn:
            cur = await conn.execute(
                "UPDATE bulk_actions SET status = ?, lease_owner = ?, lease_expires_at = ?, "
                "record = ? WHERE id = ? AND lease_owner = ?",
                (*_bulk_row(action), holder),
            )
            return cur.rowcount == 1

    async def record_audit(self, entries: Sequence[AuditEntry]) -> None:
        if not entries:
            return
        async with self._transaction() as conn:
            await conn.executemany(
                AUDIT_INSERT, [audit_row(audit_record(e, None, None)) for e in entries]
            )
