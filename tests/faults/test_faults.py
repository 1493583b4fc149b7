"""Fault injection on real processes (kill -9, SIGTERM), a real nats-server (restarted, its work
stream purged or deleted) and a real SQLite store (locked). Lost runs must be 0 in every
scenario; each test prints its figures (failover time, duplicates) with ``-s``.

Settings are scaled down so the suite stays fast: lease TTL 3 s (default 10 s), ack wait 2 s,
re-dispatch timeout 4 s. bench/failover.py measures failover with the default TTL.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.js import JetStreamContext

from core.settings import Settings
from jobsched.client import ApiError
from jobsched.natsserver import NatsServer
from store.sqlite import path_from_url
from tests.conftest import SettingsFactory
from tests.faults.cluster import (
    Cluster,
    Run,
    cluster,
    failover_seconds,
    lost_and_duplicates,
    now,
)
from tests.natsauth import observer_url

pytestmark = pytest.mark.slow

FAST = {
    "lease_ttl_seconds": 3.0,
    "ack_wait_seconds": 2.0,
    "redispatch_after_seconds": 4.0,
    "scan_interval_seconds": 1.0,
    "lookahead_seconds": 5.0,
    "partitions": 16,
    "log_level": "INFO",
    "quota_creates_per_second": 0,  # one user creates a few hundred jobs at once here
    "worker_running_grace_seconds": 0.5,  # the default: short runs report their outcome alone
}


def fast(make_settings: SettingsFactory, **overrides: object) -> Settings:
    return make_settings(**{**FAST, **overrides})


async def test_1_killing_a_scheduler_fails_over_to_the_survivor(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = fast(make_settings)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("scheduler", "s2")
        c.start("worker", "w1")
        await c.wait_balanced({"s1", "s2"})
        start = now() + timedelta(seconds=3)
        jobs = await c.create_once_jobs(300, start, spread_seconds=15)
        await asyncio.sleep(max(0.0, (start + timedelta(seconds=7.5) - now()).total_seconds()))
        killed_at = c.kill("s1")
        runs = await c.wait_succeeded(jobs, timeout_seconds=60)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    failover = failover_seconds(runs, "s1", killed_at)
    print(f"\nscenario 1: lost={lost} duplicates={duplicates} failover={failover:.2f}s")
    assert lost == 0
    assert {r.dispatched_by for r in runs} == {"s1", "s2"}
    assert 0 < failover <= 2 * settings.scheduler.lease_ttl_seconds + 2


async def test_2_killing_a_worker_mid_task_redelivers_its_runs(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = fast(make_settings)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("worker", "w1")
        c.start("worker", "w2")
        await c.wait_balanced({"s1"})
        assert c.client is not None
        jobs = [
            (await c.client.create_job({"taskId": "sleep", "parameters": {"seconds": 1.5}})).id
            for _ in range(20)
        ]
        async with asyncio.timeout(20):
            while not (running := [r for r in c.runs() if r.status == "RUNNING"]):
                await asyncio.sleep(0.05)
        victim = running[0].worker_id
        survivor = "w2" if victim == "w1" else "w1"
        assert victim is not None
        c.kill(victim)
        runs = await c.wait_succeeded(jobs, timeout_seconds=60)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    redelivered = [r for r in runs if r.attempt > 1]
    print(f"\nscenario 2: lost={lost} duplicates={duplicates} redelivered={len(redelivered)}")
    assert lost == 0 and duplicates == 0
    assert redelivered and all(r.worker_id == survivor for r in redelivered)


async def test_2b_killing_a_worker_within_the_running_grace_redelivers_the_run(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """The run never reported RUNNING (its attempt is within the grace): the store holds it
    QUEUED, its message unacked; after the kill JetStream redelivers it to the survivor."""
    settings = fast(make_settings, worker_running_grace_seconds=30.0)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("worker", "w1")
        await c.wait_balanced({"s1"})
        assert c.client is not None
        job = await c.client.create_job({"taskId": "sleep", "parameters": {"seconds": 3.0}})
        prefix = settings.nats.subject_prefix
        nc = await nats.connect(observer_url(settings.nats.url).split(","))
        try:
            js = nc.jetstream()
            async with asyncio.timeout(20):
                while await delivered(js, f"{prefix.upper()}_WORK", "workers-default") != 1:
                    await asyncio.sleep(0.05)
        finally:
            await nc.close()
        [held] = [r for r in c.runs() if r.job_id == job.id]
        assert held.status == "QUEUED" and held.started_at is None  # within its grace
        c.kill("w1")
        c.start("worker", "w2")
        runs = await c.wait_succeeded([job.id], timeout_seconds=60)
    lost, duplicates = lost_and_duplicates([job.id], runs)
    assert lost == 0 and duplicates == 0
    [run] = runs
    assert (run.attempt, run.worker_id) == (2, "w2")


async def delivered(js: JetStreamContext, stream: str, consumer: str) -> int:
    """Messages the consumer delivered and nobody acked yet (0 before the consumer exists)."""
    try:
        return int((await js.consumer_info(stream, consumer)).num_ack_pending or 0)
    except nats.js.errors.NotFoundError:
        return 0


async def test_3_restarting_nats_loses_nothing(
    make_settings: SettingsFactory, own_nats: NatsServer, tmp_path: Path
) -> None:
    settings = fast(make_settings, nats_url=own_nats.url)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("worker", "w1")
        await c.wait_balanced({"s1"})
        start = now() + timedelta(seconds=2)
        jobs = await c.create_once_jobs(100, start, spread_seconds=10)
        await asyncio.sleep(max(0.0, (start + timedelta(seconds=4) - now()).total_seconds()))
        own_nats.restart()
        runs = await c.wait_succeeded(jobs, timeout_seconds=60)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    print(f"\nscenario 3: lost={lost} duplicates={duplicates}")
    assert lost == 0


async def test_4_an_unavailable_store_answers_503_and_loses_nothing(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = fast(make_settings, store_timeout_seconds=0.5)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("worker", "w1")
        await c.wait_balanced({"s1"})
        assert c.client is not None
        start = now() + timedelta(seconds=1.5)
        jobs = await c.create_once_jobs(40, start, spread_seconds=4)
        locked, release = threading.Event(), threading.Event()

        def hold_lock() -> None:
            conn = sqlite3.connect(path_from_url(settings.resolved_store_url), isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            locked.set()
            release.wait(30)
            conn.execute("COMMIT")
            conn.close()

        holder = threading.Thread(target=hold_lock)
        holder.start()
        await asyncio.to_thread(locked.wait, 10)
        refused = accepted = 0
        outage_end = now() + timedelta(seconds=4)
        try:
            while now() < outage_end:
                try:
                    job = await c.client.create_job({"taskId": "noop"})
                    jobs.append(job.id)
                    accepted += 1
                except ApiError as e:
                    assert e.status == 503, e
                    assert e.problem is not None and e.problem.code == "store_unavailable"
                    refused += 1
        finally:
            release.set()
            await asyncio.to_thread(holder.join)
        later = [(await c.client.create_job({"taskId": "noop"})).id for _ in range(10)]
        runs = await c.wait_succeeded([*jobs, *later], timeout_seconds=60)
    lost, duplicates = lost_and_duplicates([*jobs, *later], runs)
    print(
        f"\nscenario 4: refused={refused} accepted-during-outage={accepted} lost={lost} duplicates={duplicates}"
    )
    assert refused > 0
    assert lost == 0


async def test_5_a_joining_scheduler_takes_its_share(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = fast(make_settings)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("scheduler", "s2")
        c.start("worker", "w1")
        await c.wait_balanced({"s1", "s2"})
        start = now() + timedelta(seconds=2)
        jobs = await c.create_once_jobs(200, start, spread_seconds=10)
        await asyncio.sleep(max(0.0, (start + timedelta(seconds=3) - now()).total_seconds()))
        c.start("scheduler", "s3")
        shares = await c.wait_balanced({"s1", "s2", "s3"}, timeout_seconds=30)
        runs = await c.wait_succeeded(jobs, timeout_seconds=60)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    print(
        f"\nscenario 5: shares={ {k: len(v) for k, v in shares.items()} } lost={lost} duplicates={duplicates}"
    )
    assert lost == 0
    assert all(len(v) >= 5 for v in shares.values())


@pytest.mark.parametrize(
    ("drain_seconds", "handed_back"), [(10.0, False), (0.5, True)], ids=["drain", "hand-back"]
)
async def test_6_sigterm_drains_a_worker(
    make_settings: SettingsFactory, tmp_path: Path, drain_seconds: float, handed_back: bool
) -> None:
    settings = fast(make_settings, drain_timeout_seconds=drain_seconds, ack_wait_seconds=10.0)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        w1 = c.start("worker", "w1")
        await c.wait_balanced({"s1"})
        assert c.client is not None
        job = await c.client.create_job({"taskId": "sleep", "parameters": {"seconds": 2.5}})
        async with asyncio.timeout(20):
            while not any(r.job_id == job.id and r.status == "RUNNING" for r in c.runs()):
                await asyncio.sleep(0.05)
        sent = now()
        w1.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(w1.proc.wait, 30)
        stopped = now()
        c.start("worker", "w2")
        [run] = await c.wait_succeeded([job.id], timeout_seconds=30)
    print(
        f"\nscenario 6 ({'hand-back' if handed_back else 'drain'}): exit={code} stop took {(stopped - sent).total_seconds():.2f}s run={run}"
    )
    assert code == 0, w1.output()
    if handed_back:
        assert (run.attempt, run.worker_id) == (2, "w2")
        assert run.finished_at is not None
        took = (run.finished_at - sent).total_seconds()
        assert took < settings.nats.ack_wait_seconds, (
            f"handed back by a nak, not by ack-wait expiry ({took:.1f}s)"
        )
    else:
        assert (run.attempt, run.worker_id) == (1, "w1")


@pytest.mark.parametrize("how", ["purge", "delete"])
async def test_7_losing_the_work_stream_loses_no_run(
    make_settings: SettingsFactory, tmp_path: Path, prefix: str, how: str
) -> None:
    settings = fast(make_settings)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        await c.wait_balanced({"s1"})
        assert c.client is not None
        jobs = [(await c.client.create_job({"taskId": "noop"})).id for _ in range(30)]
        async with asyncio.timeout(20):
            while sum(1 for r in c.runs() if r.job_id in set(jobs)) < len(jobs):
                await asyncio.sleep(0.05)
        nc = await nats.connect(observer_url(settings.nats.url))
        try:
            js = nc.jetstream()
            stream = f"{prefix.upper()}_WORK"
            # a run is recorded before it is published: wait until the stream holds them all
            async with asyncio.timeout(10):
                while (await js.stream_info(stream)).state.messages < len(jobs):
                    await asyncio.sleep(0.05)
            assert (await js.stream_info(stream)).state.messages == len(jobs)
            if how == "purge":
                await js.purge_stream(stream)
            else:
                await js.delete_stream(stream)
        finally:
            await nc.close()
        lost_at = now()
        c.start("worker", "w1")
        runs = await c.wait_succeeded(jobs, timeout_seconds=60)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    recovered = max(r.started_at for r in runs if r.started_at) - lost_at
    print(
        f"\nscenario 7 ({how}): lost={lost} duplicates={duplicates} all re-run within {recovered.total_seconds():.1f}s"
    )
    assert lost == 0 and duplicates == 0


async def _recorded(c: Cluster, jobs: list[str], timeout_seconds: float = 20.0) -> list[Run]:
    """Wait until every job in ``jobs`` has an execution record; return them."""
    wanted = set(jobs)
    async with asyncio.timeout(timeout_seconds):
        while True:
            runs = [r for r in c.runs() if r.job_id in wanted]
            if {r.job_id for r in runs} == wanted:
                return runs
            await asyncio.sleep(0.05)


async def test_8_the_new_owner_publishes_the_runs_a_killed_scheduler_had_recorded(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    # Runs are recorded 10 s ahead of their due time, and the re-dispatch sweep waits an hour:
    # only the takeover can publish what s1 recorded and never sent.
    settings = fast(make_settings, prepare_ahead_seconds=10.0, redispatch_after_seconds=3600.0)
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("scheduler", "s2")
        c.start("worker", "w1")
        await c.wait_balanced({"s1", "s2"})
        due = now() + timedelta(seconds=8)
        jobs = await c.create_once_jobs(40, due, spread_seconds=0.5)
        recorded = await _recorded(c, jobs)
        assert now() < due - timedelta(seconds=1), "too slow to kill s1 before its runs are due"
        killed_at = c.kill("s1")
        stranded = {r.id for r in recorded if r.dispatched_by == "s1"}
        assert stranded and all(r.status == "QUEUED" for r in recorded)
        runs = await c.wait_succeeded(jobs, timeout_seconds=30)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    late = [
        (r.started_at - r.scheduled_for).total_seconds()
        for r in runs
        if r.id in stranded and r.started_at
    ]
    print(
        f"\nscenario 8: {len(stranded)} runs recorded by s1 before its kill at {killed_at:%T}: "
        f"lost={lost} duplicates={duplicates}, started at most {max(late):.2f}s after due"
    )
    assert lost == 0 and duplicates == 0
    assert {r.id for r in runs if r.id in stranded and r.status == "SUCCEEDED"} == stranded


async def test_9_sigterm_publishes_the_prepared_runs_before_handing_the_partitions_back(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    # Runs are recorded 3 s ahead and the re-dispatch sweep waits an hour; s2 (whose takeover
    # would publish what s1 left behind, and whose recorder records the outcomes) starts only
    # once s1 has exited: every run must have been published by s1 itself, at its due time.
    settings = fast(make_settings, prepare_ahead_seconds=3.0, redispatch_after_seconds=3600.0)
    async with cluster(settings, tmp_path) as c:
        s1 = c.start("scheduler", "s1")
        c.start("worker", "w1")
        await c.wait_balanced({"s1"})
        due = now() + timedelta(seconds=2)
        jobs = await c.create_once_jobs(20, due, spread_seconds=0.5)
        recorded = await _recorded(c, jobs)
        assert now() < due, "too slow to stop s1 before its runs are due"
        s1.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(s1.proc.wait, 30)
        exited_at = now()
        c.start("scheduler", "s2")
        runs = await c.wait_succeeded(jobs, timeout_seconds=20)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    print(f"\nscenario 9: exit={code} lost={lost} duplicates={duplicates}")
    assert code == 0, s1.output()
    assert all(r.status == "QUEUED" for r in recorded)
    assert lost == 0 and duplicates == 0
    assert all(r.published_at and r.scheduled_for <= r.published_at < exited_at for r in runs)
    assert "released 16 lease(s)" in s1.output()
