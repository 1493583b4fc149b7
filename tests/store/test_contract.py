"""The JobStore contract (``core.ports``), run against every backend of ``conftest.BACKENDS``.

Only the public methods of :class:`core.ports.JobStore` are used, so a test that passes on one
backend and fails on another points at a difference in behaviour, not in storage layout. Every
instant is fixed (``T0`` and offsets from it), so the tests are deterministic.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from core.errors import Conflict, InvalidRequest, JobNotFound
from core.ids import execution_id
from core.model import (
    CronSchedule,
    Execution,
    ExecutionStatus,
    ImmediateSchedule,
    IntervalSchedule,
    Job,
    JobStatus,
    OnceSchedule,
    RunTrigger,
    Schedule,
    StatusEvent,
    state_rank,
)
from core.ports import Dispatch, DispatchOutcome, DueJob, JobQuery, JobStore
from core.runs import queued_run, run_event
from tests.store.conftest import BACKENDS

T0 = datetime(2026, 6, 1, tzinfo=UTC)
EVERY_JOB = JobQuery()
OWNER = "alice"
MINUTELY = CronSchedule(expression="* * * * *")
ALL_BACKENDS = tuple(b.id for b in BACKENDS)

QUEUED = ExecutionStatus.QUEUED
RUNNING = ExecutionStatus.RUNNING
RETRYING = ExecutionStatus.RETRYING
SUCCEEDED = ExecutionStatus.SUCCEEDED
FAILED = ExecutionStatus.FAILED


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    """``T0`` plus an offset: fixed instants with millisecond precision."""
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def make_job(
    job_id: str = "job-1",
    *,
    owner: str = OWNER,
    schedule: Schedule = MINUTELY,
    created_at: datetime = T0,
    next_run_at: datetime | None = None,
    task_id: str = "noop",
    **fields: Any,
) -> Job:
    return Job(
        id=job_id,
        owner=owner,
        task_id=task_id,
        schedule=schedule,
        created_at=created_at,
        updated_at=created_at,
        next_run_at=next_run_at,
        **fields,
    )


def make_execution(job: Job, scheduled_for: datetime, *, now: datetime | None = None) -> Execution:
    """The QUEUED record a scheduler dispatches for one occurrence of ``job`` at ``now``."""
    created = scheduled_for if now is None else now
    return queued_run(job, scheduled_for, created, "scheduler-1", RunTrigger.SCHEDULE)


def run_of(
    job: Job,
    scheduled_for: datetime,
    next_run_at: datetime | None,
    *,
    expected: datetime | None = None,
) -> Dispatch:
    """The Dispatch of ``job``'s occurrence ``scheduled_for`` (expected = that occurrence)."""
    return Dispatch(
        make_execution(job, scheduled_for),
        expected_next_run_at=scheduled_for if expected is None else expected,
        next_run_at=next_run_at,
    )


def event(
    ex: Execution, status: ExecutionStatus, attempt: int, when: datetime, **fields: Any
) -> StatusEvent:
    """A status event of ``ex`` as a worker publishes it."""
    return run_event(ex, status, attempt=attempt, at=when, **fields)


async def create(store: JobStore, *jobs: Job) -> None:
    for job in jobs:
        await store.create_job(job)


async def dispatched(
    store: JobStore, job: Job, scheduled_for: datetime, next_run_at: datetime | None
) -> Execution:
    """Dispatch one occurrence of an existing job (asserting it went through); its record."""
    run = run_of(job, scheduled_for, next_run_at)
    assert await store.dispatch([run]) == [DispatchOutcome(created=True, advanced=True)]
    return run.execution


async def apply_each(store: JobStore, *events: StatusEvent) -> int:
    """Apply ``events`` one call each, as a recorder that receives them one at a time."""
    return sum([await store.apply_events([ev]) for ev in events])


async def applied_together(store: JobStore, *events: StatusEvent) -> int:
    return await store.apply_events(events)


async def execution(store: JobStore, execution_id_: str) -> Execution:
    found = await store.get_execution(execution_id_)
    assert found is not None, f"execution {execution_id_} is not stored"
    return found


async def list_ids(
    store: JobStore, query: JobQuery = EVERY_JOB, *, owner: str = OWNER, limit: int = 100
) -> list[str]:
    page = await store.list_jobs(owner, query, limit=limit, cursor=None)
    assert page.next_cursor is None, "the listing did not fit one page"
    return [j.id for j in page.items]


async def walk(store: JobStore, query: JobQuery, *, limit: int) -> list[list[str]]:
    """Every page of ``OWNER``'s listing, following the cursors."""
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = await store.list_jobs(OWNER, query, limit=limit, cursor=cursor)
        pages.append([j.id for j in page.items])
        if page.next_cursor is None:
            return pages
        assert len(pages) <= 1000, "the cursor does not advance"
        cursor = page.next_cursor


def cursor_of(payload: bytes) -> str:
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


# --- create_job / get_job --------------------------------------------------------------------------

