"""The Overview's statistics query (``run_stats``) on every store: counts per minute and final
status, schedule-to-start percentiles, unfinished runs per queue — and only the owner's."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec

from core.model import TERMINAL_RANK, CronSchedule, Execution, ExecutionStatus, state_rank
from core.ports import JobStore
from core.stats import StatsStore
from tests.store.test_contract import at, make_execution, make_job

S = ExecutionStatus


def run(
    n: int,
    status: ExecutionStatus,
    *,
    owner: str = "alice",
    queue: str = "default",
    scheduled: datetime | None = None,
    started: datetime | None = None,
    finished: datetime | None = None,
) -> Execution:
    job = make_job(f"job-{owner}-{n}", owner=owner, queue=queue)
    ex = make_execution(job, scheduled or at(n))
    fields: dict[str, Any] = {"status": status, "attempt": 1, "started_at": started}
    fields["finished_at"] = finished
    fields["state_rank"] = (
        TERMINAL_RANK if status in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.SKIPPED)
        else state_rank(status, 1)
    )  # fmt: skip
    return msgspec.structs.replace(ex, **fields)


def minute(m: float) -> int:
    return int(at(m).timestamp() * 1000)


async def insert(store: JobStore, *runs: Execution) -> None:
    for r in runs:
        assert await store.insert_execution(r)


def stats_of(store: JobStore) -> StatsStore:
    assert isinstance(store, StatsStore)
    return store


async def test_finished_runs_count_per_minute_and_status_in_the_window(store: JobStore) -> None:
    await insert(
        store,
        run(1, S.SUCCEEDED, finished=at(10, 5)),
        run(2, S.SUCCEEDED, finished=at(10, 59)),
        run(3, S.FAILED, finished=at(10, 30)),
        run(4, S.SKIPPED, finished=at(12)),
        run(5, S.CANCELLED, finished=at(59, 59)),
        run(6, S.SUCCEEDED, finished=at(60)),  # the window's end is excluded
        run(7, S.FAILED, finished=at(-1)),  # before the window
        run(8, S.SUCCEEDED, owner="bob", finished=at(10)),
        run(9, S.RUNNING, started=at(10)),
    )
    stats = await stats_of(store).run_stats("alice", at(0), at(60))
    assert sorted(stats.finished) == sorted(
        [
            (minute(10), "SUCCEEDED", 2),
            (minute(10), "FAILED", 1),
            (minute(12), "SKIPPED", 1),
            (minute(59), "CANCELLED", 1),
        ]
    )
    everyone = await stats_of(store).run_stats(None, at(0), at(60))
    assert (minute(10), "SUCCEEDED", 3) in everyone.finished


async def test_start_delay_percentiles_are_nearest_rank(store: JobStore) -> None:
    runs = [
        run(n, S.SUCCEEDED, scheduled=at(5), started=at(5) + timedelta(milliseconds=n),
            finished=at(6))
        for n in range(1, 101)
    ]  # fmt: skip
    bob = run(1, S.SUCCEEDED, owner="bob", scheduled=at(5), started=at(50), finished=at(51))
    late = run(200, S.SUCCEEDED, scheduled=at(-30), started=at(-20), finished=at(1))
    # a replay and a backfilled run start long after their scheduledFor, by design: not a delay
    replay = msgspec.structs.replace(
        run(300, S.SUCCEEDED, scheduled=at(-600), started=at(7), finished=at(8)),
        replay_of="job-alice-1:x",
    )
    backfilled = msgspec.structs.replace(
        run(301, S.SUCCEEDED, scheduled=at(-900), started=at(7), finished=at(8)), backfill=True
    )
    await insert(store, *runs, bob, late, replay, backfilled)
    delay = (await stats_of(store).run_stats("alice", at(0), at(60))).delay
    assert (delay.runs, delay.p50_ms, delay.p95_ms, delay.p99_ms, delay.max_ms) == (
        100, 50, 95, 99, 100
    )  # fmt: skip
    assert (await stats_of(store).run_stats(None, at(0), at(60))).delay.runs == 101
    finished = (await stats_of(store).run_stats("alice", at(0), at(60))).finished
    assert sum(n for _, _, n in finished) == 103  # still counted as runs
    nobody = (await stats_of(store).run_stats("carol", at(0), at(60))).delay
    assert (nobody.runs, nobody.p50_ms, nobody.max_ms) == (0, None, None)


async def test_open_runs_count_per_queue_and_status_of_the_owner(store: JobStore) -> None:
    await insert(
        store,
        run(1, S.QUEUED),
        run(2, S.QUEUED),
        run(3, S.RUNNING, started=at(3)),
        run(4, S.RETRYING, queue="reports", started=at(4)),
        run(5, S.SUCCEEDED, queue="reports", finished=at(5)),
        run(6, S.QUEUED, owner="bob", queue="bulk"),
    )
    stats = await stats_of(store).run_stats("alice", at(0), at(60))
    assert sorted(stats.open_runs) == [
        ("default", "QUEUED", 2),
        ("default", "RUNNING", 1),
        ("reports", "RETRYING", 1),
    ]
    everyone = await stats_of(store).run_stats(None, at(0), at(60))
    assert ("bulk", "QUEUED", 1) in everyone.open_runs


async def test_scheduled_groups_are_the_owners_jobs_due_by_a_time(store: JobStore) -> None:
    hourly = CronSchedule(expression="0 * * * *")
    specs = [
        ("alice", at(5), None), ("alice", at(90), None), ("alice", None, None), ("bob", at(1), None),
        ("alice", at(2), None), ("alice", at(2), hourly), ("alice", at(2), hourly),
    ]  # fmt: skip
    for n, (owner, next_run, schedule) in enumerate(specs):
        job = make_job(f"j{n}", owner=owner, next_run_at=next_run)
        await store.create_job(
            job if schedule is None else msgspec.structs.replace(job, schedule=schedule)
        )
    found = await stats_of(store).scheduled_groups("alice", at(60), limit=10)
    assert sorted((g.next_run_at, g.jobs, g.job_ids, g.schedule == hourly) for g in found) == [
        (at(2), 1, ("j4",), False),
        (at(2), 2, ("j5", "j6"), True),
        (at(5), 1, ("j0",), False),
    ]
    assert [g.schedule for g in found if g.job_ids == ("j0",)] == [make_job().schedule]
    everyone = await stats_of(store).scheduled_groups(None, at(60), limit=1)
    assert [g.job_ids for g in everyone] == [("j3",)]


async def test_running_runs_are_every_users_by_worker(store: JobStore) -> None:
    a = msgspec.structs.replace(run(1, S.RUNNING, started=at(1)), worker_id="w-2")
    b = msgspec.structs.replace(run(2, S.RUNNING, owner="bob", started=at(2)), worker_id="w-1")
    c = msgspec.structs.replace(run(3, S.RUNNING, started=at(0)), worker_id="w-2")
    await insert(store, a, b, c, run(4, S.QUEUED), run(5, S.SUCCEEDED, finished=at(5)))
    found = await stats_of(store).running_runs(limit=10)
    assert [(w, r.execution_id, r.owner) for w, r in found] == [
        ("w-1", b.id, "bob"),
        ("w-2", c.id, "alice"),
        ("w-2", a.id, "alice"),
    ]
    assert found[1][1].started_at == at(0)
    assert len(await stats_of(store).running_runs(limit=2)) == 2
