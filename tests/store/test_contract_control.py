"""The JobStore contract of job control (``core.ports``), run against every backend.

Idempotency keys (``create_job``), conditional changes (``update_job``: pause, resume, cancel,
PATCH), ``delete_job``, manual runs (``insert_execution``, ``dispatch`` of a ``ManualDispatch``),
``get_executions``, SKIPPED records and the scheduling fields of jobs, schedules and executions,
and how a run's report treats a paused or cancelled job. Same rules as ``test_contract.py``: public methods only, fixed instants.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest

from core.errors import Conflict, JobNotFound
from core.ids import execution_id
from core.model import (
    TERMINAL_RANK,
    CronSchedule,
    Execution,
    ExecutionStatus,
    ImmediateSchedule,
    IntervalSchedule,
    Job,
    JobSpec,
    JobStatus,
    MisfirePolicy,
    Missed,
    OverlapPolicy,
    RunTrigger,
    Schedule,
    spec_values,
)
from core.ports import (
    UNCHANGED,
    AnyDispatch,
    Dispatch,
    DispatchOutcome,
    IdempotencyKeyReused,
    JobChange,
    JobQuery,
    JobStatusConflict,
    JobStore,
    ManualDispatch,
)
from tests.store.test_contract import (
    MINUTELY,
    OWNER,
    RUNNING,
    SUCCEEDED,
    at,
    dispatched,
    event,
    make_execution,
    make_job,
)

PAUSED = JobStatus.PAUSED
CANCELLED = JobStatus.CANCELLED
SCHEDULED = JobStatus.SCHEDULED
LIVE = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING})


def keyed_job(job_id: str, key: str | None = "key-1", *, owner: str = OWNER) -> Job:
    return make_job(job_id, owner=owner, next_run_at=at(1), idempotency_key=key)


def spec_of(job: Job) -> JobSpec:
    return job.spec


def with_spec(job: Job, spec: JobSpec) -> dict[str, Any]:
    """``job``'s fields with those of ``spec`` (to compare a job after a PATCH)."""
    return {**{f: getattr(job, f) for f in job.__struct_fields__}, **spec_values(spec)}


def fields_of(job: Job) -> dict[str, Any]:
    return {f: getattr(job, f) for f in job.__struct_fields__}


async def job_ids(store: JobStore, owner: str = OWNER) -> list[str]:
    page = await store.list_jobs(owner, JobQuery(), limit=100, cursor=None)
    return sorted(j.id for j in page.items)


# --- scheduling fields round-trip ----------------------------------------------------------------

SCHEDULES_WITH_OPTIONS = [
    pytest.param(
        CronSchedule(
            expression="30 2 * * *",
            timezone="Europe/Berlin",
            gap="skip",
            fold="both",
            start_at=at(60),
            end_at=at(60 * 24 * 30, seconds=0.125),
            jitter_seconds=12.5,
        ),
        id="cron-options",
    ),
    pytest.param(
        IntervalSchedule(every_seconds=300, start_at=at(5), end_at=at(500), jitter_seconds=3),
        id="interval-options",
    ),
    pytest.param(CronSchedule(expression="0 * * * *", end_at=at(120)), id="cron-end-only"),
]


@pytest.mark.parametrize("schedule", SCHEDULES_WITH_OPTIONS)
async def test_a_job_round_trips_with_its_policies_key_and_schedule_options(
    store: JobStore, schedule: Schedule
) -> None:
    job = make_job(
        "job-rt",
        schedule=schedule,
        next_run_at=at(60),
        misfire_policy=MisfirePolicy.RUN_ALL,
        misfire_grace_seconds=0.5,
        max_catch_up=250,
        overlap_policy=OverlapPolicy.BUFFER_ONE,
        idempotency_key="key-ż-1",
        status=PAUSED,
    )
    await store.create_job(job, request_hash="hash-1")

    assert await store.get_job(OWNER, "job-rt") == job
    assert await store.get_jobs(["job-rt"]) == [job]
    page = await store.list_jobs(OWNER, JobQuery(status=PAUSED), limit=5, cursor=None)
    assert page.items == [job]


# --- create_job: idempotency keys ----------------------------------------------------------------


async def test_a_reused_key_with_the_same_request_answers_with_the_original_job(
    store: JobStore,
) -> None:
    original = keyed_job("job-1")
    assert await store.create_job(original, request_hash="h1") == original

    with pytest.raises(IdempotencyKeyReused) as info:
        await store.create_job(keyed_job("job-2"), request_hash="h1")

    assert info.value.same_request is True
    assert info.value.job == original
    assert await job_ids(store) == ["job-1"]
    with pytest.raises(JobNotFound):
        await store.get_job(OWNER, "job-2")