SCHEDULES = [
    pytest.param(ImmediateSchedule(), id="immediate"),
    pytest.param(OnceSchedule(execute_at=datetime(2026, 6, 2, 9, 30, 0, 250_000, UTC)), id="once"),
    pytest.param(
        CronSchedule(expression="30 2 * * 1-5", timezone="America/New_York"), id="cron-tz"
    ),
    pytest.param(CronSchedule(expression="*/5 * * * *"), id="cron-utc"),
    pytest.param(IntervalSchedule(every_seconds=90.5), id="interval"),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
async def test_a_job_round_trips_with_every_field(store: JobStore, schedule: Schedule) -> None:
    job = Job(
        id="job-rt",
        owner="alice@example.com",
        task_id="generate_report",
        schedule=schedule,
        parameters={"rows": 3, "name": "żółw", "nested": {"list": [1, 2.5, None, True, "x"]}},
        queue="reports",
        max_attempts=5,
        timeout_seconds=12.5,
        status=JobStatus.RUNNING,
        partition=17,
        created_at=datetime(2026, 6, 1, 8, 0, 0, 123_000, UTC),
        updated_at=datetime(2026, 6, 1, 8, 0, 1, 456_000, UTC),
        next_run_at=datetime(2026, 6, 1, 9, 0, 0, 1_000, UTC),
        last_run_at=datetime(2026, 6, 1, 8, 30, 0, 999_000, UTC),
        last_run_status=ExecutionStatus.FAILED,
        last_error="ValueError: boom",
        last_execution_id="job-rt:2026-06-01T08:30:00.000Z",
        last_scheduled_for=datetime(2026, 6, 1, 8, 30, tzinfo=UTC),
        run_count=7,
    )
    assert await store.create_job(job) == job

    got = await store.get_job("alice@example.com", "job-rt")

    assert got == job
    assert got.schedule == schedule
    instants = [got.created_at, got.updated_at, got.next_run_at, got.last_run_at]
    assert all(t is not None and t.utcoffset() == timedelta(0) for t in instants)
    assert got.created_at.microsecond == 123_000


async def test_a_job_with_only_defaults_round_trips(store: JobStore) -> None:
    job = make_job("job-min", schedule=ImmediateSchedule())
    await store.create_job(job)

    got = await store.get_job(OWNER, "job-min")

    assert got == job
    assert (got.next_run_at, got.last_run_status, got.last_error) == (None, None, None)


async def test_a_duplicate_job_id_is_a_conflict(store: JobStore) -> None:
    original = make_job("job-1", next_run_at=at(1))
    await store.create_job(original)

    with pytest.raises(Conflict):
        await store.create_job(make_job("job-1", owner="bob", next_run_at=at(9)))

    assert await store.get_job(OWNER, "job-1") == original
    with pytest.raises(JobNotFound):
        await store.get_job("bob", "job-1")


async def test_get_job_of_another_owner_or_unknown_id_is_not_found(store: JobStore) -> None:
    await store.create_job(make_job("job-1"))

    with pytest.raises(JobNotFound):
        await store.get_job("bob", "job-1")
    with pytest.raises(JobNotFound):
        await store.get_job(OWNER, "job-2")


# --- list_jobs ---------------------------------------------------------------------------------


async def test_list_jobs_is_newest_first_by_creation_time_then_id(store: JobStore) -> None:
    await create(
        store,
        make_job("a", created_at=at(0)),
        make_job("b", created_at=at(1)),
        make_job("c", created_at=at(1)),
        make_job("d", created_at=at(2)),
        make_job("e", created_at=at(-1)),
    )

    assert await list_ids(store) == ["d", "c", "b", "a", "e"]


FILTERS = [
    pytest.param(JobQuery(), ["j5", "j4", "j3", "j2", "j1"], id="none"),
    pytest.param(JobQuery(status=JobStatus.SCHEDULED), ["j3", "j1"], id="status"),
    pytest.param(JobQuery(last_run_status=FAILED), ["j4", "j3", "j2"], id="last-run-status"),
    pytest.param(JobQuery(created_from=at(1)), ["j5", "j4", "j3", "j2"], id="from-inclusive"),
    pytest.param(JobQuery(created_to=at(3)), ["j3", "j2", "j1"], id="to-exclusive"),
    pytest.param(JobQuery(created_from=at(1), created_to=at(3)), ["j3", "j2"], id="from-to"),
    pytest.param(
        JobQuery(status=JobStatus.SCHEDULED, last_run_status=FAILED), ["j3"], id="status-and-last"
    ),
    pytest.param(JobQuery(task_id="cleanup_export"), ["j5", "j2"], id="task"),
    pytest.param(
        JobQuery(task_id="cleanup_export", status=JobStatus.RUNNING), ["j2"], id="task-and-status"
    ),
    pytest.param(JobQuery(task_id="cleanup"), [], id="task-is-exact"),
    pytest.param(JobQuery(created_from=at(10)), [], id="nothing"),
]


@pytest.mark.parametrize(("query", "expected"), FILTERS)
async def test_list_jobs_filters(store: JobStore, query: JobQuery, expected: list[str]) -> None:
    await create(
        store,
        make_job("j1", created_at=at(0), status=JobStatus.SCHEDULED),
        make_job(
            "j2",
            created_at=at(1),
            status=JobStatus.RUNNING,
            last_run_status=FAILED,
            task_id="cleanup_export",
        ),
        make_job("j3", created_at=at(2), status=JobStatus.SCHEDULED, last_run_status=FAILED),
        make_job("j4", created_at=at(3), status=JobStatus.FAILED, last_run_status=FAILED),
        make_job(
            "j5",
            created_at=at(4),
            status=JobStatus.SUCCEEDED,
            last_run_status=SUCCEEDED,
            task_id="cleanup_export",
        ),
        make_job(
            "bob-1",
            owner="bob",
            task_id="cleanup_export",
            created_at=at(2),
            status=JobStatus.SCHEDULED,
            last_run_status=FAILED,
        ),
    )

    assert await list_ids(store, query) == expected


async def test_list_jobs_is_isolated_per_owner(store: JobStore) -> None:
    await create(
        store,
        make_job("a1", created_at=at(0)),
        make_job("b1", owner="bob", created_at=at(1)),
        make_job("a2", created_at=at(2)),
    )

    assert await list_ids(store) == ["a2", "a1"]
    assert await list_ids(store, owner="bob") == ["b1"]
    assert await list_ids(store, owner="carol") == []


def _paged_jobs() -> list[Job]:
    # 23 jobs, three per creation minute, ids not in creation order: ties are broken by id.
    return [make_job(f"job-{(i * 7) % 23:02d}", created_at=at(i // 3)) for i in range(23)]


def _newest_first(jobs: Sequence[Job]) -> list[str]:
    return [j.id for j in sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)]


@pytest.mark.parametrize("limit", [1, 5, 22, 23, 50])
async def test_list_jobs_cursor_walks_every_page_once(store: JobStore, limit: int) -> None:
    jobs = _paged_jobs()
    await create(store, *jobs)

    pages = await walk(store, JobQuery(), limit=limit)

    assert [job_id for page in pages for job_id in page] == _newest_first(jobs)
    assert all(len(page) == limit for page in pages[:-1])
    assert 1 <= len(pages[-1]) <= limit


async def test_list_jobs_cursor_walks_filtered_pages(store: JobStore) -> None:
    jobs = [
        make_job(
            f"job-{i:02d}",
            created_at=at(i // 2),
            status=JobStatus.SCHEDULED if i % 3 else JobStatus.FAILED,
        )
        for i in range(20)
    ]
    await create(store, *jobs)

    pages = await walk(store, JobQuery(status=JobStatus.SCHEDULED), limit=4)

    scheduled = [j for j in jobs if j.status == JobStatus.SCHEDULED]
    assert [job_id for page in pages for job_id in page] == _newest_first(scheduled)


async def test_list_jobs_cursor_is_stable_while_new_jobs_are_created(store: JobStore) -> None:
    jobs = [make_job(f"old-{i:02d}", created_at=at(i)) for i in range(16)]
    await create(store, *jobs)
    first = await store.list_jobs(OWNER, JobQuery(), limit=4, cursor=None)
    seen = [j.id for j in first.items]
    cursor = first.next_cursor

    newer = [
        make_job("new-a", created_at=at(20)),
        make_job("new-b", created_at=at(20)),
        make_job("zzz-same-minute-as-newest", created_at=at(15)),
    ]
    while cursor is not None:
        if newer:
            await store.create_job(newer.pop())
        page = await store.list_jobs(OWNER, JobQuery(), limit=4, cursor=cursor)
        seen.extend(j.id for j in page.items)
        cursor = page.next_cursor

    assert seen == _newest_first(jobs)
    assert (await list_ids(store))[:3] == ["new-b", "new-a", "zzz-same-minute-as-newest"]


BAD_CURSORS = [
    pytest.param("not a cursor!", id="garbage"),
    pytest.param("", id="empty"),
    pytest.param("żółw", id="non-ascii"),
    pytest.param(cursor_of(b'{"createdAt": 1}'), id="json-object"),
    pytest.param(cursor_of(b'["a", "b"]'), id="wrong-types"),
    pytest.param(cursor_of(b"[1]"), id="too-short"),
    pytest.param(cursor_of(b"\xff\xfe\x00"), id="binary"),
]


@pytest.mark.parametrize("cursor", BAD_CURSORS)
async def test_list_jobs_rejects_a_bad_cursor(store: JobStore, cursor: str) -> None:
    await create(store, *[make_job(f"job-{i}", created_at=at(i)) for i in range(3)])

    with pytest.raises(InvalidRequest) as caught:
        await store.list_jobs(OWNER, JobQuery(), limit=2, cursor=cursor)

    assert [e.field for e in caught.value.errors] == ["cursor"]


async def test_list_jobs_rejects_a_cursor_with_an_out_of_range_instant(store: JobStore) -> None:
    await create(store, make_job("job-1"))
    cursor = cursor_of(msgspec.json.encode((2**70, "job-1")))

    with pytest.raises(InvalidRequest) as caught:
        await store.list_jobs(OWNER, JobQuery(), limit=2, cursor=cursor)

    assert [e.field for e in caught.value.errors] == ["cursor"]


# --- list_executions -----------------------------------------------------------------------


async def test_list_executions_is_newest_scheduled_first_with_cursor(store: JobStore) -> None:
    job = make_job("job-1", next_run_at=at(1))
    await store.create_job(job)
    for minute in range(1, 8):
        await dispatched(store, job, at(minute), at(minute + 1))
    await store.create_job(make_job("other", next_run_at=at(1)))
    await dispatched(store, make_job("other"), at(1), at(2))

    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        page = await store.list_executions(OWNER, "job-1", limit=3, cursor=cursor)
        seen.extend(e.id for e in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break

    assert seen == [execution_id("job-1", at(minute)) for minute in range(7, 0, -1)]
    with pytest.raises(JobNotFound):
        await store.list_executions("bob", "job-1", limit=3, cursor=None)
    with pytest.raises(InvalidRequest):
        await store.list_executions(OWNER, "job-1", limit=3, cursor="not a cursor!")


# --- due_jobs ----------------------------------------------------------------------------------


async def test_due_jobs_selects_partitions_and_due_time_earliest_first(store: JobStore) -> None:
    await create(
        store,
        make_job("a", partition=0, next_run_at=at(1)),
        make_job("b", partition=1, next_run_at=at(3)),
        make_job("c", partition=2, next_run_at=at(2)),
        make_job("d", partition=1, next_run_at=at(5)),
        make_job("e", partition=3, next_run_at=at(0)),
        make_job("f", partition=0, next_run_at=None),
        make_job("g", partition=1, next_run_at=at(4)),
    )

    due = await store.due_jobs({0, 1, 2}, at(4), limit=10)

    assert [j.id for j in due] == ["a", "c", "b", "g"]
    assert [j.id for j in await store.due_jobs([0, 1, 2], at(4), limit=2)] == ["a", "c"]
    assert [j.id for j in await store.due_jobs({3}, at(4), limit=10)] == ["e"]
    assert [j.id for j in await store.due_jobs({0, 1, 2}, at(0.5), limit=10)] == []
    assert await store.due_jobs(set(), at(100), limit=10) == []


async def test_due_jobs_returns_each_jobs_id_due_time_and_partition(store: JobStore) -> None:
    """A scan reads what the scheduler's heap holds, not the jobs (read at dispatch)."""
    job = make_job("a", partition=5, next_run_at=at(1), parameters={"k": [1, 2]}, queue="q1")
    await store.create_job(job)

    due = await store.due_jobs({5}, at(1), limit=1)

    assert due == [DueJob("a", at(1), 5)]
    assert due[0].next_run_at.tzinfo is not None and due[0].next_run_at.utcoffset() == timedelta()


# --- dispatch ------------------------------------------------------------------------------


async def test_first_dispatch_inserts_the_run_and_advances_the_job(store: JobStore) -> None:
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    run = Dispatch(
        make_execution(job, at(1), now=at(1, 0.25)), expected_next_run_at=at(1), next_run_at=at(2)
    )

    assert await store.dispatch([run]) == [DispatchOutcome(created=True, advanced=True)]

    stored = await execution(store, run.execution.id)
    assert stored == run.execution
    assert stored.status == QUEUED
    got = await store.get_job(OWNER, job.id)
    assert (got.next_run_at, got.last_scheduled_for, got.run_count) == (at(2), at(1), 1)
    assert got.last_dispatched_for == got.last_scheduled_for
    unchanged = msgspec.structs.replace(
        got,
        next_run_at=at(1),
        last_scheduled_for=None,
        last_dispatched_for=None,
        run_count=0,
        updated_at=job.updated_at,
    )
    assert unchanged == job
    assert [j.id for j in await store.due_jobs({0}, at(1, 59), limit=10)] == []


async def test_repeated_dispatch_creates_nothing_and_advances_once(store: JobStore) -> None:
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    run = run_of(job, at(1), at(2))
    await store.dispatch([run])
    await store.apply_events([event(run.execution, RUNNING, 1, at(1, 1), started_at=at(1, 1))])
    before = await execution(store, run.execution.id)

    again = await store.dispatch([run])

    assert [o.created for o in again] == [False]
    got = await store.get_job(OWNER, job.id)
    assert (got.next_run_at, got.last_scheduled_for, got.run_count) == (at(2), at(1), 1)
    assert await execution(store, run.execution.id) == before


async def test_a_retried_dispatch_that_already_went_through_reports_advanced(
    store: JobStore,
) -> None:
    """A scheduler that retries a dispatch whose first call committed (the answer was lost) must
    still publish the run, so the twin reports ``advanced`` (publishing is de-duplicated by the
    execution id); it creates nothing."""
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    run = run_of(job, at(1), at(2))
    await store.dispatch([run])

    assert await store.dispatch([run]) == [DispatchOutcome(created=False, advanced=True)]


async def test_dispatch_with_a_stale_expected_time_changes_nothing(store: JobStore) -> None:
    job = make_job(next_run_at=at(5))  # rescheduled since the scheduler read it at 1
    await store.create_job(job)
    run = run_of(job, at(1), at(2), expected=at(1))

    assert await store.dispatch([run]) == [DispatchOutcome(created=False, advanced=False)]

    assert await store.get_execution(run.execution.id) is None
    assert await store.get_job(OWNER, job.id) == job


async def test_a_competing_dispatch_with_another_plan_is_not_advanced(store: JobStore) -> None:
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    winner = await dispatched(store, job, at(1), at(2))

    # Another scheduler read the job before the winner advanced it, and planned a later next run.
    loser = run_of(job, at(1), at(3), expected=at(1))

    assert await store.dispatch([loser]) == [DispatchOutcome(created=False, advanced=False)]
    got = await store.get_job(OWNER, job.id)
    assert (got.next_run_at, got.run_count) == (at(2), 1)
    assert await execution(store, winner.id) == winner


async def test_dispatch_of_a_missing_job_changes_nothing(store: JobStore) -> None:
    ghost = make_job("ghost", next_run_at=at(1))
    run = run_of(ghost, at(1), at(2))

    assert await store.dispatch([run]) == [DispatchOutcome(created=False, advanced=False)]
    assert await store.get_execution(run.execution.id) is None


async def test_dispatch_of_an_already_reported_run_advances_without_resetting_it(
    store: JobStore,
) -> None:
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    run = run_of(job, at(1), at(2))
    # The worker's RUNNING event was recorded before the scheduler's store write.
    assert await store.apply_events([event(run.execution, RUNNING, 1, at(1, 2))]) == 1

    assert await store.dispatch([run]) == [DispatchOutcome(created=False, advanced=True)]

    assert (await execution(store, run.execution.id)).status == RUNNING
    assert (await store.get_job(OWNER, job.id)).next_run_at == at(2)


async def test_a_dispatch_batch_keeps_the_order_of_mixed_outcomes(store: JobStore) -> None:
    a = make_job("a", next_run_at=at(1))
    b = make_job("b", next_run_at=at(5))
    c = make_job("c", next_run_at=at(1))
    e = make_job("e", next_run_at=at(1), schedule=ImmediateSchedule())
    await create(store, a, b, c, e)
    c_run = run_of(c, at(1), at(2))
    await store.apply_events([event(c_run.execution, RUNNING, 1, at(1, 1))])
    runs = [
        run_of(a, at(1), at(2)),
        run_of(b, at(1), at(2), expected=at(1)),
        c_run,
        run_of(make_job("missing"), at(1), at(2)),
        run_of(e, at(1), None),
    ]

    outcomes = await store.dispatch(runs)

    assert outcomes == [
        DispatchOutcome(created=True, advanced=True),
        DispatchOutcome(created=False, advanced=False),
        DispatchOutcome(created=False, advanced=True),
        DispatchOutcome(created=False, advanced=False),
        DispatchOutcome(created=True, advanced=True),
    ]
    stored = [await store.get_execution(r.execution.id) is not None for r in runs]
    assert stored == [True, False, True, False, True]
    assert await store.dispatch([]) == []


async def test_dispatch_without_a_next_run_finishes_a_one_time_job(store: JobStore) -> None:
    job = make_job(schedule=ImmediateSchedule(), next_run_at=at(0))
    await store.create_job(job)

    await dispatched(store, job, at(0), None)

    got = await store.get_job(OWNER, job.id)
    assert (got.next_run_at, got.last_scheduled_for, got.run_count) == (None, at(0), 1)
    assert await store.due_jobs({0}, at(10_000), limit=10) == []


async def test_a_batch_with_consecutive_occurrences_of_one_job_records_both(
    store: JobStore,
) -> None:
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    runs = [run_of(job, at(1), at(2)), run_of(job, at(2), at(3))]

    outcomes = await store.dispatch(runs)

    assert outcomes == [DispatchOutcome(created=True, advanced=True)] * 2
    assert [await store.get_execution(r.execution.id) is not None for r in runs] == [True, True]
    got = await store.get_job(OWNER, job.id)
    assert (got.next_run_at, got.last_scheduled_for, got.run_count) == (at(3), at(2), 2)


# --- apply_events: executions --------------------------------------------------------------


async def dispatched_job(
    store: JobStore, *, schedule: Schedule = MINUTELY, next_run_at: datetime | None = None
) -> tuple[Job, Execution]:
    """A job with its first occurrence (at 1) dispatched; the next run is ``next_run_at``."""
    job = make_job(schedule=schedule, next_run_at=at(1))
    await store.create_job(job)
    return job, await dispatched(store, job, at(1), next_run_at)


async def test_events_follow_the_state_order_to_success(store: JobStore) -> None:
    _, ex = await dispatched_job(store, next_run_at=at(2))
    steps = [
        (event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1)), RUNNING, 1),
        (event(ex, RETRYING, 1, at(1, 2), error="boom"), RETRYING, 1),
        (event(ex, RUNNING, 2, at(1, 3), started_at=at(1, 3)), RUNNING, 2),
        (event(ex, SUCCEEDED, 2, at(1, 4), finished_at=at(1, 4)), SUCCEEDED, 2),
    ]

    for ev, status, attempt in steps:
        assert await store.apply_events([ev]) == 1, f"{status} {attempt} was not applied"
        stored = await execution(store, ex.id)
        assert (stored.status, stored.attempt) == (status, attempt)
        assert stored.state_rank == state_rank(status, attempt)


LATE_AFTER_SUCCESS = [
    pytest.param(RUNNING, 1, id="running-1"),
    pytest.param(RETRYING, 1, id="retrying-1"),
    pytest.param(RUNNING, 3, id="running-3"),
    pytest.param(QUEUED, 0, id="queued"),
    pytest.param(SUCCEEDED, 2, id="duplicate-success"),
    pytest.param(FAILED, 3, id="failed"),
]


@pytest.mark.parametrize(("status", "attempt"), LATE_AFTER_SUCCESS)
async def test_a_late_event_never_overwrites_success(
    store: JobStore, status: ExecutionStatus, attempt: int
) -> None:
    _, ex = await dispatched_job(store, next_run_at=at(2))
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1)),
            event(ex, SUCCEEDED, 2, at(1, 4), finished_at=at(1, 4), result={"ok": True}),
        ]
    )
    done = await execution(store, ex.id)

    late = event(ex, status, attempt, at(1, 9), started_at=at(1, 9), error="late")

    assert await store.apply_events([late]) == 0
    after = await execution(store, ex.id)
    # The run is as it was; only its attempt history may learn of an attempt it had not heard of
    # (test_contract_history.py checks how).
    assert msgspec.structs.replace(after, attempts=[]) == msgspec.structs.replace(done, attempts=[])
    history = {a.attempt: msgspec.structs.asdict(a) for a in after.attempts}
    for before in done.attempts:  # what was known of an attempt stays (the late event is later)
        known = {k: v for k, v in msgspec.structs.asdict(before).items() if v is not None}
        del known["redelivered"]
        assert known.items() <= history[before.attempt].items()


