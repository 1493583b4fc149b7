"""The worker's decisions on fakes: the in-memory bus, a fake clock for timestamps and retry
pacing, tasks that finish when the test says so.

Each test delivers a run and asserts on the status events the worker reported, in order, and
on how it settled the message (ack, nak with a delay, term): success, retries with backoff,
giving up, poison messages, cancellation, timeouts, report retries and the drain on stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from actors.worker import (
    PRESENCE_MIN_GAP_SECONDS,
    RETRY_AFTER_MAX_SECONDS,
    Worker,
    _RunningReport,
)
from core.clock import FakeClock
from core.cluster import PRESENCE_HEARTBEAT_SECONDS, WorkerHeartbeat
from core.ids import execution_id
from core.model import ExecutionStatus, RunMessage, StatusEvent
from core.settings import WorkerConfig
from core.tasks import TaskCatalog, TaskContext, TaskError
from tests.actors.harness import T0, at
from tests.fakes import FakeBus, FakeCancelSignals, FakeDelivery, until, waits

S = ExecutionStatus


class NoParams(msgspec.Struct):
    pass


class Count(msgspec.Struct):
    n: int


class Gate:
    """Tasks that the test controls: ``block`` waits until released; ``fail`` raises."""

    def __init__(self) -> None:
        self.started: list[TaskContext] = []
        self.release = asyncio.Event()

    def catalog(self) -> TaskCatalog:
        catalog = TaskCatalog()

        @catalog.task("ok", params=NoParams)
        async def ok(params: NoParams, ctx: TaskContext) -> dict[str, int]:
            self.started.append(ctx)
            return {"attempt": ctx.attempt}

        @catalog.task("fail", params=NoParams)
        async def fail(params: NoParams, ctx: TaskContext) -> None:
            self.started.append(ctx)
            raise RuntimeError("boom")

        @catalog.task("refuse", params=NoParams)
        async def refuse(params: NoParams, ctx: TaskContext) -> None:
            raise TaskError("HTTP 404 from GET https://example.com/", retryable=False)

        @catalog.task("later", params=Count)
        async def later(params: Count, ctx: TaskContext) -> None:
            raise TaskError("HTTP 503 from GET https://example.com/", retry_after_seconds=params.n)

        @catalog.task("count", params=Count)
        async def count(params: Count, ctx: TaskContext) -> int:
            self.started.append(ctx)
            return params.n

        @catalog.task("block", params=NoParams)
        async def block(params: NoParams, ctx: TaskContext) -> str:
            self.started.append(ctx)
            await self.release.wait()
            return "released"

        return catalog


def run(task_id: str = "ok", job_id: str = "j1", **fields: Any) -> RunMessage:
    return RunMessage(
        execution_id=execution_id(job_id, T0),
        job_id=job_id,
        owner="alice",
        partition=0,
        task_id=task_id,
        queue="default",
        scheduled_for=T0,
        published_at=T0,
        **fields,
    )


@dataclass
class WorkerRig:
    bus: FakeBus
    clock: FakeClock
    gate: Gate
    markers: FakeCancelSignals
    worker: Worker
    task: asyncio.Task[None]

    def deliver(self, message: RunMessage | bytes, *, num_delivered: int = 1) -> FakeDelivery:
        data = message if isinstance(message, bytes) else msgspec.json.encode(message)
        msg_id = None if isinstance(message, bytes) else message.msg_id
        return self.bus.work_queue("default").put(
            FakeDelivery(data, msg_id=msg_id, num_delivered=num_delivered)
        )

    async def settled(self, d: FakeDelivery) -> str:
        async with asyncio.timeout(5):
            await d.done.wait()
        assert d.settled is not None
        return d.settled

    def statuses(self, execution: str | None = None) -> list[ExecutionStatus]:
        return [
            e.status for e in self.bus.statuses if execution is None or e.execution_id == execution
        ]

    def last(self) -> StatusEvent:
        """The latest status event reported."""
        return self.bus.statuses[-1]

    async def stop(self) -> None:
        self.worker.stop()
        self.bus.wake()
        async with asyncio.timeout(5):
            await self.task


class FakePresence:
    """A :class:`core.ports.WorkerPresenceBoard` in memory: the live heartbeats by worker id."""

    def __init__(self) -> None:
        self.live: dict[str, WorkerHeartbeat] = {}
        self.changed = asyncio.Event()

    async def announce(self, heartbeat: WorkerHeartbeat) -> None:
        self.live[heartbeat.worker_id] = heartbeat
        self.changed.set()

    async def withdraw(self, worker_id: str) -> None:
        self.live.pop(worker_id, None)
        self.changed.set()

    async def beat(self, worker_id: str, in_flight: int) -> WorkerHeartbeat:
        """Wait for a heartbeat of ``worker_id`` saying ``in_flight``."""
        async with asyncio.timeout(5):
            while (hb := self.live.get(worker_id)) is None or hb.in_flight != in_flight:
                self.changed.clear()
                await self.changed.wait()
        return hb


@asynccontextmanager
async def worker_rig(
    presence: FakePresence | None = None, **config: Any
) -> AsyncIterator[WorkerRig]:
    bus, clock, gate, markers = FakeBus(), FakeClock(T0), Gate(), FakeCancelSignals()
    settings: dict[str, Any] = {
        "worker_id": "w1",
        "cpu_slots": 1,
        "drain_timeout_seconds": 5.0,
        "running_grace_seconds": 0.0,  # RUNNING at once, unless a test says otherwise
    }
    worker_config = WorkerConfig(**(settings | config))
    worker = Worker(
        bus, gate.catalog(), clock, worker_config, markers, timer=clock, presence=presence
    )
    task = asyncio.create_task(worker.run(), name="worker under test")
    rig = WorkerRig(bus, clock, gate, markers, worker, task)
    try:
        async with asyncio.timeout(5):
            await worker.ready.wait()
        yield rig
    finally:
        gate.release.set()
        if not task.done():
            await rig.stop()


async def test_a_run_reports_running_then_succeeded_then_is_acked() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run())

        assert await rig.settled(d) == "ack"
        assert rig.statuses() == [S.RUNNING, S.SUCCEEDED]
        done = rig.last()
        assert (done.attempt, done.result, done.worker_id) == (1, {"attempt": 1}, "w1")
        assert done.started_at == T0 and done.finished_at == T0
        assert rig.gate.started[0].idempotency_key == execution_id("j1", T0)


async def test_a_failed_attempt_is_retried_with_a_backoff_delay() -> None:
    async with worker_rig(retry_backoff_seconds=2.0, retry_backoff_max_seconds=60.0) as rig:
        d = rig.deliver(run("fail", max_attempts=3))

        assert await rig.settled(d) == "nak"
        assert rig.statuses() == [S.RUNNING, S.RETRYING]
        retrying = rig.last()
        assert (
            d.nak_delay_seconds is not None and 1.6 <= d.nak_delay_seconds <= 2.4
        )  # 2 s ± 20 % jitter
        assert retrying.next_attempt_at is not None
        assert abs((retrying.next_attempt_at - T0).total_seconds() - d.nak_delay_seconds) < 0.001
        assert retrying.error == "RuntimeError: boom"


async def test_the_backoff_grows_with_the_attempt_up_to_its_cap() -> None:
    async with worker_rig(retry_backoff_seconds=2.0, retry_backoff_max_seconds=5.0) as rig:
        delays = []
        for attempt in (1, 2, 3, 4):
            message = run("fail", job_id=f"j{attempt}", max_attempts=10)
            d = rig.deliver(message, num_delivered=attempt)
            await rig.settled(d)
            assert d.nak_delay_seconds is not None
            delays.append(d.nak_delay_seconds)

        assert 1.6 <= delays[0] <= 2.4 and 3.2 <= delays[1] <= 4.8
        assert delays[2] == delays[3] == 5.0


async def test_the_last_attempt_fails_the_run_for_good() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("fail", max_attempts=2), num_delivered=2)

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.RUNNING, S.FAILED]
        assert rig.last().attempt == 2


async def test_a_task_error_that_is_not_retryable_fails_the_run_at_once() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("refuse", max_attempts=5))

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.RUNNING, S.FAILED]
        assert rig.last().error == "HTTP 404 from GET https://example.com/"  # its own words


async def test_a_retry_after_delays_the_next_attempt_beyond_the_backoff() -> None:
    async with worker_rig(retry_backoff_seconds=1.0, retry_backoff_max_seconds=60.0) as rig:
        d = rig.deliver(run("later", max_attempts=3, parameters={"n": 30}))

        assert await rig.settled(d) == "nak"
        assert d.nak_delay_seconds == 30.0
        assert rig.last().next_attempt_at == T0 + timedelta(seconds=30)


async def test_a_short_retry_after_does_not_shorten_the_backoff() -> None:
    async with worker_rig(retry_backoff_seconds=10.0, retry_backoff_max_seconds=60.0) as rig:
        d = rig.deliver(run("later", max_attempts=3, parameters={"n": 1}))

        await rig.settled(d)
        assert d.nak_delay_seconds is not None and 8.0 <= d.nak_delay_seconds <= 12.0


async def test_a_retry_after_is_capped() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("later", max_attempts=3, parameters={"n": 10**9}))

        await rig.settled(d)
        assert d.nak_delay_seconds == RETRY_AFTER_MAX_SECONDS


async def test_attempts_spent_before_publication_count() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("fail", max_attempts=3, attempt_offset=2))

        assert await rig.settled(d) == "term"
        assert rig.last().attempt == 3


async def test_a_redelivery_past_max_attempts_gives_up_without_running() -> None:
    """Earlier attempts died with their worker: no outcome, but the attempts are spent."""
    async with worker_rig() as rig:
        d = rig.deliver(run("ok", max_attempts=2), num_delivered=3)

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.FAILED]
        assert "gave up after 2 attempt(s)" in str(rig.last().error)
        assert rig.gate.started == []


async def test_an_undecodable_message_is_terminated_and_recorded_failed() -> None:
    async with worker_rig() as rig:
        d = rig.bus.work_queue("default").put(
            FakeDelivery(b"{not json", msg_id=execution_id("j9", T0))
        )

        assert await rig.settled(d) == "term"
        [failed] = rig.bus.statuses
        assert (failed.execution_id, failed.job_id, failed.status) == (
            execution_id("j9", T0),
            "j9",
            S.FAILED,
        )
        assert failed.error is not None and failed.error.startswith("undecodable run message")


async def test_a_message_without_an_id_is_terminated_without_a_report() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(b"[]")

        assert await rig.settled(d) == "term"
        assert rig.bus.statuses == []


async def test_an_unknown_task_fails_the_run_at_once() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("nope", max_attempts=3))

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.FAILED]
        assert "unknown task 'nope'" in str(rig.last().error)


async def test_bad_parameters_fail_the_run_at_once() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("count", parameters={"n": "many"}, max_attempts=3))

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.FAILED]
        assert "parameters.n" in str(rig.last().error)
        assert rig.gate.started == []


async def test_a_run_of_a_cancelled_job_is_not_started() -> None:
    async with worker_rig() as rig:
        await rig.markers.cancel_job("j1")
        d = rig.deliver(run("ok"))

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.CANCELLED]
        assert rig.gate.started == []


async def test_a_running_run_is_cancelled_by_its_marker() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("block"))
        await until(lambda: bool(rig.gate.started))

        await rig.markers.cancel_run(execution_id("j1", T0))

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.RUNNING, S.CANCELLED]


async def test_a_marker_for_another_run_leaves_this_one_running() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("block"))
        await until(lambda: bool(rig.gate.started))

        await rig.markers.cancel_run(execution_id("other", T0))
        await rig.markers.cancel_job("other")
        rig.gate.release.set()

        assert await rig.settled(d) == "ack"
        assert rig.statuses() == [S.RUNNING, S.SUCCEEDED]


async def test_a_task_past_its_timeout_fails_the_attempt() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("block", timeout_seconds=0.01, max_attempts=1))

        assert await rig.settled(d) == "term"
        assert rig.statuses() == [S.RUNNING, S.FAILED]
        assert rig.last().error == "TimeoutError: task ran past its timeout of 0.01 s"


async def test_a_redelivered_finished_run_is_settled_again_without_running() -> None:
    async with worker_rig() as rig:
        first = rig.deliver(run("ok"))
        assert await rig.settled(first) == "ack"

        again = rig.deliver(run("ok"), num_delivered=2)

        assert await rig.settled(again) == "ack"
        assert len(rig.gate.started) == 1
        assert rig.statuses() == [S.RUNNING, S.SUCCEEDED]


async def test_a_report_is_retried_with_backoff_until_it_is_stored() -> None:
    async with worker_rig() as rig:
        rig.bus.fail("publish_status", 3)
        d = rig.deliver(run("ok"))

        assert await waits(rig.clock, 3) == [0.1, 0.2, 0.4]
        assert await rig.settled(d) == "ack"
        assert rig.statuses() == [S.RUNNING, S.SUCCEEDED]


async def test_the_run_is_acked_only_after_its_final_report_is_stored() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("block"))
        await until(lambda: rig.statuses() == [S.RUNNING])
        rig.bus.fail("publish_status", 1)
        rig.gate.release.set()

        await rig.clock.until_asleep(1)  # the SUCCEEDED report waits for its retry
        assert d.settled is None
        await rig.clock.advance(1)

        assert await rig.settled(d) == "ack"


async def test_concurrency_bounds_the_runs_in_flight() -> None:
    async with worker_rig(concurrency=2, prefetch=0) as rig:
        for i in range(4):
            rig.deliver(run("block", job_id=f"j{i}"))

        await until(lambda: len(rig.gate.started) == 2)
        assert len(rig.bus.work_queue("default").ready) == 2

        rig.gate.release.set()
        await until(lambda: len(rig.gate.started) == 4)


async def test_a_stop_lets_the_run_in_flight_finish() -> None:
    async with worker_rig() as rig:
        d = rig.deliver(run("block"))
        await until(lambda: bool(rig.gate.started))

        rig.worker.stop()
        rig.bus.wake()
        await rig.clock.until_asleep(0)
        assert not rig.task.done() and d.settled is None  # draining: the run goes on
        rig.gate.release.set()
        async with asyncio.timeout(5):
            await rig.task

        assert d.settled == "ack"
        assert rig.statuses() == [S.RUNNING, S.SUCCEEDED]


async def test_a_stop_hands_back_what_outlives_the_drain_timeout() -> None:
    async with worker_rig(drain_timeout_seconds=0.05) as rig:
        d = rig.deliver(run("block"))
        await until(lambda: bool(rig.gate.started))

        await rig.stop()

        assert d.settled == "nak"
        assert rig.statuses() == [S.RUNNING]
        assert rig.bus.work_queue("default").closed


async def test_messages_fetched_while_stopping_are_handed_back() -> None:
    async with worker_rig() as rig:
        queue = rig.bus.work_queue("default")
        rig.worker.stop()
        left = queue.put(FakeDelivery(msgspec.json.encode(run())))
        rig.bus.wake()
        async with asyncio.timeout(5):
            await rig.task

        assert left.settled == "nak"
        assert rig.gate.started == []


async def test_a_deleted_consumer_is_re_created_and_consumed_again() -> None:
    async with worker_rig() as rig:
        queue = rig.bus.work_queue("default")
        queue.missing = True
        queue.wake()
        d = rig.deliver(run())

        assert await rig.settled(d) == "ack"


async def test_a_pull_outage_is_retried_every_second() -> None:
    async with worker_rig() as rig:
        queue = rig.bus.work_queue("default")
        queue.failures = 2
        queue.wake()  # the pull in flight ends; the next two fail
        await rig.clock.until_asleep(1)
        d = rig.deliver(run())

        for _ in range(2):
            await rig.clock.until_asleep(1)
            assert rig.clock.deadlines() == [rig.clock.now() + timedelta(seconds=1)]
            await rig.clock.advance(1)

        assert await rig.settled(d) == "ack"
        assert rig.last().started_at == at(2)


async def test_with_a_running_grace_a_short_run_reports_its_outcome_alone() -> None:
    async with worker_rig(running_grace_seconds=0.05) as rig:
        d = rig.deliver(run())

        assert await rig.settled(d) == "ack"
        assert rig.statuses() == [S.SUCCEEDED]
        done = rig.last()
        assert done.started_at == T0 and done.finished_at == T0 and done.attempt == 1


async def test_with_a_running_grace_a_short_failed_attempt_reports_retrying_alone() -> None:
    async with worker_rig(running_grace_seconds=0.05, retry_backoff_seconds=2.0) as rig:
        d = rig.deliver(run("fail", max_attempts=3))

        assert await rig.settled(d) == "nak"
        assert rig.statuses() == [S.RETRYING]
        assert rig.last().started_at == T0


async def test_a_run_longer_than_the_grace_reports_running_once_it_passed() -> None:
    async with worker_rig(running_grace_seconds=0.05) as rig:
        d = rig.deliver(run("block"))
        await until(lambda: bool(rig.gate.started))
        await rig.clock.until_asleep(1)
        assert rig.statuses() == []  # still within its grace
        [deadline] = rig.clock.deadlines()
        assert deadline == T0 + timedelta(seconds=0.05)

        await rig.clock.set(deadline)
        await until(lambda: rig.statuses() == [S.RUNNING])
        assert rig.last().at == T0  # the time it started, not when it was reported
        rig.gate.release.set()

        assert await rig.settled(d) == "ack"
        assert rig.statuses() == [S.RUNNING, S.SUCCEEDED]


async def test_attempts_within_their_grace_share_one_sleeper() -> None:
    async with worker_rig(running_grace_seconds=0.05) as rig:
        ds = [rig.deliver(run("block", job_id=f"j{i}")) for i in range(3)]
        await until(lambda: len(rig.gate.started) == 3)
        await rig.clock.until_asleep(1)
        assert rig.clock.deadlines() == [T0 + timedelta(seconds=0.05)]  # not one per attempt

        await rig.clock.set(T0 + timedelta(seconds=0.05))
        await until(lambda: rig.statuses() == [S.RUNNING] * 3)
        rig.gate.release.set()
        assert [await rig.settled(d) for d in ds] == ["ack"] * 3


async def at_deadline(clock: FakeClock, deadline: datetime) -> None:
    """Move ``clock`` to ``deadline`` once a task sleeps until it."""
    await until(lambda: deadline in clock.deadlines())
    await clock.set(deadline)


async def test_a_worker_heartbeats_while_it_consumes_and_withdraws_on_stop() -> None:
    presence = FakePresence()
    second = timedelta(seconds=PRESENCE_MIN_GAP_SECONDS)
    async with worker_rig(presence, concurrency=3) as rig:
        first = await presence.beat("w1", in_flight=0)
        assert (first.queues, first.concurrency, first.started_at) == (["default"], 3, T0)
        period = timedelta(seconds=PRESENCE_HEARTBEAT_SECONDS)
        await at_deadline(rig.clock, T0 + period)
        beat_at = rig.clock.now()
        await until(lambda: beat_at + period in rig.clock.deadlines())  # renewed, asleep again

        d = rig.deliver(run("block"))  # a run starting is told at once, one gap after the beat
        await until(lambda: len(rig.gate.started) == 1)
        await at_deadline(rig.clock, beat_at + second)
        assert (await presence.beat("w1", in_flight=1)).started_at == T0

        rig.gate.release.set()
        assert await rig.settled(d) == "ack"
        await at_deadline(rig.clock, beat_at + 2 * second)
        await presence.beat("w1", in_flight=0)
        await rig.stop()
        assert presence.live == {}


async def test_a_running_report_due_while_its_runs_task_group_shuts_down_is_dropped() -> None:
    """A run's own task failed, so its task group is cancelling the attempt, when the grace
    timer publishes the run's RUNNING report: the report is dropped (before: create_task's
    RuntimeError ended the grace timer, and with it the whole worker)."""
    reported: list[object] = []

    async def report(event: object) -> None:
        reported.append(event)

    worker: Any = SimpleNamespace(
        config=SimpleNamespace(running_grace_seconds=0.5),
        timer=FakeClock(T0),
        _report=report,
        name="worker[w]",
    )
    event: Any = SimpleNamespace(execution_id="e1")

    async def fails() -> None:
        raise ValueError("a keepalive's bug")

    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.timeout(5), asyncio.TaskGroup() as tg:
            running = _RunningReport(worker, event, tg)
            tg.create_task(fails())
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:  # the group aborts: its grace passes now
                running.publish()
                raise
    assert [type(e) for e in raised.value.exceptions] == [ValueError]
    assert reported == []
