"""The dashboard pipelines of ``store/mongo_queries.py`` against the in-process fake.

The data is generated from a fixed seed; every expected number is computed here in plain Python
from the same runs, independently of the pipelines. mongomock evaluates the pipelines, so this
proves their logic, not that a given server version accepts them (see ``tests/store/mongo_fake.py``
for what the fake cannot prove). ``docs/data-model.md`` must show exactly these pipelines.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from bson import json_util

from core.model import Execution, ExecutionStatus
from store.mongo import EXECUTIONS, MongoStore, to_document
from store.mongo_queries import (
    failures_per_task_per_day,
    render,
    running_jobs,
    runs_by_status_per_hour,
    scheduling_delay_per_hour,
)
from tests.store.backends import fake_mongo_store

DOC = Path(__file__).resolve().parents[2] / "docs" / "data-model.md"
SINCE = datetime(2026, 6, 1, tzinfo=UTC)
UNTIL = datetime(2026, 6, 3, tzinfo=UTC)
TASKS = ("generate_report", "cleanup_export", "noop")
OWNERS = ("alice", "bob")
STATUSES = [
    ExecutionStatus.QUEUED,
    ExecutionStatus.RUNNING,
    ExecutionStatus.RETRYING,
    ExecutionStatus.SUCCEEDED,
    ExecutionStatus.FAILED,
]


def make_runs(seed: int = 7, count: int = 400) -> list[Execution]:
    """Runs spread over three days (one outside the window on each side), every status."""
    rng = random.Random(seed)
    runs = []
    for n in range(count):
        scheduled = SINCE - timedelta(hours=6) + timedelta(seconds=rng.randrange(60 * 3600))
        scheduled = scheduled.replace(microsecond=rng.randrange(1000) * 1000)
        status = rng.choice(STATUSES)
        started = None
        if status != ExecutionStatus.QUEUED and rng.random() < 0.9:
            started = scheduled + timedelta(milliseconds=rng.choice([0, 5, 40, 300, 2500, 60_000]))
        attempt = 0 if status == ExecutionStatus.QUEUED else rng.randint(1, 3)
        job = f"job{n % 37:02d}"
        runs.append(
            Execution(
                id=f"{job}:{n}",
                job_id=job,
                owner=OWNERS[n % 37 % 2],
                task_id=TASKS[n % 37 % 3],
                status=status,
                attempt=attempt,
                scheduled_for=scheduled,
                created_at=scheduled,
                updated_at=started or scheduled,
                started_at=started,
            )
        )
    return runs


RUNS = make_runs()


@pytest.fixture
async def store() -> AsyncIterator[MongoStore]:
    s = await fake_mongo_store()
    await s.database[EXECUTIONS].insert_many([to_document(r) for r in RUNS])
    yield s
    await s.close()


async def aggregate(store: MongoStore, pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cursor = await store.database[EXECUTIONS].aggregate(pipeline)
    return await cursor.to_list()


def in_window(r: Execution, owner: str | None) -> bool:
    return SINCE <= r.scheduled_for < UNTIL and (owner is None or r.owner == owner)


def hour_of(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def p(values: list[int], fraction: float) -> int:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@pytest.mark.parametrize("owner", [None, "alice"])
async def test_runs_by_status_per_hour(store: MongoStore, owner: str | None) -> None:
    expected = Counter(
        (hour_of(r.scheduled_for), r.status.value) for r in RUNS if in_window(r, owner)
    )
    rows = await aggregate(store, runs_by_status_per_hour(SINCE, UNTIL, owner=owner))
    assert [(r["hour"], r["status"], r["runs"]) for r in rows] == [
        (h, s, n) for (h, s), n in sorted(expected.items())
    ]
    assert sum(r["runs"] for r in rows) == sum(1 for r in RUNS if in_window(r, owner))
    assert {r["hour"] for r in rows} <= {SINCE + timedelta(hours=h) for h in range(48)}
    assert len({r["hour"] for r in rows}) > 40


@pytest.mark.parametrize("owner", [None, "bob"])
async def test_failures_per_task_per_day(store: MongoStore, owner: str | None) -> None:
    expected = Counter(
        (r.scheduled_for.replace(hour=0, minute=0, second=0, microsecond=0), r.task_id)
        for r in RUNS
        if in_window(r, owner) and r.status == ExecutionStatus.FAILED
    )
    rows = await aggregate(store, failures_per_task_per_day(SINCE, UNTIL, owner=owner))
    want = sorted(expected.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1]))
    assert [(r["day"], r["taskId"], r["failures"]) for r in rows] == [
        (d, t, n) for (d, t), n in want
    ]
    assert {r["day"] for r in rows} == {SINCE, SINCE + timedelta(days=1)}


@pytest.mark.parametrize("owner", [None, "alice"])
async def test_scheduling_delay_percentiles_per_hour(store: MongoStore, owner: str | None) -> None:
    delays: dict[datetime, list[int]] = defaultdict(list)
    for r in RUNS:
        if in_window(r, owner) and r.started_at is not None:
            delay = (r.started_at - r.scheduled_for) // timedelta(milliseconds=1)
            delays[hour_of(r.scheduled_for)].append(delay)
    rows = await aggregate(store, scheduling_delay_per_hour(SINCE, UNTIL, owner=owner))
    assert [r["hour"] for r in rows] == sorted(delays)
    for row in rows:
        values = delays[row["hour"]]
        assert row["runs"] == len(values)
        assert row["p50Ms"] == p(values, 0.5)
        assert row["p95Ms"] == p(values, 0.95)
        assert row["maxMs"] == max(values)


async def test_scheduling_delay_known_hour() -> None:
    """Twenty runs with delays 1..20 s in one hour: p50 = 10 s, p95 = 19 s (nearest rank)."""
    s = await fake_mongo_store()
    hour = datetime(2026, 6, 1, 10, tzinfo=UTC)
    docs = []
    for i in range(1, 21):
        sf = hour + timedelta(minutes=i)
        run = Execution(
            id=f"j:{i}",
            job_id="j",
            owner="alice",
            task_id="noop",
            status=ExecutionStatus.SUCCEEDED,
            attempt=1,
            scheduled_for=sf,
            created_at=sf,
            updated_at=sf,
            started_at=sf + timedelta(seconds=21 - i),
        )
        docs.append(to_document(run))
    await s.database[EXECUTIONS].insert_many(docs)
    rows = await aggregate(s, scheduling_delay_per_hour(hour, hour + timedelta(hours=1)))
    assert rows == [{"hour": hour, "runs": 20, "p50Ms": 10_000, "p95Ms": 19_000, "maxMs": 20_000}]
    await s.close()


@pytest.mark.parametrize("owner", [None, "bob"])
async def test_running_jobs(store: MongoStore, owner: str | None) -> None:
    running = [
        r
        for r in RUNS
        if r.status in (ExecutionStatus.RUNNING, ExecutionStatus.RETRYING)
        and (owner is None or r.owner == owner)
    ]
    by_job: dict[str, list[Execution]] = defaultdict(list)
    for r in running:
        by_job[r.job_id].append(r)

    def earliest(rs: list[Execution]) -> datetime | None:
        starts = [r.started_at for r in rs if r.started_at is not None]
        return min(starts) if starts else None

    rows = await aggregate(store, running_jobs(owner=owner))
    assert {r["jobId"] for r in rows} == set(by_job)
    for row in rows:
        rs = by_job[row["jobId"]]
        assert row["runs"] == len(rs)
        assert row["owner"] == rs[0].owner and row["taskId"] == rs[0].task_id
        assert row["startedAt"] == earliest(rs)
        assert row["attempt"] == max(r.attempt for r in rs)
    starts = [r["startedAt"] for r in rows if r["startedAt"] is not None]
    assert starts == sorted(starts)


# --- the documentation shows exactly these pipelines --------------------------------------------

DOC_EXAMPLES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "runs_by_status_per_hour": lambda: runs_by_status_per_hour(
        datetime(2026, 6, 1, tzinfo=UTC), datetime(2026, 6, 2, tzinfo=UTC)
    ),
    "failures_per_task_per_day": lambda: failures_per_task_per_day(
        datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC)
    ),
    "scheduling_delay_per_hour": lambda: scheduling_delay_per_hour(
        datetime(2026, 6, 1, tzinfo=UTC), datetime(2026, 6, 2, tzinfo=UTC)
    ),
    "running_jobs": running_jobs,
}


def doc_pipelines() -> dict[str, Any]:
    """The JSON blocks of docs/data-model.md that follow ``<!-- pipeline: NAME -->``."""
    blocks = re.findall(r"<!-- pipeline: (\w+) -->\s*```json\n(.*?)```", DOC.read_text(), re.S)
    return {name: json.loads(body) for name, body in blocks}


def test_doc_shows_the_pipelines_of_the_functions() -> None:
    documented = doc_pipelines()
    assert set(documented) == set(DOC_EXAMPLES)
    for name, example in DOC_EXAMPLES.items():
        assert documented[name] == json.loads(render(example())), name


def test_rendered_pipelines_round_trip() -> None:
    for example in DOC_EXAMPLES.values():
        pipeline = example()
        options = json_util.JSONOptions(tz_aware=True, tzinfo=UTC)
        assert json_util.loads(render(pipeline), json_options=options) == pipeline
