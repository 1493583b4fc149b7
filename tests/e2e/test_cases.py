"""Real-world cases from tests/cases/scheduling-cases.json, end to end on real NATS and SQLite.

S01 misfire after downtime, S02 once job 1 s late, S06 poison messages, S07 message-id reuse.
(S05, the long run past the ack wait, is in test_pipeline.py; S03 in tests/gateway.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import nats

from bus.nats import BusConfig
from core.clock import FakeClock
from core.ids import execution_id, run_key
from core.model import ExecutionStatus, RunMessage
from tests.conftest import SettingsFactory
from tests.natsauth import observer_url
from tests.support import EventLog, Stack, start_stack, succeeded, wait_executions, wait_job


async def consumer_state(settings_url: str, prefix: str) -> tuple[int, int, int]:
    """(pending, ack pending, redelivered) of the default queue's consumer."""
    cfg = BusConfig(servers=[settings_url], prefix=prefix)
    nc = await nats.connect(observer_url(settings_url))
    try:
        info = await nc.jetstream().consumer_info(cfg.work_stream, cfg.work_consumer("default"))
        return info.num_pending or 0, info.num_ack_pending or 0, info.num_redelivered or 0
    finally:
        await nc.close()


async def test_s02_once_job_one_second_late_runs_exactly_once(stack: Stack) -> None:
    client = stack.client()
    late = datetime.now(UTC) - timedelta(seconds=1)
    job = await client.create_job(
        {"taskId": "noop", "schedule": {"type": "once", "executeAt": late.isoformat()}}
    )
    done = await wait_job(client, job.id, {"SUCCEEDED", "FAILED"})
    assert done.status == "SUCCEEDED"
    runs = await wait_executions(client, job.id, lambda rs: len(rs) >= 1)
    assert len(runs) == 1 and runs[0].scheduled_for == job.next_run_at


async def test_s06_poison_messages_are_terminated_and_recorded(stack: Stack, prefix: str) -> None:
    client = stack.client()
    cfg = BusConfig(servers=[observer_url(stack.settings.nats.url)], prefix=prefix)
    async with EventLog(stack.settings.nats.url, prefix) as log:
        poison = await client.create_job(
            {"taskId": "fail", "parameters": {"times": 100}, "maxAttempts": 3}
        )
        later = await client.create_job(
            {
                "taskId": "noop",
                "schedule": {
                    "type": "once",
                    "executeAt": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
                },
            }
        )
        assert later.next_run_at is not None
        later_exec = execution_id(later.id, later.next_run_at)
        nc = await nats.connect(observer_url(stack.settings.nats.url))
        try:
            js = nc.jetstream()
            await js.publish(f"{prefix}.work.default.{run_key('x')}", b"\x00 not a run")
            await js.publish(
                f"{prefix}.work.default.{run_key(later_exec)}",
                b"{broken",
                headers={"Nats-Msg-Id": later_exec},
            )
            ghost = RunMessage(
                execution_id=f"{later.id}:ghost",
                job_id=later.id,
                owner="alice",
                partition=later.partition,
                task_id="ghost_task",
                queue="default",
                scheduled_for=later.next_run_at,
                published_at=datetime.now(UTC),
            )
            await js.publish(
                f"{prefix}.work.default.{run_key(ghost.execution_id)}", msgspec.json.encode(ghost)
            )
        finally:
            await nc.close()
        healthy = await client.create_job({"taskId": "noop"})
        await wait_job(client, healthy.id, {"SUCCEEDED"})
        done = await wait_job(client, poison.id, {"FAILED"}, timeout_seconds=20)
        await log.wait_for(
            lambda evs: (
                any(e.execution_id == later_exec and e.status == "FAILED" for e in evs)
                and any(e.execution_id == ghost.execution_id and e.status == "FAILED" for e in evs)
            ),
            timeout_seconds=10,
            what="FAILED for the undecodable and the unknown-task messages",
        )
    running = [e.attempt for e in log.of(poison.id) if e.status == ExecutionStatus.RUNNING]
    assert running == [1, 2, 3]
    assert done.last_error and "attempt 3" in done.last_error
    failed = await client.list_jobs(status="FAILED")
    assert poison.id in [j.id for j in failed.items]
    [ghost_event] = [e for e in log.events if e.execution_id == ghost.execution_id]
    assert ghost_event.error and "unknown task 'ghost_task'" in ghost_event.error
    [broken_event] = [e for e in log.events if e.execution_id == later_exec]
    assert broken_event.error and "undecodable" in broken_event.error
    recorded = await wait_executions(
        client, later.id, lambda rs: len(rs) == 2 and all(r.status == "FAILED" for r in rs)
    )
    assert {r.id for r in recorded} == {later_exec, ghost.execution_id}
    pending, ack_pending, _ = await consumer_state(stack.settings.nats.url, prefix)
    assert (pending, ack_pending) == (0, 0), "every poison message left the work queue"
    assert cfg.work_consumer("default") == "workers-default"