async def test_out_of_order_events_keep_the_highest_state(store: JobStore) -> None:
    _, ex = await dispatched_job(store, next_run_at=at(2))

    assert await store.apply_events([event(ex, RUNNING, 2, at(1, 3))]) == 1
    assert await store.apply_events([event(ex, RETRYING, 1, at(1, 2))]) == 0
    assert await store.apply_events([event(ex, RUNNING, 1, at(1, 1))]) == 0

    stored = await execution(store, ex.id)
    assert (stored.status, stored.attempt) == (RUNNING, 2)


async def test_apply_events_counts_the_executions_it_changed(store: JobStore) -> None:
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    ex1 = await dispatched(store, job, at(1), at(2))
    ex2 = await dispatched(store, job, at(2), at(3))
    await store.apply_events([event(ex2, RUNNING, 1, at(2, 1))])
    ex3 = make_execution(job, at(3))  # not dispatched yet

    changed = await store.apply_events(
        [
            event(ex1, RUNNING, 1, at(2, 5)),
            event(ex1, RUNNING, 1, at(2, 5)),  # duplicate in the same batch
            event(ex2, QUEUED, 0, at(2, 5)),  # stale
            event(ex2, RUNNING, 1, at(2, 5)),  # duplicate of the stored state
            event(ex3, RUNNING, 1, at(3, 1)),  # inserts
        ]
    )

    assert changed == 2
    assert await store.apply_events([]) == 0