async def test_a_reused_key_with_another_request_is_reported_with_the_original_job(
    store: JobStore,
) -> None:
    original = keyed_job("job-1")
    await store.create_job(original, request_hash="h1")

    with pytest.raises(IdempotencyKeyReused) as info:
        await store.create_job(keyed_job("job-2"), request_hash="h2")

    assert info.value.same_request is False
    assert info.value.job == original
    assert await job_ids(store) == ["job-1"]


async def test_a_key_without_request_hashes_counts_as_the_same_request(store: JobStore) -> None:
    await store.create_job(keyed_job("job-1"))

    with pytest.raises(IdempotencyKeyReused) as info:
        await store.create_job(keyed_job("job-2"))
    assert info.value.same_request is True

    with pytest.raises(IdempotencyKeyReused) as info:
        await store.create_job(keyed_job("job-3"), request_hash="h1")
    assert info.value.same_request is False


async def test_one_key_for_two_owners_creates_two_jobs(store: JobStore) -> None:
    alice = keyed_job("job-a")
    bob = keyed_job("job-b", owner="bob")
    await store.create_job(alice, request_hash="h1")
    await store.create_job(bob, request_hash="h1")

    assert await store.get_job(OWNER, "job-a") == alice
    assert await store.get_job("bob", "job-b") == bob


async def test_jobs_without_a_key_and_with_other_keys_do_not_collide(store: JobStore) -> None:
    for job in (
        keyed_job("job-1", None),
        keyed_job("job-2", None),
        keyed_job("job-3", "key-1"),
        keyed_job("job-4", "key-2"),
        keyed_job("job-5", "KEY-1"),
    ):
        await store.create_job(job, request_hash="h")

    assert await job_ids(store) == ["job-1", "job-2", "job-3", "job-4", "job-5"]


async def test_list_jobs_finds_the_job_of_an_idempotency_key(store: JobStore) -> None:
    for job in (
        keyed_job("job-1", None),
        keyed_job("job-2", "key-1"),
        keyed_job("job-3", "key-10"),
        keyed_job("job-4", "KEY-1"),
        keyed_job("job-b", "key-1", owner="bob"),
    ):
        await store.create_job(job, request_hash="h")

    async def keyed(key: str, owner: str | None = OWNER, **filters: Any) -> list[str]:
        query = JobQuery(idempotency_key=key, **filters)
        page = await store.list_jobs(owner, query, limit=10, cursor=None)
        return [j.id for j in page.items]

    assert await keyed("key-1") == ["job-2"]  # exact: neither a prefix nor another case
    assert await keyed("KEY-1") == ["job-4"]
    assert await keyed("key-1", owner="bob") == ["job-b"]  # per owner
    assert sorted(await keyed("key-1", owner=None)) == ["job-2", "job-b"]
    assert await keyed("key-") == []
    assert await keyed("key-1", status=JobStatus.PAUSED) == []  # with the other filters
    assert await keyed("key-1", task_id="noop") == ["job-2"]


async def test_a_duplicate_id_with_a_new_key_is_a_conflict(store: JobStore) -> None:
    original = keyed_job("job-1", "key-1")
    await store.create_job(original)

    with pytest.raises(Conflict) as info:
        await store.create_job(keyed_job("job-1", "key-2"))

    assert not isinstance(info.value, IdempotencyKeyReused)
    assert await store.get_job(OWNER, "job-1") == original


async def test_the_key_of_a_deleted_job_can_be_used_again(store: JobStore) -> None:
    await store.create_job(keyed_job("job-1"), request_hash="h1")
    await store.delete_job(OWNER, "job-1")

    again = keyed_job("job-2")
    assert await store.create_job(again, request_hash="h2") == again
    assert await job_ids(store) == ["job-2"]


@pytest.mark.parametrize("same", [True, False], ids=["same-request", "other-requests"])
async def test_concurrent_creates_with_one_key_create_exactly_one_job(
    store: JobStore, same: bool
) -> None:
    jobs = [keyed_job(f"job-{i}") for i in range(6)]

    results = await asyncio.gather(
        *(store.create_job(j, request_hash="h" if same else f"h{i}") for i, j in enumerate(jobs)),
        return_exceptions=True,
    )

    created = [r for r in results if isinstance(r, Job)]
    reused = [r for r in results if isinstance(r, IdempotencyKeyReused)]
    assert len(created) == 1, results
    assert len(reused) == len(jobs) - 1, results
    [winner] = created
    assert all(e.job == winner and e.same_request is same for e in reused)
    assert await job_ids(store) == [winner.id]
    assert await store.get_job(OWNER, winner.id) == winner


