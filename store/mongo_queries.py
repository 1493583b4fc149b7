"""Dashboard queries: aggregation pipelines over the ``executions`` collection.

Each function returns a pipeline (a list of stages) to pass to ``db.executions.aggregate``; the
same pipelines, rendered as Extended JSON, are in ``docs/data-model.md``. Every pipeline starts
with a ``$match`` on ``status`` (and ``owner`` when given) and a ``scheduledFor`` window, so it is
served by ``executions_status_scheduled`` (all users) or ``executions_owner_status_scheduled``
(one user) rather than a collection scan.

Portability: only operators that MongoDB 4.0 and later and mongomock both implement. Hours and
days are bucketed with date arithmetic (``date - ((date - epoch) mod period)``, a BSON date)
instead of ``$dateTrunc`` (MongoDB 5.0+); percentiles use the nearest-rank method on an array
built by ``$push`` after a ``$sort`` (MongoDB guarantees that ``$push`` follows the input order)
instead of ``$percentile`` (MongoDB 7.0+). ``$push`` keeps every delay of an hour in memory
(100 MiB limit per group, about six million runs per hour). The store itself needs MongoDB 6.0+
(see ``store.mongo``), so in practice: MongoDB 6.0 or later.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bson import json_util

from core.model import ExecutionStatus

Pipeline = list[dict[str, Any]]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
ANY_STATUS = {"$type": "string"}
"""Every run: a bound on ``status`` that keeps the status-led indexes usable (a range scan over
all statuses, then the ``scheduledFor`` window) without listing the statuses."""
IN_PROGRESS_STATUSES = [ExecutionStatus.RUNNING.value, ExecutionStatus.RETRYING.value]


def truncate(field: str, period_ms: int) -> dict[str, Any]:
    """Expression: the date in ``field`` truncated to a multiple of ``period_ms`` since the epoch
    (UTC hours and days), as a BSON date."""
    return {"$subtract": [field, {"$mod": [{"$subtract": [field, EPOCH]}, period_ms]}]}


def nearest_rank(sorted_array: str, fraction: float) -> dict[str, Any]:
    """Expression: the ``fraction`` percentile (nearest rank) of an ascending array."""
    index = {"$subtract": [{"$ceil": {"$multiply": [fraction, {"$size": sorted_array}]}}, 1]}
    return {"$arrayElemAt": [sorted_array, {"$toInt": {"$max": [0, index]}}]}


def _match(
    status: Any, since: datetime | None, until: datetime | None, owner: str | None
) -> dict[str, Any]:
    match: dict[str, Any] = {} if owner is None else {"owner": owner}
    match["status"] = status
    window: dict[str, Any] = {}
    if since is not None:
        window["$gte"] = since
    if until is not None:
        window["$lt"] = until
    if window:
        match["scheduledFor"] = window
    return match


def runs_by_status_per_hour(
    since: datetime, until: datetime, *, owner: str | None = None
) -> Pipeline:
    """Runs per scheduled hour and status, in ``[since, until)``, oldest hour first.

    Rows: ``{"hour": <date>, "status": "SUCCEEDED", "runs": 12}``.
    """
    return [
        {"$match": _match(ANY_STATUS, since, until, owner)},
        {
            "$group": {
                "_id": {"hour": truncate("$scheduledFor", HOUR_MS), "status": "$status"},
                "runs": {"$sum": 1},
            }
        },
        {"$project": {"_id": 0, "hour": "$_id.hour", "status": "$_id.status", "runs": 1}},
        {"$sort": {"hour": 1, "status": 1}},
    ]


def failures_per_task_per_day(
    since: datetime, until: datetime, *, owner: str | None = None
) -> Pipeline:
    """Failed runs (after their last attempt) per task and scheduled day (UTC), most first.

    Rows: ``{"day": <date>, "taskId": "generate_report", "failures": 3}``.
    """
    return [
        {"$match": _match(ExecutionStatus.FAILED.value, since, until, owner)},
        {
            "$group": {
                "_id": {"day": truncate("$scheduledFor", DAY_MS), "taskId": "$taskId"},
                "failures": {"$sum": 1},
            }
        },
        {"$project": {"_id": 0, "day": "$_id.day", "taskId": "$_id.taskId", "failures": 1}},
        {"$sort": {"day": 1, "failures": -1, "taskId": 1}},
    ]


def scheduling_delay_per_hour(
    since: datetime, until: datetime, *, owner: str | None = None
) -> Pipeline:
    """Scheduling delay (first ``startedAt`` minus ``scheduledFor``, milliseconds) per scheduled
    hour: p50, p95 (nearest rank) and max, over the runs that started.

    Rows: ``{"hour": <date>, "runs": 40, "p50Ms": 35, "p95Ms": 410, "maxMs": 1200}``.
    """
    match = _match(ANY_STATUS, since, until, owner)
    match["startedAt"] = {"$type": "date"}
    return [
        {"$match": match},
        {
            "$project": {
                "hour": truncate("$scheduledFor", HOUR_MS),
                "delayMs": {"$subtract": ["$startedAt", "$scheduledFor"]},
            }
        },
        {"$sort": {"delayMs": 1}},
        {"$group": {"_id": "$hour", "delays": {"$push": "$delayMs"}}},
        {
            "$project": {
                "_id": 0,
                "hour": "$_id",
                "runs": {"$size": "$delays"},
                "p50Ms": nearest_rank("$delays", 0.5),
                "p95Ms": nearest_rank("$delays", 0.95),
                "maxMs": {"$arrayElemAt": ["$delays", -1]},
            }
        },
        {"$sort": {"hour": 1}},
    ]


def running_jobs(*, owner: str | None = None) -> Pipeline:
    """Jobs with a run in progress now (RUNNING, or RETRYING: waiting between attempts), the
    longest-running first.

    Rows: ``{"jobId": …, "owner": …, "taskId": …, "runs": 1, "startedAt": <date>, "attempt": 2,
    "updatedAt": <date>}`` (``runs``: how many of its runs are in progress; ``startedAt``: the
    earliest start among them; ``attempt``: the highest attempt).
    """
    return [
        {"$match": _match({"$in": IN_PROGRESS_STATUSES}, None, None, owner)},
        {
            "$group": {
                "_id": "$jobId",
                "owner": {"$first": "$owner"},
                "taskId": {"$first": "$taskId"},
                "runs": {"$sum": 1},
                "startedAt": {"$min": "$startedAt"},
                "attempt": {"$max": "$attempt"},
                "updatedAt": {"$max": "$updatedAt"},
            }
        },
        {
            "$project": {
                "_id": 0,
                "jobId": "$_id",
                "owner": 1,
                "taskId": 1,
                "runs": 1,
                "startedAt": 1,
                "attempt": 1,
                "updatedAt": 1,
            }
        },
        {"$sort": {"startedAt": 1, "jobId": 1}},
    ]


DASHBOARDS = {
    "runs_by_status_per_hour": runs_by_status_per_hour,
    "failures_per_task_per_day": failures_per_task_per_day,
    "scheduling_delay_per_hour": scheduling_delay_per_hour,
}
"""The windowed dashboards by name (``running_jobs`` takes no window)."""


def render(pipeline: Pipeline) -> str:
    """``pipeline`` as relaxed Extended JSON, one stage per line (as in ``docs/data-model.md``).

    Paste it into mongosh as ``db.executions.aggregate(EJSON.parse(`…`))``.
    """
    stages = [
        json_util.dumps(stage, json_options=json_util.RELAXED_JSON_OPTIONS) for stage in pipeline
    ]
    return "[\n  " + ",\n  ".join(stages) + "\n]"
