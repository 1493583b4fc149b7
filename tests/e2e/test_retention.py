"""Retention on real processes: a scheduler process (scheduler, recorder, pruner) and a worker
process on a real nats-server and SQLite file, observed through the gateway's API."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from core.model import ACTIVE_EXECUTION_STATUSES, Execution, ExecutionStatus
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.e2e.test_metrics import scrape_until, value
from tests.support import (
    Child,
    Stack,
    env_for,
    executions,
    free_port,
    start_stack,
    wait_executions,
)

pytestmark = pytest.mark.slow

KEEP = 5
RUNS = 40
PRUNE_LAG = timedelta(seconds=2)
"""A run that finished this recently may still be on its way to the pruner (notice, store)."""


def in_flight(runs: list[Execution], sampled_at: datetime) -> int:
    """Records a prune may not have removed yet: unfinished runs, and runs that finished less
    than :data:`PRUNE_LAG` before the sample was taken."""
    return sum(
        r.status in ACTIVE_EXECUTION_STATUSES
        or (r.finished_at is not None and r.finished_at > sampled_at - PRUNE_LAG)
        for r in runs
    )


async def test_a_fast_interval_job_keeps_its_limit_plus_the_runs_in_flight(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """An interval job every 0.2 s with ``historyLimit: 5`` (the deployment keeps 1,000): at
    every look its history holds at most 5 + in-flight records, and once it is paused exactly
    its 5 latest runs remain; the scheduler process counts what it pruned."""
    port = free_port()
    # 0.2 s runs are this test's load: below the default smallest interval (1 s)
    settings = make_settings(history_limit=1000, quota_min_interval_seconds=0.1)
    async with start_stack(settings, Roles(gateway=True)) as stack:
        scheduler = Child(
            ["scheduler"],
            env_for(settings, JOBSCHED_SCHEDULER_ID="s1", JOBSCHED_METRICS_PORT=str(port)),
            tmp_path / "scheduler.log",
        )
        worker = Child(["worker"], env_for(settings, JOBSCHED_WORKER_ID="w1"), tmp_path / "w.log")
        try:
            client = stack.client()
            job = await client.create_job(
                {
                    "taskId": "noop",
                    "schedule": {"type": "interval", "everySeconds": 0.2},
                    "historyLimit": KEEP,
                }
            )
            looks = 0
            async with asyncio.timeout(60):
                while (await client.get_job(job.id)).run_count < RUNS:
                    sampled_at = datetime.now(UTC)
                    runs = await executions(client, job.id)
                    bound = KEEP + in_flight(runs, sampled_at)
                    assert len(runs) <= bound, [(r.status, r.finished_at) for r in runs]
                    looks += 1
                    await asyncio.sleep(0.05)
            assert looks >= 20

            await client.pause_job(job.id)

            kept = await wait_executions(
                client,
                job.id,
                lambda rs: (
                    len(rs) == KEEP and all(r.status not in ACTIVE_EXECUTION_STATUSES for r in rs)
                ),
                timeout_seconds=20,
                what=f"{KEEP} finished runs once paused",
            )
            latest = await client.get_job(job.id)
            assert latest.last_execution_id in {r.id for r in kept}
            await scrape_until(
                f"http://127.0.0.1:{port}/metrics",
                lambda s: value(s, "jobsched_pruned_runs_total") == latest.run_count - KEEP,
                what=f"{latest.run_count - KEEP} pruned runs on the scheduler's metrics",
            )
            assert scheduler.terminate() == 0, scheduler.output()
        finally:
            worker.close()
            scheduler.close()


async def test_skipped_records_are_pruned_while_the_long_run_still_runs(
    make_settings: SettingsFactory,
) -> None:
    """``overlapPolicy: forbid``: while one run sleeps, every occurrence due meanwhile becomes a
    SKIPPED record. No run finishes, so no finish notice: the scheduler itself marks the job for
    the pruner, which keeps the 3 most recent records while the long run goes on."""
    async with start_stack(make_settings(quota_min_interval_seconds=0.1)) as stack:
        await _skipped_records_are_pruned(stack)


async def _skipped_records_are_pruned(stack: Stack) -> None:
    client = stack.client()
    job = await client.create_job(
        {
            "taskId": "sleep",
            "parameters": {"seconds": 30},
            "schedule": {"type": "interval", "everySeconds": 0.2},
            "overlapPolicy": "forbid",
            "historyLimit": 3,
        }
    )
    try:
        async with asyncio.timeout(20):
            while (await client.get_job(job.id)).run_count < 15:
                await asyncio.sleep(0.05)
        runs = await wait_executions(
            client,
            job.id,
            lambda rs: (
                sum(r.status == "SKIPPED" for r in rs) <= 3
                and any(r.status == "RUNNING" for r in rs)
            ),
            what="at most 3 SKIPPED records beside the running run",
        )
        assert [r.status for r in runs].count(ExecutionStatus.RUNNING) == 1
    finally:
        await client.cancel_job(job.id)