async def test_first_start_and_publish_times_are_kept(store: JobStore) -> None:
    _, ex = await dispatched_job(store, next_run_at=at(2))
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1), published_at=at(1, 0.5)),
            event(ex, RETRYING, 1, at(1, 2), started_at=at(1, 1), published_at=at(1, 0.5)),
            event(ex, RUNNING, 2, at(1, 3), started_at=at(1, 3), published_at=at(1, 2.5)),
        ]
    )

    stored = await execution(store, ex.id)
    assert (stored.started_at, stored.published_at) == (at(1, 1), at(1, 0.5))


async def test_error_survives_a_retry_and_is_cleared_on_success(store: JobStore) -> None:
    _, ex = await dispatched_job(store, next_run_at=at(2))
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1), worker_id="w1"),
            event(ex, RETRYING, 1, at(1, 2), error="boom", next_attempt_at=at(1, 5)),
        ]
    )
    retrying = await execution(store, ex.id)
    assert (retrying.error, retrying.next_attempt_at) == ("boom", at(1, 5))

    await store.apply_events([event(ex, RUNNING, 2, at(1, 5), started_at=at(1, 5), worker_id="w2")])
    assert (await execution(store, ex.id)).error == "boom"

    result = {"rows": 3, "file": "report.csv", "parts": [1, 2.5, None]}
    await store.apply_events(
        [event(ex, SUCCEEDED, 2, at(1, 7), finished_at=at(1, 7), worker_id="w2", result=result)]
    )
    done = await execution(store, ex.id)
    assert (done.status, done.error, done.finished_at) == (SUCCEEDED, None, at(1, 7))
    assert (done.result, done.worker_id) == (result, "w2")


