"""The job service (:class:`gateway.service.JobService`) on the in-memory bus and cancel-marker
fakes (``tests/fakes.py``), a SQLite store in a temp dir and a fake clock: what each operation
records, publishes and signals, without NATS or HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from core.access import Principal, Role
from core.audit import AuditQuery, AuditRecord
from core.clock import FakeClock
from core.errors import QuotaExceeded
from core.model import (
    CronScheduleIn,
    ExecutionStatus,
    Job,
    JobCreate,
    JobEvent,
    JobNotice,
    JobStatus,
    RunTrigger,
    StatusEvent,
)
from core.ports import JobStatusConflict
from core.quotas import Quotas
from core.settings import GatewayConfig
from gateway.service import JobService
from jobsched.tasks import builtin_catalog
from store.sqlite import SqliteStore
from tests.fakes import FakeBus, FakeCancelSignals

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
ALICE = Principal("alice")
ROOT = Principal("root", Role.ADMIN)
EVERY_MINUTE = JobCreate(
    task_id="noop", schedule=CronScheduleIn(expression="* * * * *", timezone="UTC")
)


@dataclass
class Rig:
    service: JobService
    store: SqliteStore
    bus: FakeBus
    markers: FakeCancelSignals
    clock: FakeClock
    notices: list[JobNotice]

    def job_events(self) -> list[tuple[str, str, JobStatus, str | None]]:
        return [
            (e.job_id, e.event, e.status, e.actor)
            for e in self.bus.events
            if isinstance(e, JobEvent)
        ]

    def run_events(self) -> list[StatusEvent]:
        return [e for e in self.bus.events if isinstance(e, StatusEvent)]

    async def audit_of(self, job_id: str, action: str) -> AuditRecord:
        """The job's one audit record of ``action`` (records of one instant of the fake clock
        have no order between them)."""
        page = await self.store.list_audit(AuditQuery(job_id=job_id), limit=50, cursor=None)
        [record] = [r for r in page.items if r.action == action]
        return record

    async def job(self) -> tuple[Job, Job]:
        """A recurring job of alice's (next run at 12:01), as created and as stored."""
        created, _ = await self.service.create(ALICE, EVERY_MINUTE)
        return created, await self.store.get_job("alice", created.id)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    rig = await make_rig(tmp_path)
    yield rig
    await rig.store.close()


async def make_rig(tmp_path: Path, quotas: Quotas | None = None) -> Rig:
    store = SqliteStore(tmp_path / "service.db")
    await store.open()
    bus, markers, clock = FakeBus(), FakeCancelSignals(), FakeClock(T0)
    config = GatewayConfig(partitions=8, quotas=quotas or Quotas())
    service = JobService(store, bus, builtin_catalog(), clock, config, markers)
    notices: list[JobNotice] = []

    async def heard(notice: JobNotice) -> None:
        notices.append(notice)

    await bus.subscribe_notices(heard)
    return Rig(service, store, bus, markers, clock, notices)


async def test_create_tells_the_partition_and_publishes_a_created_event(rig: Rig) -> None:
    job, _ = await rig.job()

    assert rig.notices == [
        JobNotice(job_id=job.id, partition=job.partition, next_run_at=job.next_run_at)
    ]
    assert job.next_run_at == datetime(2026, 6, 1, 12, 1, tzinfo=UTC)
    assert rig.job_events() == [(job.id, "created", JobStatus.SCHEDULED, "alice")]


async def test_trigger_dispatches_a_manual_run_as_a_scheduled_one_is_dispatched(rig: Rig) -> None:
    _, before = await rig.job()
    await rig.clock.advance(5)

    run = await rig.service.trigger(ALICE, before.id)

    assert (run.status, run.trigger, run.scheduled_for) == (
        ExecutionStatus.QUEUED,
        RunTrigger.MANUAL,
        T0 + timedelta(seconds=5),
    )
    assert await rig.store.get_execution(run.id) == run
    after = await rig.store.get_job("alice", before.id)  # counted; the schedule is left alone
    assert after == msgspec.structs.replace(before, run_count=before.run_count + 1)
    [queued] = rig.run_events()
    assert (queued.execution_id, queued.status, queued.attempt) == (run.id, run.status, 0)
    [published] = rig.bus.published
    assert published.stored
    message = published.run
    assert (message.execution_id, message.job_id, message.trigger) == (
        run.id,
        before.id,
        RunTrigger.MANUAL,
    )
    assert (message.published_at, message.attempt_offset, message.redispatched_at_ms) == (
        rig.clock.now(),
        0,
        0,
    )
    triggered = await rig.audit_of(before.id, "triggered")
    assert (triggered.action, triggered.actor, triggered.execution_id) == (
        "triggered",
        "alice",
        run.id,
    )


