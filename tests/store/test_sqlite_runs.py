"""The SQLite store's dead-letter listings and bulk claims are index searches in index order,
never table scans or sorts: the query planner's own account (``EXPLAIN QUERY PLAN``) of the
statements the store actually sent, as SQLite traced them with their values."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from core.bulk import RunQuery
from core.model import ExecutionStatus
from store.pages import encode_cursor
from store.sqlite import SqliteStore

T0 = datetime(2026, 6, 1, tzinfo=UTC)


async def test_every_dead_letter_listing_searches_an_index_in_its_order(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "plan.db")
    await store.open()
    sent: list[str] = []
    reader = store._r
    on_thread: Callable[..., Awaitable[None]] = reader._execute  # the reader's own thread
    await on_thread(reader._conn.set_trace_callback, sent.append)
    try:
        for owner in ("alice", None):
            for task_id in (None, "noop"):
                query = RunQuery(ExecutionStatus.FAILED, task_id, T0, None, "503")
                await store.list_runs(owner, query, limit=10, cursor=None)
                await store.list_runs(owner, query, limit=10, cursor=encode_cursor(1, "x"))
    finally:
        await on_thread(reader._conn.set_trace_callback, None)
        await store.close()
    selects = [s for s in sent if s.startswith("SELECT") and "FROM executions" in s]
    assert len(selects) == 8
    db = sqlite3.connect(tmp_path / "plan.db")
    for sql in selects:
        plan = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}")]
        assert plan[0].startswith("SEARCH executions USING") and "INDEX executions_" in plan[0]
        assert not any("TEMP B-TREE" in step for step in plan), (sql, plan)
    db.close()
