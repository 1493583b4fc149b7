"""The scheduler's decisions on fakes: a fake clock, the in-memory bus, a real SQLite store.

Each test drives the clock and asserts on what the scheduler published to the work queue,
when, and what the store holds: due-time dispatch, prepare-ahead, misfire and overlap
policies, the re-dispatch sweep's strikes, retries, fencing and the drain on stop. No NATS and
no real waiting; the wiring to NATS is proven by the e2e and fault tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from core.dispatch import plan_job
from core.errors import StoreUnavailable
from core.ids import execution_id
from core.model import (
    ExecutionStatus,
    Job,
    JobNotice,
    JobStatus,
    MisfirePolicy,
    OnceSchedule,
    OverlapPolicy,
    RunTrigger,
)
from core.ports import DueJob, JobChange
from core.runs import run_event
from store.sqlite import SqliteStore
from tests.actors.harness import T0, SchedulerRig, at, job, scheduler_rig
from tests.fakes import until


def published_ids(rig: SchedulerRig) -> list[str]:
    return [r.execution_id for r in rig.bus.stored_runs]


async def finish(rig: SchedulerRig, run_id: str, status: ExecutionStatus, when: datetime) -> None:
    """The recorder recorded ``status`` for the run (and, if final, a worker settled it)."""
    run = await rig.execution(run_id)
    done = status not in (ExecutionStatus.RUNNING, ExecutionStatus.RETRYING)
    event = run_event(
        run, status, attempt=1, at=when, finished_at=when if done else None, error=None
    )
    await rig.store.apply_events([event])
    if done:
        rig.bus.settle_run(run_id)


# --- due-time dispatch -------------------------------------------------------------------------


async def test_a_run_is_published_at_its_due_time_and_not_before(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [job(next_run_at=at(10))]) as rig:
        await rig.to(9.999)
        assert rig.bus.published == []

        await rig.to(10)

        [run] = rig.bus.stored_runs
        assert (run.execution_id, run.scheduled_for, run.published_at) == (
            execution_id("j1", at(10)),
            at(10),
            at(10),
        )
        assert run.trigger == RunTrigger.SCHEDULE
        assert (await rig.execution(run.execution_id)).status == ExecutionStatus.QUEUED
        assert (await rig.job()).next_run_at == at(70)


async def test_the_next_occurrence_follows_the_scheduled_time_not_the_late_wake_up(
    tmp_path: Path,
) -> None:
    async with scheduler_rig(tmp_path, [job(next_run_at=at(10))]) as rig:
        await rig.to(12.5)  # woken 2.5 s late, within the misfire grace

        first = execution_id("j1", at(10))
        assert published_ids(rig) == [first]
        assert (await rig.job()).next_run_at == at(70)

        await finish(rig, first, ExecutionStatus.SUCCEEDED, at(13))
        await rig.to(70)
        assert published_ids(rig) == [first, execution_id("j1", at(70))]


async def test_the_main_loop_sleeps_until_the_earliest_due_job(tmp_path: Path) -> None:
    jobs = [job("a", next_run_at=at(20)), job("b", next_run_at=at(3))]
    async with scheduler_rig(tmp_path, jobs, scan_interval_seconds=5.0) as rig:
        assert min(rig.clock.deadlines()) == at(3)

        await rig.to(3)
        assert published_ids(rig) == [execution_id("b", at(3))]
        assert min(rig.clock.deadlines()) == at(5)  # the safety scan comes next


async def test_a_job_beyond_the_lookahead_is_loaded_by_a_later_scan(tmp_path: Path) -> None:
    async with scheduler_rig(
        tmp_path, [job(next_run_at=at(40))], lookahead_seconds=30.0, scan_interval_seconds=5.0
    ) as rig:
        assert len(rig.scheduler.state.heap) == 0

        await rig.to(10)  # the scan at 10 s looks up to 40 s ahead
        assert len(rig.scheduler.state.heap) == 1
        await rig.to(40)
        assert published_ids(rig) == [execution_id("j1", at(40))]


async def test_a_notice_brings_a_new_job_in_before_the_next_scan(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, scan_interval_seconds=60.0) as rig:
        new = job(next_run_at=at(2))
        await rig.store.create_job(new)
        await rig.bus.notify(JobNotice(job_id="j1", partition=new.partition, next_run_at=at(2)))
        await rig.idle()

        await rig.to(2)
        assert published_ids(rig) == [execution_id("j1", at(2))]


async def test_a_notice_for_a_partition_it_does_not_own_is_ignored(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, scan_interval_seconds=60.0) as rig:
        new = job(next_run_at=at(2))
        rig.ownership.lose({new.partition})
        await rig.store.create_job(new)
        await rig.bus.notify(JobNotice(job_id="j1", partition=new.partition, next_run_at=at(2)))

        await rig.to(2)
        assert rig.bus.published == []


async def test_a_one_off_job_runs_once_and_is_done(tmp_path: Path) -> None:
    once = job(schedule=OnceSchedule(execute_at=at(5)), next_run_at=at(5))
    async with scheduler_rig(tmp_path, [once]) as rig:
        await rig.to(5)
        await rig.to(300)

        assert published_ids(rig) == [execution_id("j1", at(5))]
        assert (await rig.job()).next_run_at is None


# --- prepare-ahead -----------------------------------------------------------------------------


async def test_runs_are_recorded_ahead_and_published_at_their_due_time(tmp_path: Path) -> None:
    async with scheduler_rig(
        tmp_path, [job(next_run_at=at(10))], prepare_ahead_seconds=2.0, scan_interval_seconds=60.0
    ) as rig:
        assert min(rig.clock.deadlines()) == at(9)  # half the lead before the job

        await rig.to(9)
        run_id = execution_id("j1", at(10))
        assert (await rig.execution(run_id)).status == ExecutionStatus.QUEUED
        assert rig.bus.published == []
        assert at(10) in rig.clock.deadlines()  # the publisher waits for the due time

        await rig.to(10)
        assert published_ids(rig) == [run_id]
        assert rig.bus.stored_runs[0].published_at == at(10)


async def test_its_queued_event_goes_out_when_recorded_before_the_run(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [job(next_run_at=at(10))], prepare_ahead_seconds=2.0) as rig:
        await rig.to(9)
        [event] = rig.bus.events
        assert (event.execution_id, event.status) == (  # type: ignore[union-attr]
            execution_id("j1", at(10)),
            ExecutionStatus.QUEUED,
        )
        assert rig.bus.published == []
        await rig.to(10)
        assert len(rig.bus.published) == 1


# --- misfires ----------------------------------------------------------------------------------


LATE = T0 - timedelta(minutes=10, seconds=30)


def late_job(policy: MisfirePolicy, **fields: object) -> Job:
    """Due every 60 s since 10.5 minutes ago, grace 10 s: 11 occurrences are past their grace
    (the latest by 30 s), the next one is due in 30 s."""
    return job(
        next_run_at=LATE,
        misfire_policy=policy,
        misfire_grace_seconds=10.0,
        **fields,  # type: ignore[arg-type]
    )


async def test_run_once_runs_the_latest_missed_occurrence_and_records_the_rest(
    tmp_path: Path,
) -> None:
    async with scheduler_rig(tmp_path, [late_job(MisfirePolicy.RUN_ONCE)]) as rig:
        [run] = rig.bus.stored_runs
        record = await rig.execution(execution_id("j1", LATE))

        assert (run.scheduled_for, run.trigger) == (at(-30), RunTrigger.CATCH_UP)
        assert record.status == ExecutionStatus.SKIPPED
        assert record.missed is not None and record.missed.count == 10
        assert record.skip_reason is not None and "misfire" in record.skip_reason
        assert (await rig.job()).next_run_at == at(30)


async def test_skip_runs_nothing_and_resumes_at_the_next_occurrence(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [late_job(MisfirePolicy.SKIP)]) as rig:
        assert rig.bus.published == []
        record = await rig.execution(execution_id("j1", LATE))
        assert record.status == ExecutionStatus.SKIPPED
        assert record.missed is not None and record.missed.count == 11
        assert (await rig.job()).next_run_at == at(30)

        await rig.to(30)
        assert published_ids(rig) == [execution_id("j1", at(30))]


async def test_run_all_catches_up_to_max_catch_up_runs(tmp_path: Path) -> None:
    late = late_job(MisfirePolicy.RUN_ALL, max_catch_up=3, overlap_policy=OverlapPolicy.ALLOW)
    async with scheduler_rig(tmp_path, [late]) as rig:
        runs = rig.bus.stored_runs
        assert [r.scheduled_for for r in runs] == [at(-150), at(-90), at(-30)]
        assert all(r.trigger == RunTrigger.CATCH_UP for r in runs)


async def test_a_run_within_the_grace_is_on_time(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [job(next_run_at=T0 - timedelta(seconds=30))]) as rig:
        [run] = rig.bus.stored_runs
        assert run.scheduled_for == T0 - timedelta(seconds=30)
        assert run.trigger == RunTrigger.SCHEDULE


# --- overlap -----------------------------------------------------------------------------------


async def running_previous(rig: SchedulerRig) -> str:
    """Let the run due at 10 s go out and start: it is RUNNING and its message is held."""
    await rig.to(10)
    first = execution_id("j1", at(10))
    await finish(rig, first, ExecutionStatus.RUNNING, at(11))
    return first


async def test_forbid_skips_an_occurrence_while_the_previous_run_is_active(
    tmp_path: Path,
) -> None:
    async with scheduler_rig(tmp_path, [job(overlap_policy=OverlapPolicy.FORBID)]) as rig:
        first = await running_previous(rig)

        await rig.to(70)

        assert published_ids(rig) == [first]
        skipped = await rig.execution(execution_id("j1", at(70)))
        assert skipped.status == ExecutionStatus.SKIPPED
        assert skipped.skip_reason is not None and first in skipped.skip_reason
        assert (await rig.job()).next_run_at == at(130)


async def test_forbid_runs_when_the_previous_runs_message_is_gone(tmp_path: Path) -> None:
    """The store still says RUNNING, but the work stream no longer holds the message: the run
    ended and the recorder has not written it yet, so it does not overlap."""
    async with scheduler_rig(tmp_path, [job(overlap_policy=OverlapPolicy.FORBID)]) as rig:
        first = await running_previous(rig)
        rig.bus.settle_run(first)

        await rig.to(70)

        assert published_ids(rig) == [first, execution_id("j1", at(70))]


async def test_allow_runs_alongside_the_previous_run(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [job(overlap_policy=OverlapPolicy.ALLOW)]) as rig:
        first = await running_previous(rig)

        await rig.to(70)

        assert published_ids(rig) == [first, execution_id("j1", at(70))]


async def test_replace_cancels_the_previous_run_and_starts_the_new_one(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [job(overlap_policy=OverlapPolicy.REPLACE)]) as rig:
        first = await running_previous(rig)

        await rig.to(70)

        assert rig.markers.cancelled_runs == [first]
        assert published_ids(rig) == [first, execution_id("j1", at(70))]


async def test_buffer_one_waits_for_the_previous_run_and_starts_when_it_ends(
    tmp_path: Path,
) -> None:
    async with scheduler_rig(tmp_path, [job(overlap_policy=OverlapPolicy.BUFFER_ONE)]) as rig:
        first = await running_previous(rig)
        await rig.to(70)
        assert published_ids(rig) == [first]  # waiting, not skipped
        assert await rig.store.get_execution(execution_id("j1", at(70))) is None

        await rig.clock.set(at(75))
        await finish(rig, first, ExecutionStatus.SUCCEEDED, at(75))
        await rig.bus.publish_finished(["j1"])  # the recorder's notice
        await rig.idle()

        assert published_ids(rig) == [first, execution_id("j1", at(70))]
        assert rig.bus.stored_runs[-1].published_at == at(75)


async def test_buffer_one_is_rechecked_by_the_scan_when_the_notice_is_lost(
    tmp_path: Path,
) -> None:
    async with scheduler_rig(
        tmp_path, [job(overlap_policy=OverlapPolicy.BUFFER_ONE)], scan_interval_seconds=5.0
    ) as rig:
        first = await running_previous(rig)
        await rig.to(70)
        await finish(rig, first, ExecutionStatus.SUCCEEDED, at(71))

        await rig.to(75)  # the next scan, no notice

        assert published_ids(rig) == [first, execution_id("j1", at(70))]


async def test_a_job_due_later_is_decided_at_its_due_time_not_when_recorded_ahead(
    tmp_path: Path,
) -> None:
    """With prepare-ahead, a job whose previous run is active is decided at its due time, so a
    previous run that ends in between does not make it skip."""
    jobs = [job(overlap_policy=OverlapPolicy.FORBID)]
    async with scheduler_rig(tmp_path, jobs, prepare_ahead_seconds=2.0) as rig:
        await rig.to(10)
        first = execution_id("j1", at(10))
        await finish(rig, first, ExecutionStatus.RUNNING, at(11))
        await rig.to(69)  # recording time for the 70 s run: the previous one is still active
        assert await rig.store.get_execution(execution_id("j1", at(70))) is None

        await finish(rig, first, ExecutionStatus.SUCCEEDED, at(69.5))
        await rig.to(70)

        assert published_ids(rig) == [first, execution_id("j1", at(70))]


# --- re-dispatch of lost runs ------------------------------------------------------------------


async def lost_run(rig: SchedulerRig) -> str:
    """A one-off run published at 5 s whose message then vanished from the work stream."""
    await rig.to(5)
    [run_id] = published_ids(rig)
    rig.bus.held.clear()
    return run_id


ONCE = [job(schedule=OnceSchedule(execute_at=at(5)), next_run_at=at(5))]
SWEEP: dict[str, Any] = {"redispatch_after_seconds": 60.0, "scan_interval_seconds": 5.0}


async def test_a_lost_run_is_re_published_at_its_second_sighting(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, ONCE, **SWEEP) as rig:
        run_id = await lost_run(rig)
        rig.bus.ack_floor = await rig.bus.status_last_seq()  # the recorders are caught up

        await rig.to(66)  # untouched for over 60 s: first sighting, a strike only
        assert len(rig.bus.published) == 1
        assert run_id in rig.scheduler.state.strikes

        await rig.to(71)  # second sighting, every event up to the first one recorded

        again = rig.bus.published[-1].run
        assert (again.execution_id, again.redispatched_at_ms != 0) == (run_id, True)
        assert len(rig.bus.published) == 2


async def test_a_lost_run_waits_for_the_recorder_to_catch_up(tmp_path: Path) -> None:
    """Events written before the first sighting may still be on their way to the store: the
    run is re-published only once the recorders' ack floor has passed them."""
    async with scheduler_rig(tmp_path, ONCE, **SWEEP) as rig:
        run_id = await lost_run(rig)
        await rig.bus.publish_status(
            run_event(
                await rig.execution(run_id),
                ExecutionStatus.RUNNING,
                attempt=1,
                at=at(6),
                finished_at=None,
                error=None,
            )
        )
        rig.bus.ack_floor = 1  # the QUEUED event is recorded, the RUNNING one not yet

        await rig.to(66)
        await rig.to(71)
        await rig.to(76)
        assert len(rig.bus.published) == 1

        rig.bus.ack_floor = await rig.bus.status_last_seq()
        await rig.to(81)
        assert [p.run.execution_id for p in rig.bus.published] == [run_id, run_id]