# --- update_job ----------------------------------------------------------------------------------

PRECONDITIONS = [
    pytest.param(None, True, id="any-status"),
    pytest.param(LIVE, True, id="allowed"),
    pytest.param(frozenset({SCHEDULED}), True, id="allowed-exactly"),
    pytest.param(frozenset({PAUSED}), False, id="not-allowed"),
    pytest.param(frozenset({PAUSED, CANCELLED, JobStatus.FAILED}), False, id="none-allowed"),
    pytest.param(frozenset(), False, id="empty"),
]


@pytest.mark.parametrize(("allowed_from", "applies"), PRECONDITIONS)
async def test_update_job_applies_only_from_the_allowed_statuses(
    store: JobStore, allowed_from: frozenset[JobStatus] | None, applies: bool
) -> None:
    job = make_job("job-1", next_run_at=at(5))
    await store.create_job(job)
    pause = JobChange("paused", allowed_from=allowed_from, status=PAUSED, next_run_at=None)

    if applies:
        after = await store.update_job(OWNER, "job-1", pause, now=at(2))
        changed = {"status": PAUSED, "next_run_at": None, "updated_at": at(2)}
        expected = Job(**{**fields_of(job), **changed})
        assert after == expected
        assert await store.get_job(OWNER, "job-1") == expected
    else:
        with pytest.raises(JobStatusConflict) as info:
            await store.update_job(OWNER, "job-1", pause, now=at(2))
        assert info.value.job_status == SCHEDULED
        assert info.value.code == "job_state_conflict"
        assert "paused" in info.value.message
        assert await store.get_job(OWNER, "job-1") == job


async def test_pause_resume_cancel_follow_their_preconditions(store: JobStore) -> None:
    await store.create_job(make_job("job-1", next_run_at=at(5)))
    pause = JobChange("paused", allowed_from=LIVE, status=PAUSED, next_run_at=None)
    resume = JobChange(
        "resumed", allowed_from=frozenset({PAUSED}), status=SCHEDULED, next_run_at=at(9)
    )
    cancel = JobChange(
        "cancelled", allowed_from=LIVE | {PAUSED}, status=CANCELLED, next_run_at=None
    )

    with pytest.raises(JobStatusConflict):
        await store.update_job(OWNER, "job-1", resume, now=at(1))
    paused = await store.update_job(OWNER, "job-1", pause, now=at(2))
    assert (paused.status, paused.next_run_at, paused.updated_at) == (PAUSED, None, at(2))
    assert await store.due_jobs({0}, at(100), limit=10) == []
    with pytest.raises(JobStatusConflict) as info:
        await store.update_job(OWNER, "job-1", pause, now=at(3))
    assert info.value.job_status == PAUSED

    resumed = await store.update_job(OWNER, "job-1", resume, now=at(4))
    assert (resumed.status, resumed.next_run_at, resumed.updated_at) == (SCHEDULED, at(9), at(4))
    assert [j.id for j in await store.due_jobs({0}, at(9), limit=10)] == ["job-1"]

    cancelled = await store.update_job(OWNER, "job-1", cancel, now=at(5))
    assert (cancelled.status, cancelled.next_run_at) == (CANCELLED, None)
    for change in (pause, resume, cancel):
        with pytest.raises(JobStatusConflict) as info:
            await store.update_job(OWNER, "job-1", change, now=at(6))
        assert info.value.job_status == CANCELLED
    assert (await store.get_job(OWNER, "job-1")).updated_at == at(5)
    page = await store.list_jobs(OWNER, JobQuery(status=CANCELLED), limit=5, cursor=None)
    assert [j.id for j in page.items] == ["job-1"]


NEXT_RUN_CHANGES = [
    pytest.param(at(5), UNCHANGED, at(5), id="unchanged"),
    pytest.param(at(5), None, None, id="cleared"),
    pytest.param(at(5), at(9, seconds=0.001), at(9, seconds=0.001), id="set"),
    pytest.param(None, UNCHANGED, None, id="unchanged-none"),
    pytest.param(None, at(7), at(7), id="set-from-none"),
]