async def test_s07_each_occurrence_has_its_own_message_id(
    make_settings: SettingsFactory, prefix: str
) -> None:
    clock = FakeClock(datetime(2026, 6, 1, 9, 59, 30, tzinfo=UTC))
    settings = make_settings()
    async with (
        start_stack(settings, clock=clock) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        client = stack.client()
        job = await client.create_job(
            {"taskId": "noop", "schedule": {"type": "cron", "expression": "* * * * *"}}
        )
        assert job.next_run_at == datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
        for minute in range(5):
            await clock.set(datetime(2026, 6, 1, 10, minute, tzinfo=UTC))
            await wait_executions(client, job.id, succeeded(minute + 1), timeout_seconds=10)
        runs = await wait_executions(
            client, job.id, lambda rs: len(rs) == 5 and all(r.status == "SUCCEEDED" for r in rs)
        )
        assert sorted(r.scheduled_for.minute for r in runs) == [0, 1, 2, 3, 4]
        assert len({r.id for r in runs}) == 5

        retried = next(r for r in runs if r.scheduled_for.minute == 2)
        nc = await nats.connect(observer_url(settings.nats.url))
        try:
            js = nc.jetstream()
            ack = await js.publish(
                f"{prefix}.work.default.{run_key(retried.id)}",
                b"{}",
                headers={"Nats-Msg-Id": retried.id},
            )
            assert ack.duplicate, "a retried publish of one occurrence is absorbed"
            naive = [
                await js.publish(
                    f"{prefix}.work.default.naive", b"{}", headers={"Nats-Msg-Id": job.id}
                )
                for _ in range(2)
            ]
            assert [a.duplicate for a in naive] == [None, True], (
                "why an id per job alone would lose runs"
            )
            await js.purge_stream(f"{prefix.upper()}_WORK", subject=f"{prefix}.work.default.naive")
        finally:
            await nc.close()
        running = [e for e in log.of(job.id) if e.status == ExecutionStatus.RUNNING]
        assert sorted(e.scheduled_for.minute for e in running) == [0, 1, 2, 3, 4]


async def test_s01_misfire_after_downtime_runs_the_latest_occurrence_once(
    make_settings: SettingsFactory,
) -> None:
    clock = FakeClock(datetime(2026, 6, 1, 8, 28, 30, tzinfo=UTC))
    settings = make_settings()
    async with start_stack(settings, clock=clock) as stack:
        job = await stack.client().create_job(
            {"taskId": "noop", "schedule": {"type": "cron", "expression": "* * * * *"}}
        )
        await clock.set(datetime(2026, 6, 1, 8, 29, tzinfo=UTC))
        await wait_executions(
            stack.client(), job.id, lambda rs: [r.status for r in rs] == ["SUCCEEDED"]
        )
    await clock.set(datetime(2026, 6, 1, 10, 21, 30, tzinfo=UTC))
    async with start_stack(settings, clock=clock) as stack:
        client = stack.client()

        await wait_executions(client, job.id, succeeded(2))
        for minute in (22, 23):
            await clock.set(datetime(2026, 6, 1, 10, minute, tzinfo=UTC))
            await wait_executions(client, job.id, succeeded(minute - 19))
        runs = await wait_executions(client, job.id, succeeded(4))
        ran = sorted(
            (r.scheduled_for.hour, r.scheduled_for.minute) for r in runs if r.status == "SUCCEEDED"
        )
        assert ran == [(8, 29), (10, 21), (10, 22), (10, 23)]
        [record] = [r for r in runs if r.status == "SKIPPED"]
        assert record.skip_reason == "misfire"
        assert record.missed is not None
        assert (record.missed.count, record.missed.policy) == (111, "runOnce")
        assert record.missed.first == datetime(2026, 6, 1, 8, 30, tzinfo=UTC)
        assert record.missed.last == datetime(2026, 6, 1, 10, 20, tzinfo=UTC)
        catch_up = next(
            r for r in runs if r.scheduled_for.hour == 10 and r.scheduled_for.minute == 21
        )
        assert catch_up.published_at == datetime(2026, 6, 1, 10, 21, 30, tzinfo=UTC)
        current = await client.get_job(job.id)
        assert current.next_run_at == datetime(2026, 6, 1, 10, 24, tzinfo=UTC)