async def test_a_run_whose_message_is_held_is_never_re_published(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, ONCE, **SWEEP) as rig:
        await rig.to(5)

        for t in (66, 71, 76, 81):
            await rig.to(t)

        assert len(rig.bus.published) == 1
        assert rig.scheduler.state.strikes == {}


async def test_a_lost_run_of_a_cancelled_job_is_closed_not_re_published(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, ONCE, **SWEEP) as rig:
        run_id = await lost_run(rig)
        rig.bus.ack_floor = await rig.bus.status_last_seq()
        await rig.store.update_job(
            "alice", "j1", JobChange(action="cancelled", status=JobStatus.CANCELLED), now=at(6)
        )

        await rig.to(66)
        await rig.to(71)

        assert len(rig.bus.published) == 1
        assert (await rig.execution(run_id)).status == ExecutionStatus.CANCELLED


# --- retries -----------------------------------------------------------------------------------


class FlakyStore(SqliteStore):
    """SQLite whose next ``outages`` reads of due jobs fail as if the store were down."""

    outages = 0
    calls: list[datetime]

    async def due_jobs(
        self, partitions: Collection[int], until: datetime, *, limit: int
    ) -> list[DueJob]:
        self.calls.append(until)
        if self.outages > 0:
            self.outages -= 1
            raise StoreUnavailable("store down (test)")
        return await super().due_jobs(partitions, until, limit=limit)