@pytest.mark.parametrize(("before", "change", "expected"), NEXT_RUN_CHANGES)
async def test_update_job_next_run_at_unchanged_none_or_a_value(
    store: JobStore, before: datetime | None, change: object, expected: datetime | None
) -> None:
    job = make_job("job-1", next_run_at=before)
    await store.create_job(job)

    after = await store.update_job(
        OWNER, "job-1", JobChange("changed", next_run_at=change), now=at(3)
    )

    assert after == Job(**{**fields_of(job), "next_run_at": expected, "updated_at": at(3)})
    assert await store.get_job(OWNER, "job-1") == after
    due = [j.id for j in await store.due_jobs({0}, at(1000), limit=10)]
    assert due == ([] if expected is None else ["job-1"])


CRON_SPEC = JobSpec(
    task_id="noop",
    schedule=CronSchedule(
        expression="15 3 * * 1-5",
        timezone="America/New_York",
        gap="skip",
        fold="both",
        start_at=at(10),
        end_at=at(60 * 24 * 7),
        jitter_seconds=30,
    ),
    parameters={"region": "ACME-42", "nested": {"list": [1, 2.5, None, "ż"]}},
    queue="reports",
    max_attempts=7,
    timeout_seconds=42.5,
    misfire_policy=MisfirePolicy.SKIP,
    misfire_grace_seconds=0,
    max_catch_up=1,
    overlap_policy=OverlapPolicy.REPLACE,
)
SPECS = [
    pytest.param(CRON_SPEC, id="cron"),
    pytest.param(
        JobSpec(
            task_id="noop",
            schedule=IntervalSchedule(
                every_seconds=0.5, start_at=at(1, seconds=0.25), end_at=at(2), jitter_seconds=0.1
            ),
            parameters={},
            queue="default",
            max_attempts=1,
            timeout_seconds=1,
            misfire_policy=MisfirePolicy.RUN_ALL,
            misfire_grace_seconds=3600,
            max_catch_up=1000,
            overlap_policy=OverlapPolicy.ALLOW,
        ),
        id="interval",
    ),
    pytest.param(
        JobSpec(
            task_id="noop",
            schedule=ImmediateSchedule(),
            parameters={"x": 1},
            queue="q1",
            max_attempts=3,
            timeout_seconds=300,
            misfire_policy=MisfirePolicy.RUN_ONCE,
            misfire_grace_seconds=60,
            max_catch_up=10,
            overlap_policy=OverlapPolicy.BUFFER_ONE,
        ),
        id="immediate",
    ),
]


@pytest.mark.parametrize("spec", SPECS)
async def test_update_job_replaces_the_spec_and_keeps_the_rest(
    store: JobStore, spec: JobSpec
) -> None:
    job = make_job(
        "job-1",
        schedule=CronSchedule(expression="0 0 * * *", gap="shift", jitter_seconds=5),
        parameters={"old": True, "drop": "me"},
        next_run_at=at(5),
        last_scheduled_for=at(-5),
        run_count=4,
        last_run_status=ExecutionStatus.FAILED,
        last_error="boom",
        idempotency_key="key-1",
    )
    await store.create_job(job, request_hash="h1")
    patch = JobChange("changed", allowed_from=LIVE | {PAUSED}, spec=spec)

    after = await store.update_job(OWNER, "job-1", patch, now=at(3))

    expected = Job(**{**with_spec(job, spec), "updated_at": at(3)})
    assert after == expected
    assert spec_of(after) == spec
    assert await store.get_job(OWNER, "job-1") == expected
    assert await store.get_jobs(["job-1"]) == [expected]
    with pytest.raises(IdempotencyKeyReused) as info:  # the key and its request stay
        await store.create_job(keyed_job("job-2"), request_hash="h1")
    assert info.value.job == expected and info.value.same_request


async def test_update_job_changes_spec_status_and_next_run_at_together(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(5), status=PAUSED)
    await store.create_job(job)
    change = JobChange(
        "resumed",
        allowed_from=frozenset({PAUSED}),
        status=SCHEDULED,
        next_run_at=at(8),
        spec=CRON_SPEC,
    )

    after = await store.update_job(OWNER, "job-1", change, now=at(4))

    changed = {"status": SCHEDULED, "next_run_at": at(8), "updated_at": at(4)}
    assert after == Job(**{**with_spec(job, CRON_SPEC), **changed})