async def test_a_failed_run_keeps_its_error(store: JobStore) -> None:
    _, ex = await dispatched_job(store, next_run_at=at(2))
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1)),
            event(ex, FAILED, 1, at(1, 2), finished_at=at(1, 2), error="ValueError: bad input"),
        ]
    )

    failed = await execution(store, ex.id)
    assert (failed.status, failed.error, failed.finished_at) == (
        FAILED,
        "ValueError: bad input",
        at(1, 2),
    )


async def test_an_event_of_an_unknown_execution_inserts_it(store: JobStore) -> None:
    job = make_job(partition=9, next_run_at=at(1), queue="reports", max_attempts=4)
    ex = make_execution(job, at(1))
    ev = event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1), worker_id="w1", published_at=at(1))

    assert await store.apply_events([ev]) == 1

    stored = await execution(store, ex.id)
    assert (stored.job_id, stored.owner, stored.partition, stored.task_id) == (
        job.id,
        OWNER,
        9,
        "noop",
    )
    assert (stored.queue, stored.max_attempts, stored.scheduled_for) == ("reports", 4, at(1))
    assert (stored.status, stored.attempt, stored.state_rank) == (
        RUNNING,
        1,
        state_rank(RUNNING, 1),
    )
    assert (stored.started_at, stored.published_at, stored.worker_id) == (at(1, 1), at(1), "w1")