async def test_a_store_outage_is_retried_every_second(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "jobs.db")
    store.calls = []
    store.outages = 2
    async with scheduler_rig(tmp_path, [job(next_run_at=at(3))], store=store) as rig:
        assert rig.bus.published == []
        assert min(rig.clock.deadlines()) == at(1)  # the retry, 1 s after the failed scan

        await rig.to(1)
        assert min(rig.clock.deadlines()) == at(2)
        await rig.to(2)  # the store is back: the scan loads the job
        await rig.to(3)

        assert published_ids(rig) == [execution_id("j1", at(3))]
        assert len(store.calls) == 3


async def test_a_failed_publish_is_retried_a_second_later(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [job(next_run_at=at(10))]) as rig:
        rig.bus.fail("publish_runs")

        await rig.to(10)
        assert rig.scheduler.state.unpublished
        assert rig.bus.published == []
        assert rig.bus.streams_ensured == 1  # a deleted stream is re-created
        assert at(11) in rig.clock.deadlines()

        await rig.to(11)
        [run] = rig.bus.stored_runs
        assert (run.execution_id, run.published_at) == (execution_id("j1", at(10)), at(11))


async def test_a_publish_outage_does_not_hold_up_the_store_work(tmp_path: Path) -> None:
    jobs = [job("a", next_run_at=at(10)), job("b", next_run_at=at(20))]
    async with scheduler_rig(tmp_path, jobs) as rig:
        rig.bus.fail("publish_runs", 100)
        await rig.to(10)
        await rig.to(20)

        assert (await rig.execution(execution_id("b", at(20)))).status == ExecutionStatus.QUEUED
        assert rig.bus.published == []

        assert rig.bus.failed_calls("publish_runs") <= 25  # about one try a second, no spin
        rig.bus.recover()
        await rig.to(21)
        assert sorted(published_ids(rig)) == [execution_id("a", at(10)), execution_id("b", at(20))]