async def test_update_job_of_another_owner_or_unknown_id_is_not_found(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(5))
    await store.create_job(job)
    everything = JobChange("cancelled", status=CANCELLED, next_run_at=None, spec=spec_of(job))

    with pytest.raises(JobNotFound):
        await store.update_job("bob", "job-1", everything, now=at(1))
    with pytest.raises(JobNotFound):  # not found outranks a status conflict
        await store.update_job(
            "bob", "job-1", JobChange("paused", allowed_from=frozenset()), now=at(1)
        )
    with pytest.raises(JobNotFound):
        await store.update_job(OWNER, "job-2", everything, now=at(1))

    assert await store.get_job(OWNER, "job-1") == job


# --- delete_job ----------------------------------------------------------------------------------


async def test_delete_job_deletes_the_job_and_its_executions(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(1))
    other = make_job("job-2", next_run_at=at(1))
    await store.create_job(job)
    await store.create_job(other)
    first = await dispatched(store, job, at(1), at(2))
    second = await dispatched(store, job, at(2), at(3))
    kept = await dispatched(store, other, at(1), at(2))
    manual = manual_run(job, at(1, seconds=30))
    assert await store.insert_execution(manual)
    await store.apply_events([event(first, SUCCEEDED, 1, at(1, seconds=5))])

    await store.delete_job(OWNER, "job-1")

    with pytest.raises(JobNotFound):
        await store.get_job(OWNER, "job-1")
    with pytest.raises(JobNotFound):
        await store.list_executions(OWNER, "job-1", limit=10, cursor=None)
    for gone in (first, second, manual):
        assert await store.get_execution(gone.id) is None
    assert await store.get_executions([first.id, second.id, manual.id, kept.id]) == [kept]
    assert await store.get_jobs(["job-1", "job-2"]) == [await store.get_job(OWNER, "job-2")]
    assert await store.stale_executions({0}, at(1000), limit=10) == [kept]
    assert [j.id for j in await store.due_jobs({0}, at(1000), limit=10)] == ["job-2"]