# --- apply_events: the job's summary ------------------------------------------------------------


async def test_a_one_time_job_runs_then_succeeds(store: JobStore) -> None:
    job, ex = await dispatched_job(store, schedule=ImmediateSchedule(), next_run_at=None)

    await store.apply_events([event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1))])
    running = await store.get_job(OWNER, job.id)
    assert (running.status, running.last_run_at, running.last_execution_id) == (
        JobStatus.RUNNING,
        at(1, 1),
        ex.id,
    )
    assert running.last_run_status is None

    await store.apply_events(
        [event(ex, SUCCEEDED, 1, at(1, 2), started_at=at(1, 1), finished_at=at(1, 2))]
    )
    done = await store.get_job(OWNER, job.id)
    assert (done.status, done.last_run_status, done.last_error) == (
        JobStatus.SUCCEEDED,
        SUCCEEDED,
        None,
    )
    assert (done.last_run_at, done.last_execution_id) == (at(1, 1), ex.id)


async def test_a_one_time_job_retries_then_fails(store: JobStore) -> None:
    job, ex = await dispatched_job(store, schedule=ImmediateSchedule(), next_run_at=None)

    await apply_each(
        store,
        event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1)),
        event(ex, RETRYING, 1, at(1, 2), started_at=at(1, 1), error="first"),
    )
    retrying = await store.get_job(OWNER, job.id)
    assert (retrying.status, retrying.last_error) == (JobStatus.RUNNING, "first")
    assert retrying.last_run_status is None

    await apply_each(
        store,
        event(ex, RUNNING, 2, at(1, 3), started_at=at(1, 3)),
        event(ex, FAILED, 2, at(1, 4), started_at=at(1, 3), finished_at=at(1, 4), error="final"),
    )
    failed = await store.get_job(OWNER, job.id)
    assert (failed.status, failed.last_run_status, failed.last_error) == (
        JobStatus.FAILED,
        FAILED,
        "final",
    )
    assert failed.last_execution_id == ex.id
    assert await list_ids(store, JobQuery(status=JobStatus.FAILED)) == [job.id]