# --- ownership: fencing ------------------------------------------------------------------------


async def test_a_partition_lost_before_the_due_time_is_not_dispatched(tmp_path: Path) -> None:
    j = job(next_run_at=at(10))
    async with scheduler_rig(tmp_path, [j]) as rig:
        await rig.to(5)
        rig.ownership.lose({j.partition})
        await rig.idle()

        await rig.to(10)

        assert rig.bus.published == []
        assert await rig.store.get_execution(execution_id("j1", at(10))) is None
        assert (await rig.job()).next_run_at == at(10)  # left for the new owner


async def test_a_fenced_partition_is_dispatched_again_once_regained(tmp_path: Path) -> None:
    j = job(next_run_at=at(10))
    async with scheduler_rig(tmp_path, [j]) as rig:
        rig.ownership.lose({j.partition})
        await rig.to(10)
        assert rig.bus.published == []

        rig.ownership.gain({j.partition})
        await rig.idle()

        assert published_ids(rig) == [execution_id("j1", at(10))]


async def test_a_taken_over_partition_publishes_the_runs_its_previous_owner_recorded(
    tmp_path: Path,
) -> None:
    """The previous owner recorded the run ahead (QUEUED) and died before publishing it."""
    j = job(next_run_at=at(10))
    async with scheduler_rig(tmp_path, [j], prepare_ahead_seconds=2.0) as rig:
        rig.ownership.lose({j.partition})
        await rig.idle()
        # the previous owner's work: record the run at 9 s, never publish it
        plan = plan_job(j, at(10), previous=None, buffered=False, scheduler_id="dead")
        await rig.store.dispatch(plan.dispatches)
        await rig.to(9.5)

        rig.ownership.gain({j.partition})
        await rig.idle()
        assert rig.bus.published == []  # at its due time, not at once
        await rig.to(10)

        assert published_ids(rig) == [execution_id("j1", at(10))]


