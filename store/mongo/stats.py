"""The MongoDB store's statistics query (:class:`core.stats.StatsStore`): three aggregation
pipelines over ``executions``, each served by an index of
:data:`store.mongo.schema.STATS_INDEXES`.

Only operators MongoDB 4.0+ and mongomock both implement (as in ``store/mongo_queries.py``):
minutes are truncated by date arithmetic, percentiles are nearest rank over an array built by
``$push`` after a ``$sort``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from pymongo.asynchronous.collection import AsyncCollection

from core.cluster import InFlightRun
from core.heatmap import SAMPLE_IDS, ScheduledGroup
from core.model import Schedule
from core.stats import BUCKET_SECONDS, DelaySummary, RunStats
from core.timeutil import to_epoch_ms
from store.mongo.schema import DUE, FINISHED, ID, UNFINISHED, Document
from store.mongo_errors import translated
from store.mongo_queries import Pipeline, nearest_rank, truncate


def _who(owner: str | None) -> dict[str, Any]:
    return {} if owner is None else {"owner": owner}


def finished_per_minute(owner: str | None, since: datetime, until: datetime) -> Pipeline:
    """Rows ``{"_id": {"minute": <date>, "status": "FAILED"}, "runs": 3}``."""
    match = {
        **_who(owner),
        "stateRank": dict(FINISHED["stateRank"]),
        "finishedAt": {"$gte": since, "$lt": until},
    }
    minute = truncate("$finishedAt", BUCKET_SECONDS * 1000)
    return [
        {"$match": match},
        {"$group": {"_id": {"minute": minute, "status": "$status"}, "runs": {"$sum": 1}}},
    ]


def start_delay(owner: str | None, since: datetime, until: datetime) -> Pipeline:
    """One row ``{"runs": n, "p50": ms, "p95": ms, "p99": ms, "max": ms}`` (none: no runs).
    Replays and backfilled runs are left out (their ``scheduledFor`` lies in the past by
    design); they are filtered on the fetched documents of the window's started runs."""
    match = {
        **_who(owner),
        "startedAt": {"$type": "date", "$gte": since, "$lt": until},
        "replayOf": None,
        "backfill": {"$ne": True},
    }
    return [
        {"$match": match},
        {"$project": {"d": {"$subtract": ["$startedAt", "$scheduledFor"]}}},
        {"$sort": {"d": 1}},
        {"$group": {"_id": None, "delays": {"$push": "$d"}}},
        {
            "$project": {
                "_id": 0,
                "runs": {"$size": "$delays"},
                "p50": nearest_rank("$delays", 0.50),
                "p95": nearest_rank("$delays", 0.95),
                "p99": nearest_rank("$delays", 0.99),
                "max": {"$arrayElemAt": ["$delays", -1]},
            }
        },
    ]


def open_per_queue(owner: str | None) -> Pipeline:
    """Rows ``{"_id": {"queue": "default", "status": "QUEUED"}, "runs": 2}``."""
    match = {**_who(owner), "stateRank": dict(UNFINISHED["stateRank"])}
    return [
        {"$match": match},
        {"$group": {"_id": {"queue": "$queue", "status": "$status"}, "runs": {"$sum": 1}}},
    ]


async def _rows(executions: AsyncCollection[Document], pipeline: Pipeline) -> list[Document]:
    cursor = await executions.aggregate(pipeline)
    return list(await cursor.to_list(None))


async def run_stats(
    executions: AsyncCollection[Document], owner: str | None, since: datetime, until: datetime
) -> RunStats:
    """See :meth:`core.stats.StatsStore.run_stats`."""
    with translated("run stats"):
        finished = await _rows(executions, finished_per_minute(owner, since, until))
        delays = await _rows(executions, start_delay(owner, since, until))
        open_runs = await _rows(executions, open_per_queue(owner))
    d = delays[0] if delays else None
    delay = (
        DelaySummary(
            runs=int(d["runs"]),
            p50_ms=int(d["p50"]),
            p95_ms=int(d["p95"]),
            p99_ms=int(d["p99"]),
            max_ms=int(d["max"]),
        )
        if d and d["runs"]
        else DelaySummary()
    )
    return RunStats(
        finished=[
            (to_epoch_ms(r["_id"]["minute"]), str(r["_id"]["status"]), int(r["runs"]))
            for r in finished
        ],
        delay=delay,
        open_runs=[
            (str(r["_id"]["queue"]), str(r["_id"]["status"]), int(r["runs"])) for r in open_runs
        ],
    )


async def scheduled_groups(
    jobs: AsyncCollection[Document], owner: str | None, until: datetime, *, limit: int
) -> list[ScheduledGroup]:
    """See :meth:`core.stats.StatsStore.scheduled_groups` (``jobs_stats_owner_next``,
    ``jobs_stats_next``): grouped by the stored ``schedule`` and ``nextRunAt``."""
    query = {**_who(owner), "nextRunAt": {**DUE["nextRunAt"], "$lte": until}}
    pipeline: Pipeline = [
        {"$match": query},
        {
            "$group": {
                "_id": {"schedule": "$schedule", "next": "$nextRunAt"},
                "jobs": {"$sum": 1},
                "ids": {"$push": f"${ID}"},
            }
        },
        {"$sort": {"_id.next": 1}},
        {"$limit": limit},
    ]
    with translated("scheduled jobs"):
        docs = await _rows(jobs, pipeline)
    return [
        ScheduledGroup(
            msgspec.convert(d["_id"]["schedule"], Schedule),
            d["_id"]["next"],
            int(d["jobs"]),
            tuple(sorted(str(i) for i in d["ids"])[:SAMPLE_IDS]),
        )
        for d in docs
    ]


async def running_runs(
    executions: AsyncCollection[Document], *, limit: int
) -> list[tuple[str, InFlightRun]]:
    """See :meth:`core.stats.StatsStore.running_runs` (``executions_status_scheduled``)."""
    projection = {ID: 1, "jobId": 1, "owner": 1, "taskId": 1, "queue": 1, "attempt": 1,
                  "startedAt": 1, "workerId": 1}  # fmt: skip
    with translated("running runs"):
        docs = await executions.find({"status": "RUNNING"}, projection).limit(limit).to_list()
    runs = [
        (
            str(d.get("workerId") or "?"),
            InFlightRun(
                execution_id=str(d[ID]),
                job_id=d["jobId"],
                owner=d["owner"],
                task_id=d["taskId"],
                queue=d.get("queue", "default"),
                attempt=int(d.get("attempt", 0)),
                started_at=d.get("startedAt"),
            ),
        )
        for d in docs
    ]
    return sorted(runs, key=lambda r: (r[0], r[1].started_at or datetime.min.replace(tzinfo=UTC)))