async def test_last_run_at_is_when_the_run_first_started(store: JobStore) -> None:
    job, ex = await dispatched_job(store, schedule=ImmediateSchedule(), next_run_at=None)

    # As the worker reports them: every event of an attempt carries that attempt's start.
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1)),
            event(ex, RETRYING, 1, at(1, 2), started_at=at(1, 1), error="first"),
            event(ex, RUNNING, 2, at(1, 3), started_at=at(1, 3)),
            event(ex, SUCCEEDED, 2, at(1, 4), started_at=at(1, 3), finished_at=at(1, 4)),
        ]
    )

    started = (await execution(store, ex.id)).started_at
    assert started == at(1, 1)
    assert (await store.get_job(OWNER, job.id)).last_run_at == started


async def test_a_recurring_job_returns_to_scheduled_after_each_run(store: JobStore) -> None:
    job, ex1 = await dispatched_job(store, next_run_at=at(2))

    await store.apply_events([event(ex1, RUNNING, 1, at(1, 1), started_at=at(1, 1))])
    assert (await store.get_job(OWNER, job.id)).status == JobStatus.RUNNING

    await store.apply_events([event(ex1, SUCCEEDED, 1, at(1, 2), finished_at=at(1, 2))])
    after_1 = await store.get_job(OWNER, job.id)
    assert (after_1.status, after_1.last_run_status, after_1.last_execution_id) == (
        JobStatus.SCHEDULED,
        SUCCEEDED,
        ex1.id,
    )
    assert after_1.next_run_at == at(2)

    ex2 = await dispatched(store, after_1, at(2), at(3))
    await apply_each(
        store,
        event(ex2, RUNNING, 1, at(2, 1), started_at=at(2, 1)),
        event(ex2, FAILED, 1, at(2, 2), started_at=at(2, 1), finished_at=at(2, 2), error="boom"),
    )
    after_2 = await store.get_job(OWNER, job.id)
    assert (after_2.status, after_2.last_run_status, after_2.last_error) == (
        JobStatus.SCHEDULED,
        FAILED,
        "boom",
    )
    assert (after_2.last_run_at, after_2.last_execution_id) == (at(2, 1), ex2.id)
    assert await list_ids(store, JobQuery(last_run_status=FAILED)) == [job.id]
    assert await list_ids(store, JobQuery(status=JobStatus.SCHEDULED)) == [job.id]


async def test_a_late_event_of_an_older_run_does_not_override_a_newer_run(
    store: JobStore,
) -> None:
    job, old = await dispatched_job(store, next_run_at=at(2))
    await store.apply_events([event(old, RUNNING, 1, at(1, 1), started_at=at(1, 1))])
    new = await dispatched(store, await store.get_job(OWNER, job.id), at(2), at(3))
    await store.apply_events([event(new, RUNNING, 1, at(2, 1), started_at=at(2, 1))])
    summary = await store.get_job(OWNER, job.id)

    late = event(old, SUCCEEDED, 1, at(2, 5), started_at=at(1, 1), finished_at=at(2, 5))
    assert await store.apply_events([late]) == 1

    assert (await execution(store, old.id)).status == SUCCEEDED
    got = await store.get_job(OWNER, job.id)
    assert (got.status, got.last_execution_id, got.last_run_at) == (
        JobStatus.RUNNING,
        new.id,
        at(2, 1),
    )
    assert got.last_run_status is None
    assert got == summary


async def test_a_stale_event_does_not_touch_the_job(store: JobStore) -> None:
    job, ex = await dispatched_job(store, schedule=ImmediateSchedule(), next_run_at=None)
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1)),
            event(ex, SUCCEEDED, 1, at(1, 2), started_at=at(1, 1), finished_at=at(1, 2)),
        ]
    )
    done = await store.get_job(OWNER, job.id)

    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 9), started_at=at(1, 9)),
            event(ex, RETRYING, 1, at(1, 9), error="late"),
        ]
    )

    assert await store.get_job(OWNER, job.id) == done


