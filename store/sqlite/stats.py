"""The SQLite store's statistics query (:class:`core.stats.StatsStore`) and its indexes.

Each part of :class:`core.stats.RunStats` is one statement served by a covering index of its
own (``executions_stats_*``, created by :data:`STATS_SCHEMA` on open): the finished runs of a
window by ``finished_at``, the started ones by ``started_at``, the open ones by the partial index
of unfinished runs. Instants are epoch milliseconds, as everywhere in this store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from core.cluster import InFlightRun
from core.heatmap import SAMPLE_IDS, ScheduledGroup
from core.model import Schedule
from core.stats import BUCKET_SECONDS, OPEN_STATUSES, RunStats, delay_summary
from core.timeutil import from_epoch_ms, to_epoch_ms

_schedule = msgspec.json.Decoder(Schedule)

STATS_SCHEMA = """
CREATE INDEX IF NOT EXISTS executions_stats_owner_finished
    ON executions (owner, finished_at, status, state_rank) WHERE state_rank = 1000000;
CREATE INDEX IF NOT EXISTS executions_stats_finished
    ON executions (finished_at, status, state_rank) WHERE state_rank = 1000000;
DROP INDEX IF EXISTS executions_stats_owner_started;
DROP INDEX IF EXISTS executions_stats_started;
CREATE INDEX IF NOT EXISTS executions_stats_owner_started_on_time
    ON executions (owner, started_at, scheduled_for, catch_up)
    WHERE started_at IS NOT NULL AND catch_up = 0;
CREATE INDEX IF NOT EXISTS executions_stats_started_on_time
    ON executions (started_at, scheduled_for, catch_up)
    WHERE started_at IS NOT NULL AND catch_up = 0;
CREATE INDEX IF NOT EXISTS jobs_stats_owner_next
    ON jobs (owner, next_run_at, json_extract(CAST(spec AS TEXT), '$.schedule'), id)
    WHERE next_run_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_stats_next
    ON jobs (next_run_at, json_extract(CAST(spec AS TEXT), '$.schedule'), id)
    WHERE next_run_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS executions_stats_open
    ON executions (owner, queue, status) WHERE state_rank < 1000000;
"""
"""Indexes of :func:`run_stats` (new names only: no existing index is changed; the started-run
indexes of before replays and backfills were left out of the delay are dropped). The literal
terminal rank and ``catch_up = 0`` let SQLite match the partial indexes (``catch_up`` is a key
too, or SQLite would read the row to check it: the index would not cover the query)."""

_OPEN = ", ".join(f"'{s.value}'" for s in OPEN_STATUSES)

Fetch = Callable[[str, Sequence[Any]], Awaitable[Sequence[Sequence[Any]]]]


def _owned(owner: str | None) -> tuple[str, list[Any]]:
    return ("owner = ? AND ", [owner]) if owner is not None else ("", [])


async def run_stats(fetch: Fetch, owner: str | None, since: datetime, until: datetime) -> RunStats:
    """See :meth:`core.stats.StatsStore.run_stats`; ``fetch(sql, params)`` reads rows."""
    who, params = _owned(owner)
    window = [to_epoch_ms(since), to_epoch_ms(until)]
    step = BUCKET_SECONDS * 1000
    finished = await fetch(
        f"SELECT finished_at - finished_at % {step} AS minute, status, COUNT(*) FROM executions "
        f"WHERE {who}state_rank = 1000000 AND finished_at >= ? AND finished_at < ? "
        "GROUP BY minute, status",
        [*params, *window],
    )
    delays = await fetch(
        "SELECT started_at - scheduled_for AS d FROM executions "
        f"WHERE {who}started_at IS NOT NULL AND catch_up = 0 AND started_at >= ? "
        "AND started_at < ? ORDER BY d",
        [*params, *window],
    )
    open_runs = await fetch(
        f"SELECT queue, status, COUNT(*) FROM executions WHERE {who}state_rank < 1000000 "
        f"AND status IN ({_OPEN}) GROUP BY queue, status",
        params,
    )
    return RunStats(
        finished=[(int(m), str(s), int(n)) for m, s, n in finished],
        delay=delay_summary([int(d) for (d,) in delays]),
        open_runs=[(str(q), str(s), int(n)) for q, s, n in open_runs],
    )


async def scheduled_groups(
    fetch: Fetch, owner: str | None, until: datetime, *, limit: int
) -> list[ScheduledGroup]:
    """See :meth:`core.stats.StatsStore.scheduled_groups` (``jobs_stats_owner_next``,
    ``jobs_stats_next``): grouped in SQL by the spec's ``schedule`` (as stored: one encoder, so
    equal schedules are equal text) and the next run, so a template's thousand jobs are one row;
    the indexes hold that schedule (an expression index), so the groups come in index order."""
    who, params = _owned(owner)
    rows = await fetch(
        "SELECT json_extract(CAST(spec AS TEXT), '$.schedule') AS schedule, next_run_at, "
        f"COUNT(*), group_concat(id, ' ') FROM jobs WHERE {who}next_run_at IS NOT NULL "
        "AND next_run_at <= ? GROUP BY next_run_at, schedule ORDER BY next_run_at LIMIT ?",
        [*params, to_epoch_ms(until), limit],
    )
    decoded: dict[str, Schedule] = {}
    out = []
    for text, next_run_at, n, ids in rows:
        schedule = decoded.get(text)
        if schedule is None:
            schedule = decoded[text] = _schedule.decode(text)
        sample = tuple(sorted(ids.split(" "))[:SAMPLE_IDS])
        out.append(ScheduledGroup(schedule, from_epoch_ms(next_run_at), int(n), sample))
    return out


async def running_runs(fetch: Fetch, *, limit: int) -> list[tuple[str, InFlightRun]]:
    """See :meth:`core.stats.StatsStore.running_runs` (partial index ``executions_open``: its
    condition is repeated so that SQLite can use it)."""
    rows = await fetch(
        "SELECT worker_id, id, job_id, owner, task_id, queue, attempt, started_at FROM executions "
        f"WHERE status IN ({_OPEN}) AND status = 'RUNNING' ORDER BY worker_id, started_at LIMIT ?",
        [limit],
    )
    return [
        (
            str(worker or "?"),
            InFlightRun(
                execution_id=run_id,
                job_id=job_id,
                owner=owner,
                task_id=task_id,
                queue=queue,
                attempt=int(attempt),
                started_at=from_epoch_ms(started) if started else None,
            ),
        )
        for worker, run_id, job_id, owner, task_id, queue, attempt, started in rows
    ]