async def test_an_admin_triggers_another_users_job_as_themselves(rig: Rig) -> None:
    job, _ = await rig.job()

    run = await rig.service.trigger(ROOT, job.id)

    assert run.owner == "alice"
    triggered = await rig.audit_of(job.id, "triggered")
    assert (triggered.actor, triggered.owner) == ("root", "alice")


async def test_a_triggered_run_whose_publish_fails_is_left_queued_for_re_dispatch(
    rig: Rig,
) -> None:
    job, _ = await rig.job()
    rig.bus.fail("publish_runs")

    run = await rig.service.trigger(ALICE, job.id)

    assert rig.bus.published == []
    assert rig.bus.streams_ensured == 0  # not the gateway's to do: its NATS user may not
    assert [e.execution_id for e in rig.run_events()] == [run.id]  # QUEUED went out
    later = rig.clock.now() + timedelta(minutes=5)
    assert await rig.store.stale_executions({job.partition}, later, limit=5) == [run]


async def test_triggers_beyond_runs_per_minute_are_refused_and_record_nothing(
    tmp_path: Path,
) -> None:
    rig = await make_rig(tmp_path / "quota", Quotas(runs_per_minute=1))
    try:
        job, _ = await rig.job()
        first = await rig.service.trigger(ALICE, job.id)
        with pytest.raises(QuotaExceeded) as refused:
            await rig.service.trigger(ALICE, job.id)
        assert refused.value.limit == "runsPerMinute"
        page = await rig.store.list_executions("alice", job.id, limit=5, cursor=None)
        assert page.items == [first]
        assert [p.run.execution_id for p in rig.bus.published] == [first.id]

        await rig.clock.advance(60)
        second = await rig.service.trigger(ALICE, job.id)
        assert [p.run.execution_id for p in rig.bus.published] == [first.id, second.id]
    finally:
        await rig.store.close()


async def test_cancel_marks_the_job_publishes_its_event_and_stops_triggers(rig: Rig) -> None:
    job, _ = await rig.job()
    await rig.clock.advance(1)

    cancelled = await rig.service.cancel(ALICE, job.id)

    assert (cancelled.status, cancelled.next_run_at) == (JobStatus.CANCELLED, None)
    assert rig.markers.jobs == {job.id}
    assert rig.job_events()[-1] == (job.id, "cancelled", JobStatus.CANCELLED, "alice")
    assert len(rig.notices) == 1  # the creation's only: no run is left to wake a scheduler for
    with pytest.raises(JobStatusConflict):
        await rig.service.trigger(ALICE, job.id)
    assert rig.bus.published == [] and rig.run_events() == []


async def test_delete_marks_the_job_and_publishes_its_last_event(rig: Rig) -> None:
    job, _ = await rig.job()
    run = await rig.service.trigger(ALICE, job.id)
    await rig.clock.advance(1)

    await rig.service.delete(ALICE, job.id)

    assert rig.markers.jobs == {job.id}  # the queued manual run will not start
    assert await rig.store.get_jobs([job.id]) == []
    assert await rig.store.get_execution(run.id) is None
    assert rig.job_events()[-1] == (job.id, "deleted", JobStatus.SCHEDULED, "alice")


async def test_pause_and_resume_publish_their_events_and_resume_tells_the_partition(
    rig: Rig,
) -> None:
    job, _ = await rig.job()
    await rig.clock.advance(timedelta(minutes=2))

    await rig.service.pause(ALICE, job.id)
    resumed = await rig.service.resume(ALICE, job.id)

    assert [e[1:3] for e in rig.job_events()] == [
        ("created", JobStatus.SCHEDULED),
        ("paused", JobStatus.PAUSED),
        ("resumed", JobStatus.SCHEDULED),
    ]
    assert resumed.next_run_at == datetime(2026, 6, 1, 12, 3, tzinfo=UTC)
    assert rig.notices[-1] == JobNotice(
        job_id=job.id, partition=job.partition, next_run_at=resumed.next_run_at
    )


async def test_a_lost_notice_does_not_fail_the_change(rig: Rig) -> None:
    rig.bus.fail("notify")

    job, stored = await rig.job()

    assert (stored.id, stored.next_run_at, rig.notices) == (job.id, job.next_run_at, [])
    assert rig.job_events() == [(job.id, "created", JobStatus.SCHEDULED, "alice")]