async def test_delete_job_of_another_owner_or_unknown_id_is_not_found(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    run = await dispatched(store, job, at(1), at(2))

    with pytest.raises(JobNotFound):
        await store.delete_job("bob", "job-1")
    with pytest.raises(JobNotFound):
        await store.delete_job(OWNER, "job-2")

    assert (await store.get_job(OWNER, "job-1")).run_count == 1
    assert await store.get_execution(run.id) == run
    await store.delete_job(OWNER, "job-1")
    with pytest.raises(JobNotFound):
        await store.delete_job(OWNER, "job-1")


# --- insert_execution / get_executions -----------------------------------------------------------


def manual_run(job: Job, now: datetime, **fields: Any) -> Execution:
    """A manual run, as the gateway's trigger records it."""
    return Execution(
        **{
            **_execution_fields(make_execution(job, now)),
            "id": f"{execution_id(job.id, now)}!manual",
            "trigger": RunTrigger.MANUAL,
            "dispatched_by": "gateway",
            **fields,
        }
    )


def _execution_fields(ex: Execution) -> dict[str, Any]:
    return {f: getattr(ex, f) for f in ex.__struct_fields__}


async def test_insert_execution_inserts_once(store: JobStore) -> None:
    job = make_job("job-1")
    await store.create_job(job)
    run = manual_run(job, at(3), jitter_ms=250)

    assert await store.insert_execution(run) is True
    assert await store.insert_execution(run) is False
    assert await store.insert_execution(manual_run(job, at(3), queue="other")) is False

    assert await store.get_execution(run.id) == run
    page = await store.list_executions(OWNER, "job-1", limit=10, cursor=None)
    assert page.items == [run]
    assert await store.stale_executions({0}, at(4), limit=10) == [run]


async def test_a_manual_run_follows_status_events_like_any_run(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(10))
    await store.create_job(job)
    run = manual_run(job, at(3))
    await store.insert_execution(run)

    assert await store.apply_events([event(run, RUNNING, 1, at(3, seconds=1))]) == 1
    assert await store.apply_events([event(run, SUCCEEDED, 1, at(3, seconds=2))]) == 1

    stored = await store.get_execution(run.id)
    assert stored is not None
    assert (stored.status, stored.trigger, stored.dispatched_by) == (
        SUCCEEDED,
        RunTrigger.MANUAL,
        "gateway",
    )
    after = await store.get_job(OWNER, "job-1")
    assert (after.status, after.last_run_status, after.next_run_at) == (
        SCHEDULED,
        SUCCEEDED,
        at(10),
    )


async def test_get_executions_returns_the_existing_ones(store: JobStore) -> None:
    a = make_job("job-a", next_run_at=at(1))
    b = make_job("job-b", owner="bob", next_run_at=at(1))
    await store.create_job(a)
    await store.create_job(b)
    runs = [
        await dispatched(store, a, at(1), at(2)),
        await dispatched(store, a, at(2), at(3)),
        await dispatched(store, b, at(1), None),
    ]
    manual = manual_run(a, at(5))
    await store.insert_execution(manual)
    expected = sorted([*runs, manual], key=lambda e: e.id)
    ids = [e.id for e in expected]

    assert await store.get_executions([]) == []
    assert await store.get_executions(["job-a:missing", "nope"]) == []
    got = await store.get_executions([*reversed(ids), "nope", ids[0]])
    assert sorted(got, key=lambda e: e.id) == expected
    assert await store.get_executions({runs[2].id}) == [runs[2]]


async def test_get_executions_handles_large_id_sets(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(0))
    await store.create_job(job)
    nxt: datetime | None = at(0)
    expected = []
    for i in range(3):
        assert nxt is not None
        expected.append(await dispatched(store, job, nxt, at(i + 1)))
        nxt = at(i + 1)
    ids = [f"job-1:unknown-{i}" for i in range(1200)] + [e.id for e in expected]

    got = await store.get_executions(ids)

    assert sorted(got, key=lambda e: e.id) == sorted(expected, key=lambda e: e.id)


# --- SKIPPED records and the new execution fields ------------------------------------------------


def skipped_record(job: Job, scheduled_for: datetime, **fields: Any) -> Execution:
    """A SKIPPED record, as the scheduler's dispatch plan makes one."""
    recorded = scheduled_for + timedelta(seconds=90)
    return Execution(
        **{
            **_execution_fields(make_execution(job, scheduled_for, now=recorded)),
            "status": ExecutionStatus.SKIPPED,
            "state_rank": TERMINAL_RANK,
            "finished_at": recorded,
            "dispatched_by": "scheduler-1",
            "skip_reason": "misfire: 3 occurrences missed the grace period",
            "missed": Missed(count=3, first=at(-2), last=scheduled_for, policy="skip"),
            **fields,
        }
    )


RECORDS = [
    pytest.param({}, id="skipped-misfire"),
    pytest.param(
        {
            "skip_reason": "overlap: previous run job-1:x is still RUNNING",
            "missed": None,
            "trigger": RunTrigger.SCHEDULE,
        },
        id="skipped-overlap",
    ),
    pytest.param(
        {"missed": Missed(count=1, policy="forbid"), "trigger": RunTrigger.CATCH_UP},
        id="skipped-missed-without-times",
    ),
    pytest.param(
        {
            "status": ExecutionStatus.QUEUED,
            "state_rank": 0,
            "finished_at": None,
            "skip_reason": None,
            "missed": Missed(count=12, first=at(-30), last=at(-1), policy="runOnce"),
            "trigger": RunTrigger.CATCH_UP,
            "jitter_ms": 1234,
        },
        id="queued-catch-up-with-jitter",
    ),
]


@pytest.mark.parametrize("fields", RECORDS)
async def test_dispatched_records_round_trip_with_trigger_jitter_and_missed(
    store: JobStore, fields: dict[str, Any]
) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    record = skipped_record(job, at(1), **fields)

    outcome = await store.dispatch(
        [Dispatch(record, expected_next_run_at=at(1), next_run_at=at(2))]
    )

    assert outcome == [DispatchOutcome(created=True, advanced=True)]
    assert await store.get_execution(record.id) == record
    assert await store.get_executions([record.id]) == [record]
    page = await store.list_executions(OWNER, "job-1", limit=5, cursor=None)
    assert page.items == [record]
    after = await store.get_job(OWNER, "job-1")
    assert (after.next_run_at, after.last_scheduled_for, after.run_count) == (at(2), at(1), 1)
    stale = await store.stale_executions({0}, at(1000), limit=10)
    assert stale == ([record] if record.status == ExecutionStatus.QUEUED else [])


async def test_a_batch_of_skipped_records_and_a_run_records_all(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    skipped = [skipped_record(job, at(i)) for i in (1, 2)]
    run = make_execution(job, at(3), now=at(3, seconds=1))
    batch = [
        Dispatch(skipped[0], expected_next_run_at=at(1), next_run_at=at(2)),
        Dispatch(skipped[1], expected_next_run_at=at(2), next_run_at=at(3)),
        Dispatch(run, expected_next_run_at=at(3), next_run_at=at(4)),
    ]

    assert await store.dispatch(batch) == [DispatchOutcome(created=True, advanced=True)] * 3
    assert await store.dispatch(batch) == [DispatchOutcome(created=False, advanced=True)] * 3

    page = await store.list_executions(OWNER, "job-1", limit=10, cursor=None)
    assert page.items == [run, skipped[1], skipped[0]]
    after = await store.get_job(OWNER, "job-1")
    assert (after.next_run_at, after.run_count) == (at(4), 3)


async def test_a_skipped_record_of_a_dispatch_that_did_not_advance_is_not_kept(
    store: JobStore,
) -> None:
    job = make_job("job-1", next_run_at=at(5))
    await store.create_job(job)
    record = skipped_record(job, at(1))

    outcome = await store.dispatch(
        [Dispatch(record, expected_next_run_at=at(1), next_run_at=at(2))]
    )

    assert outcome == [DispatchOutcome(created=False, advanced=False)]
    assert await store.get_execution(record.id) is None
    assert await store.get_job(OWNER, "job-1") == job


async def test_a_skipped_record_is_final(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    record = skipped_record(job, at(1))
    await store.dispatch([Dispatch(record, expected_next_run_at=at(1), next_run_at=at(2))])

    late = [event(record, RUNNING, 1, at(2)), event(record, ExecutionStatus.RETRYING, 1, at(3))]
    assert await store.apply_events(late) == 0

    assert await store.get_execution(record.id) == record


# --- dispatch of manual runs --------------------------------------------------------------------


async def test_a_manual_dispatch_records_and_counts_the_run_and_leaves_the_schedule_alone(
    store: JobStore,
) -> None:
    job = make_job("job-1", next_run_at=at(5))
    await store.create_job(job)
    run = manual_run(job, at(2))

    assert await store.dispatch([ManualDispatch(run)]) == [
        DispatchOutcome(created=True, advanced=True)
    ]
    assert await store.dispatch([ManualDispatch(run)]) == [
        DispatchOutcome(created=False, advanced=True)
    ]

    assert await store.get_execution(run.id) == run
    assert (await store.list_executions(OWNER, "job-1", limit=5, cursor=None)).items == [run]
    after = await store.get_job(OWNER, "job-1")
    assert after.run_count == job.run_count + 1  # counted once, for the repeat too
    assert msgspec.structs.replace(after, run_count=job.run_count) == job  # nextRunAt… as they were
    assert [j.id for j in await store.due_jobs({0}, at(5), limit=5)] == ["job-1"]
    assert await store.stale_executions({0}, at(1000), limit=5) == [run]


async def test_a_manual_dispatch_beside_a_chain_of_scheduled_runs_breaks_no_link(
    store: JobStore,
) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    first, second = make_execution(job, at(1)), make_execution(job, at(2))
    manual = manual_run(job, at(1, seconds=30))
    batch: list[AnyDispatch] = [
        Dispatch(first, expected_next_run_at=at(1), next_run_at=at(2)),
        ManualDispatch(manual),
        Dispatch(second, expected_next_run_at=at(2), next_run_at=at(3)),
    ]

    assert await store.dispatch(batch) == [DispatchOutcome(created=True, advanced=True)] * 3

    after = await store.get_job(OWNER, "job-1")
    assert (after.next_run_at, after.last_scheduled_for, after.run_count) == (at(3), at(2), 3)
    assert after.last_dispatched_for == at(2)
    assert {e.id for e in await store.get_executions([first.id, second.id, manual.id])} == {
        first.id,
        second.id,
        manual.id,
    }


async def test_a_manual_run_is_kept_when_a_scheduled_run_of_its_batch_is_not(
    store: JobStore,
) -> None:
    job = make_job("job-1", next_run_at=at(5))
    await store.create_job(job)
    late = make_execution(job, at(1))  # the job moved on to 5 meanwhile
    manual = manual_run(job, at(2))

    outcomes = await store.dispatch(
        [Dispatch(late, expected_next_run_at=at(1), next_run_at=at(2)), ManualDispatch(manual)]
    )

    assert outcomes == [
        DispatchOutcome(created=False, advanced=False),
        DispatchOutcome(created=True, advanced=True),
    ]
    assert await store.get_executions([late.id, manual.id]) == [manual]
    after = await store.get_job(OWNER, "job-1")
    assert after == msgspec.structs.replace(job, run_count=job.run_count + 1)  # the manual run


# --- the job summary of a paused or cancelled job ------------------------------------------------


HELD = [
    pytest.param(PAUSED, None, id="paused"),
    pytest.param(PAUSED, at(30), id="paused-with-next-run"),
    pytest.param(CANCELLED, None, id="cancelled"),
]


@pytest.mark.parametrize(("held", "next_run_at"), HELD)
@pytest.mark.parametrize("outcome", [SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED])
async def test_a_run_reporting_keeps_a_paused_or_cancelled_job_s_status(
    store: JobStore,
    held: JobStatus,
    next_run_at: datetime | None,
    outcome: ExecutionStatus,
) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    run = await dispatched(store, job, at(1), at(2))
    await store.update_job(
        OWNER, "job-1", JobChange("held", status=held, next_run_at=next_run_at), now=at(1, 10)
    )

    await store.apply_events([event(run, RUNNING, 1, at(1, 20), started_at=at(1, 20))])
    running = await store.get_job(OWNER, "job-1")
    error = None if outcome == SUCCEEDED else "stopped"
    await store.apply_events([event(run, outcome, 1, at(1, 40), error=error)])
    after = await store.get_job(OWNER, "job-1")

    assert (running.status, running.last_execution_id, running.last_run_at) == (
        held,
        run.id,
        at(1, 20),
    )
    assert (after.status, after.last_run_status, after.last_execution_id) == (held, outcome, run.id)
    assert after.next_run_at == next_run_at
    assert after.last_error == error


FINAL_STATUS = [
    pytest.param(SUCCEEDED, JobStatus.SUCCEEDED, id="succeeded"),
    pytest.param(ExecutionStatus.FAILED, JobStatus.FAILED, id="failed"),
    pytest.param(ExecutionStatus.CANCELLED, CANCELLED, id="cancelled"),
    pytest.param(ExecutionStatus.SKIPPED, JobStatus.SKIPPED, id="skipped"),
]


@pytest.mark.parametrize(("outcome", "job_status"), FINAL_STATUS)
async def test_the_last_run_s_outcome_finishes_a_job_without_a_next_run(
    store: JobStore, outcome: ExecutionStatus, job_status: JobStatus
) -> None:
    job = make_job("job-1", schedule=ImmediateSchedule(), next_run_at=at(0))
    await store.create_job(job)
    run = await dispatched(store, job, at(0), None)

    await store.apply_events([event(run, RUNNING, 1, at(0, 1), started_at=at(0, 1))])
    assert (await store.get_job(OWNER, "job-1")).status == JobStatus.RUNNING
    await store.apply_events([event(run, outcome, 1, at(0, 5))])

    after = await store.get_job(OWNER, "job-1")
    assert (after.status, after.last_run_status, after.next_run_at) == (job_status, outcome, None)
    stored = await store.get_execution(run.id)
    assert stored is not None and stored.status == outcome


async def test_a_cancelled_run_of_a_job_with_a_next_run_leaves_it_scheduled(
    store: JobStore,
) -> None:
    job = make_job("job-1", schedule=MINUTELY, next_run_at=at(1))
    await store.create_job(job)
    run = await dispatched(store, job, at(1), at(2))

    await store.apply_events(
        [
            event(run, RUNNING, 1, at(1, 1), started_at=at(1, 1)),
            event(run, ExecutionStatus.CANCELLED, 1, at(1, 2)),
        ]
    )

    after = await store.get_job(OWNER, "job-1")
    assert (after.status, after.last_run_status) == (SCHEDULED, ExecutionStatus.CANCELLED)


async def test_a_resumed_job_follows_its_runs_again(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    await store.update_job(
        OWNER, "job-1", JobChange("paused", status=PAUSED, next_run_at=None), now=at(0, 10)
    )
    await store.update_job(
        OWNER,
        "job-1",
        JobChange("resumed", allowed_from=frozenset({PAUSED}), status=SCHEDULED, next_run_at=at(3)),
        now=at(0, 20),
    )
    run = await dispatched(store, job, at(3), at(4))

    await store.apply_events([event(run, RUNNING, 1, at(3, 1), started_at=at(3, 1))])
    assert (await store.get_job(OWNER, "job-1")).status == JobStatus.RUNNING
    await store.apply_events([event(run, SUCCEEDED, 1, at(3, 2))])
    after = await store.get_job(OWNER, "job-1")
    assert (after.status, after.last_run_status, after.next_run_at) == (SCHEDULED, SUCCEEDED, at(4))