async def test_a_late_failure_after_success_does_not_touch_the_job(store: JobStore) -> None:
    job, ex = await dispatched_job(store, schedule=ImmediateSchedule(), next_run_at=None)
    await store.apply_events(
        [
            event(ex, RUNNING, 1, at(1, 1), started_at=at(1, 1)),
            event(ex, SUCCEEDED, 1, at(1, 2), started_at=at(1, 1), finished_at=at(1, 2)),
        ]
    )
    done = await store.get_job(OWNER, job.id)

    # e.g. a redelivery that another worker gave up on, reported after the first one succeeded
    late = event(ex, FAILED, 2, at(1, 9), finished_at=at(1, 9), error="max deliveries")
    assert await store.apply_events([late]) == 0

    assert (await execution(store, ex.id)).status == SUCCEEDED
    assert await store.get_job(OWNER, job.id) == done


BATCHES = {
    "ends-failed": (
        (RUNNING, 1, None),
        (RETRYING, 1, "first"),
        (RUNNING, 2, None),
        (FAILED, 2, "final"),
    ),
    "ends-running-after-a-retry": ((RUNNING, 1, None), (RETRYING, 1, "first"), (RUNNING, 2, None)),
    "ends-succeeded": ((RUNNING, 1, None), (SUCCEEDED, 1, None)),
}


@pytest.mark.parametrize("steps", BATCHES.values(), ids=BATCHES.keys())
async def test_a_batch_updates_the_job_as_its_events_one_by_one(
    store: JobStore, steps: tuple[tuple[ExecutionStatus, int, str | None], ...]
) -> None:
    results = []
    for job_id, apply in (("one-by-one", apply_each), ("batched", applied_together)):
        job = make_job(job_id, schedule=ImmediateSchedule(), next_run_at=at(1))
        await store.create_job(job)
        ex = await dispatched(store, job, at(1), None)
        events = [
            event(
                ex,
                status,
                attempt,
                at(1, i + 1),
                started_at=at(1, i + 1) if status == RUNNING else None,
                finished_at=at(1, i + 1) if status in (SUCCEEDED, FAILED) else None,
                error=error,
            )
            for i, (status, attempt, error) in enumerate(steps)
        ]
        await apply(store, *events)
        got = await store.get_job(OWNER, job.id)
        run = await execution(store, ex.id)
        results.append(
            (
                got.status,
                got.last_run_at,
                got.last_run_status,
                got.last_error,
                got.updated_at,
                run.status,
                run.attempt,
                run.error,
            )
        )

    assert results[1] == results[0]


# --- stale_executions ----------------------------------------------------------------------


async def test_stale_executions_are_unfinished_old_runs_of_the_partitions(store: JobStore) -> None:
    jobs = {p: make_job(f"job-p{p}", partition=p, next_run_at=at(1)) for p in (0, 1, 2)}
    await create(store, *jobs.values())
    queued = await dispatched(store, jobs[0], at(1), at(2))
    other_partition = await dispatched(store, jobs[2], at(1), at(2))
    running = make_execution(jobs[1], at(3))
    retrying = make_execution(jobs[0], at(4))
    succeeded = make_execution(jobs[0], at(5))
    failed = make_execution(jobs[1], at(6))
    at_cutoff = make_execution(jobs[0], at(7))
    fresh = make_execution(jobs[1], at(8))
    await store.apply_events(
        [
            event(running, RUNNING, 1, at(3)),
            event(retrying, RUNNING, 1, at(0)),
            event(retrying, RETRYING, 1, at(2)),
            event(succeeded, SUCCEEDED, 1, at(0.5)),
            event(failed, FAILED, 1, at(0)),
            event(at_cutoff, RUNNING, 1, at(10)),
            event(fresh, RUNNING, 1, at(11)),
        ]
    )

    stale = await store.stale_executions({0, 1}, at(10), limit=10)

    assert [e.id for e in stale] == [queued.id, retrying.id, running.id]
    assert stale[0] == queued
    limited = await store.stale_executions([0, 1], at(10), limit=2)
    assert [e.id for e in limited] == [queued.id, retrying.id]
    assert [e.id for e in await store.stale_executions({2}, at(10), limit=10)] == [
        other_partition.id
    ]
    assert await store.stale_executions({0, 1}, at(0), limit=10) == []
    assert await store.stale_executions(set(), at(100), limit=10) == []
    recent = await store.stale_executions({0, 1}, at(100), limit=10, updated_after=at(2))
    assert [e.id for e in recent] == [retrying.id, running.id, at_cutoff.id, fresh.id]
    assert await store.stale_executions({0, 1}, at(100), limit=10, updated_after=at(12)) == []


# --- get_execution, get_jobs, ping ---------------------------------------------------------


async def test_get_execution_of_an_unknown_id_is_none(store: JobStore) -> None:
    assert await store.get_execution("job-1:2026-06-01T00:00:00.000Z") is None


async def test_get_jobs_returns_the_existing_jobs_of_any_owner(store: JobStore) -> None:
    alice = make_job("a1", next_run_at=at(1))
    bob = make_job("b1", owner="bob", schedule=IntervalSchedule(every_seconds=30))
    await create(store, alice, bob, make_job("a2"))

    got = await store.get_jobs(["b1", "missing", "a1", "a1"])

    assert sorted(got, key=lambda j: j.id) == [alice, bob]
    assert await store.get_jobs([]) == []
    assert await store.get_jobs(["missing"]) == []


async def test_get_jobs_handles_large_id_sets(store: JobStore) -> None:
    jobs = [make_job(f"job-{i:04d}") for i in range(1200)]
    await create(store, *jobs)

    got = await store.get_jobs([j.id for j in jobs] + ["missing"])

    assert sorted(j.id for j in got) == [j.id for j in jobs]


async def test_ping_answers(store: JobStore) -> None:
    await store.ping()
