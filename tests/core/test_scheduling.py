"""core.scheduling.Scheduling: the scheduler's transitions, without I/O or a clock.

Each test feeds the state what a store or bus call would have returned and checks what it
answers: which jobs are due, what to record and publish, when to wake up, what to re-dispatch.
The wiring of these answers to the store and NATS is tested in ``tests/actors`` and
``tests/e2e``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from core.ids import execution_id
from core.model import (
    Execution,
    ExecutionStatus,
    IntervalSchedule,
    Job,
    JobNotice,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RunMessage,
    RunTrigger,
)
from core.ports import DispatchOutcome, DueJob
from core.quotas import Quotas, runs_key
from core.runs import queued_run, run_message
from core.scheduling import (
    HELD_BY_QUOTA,
    Decided,
    Scheduling,
    previous_lookups,
    stream_checks,
)
from core.settings import SchedulerConfig

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
NO_QUOTA = Quotas(runs_per_minute=0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(job_id: str = "j1", due: float = 10, *, partition: int = 0, **fields: Any) -> Job:
    """A job of alice (or ``owner``) in ``partition``, due at ``at(due)``, every 60 s."""
    owner = fields.pop("owner", "alice")
    return Job(
        id=job_id,
        owner=owner,
        task_id="noop",
        schedule=IntervalSchedule(every_seconds=60, start_at=T0),
        partition=partition,
        created_at=T0 - timedelta(hours=1),
        updated_at=T0 - timedelta(hours=1),
        next_run_at=at(due),
        **fields,
    )


def state(**overrides: Any) -> Scheduling:
    """A fresh state at T0: lookahead 30 s, scan every 5 s, no prepare-ahead, no quota."""
    settings: dict[str, Any] = {
        "lookahead_seconds": 30.0,
        "scan_interval_seconds": 5.0,
        "prepare_ahead_seconds": 0.0,
        "batch": 100,
        "heap_limit": 1000,
        "duplicate_window_seconds": 120.0,
        "redispatch_after_seconds": 60.0,
        "quotas": NO_QUOTA,
    } | overrides
    return Scheduling(T0, SchedulerConfig(**settings), scheduler_id="s1")


def run_of(j: Job, due: float, status: ExecutionStatus = ExecutionStatus.QUEUED) -> Execution:
    run = queued_run(j, at(due), at(due), "s0", RunTrigger.SCHEDULE)
    return msgspec.structs.replace(run, status=status, partition=j.partition)


def previous(j: Job, due: float, status: ExecutionStatus) -> tuple[Job, Execution]:
    """``j`` having dispatched its run at ``due``, and that run in ``status``."""
    j = msgspec.structs.replace(j, last_dispatched_for=at(due), last_scheduled_for=at(due))
    return j, run_of(j, due, status)


def scanned(s: Scheduling, jobs: Sequence[Job], now: datetime = T0) -> None:
    """A scan found the scheduled ones of ``jobs`` (as the store's ``due_jobs`` answers)."""
    due = [DueJob(j.id, j.next_run_at, j.partition) for j in jobs if j.next_run_at is not None]
    s.loaded(due, s.scan_until(now))
    s.scanned(now)


def dispatch(s: Scheduling, jobs: Sequence[Job], now: datetime, **kw: Any) -> list[Decided]:
    """decide, every decision allowed, accepted; the decisions that record something."""
    decided = s.decide(jobs, kw.pop("previous", {}), now, **kw)
    return [d for d in decided if s.accept(d)]


def record(s: Scheduling, decided: Sequence[Decided], now: datetime) -> list[RunMessage]:
    """The store advanced and created every dispatch; the runs ready to publish."""
    results = [
        ((x, d.job, d.when), DispatchOutcome(created=True, advanced=True))
        for d in decided
        for x in d.plan.dispatches
    ]
    recorded = s.recorded(results, now)
    s.prepare(recorded.ready)
    return [m for _, m in recorded.ready]


# --- due times and the lookahead window ----------------------------------------------------------


def test_jobs_come_out_in_due_time_order_when_due_and_not_before() -> None:
    s = state()
    scanned(s, [job("late", 20), job("early", 3), job("mid", 10)])

    assert s.due(at(2.999)) == []
    assert s.due(at(10)) == ["early", "mid"]
    assert s.due(at(30)) == ["late"]


def test_a_batch_hands_out_at_most_batch_jobs_the_earliest_first() -> None:
    s = state(batch=2)
    scanned(s, [job(f"j{i}", i) for i in range(5)])

    assert s.due(at(10)) == ["j0", "j1"]
    assert s.due(at(10)) == ["j2", "j3"]


def test_the_main_loop_wakes_for_the_earliest_job_or_the_next_scan() -> None:
    s = state()
    assert s.next_deadline() == T0  # the first scan is due at once
    scanned(s, [job("a", 20), job("b", 3)])

    assert s.next_deadline() == at(3)
    s.due(at(3))
    assert s.next_deadline() == at(5)  # the safety scan


def test_a_scan_is_due_a_scan_interval_after_the_last_one_that_succeeded() -> None:
    s = state()
    assert s.scan_due(T0)
    s.scanned(at(1))

    assert not s.scan_due(at(5.999))
    assert s.scan_due(at(6))


def test_a_job_beyond_the_lookahead_is_not_loaded_by_a_notice() -> None:
    s = state()
    scanned(s, [])
    assert s.window_end == at(30)

    assert not s.notice(JobNotice(job_id="far", partition=0, next_run_at=at(31)), {0})
    assert s.notice(JobNotice(job_id="near", partition=0, next_run_at=at(2)), {0})
    assert s.due(at(60)) == ["near"]


def test_a_notice_for_a_partition_not_owned_is_ignored() -> None:
    s = state()
    scanned(s, [])

    assert not s.notice(JobNotice(job_id="j1", partition=3, next_run_at=at(2)), {0, 1})
    assert len(s.heap) == 0


def test_a_full_scan_ends_the_window_at_its_last_job() -> None:
    """The store held more jobs than ``heap_limit``: the window ends where the answer ended,
    so nothing later is pushed into the heap until the next scan loads it."""
    s = state(heap_limit=2)
    scanned(s, [job("a", 1), job("b", 7)])
    assert s.window_end == at(7)

    assert not s.notice(JobNotice(job_id="c", partition=0, next_run_at=at(8)), {0})


def test_a_job_whose_next_occurrence_is_past_the_window_leaves_the_heap() -> None:
    for lookahead_seconds, expected in ((30.0, None), (120.0, at(70))):
        s = state(lookahead_seconds=lookahead_seconds)
        scanned(s, [job("j1", 10)])
        assert s.due(at(10)) == ["j1"]

        record(s, dispatch(s, [job("j1", 10)], at(10)), at(10))  # next occurrence: 70 s

        assert s.heap.peek() == expected


def test_runs_due_together_are_published_in_turns_across_owners() -> None:
    s = state(prepare_ahead_seconds=2.0, scan_interval_seconds=60.0)
    jobs = [job(f"big-{i}", 10, owner="big") for i in range(4)] + [job("small", 10, owner="small")]
    scanned(s, jobs)
    due = s.due(at(9))
    record(s, dispatch(s, [j for j in jobs if j.id in due], at(9)), at(9))
    published = s.due_runs(at(10))
    owners = [m.owner for m in published]
    assert owners[:2] in (["big", "small"], ["small", "big"]) and owners.count("big") == 4
    bigs = [m.job_id for m in published if m.owner == "big"]
    assert bigs == sorted(bigs)  # one owner's runs keep their order


# --- prepare-ahead ---------------------------------------------------------------------------------


def test_prepare_ahead_records_within_the_lead_and_publishes_at_the_due_time() -> None:
    s = state(prepare_ahead_seconds=2.0, scan_interval_seconds=60.0)
    scanned(s, [job("j1", 10)])
    assert s.next_deadline() == at(9)  # half the lead before the job
    assert s.due(at(7.999)) == []

    [due] = s.due(at(9))
    [decided] = dispatch(s, [job(due, 10)], at(9))
    assert decided.when == at(10)  # planned as of its due time
    [message] = record(s, [decided], at(9))

    assert message.execution_id == execution_id("j1", at(10))
    assert s.publish_deadline(at(9), 1.0) == at(10)
    assert s.due_runs(at(9.999)) == []
    assert s.due_runs(at(10)) == [message]
    assert not s.pending


def test_a_job_not_yet_due_within_the_lead_goes_back_to_the_heap() -> None:
    """A stale heap entry (the job moved later): it is not decided, it waits in the heap."""
    s = state(prepare_ahead_seconds=2.0)
    scanned(s, [])

    assert dispatch(s, [job("j1", 20)], at(9)) == []
    assert s.heap.peek() == at(20)


def test_a_job_whose_previous_run_is_active_is_decided_at_its_due_time() -> None:
    """Recorded ahead, it would skip for an overlap that may be over by its due time."""
    s = state(prepare_ahead_seconds=2.0)
    scanned(s, [])
    j, prev = previous(
        job("j1", 70, overlap_policy=OverlapPolicy.FORBID), 10, ExecutionStatus.RUNNING
    )

    assert dispatch(s, [j], at(69), previous={"j1": prev}) == []
    assert s.next_deadline() == at(5)  # the scan first, then
    s.scanned(at(66))
    assert s.next_deadline() == at(70)
    assert s.due(at(69.999)) == []
    assert s.due(at(70)) == ["j1"]  # decided by the store's view at 70 s


# --- the previous run --------------------------------------------------------------------------------


def test_only_policies_that_care_look_the_previous_run_up() -> None:
    jobs = [
        previous(job("allow", overlap_policy=OverlapPolicy.ALLOW), 0, ExecutionStatus.RUNNING)[0],
        previous(job("forbid", overlap_policy=OverlapPolicy.FORBID), 0, ExecutionStatus.RUNNING)[0],
        job("never-ran", overlap_policy=OverlapPolicy.FORBID),
    ]

    assert previous_lookups(jobs) == {execution_id("forbid", at(0)): jobs[1]}


def test_only_active_runs_of_jobs_decided_now_are_checked_in_the_work_stream() -> None:
    now_job, now_run = previous(
        job("now", 10, overlap_policy=OverlapPolicy.FORBID), 0, ExecutionStatus.RUNNING
    )
    later_job, later_run = previous(
        job("later", 20, overlap_policy=OverlapPolicy.FORBID), 0, ExecutionStatus.RUNNING
    )
    done_job, done_run = previous(
        job("done", 10, overlap_policy=OverlapPolicy.FORBID), 0, ExecutionStatus.SUCCEEDED
    )
    lookups = previous_lookups([now_job, later_job, done_job])

    assert stream_checks([now_run, later_run, done_run], lookups, at(10)) == [now_run]


def test_forbid_skips_while_the_previous_run_is_active_and_runs_once_it_ended() -> None:
    s = state()
    j, prev = previous(
        job("j1", 70, overlap_policy=OverlapPolicy.FORBID), 10, ExecutionStatus.RUNNING
    )

    [skipping] = s.decide([j], {"j1": prev}, at(70))
    assert [d.execution.status for d in skipping.plan.dispatches] == [ExecutionStatus.SKIPPED]

    [running] = s.decide([j], {"j1": prev}, at(70), ended={prev.id})
    assert [d.execution.status for d in running.plan.dispatches] == [ExecutionStatus.QUEUED]


# --- bufferOne -------------------------------------------------------------------------------------


def test_buffer_one_waits_for_the_previous_run_and_is_due_when_it_finishes() -> None:
    s = state()
    scanned(s, [])
    j, prev = previous(
        job("j1", 70, overlap_policy=OverlapPolicy.BUFFER_ONE), 10, ExecutionStatus.RUNNING
    )

    assert dispatch(s, [j], at(70), previous={"j1": prev}) == []
    assert s.waiting == {"j1": prev.id}
    assert s.finished(["other"], at(75)) == []

    assert s.finished(["other", "j1"], at(75)) == ["j1"]
    assert s.due(at(75)) == ["j1"]
    done = msgspec.structs.replace(prev, status=ExecutionStatus.SUCCEEDED)
    [decided] = dispatch(s, [j], at(75), previous={"j1": done})

    assert decided.waited == prev.id
    assert [e.scheduled_for for e in decided.plan.queued] == [at(70)]
    assert s.waiting == {}


def test_a_waiting_job_is_re_decided_by_the_scan_when_the_finish_notice_is_lost() -> None:
    s = state()
    j, prev = previous(
        job("j1", 70, overlap_policy=OverlapPolicy.BUFFER_ONE), 10, ExecutionStatus.RUNNING
    )
    dispatch(s, [j], at(70), previous={"j1": prev})

    scanned(s, [j], at(75))  # the job is still due: the scan loads it again
    assert s.due(at(75)) == ["j1"]


# --- quota holds -----------------------------------------------------------------------------------


def quota_state() -> Scheduling:
    return state(quotas=Quotas(runs_per_minute=60))


def test_a_job_over_its_owners_quota_is_held_until_the_bucket_refills() -> None:
    s = quota_state()
    scanned(s, [], at(9))
    decided = s.decide([job("a", 10), job("b", 10, owner="bob")], {}, at(10))
    [ask_a, ask_b] = s.quota_requests(decided)
    assert (ask_a.key, ask_a.cost, ask_b.key) == (runs_key("alice"), 1, runs_key("bob"))

    granted, held = s.within_quota(decided, [0.2501, 0.0], at(10))

    assert [d.job.id for d in granted] == ["b"]
    assert held == 1
    assert s.over_quota == {"a": 0}
    assert s.next_deadline() == at(10.251)  # whole milliseconds, rounded up
    assert s.due(at(10.250)) == []
    assert s.due(at(10.251)) == ["a"]


def test_without_a_runs_quota_nothing_is_asked() -> None:
    s = state()
    decided = s.decide([job("a", 10)], {}, at(10))

    assert s.quota_requests(decided) == []
    assert s.within_quota(decided, [], at(10)) == (decided, 0)


def test_a_held_job_keeps_its_buffer_one_wait_and_names_the_quota_when_it_misfires() -> None:
    s = quota_state()
    j, prev = previous(
        job("j1", 70, overlap_policy=OverlapPolicy.BUFFER_ONE, misfire_policy=MisfirePolicy.SKIP),
        10,
        ExecutionStatus.RUNNING,
    )
    [waiting] = s.decide([j], {"j1": prev}, at(70))
    assert s.accept(waiting) == []
    assert s.waiting == {"j1": prev.id}
    done = {"j1": msgspec.structs.replace(prev, status=ExecutionStatus.SUCCEEDED)}

    decided = s.decide([j], done, at(75))
    s.within_quota(decided, [120.0], at(75))  # held for two minutes: past the grace
    assert s.waiting == {"j1": prev.id}

    [late] = s.decide([j], done, at(195))
    assert late.waited == prev.id
    reasons = [d.execution.skip_reason or "" for d in late.plan.dispatches]
    assert any(HELD_BY_QUOTA in r for r in reasons)
    s.accept(late)
    assert s.over_quota == {}


def test_a_held_job_that_is_no_longer_due_here_is_released() -> None:
    s = quota_state()
    decided = s.decide([job("a", 10), job("b", 10)], {}, at(10))
    s.within_quota(decided, [1.0, 1.0], at(10))
    assert set(s.over_quota) == {"a", "b"}

    kept = s.to_dispatch(["a", "b"], [job("a", 10)], owned={0})  # b was deleted

    assert [j.id for j in kept] == ["a"]
    assert set(s.over_quota) == {"a"}


# --- partitions: fencing and take-over -------------------------------------------------------------


def test_a_lost_partition_drops_its_due_jobs_and_holds() -> None:
    s = quota_state()
    scanned(s, [job("p0", 10, partition=0), job("p1", 10, partition=1)])
    decided = s.decide([job("h0", 3, partition=0), job("h1", 3, partition=1)], {}, at(3))
    s.within_quota(decided, [1.0, 1.0], at(3))

    assert s.lost(frozenset({0})) == 1

    assert s.over_quota == {"h1": 1}
    assert s.due(at(4)) == ["h1"]
    assert s.due(at(10)) == ["p1"]


def test_jobs_of_partitions_not_owned_are_not_dispatched() -> None:
    s = state()
    kept = s.to_dispatch(["a", "b"], [job("a", partition=0), job("b", partition=1)], owned={1})

    assert [j.id for j in kept] == ["b"]


def test_a_gained_partition_is_scanned_and_taken_over_at_once() -> None:
    s = state()
    scanned(s, [])
    s.gained(frozenset({2, 3}), at(1))
    assert s.next_deadline() == at(1)
    assert s.taken == {2, 3}

    s.gained(frozenset({4}), at(1.5))  # while the take-over of 2 and 3 is under way
    j = msgspec.structs.replace(job("j1", 10, partition=2), last_scheduled_for=at(10))
    s.taken_over(frozenset({2, 3}), [run_of(j, 10)], {"j1": j}, at(2))
    assert s.taken == {4}


def test_a_take_over_prepares_the_recorded_runs_that_may_run() -> None:
    s = state()
    advanced = msgspec.structs.replace(job("ok", 70), last_scheduled_for=at(10))
    cancelled = msgspec.structs.replace(advanced, id="gone", status=JobStatus.CANCELLED)
    never_due = job("orphan", 10)  # recorded, the job not advanced past it
    recorded = [
        run_of(advanced, 10),
        run_of(advanced, 9, ExecutionStatus.RUNNING),
        run_of(cancelled, 10),
        run_of(never_due, 10),
        run_of(job("deleted", 10), 10),
    ]
    jobs = {j.id: j for j in (advanced, cancelled, never_due)}

    assert s.taken_over(frozenset({0}), recorded, jobs, at(9)) == 1
    assert [m.execution_id for m in s.due_runs(at(10))] == [execution_id("ok", at(10))]


# --- publishing ------------------------------------------------------------------------------------


def message(job_id: str, due: float) -> RunMessage:
    j = job(job_id, due)
    return run_message(j, run_of(j, due), at(due))


def test_a_failed_publish_is_kept_and_retried_after_the_delay() -> None:
    s = state()
    a, b = message("a", 10), message("b", 10)

    assert s.published([a, b], [RuntimeError("bus down"), None]) == [b]
    assert s.unpublished == {a.execution_id: a}
    assert s.pending
    assert s.publish_deadline(at(10), 1.0) == at(11)

    assert s.published([a], [None]) == [a]
    assert not s.pending
    assert s.publish_deadline(at(11), 1.0) == at(11) + timedelta(hours=1)


# --- the store refusing a job ----------------------------------------------------------------------


def test_a_refused_job_is_news_once_until_it_is_recorded_again() -> None:
    s = state()
    j = job()

    assert s.refused(j)
    assert not s.refused(j)
    s.accepted(["j1"])
    assert s.refused(j)


def test_records_another_scheduler_made_first_are_not_published() -> None:
    s = state()
    [decided] = dispatch(s, [job("j1", 10)], at(10))
    [d] = decided.plan.dispatches

    recorded = s.recorded(
        [((d, decided.job, at(10)), DispatchOutcome(created=False, advanced=False))], at(10)
    )

    assert (recorded.ready, recorded.events, recorded.skipped) == ([], [], [])


# --- re-dispatch of lost runs ----------------------------------------------------------------------


def test_a_lost_run_is_re_published_at_its_second_sighting_once_the_recorders_caught_up() -> None:
    s = state()
    j = msgspec.structs.replace(job("j1", 70), last_scheduled_for=at(10))
    gone = run_of(j, 10, ExecutionStatus.RUNNING)

    assert s.sighted([gone], last_seq=7, ack_floor=7) == []  # first sighting: a strike
    assert s.strikes == {gone.id: 7}
    assert s.sighted([gone], last_seq=9, ack_floor=6) == []  # events of then still in flight
    assert s.strikes == {gone.id: 7}
    assert s.sighted([gone], last_seq=9, ack_floor=7) == [gone]
    assert s.strikes == {}

    [again] = s.resend([gone], {"j1": j}, at(80)).messages
    assert (again.execution_id, again.redispatched_at_ms > 0) == (gone.id, True)
    assert again.attempt_offset == gone.attempt


def test_a_run_seen_again_in_the_work_stream_loses_its_strike() -> None:
    s = state()
    gone = run_of(job(), 10, ExecutionStatus.RUNNING)
    s.sighted([gone], last_seq=3, ack_floor=0)

    assert s.sighted([], last_seq=0, ack_floor=0) == []
    assert s.strikes == {}


def test_lost_runs_that_must_not_run_are_closed_and_those_awaiting_a_retry_not_resent() -> None:
    s = state()
    live = msgspec.structs.replace(job("live", 70), last_scheduled_for=at(10))
    cancelled = msgspec.structs.replace(live, id="cancelled", status=JobStatus.CANCELLED)
    orphan = job("orphan", 10)
    retrying = msgspec.structs.replace(live, id="retrying")
    runs = [run_of(j, 10) for j in (live, cancelled, orphan, retrying)] + [
        run_of(job("deleted"), 10)
    ]
    jobs = {j.id: j for j in (live, cancelled, orphan, retrying)}
    s.published([run_message(retrying, runs[3], at(10))], [RuntimeError("bus down")])

    resend = s.resend(runs, jobs, at(80))

    assert [m.job_id for m in resend.messages] == ["live"]
    assert [(e.job_id, e.status) for e in resend.closing] == [
        ("cancelled", ExecutionStatus.CANCELLED),
        ("orphan", ExecutionStatus.SKIPPED),
        ("deleted", ExecutionStatus.CANCELLED),
    ]


def test_candidates_are_runs_untouched_for_the_re_dispatch_timeout() -> None:
    assert state(redispatch_after_seconds=60.0).stale_before(at(100)) == at(40)