# --- stop ----------------------------------------------------------------------------------------


async def test_a_stop_publishes_the_prepared_runs_before_handing_partitions_back(
    tmp_path: Path,
) -> None:
    async with scheduler_rig(
        tmp_path, [job(next_run_at=at(10))], prepare_ahead_seconds=2.0, drain_seconds=5.0
    ) as rig:
        await rig.to(9)  # recorded, not published
        rig.scheduler.stop()
        await rig.clock.until_asleep(1)  # only the publisher is left
        assert not rig.ownership.stopped
        assert rig.bus.published == []

        await rig.clock.set(at(10))
        async with asyncio.timeout(5):
            await rig.task

        assert published_ids(rig) == [execution_id("j1", at(10))]
        assert rig.ownership.stopped


async def test_a_stop_with_nothing_prepared_returns_at_once(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path, [job(next_run_at=at(10))], drain_seconds=30.0) as rig:
        rig.scheduler.stop()
        async with asyncio.timeout(1):
            await rig.task
        assert rig.ownership.stopped
        assert rig.bus.published == []


async def test_stop_is_idempotent(tmp_path: Path) -> None:
    async with scheduler_rig(tmp_path) as rig:
        rig.scheduler.stop()
        rig.scheduler.stop()
        await until(rig.task.done)
