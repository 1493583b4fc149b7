"""The worker within concurrency limits and per-user fairness, on fakes: a run waiting for a
slot does not hold an execution slot, slots are given back after the outcome, ``skip``, and
the round-robin intake."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec

from actors.worker import Worker
from core.clock import FakeClock
from core.concurrency import ConcurrencyPolicy
from core.model import ExecutionStatus, RunMessage
from core.settings import WorkerConfig
from tests.actors.harness import T0
from tests.actors.test_worker_unit import Gate, run
from tests.fakes import FakeBus, FakeCancelSignals, FakeDelivery, until
from tests.slotfake import MemorySlots

S = ExecutionStatus


@dataclass
class Rig:
    bus: FakeBus
    gate: Gate
    slots: MemorySlots
    worker: Worker

    def deliver(self, message: RunMessage) -> FakeDelivery:
        data = msgspec.json.encode(message)
        return self.bus.work_queue("default").put(FakeDelivery(data, msg_id=message.msg_id))

    def statuses(self, job_id: str) -> list[S]:
        return [e.status for e in self.bus.statuses if e.job_id == job_id]


@asynccontextmanager
async def rig(**config: Any) -> AsyncIterator[Rig]:
    bus, clock, gate = FakeBus(), FakeClock(T0), Gate()
    slots = MemorySlots()
    settings: dict[str, Any] = {
        "worker_id": "w1",
        "cpu_slots": 1,
        "drain_timeout_seconds": 5.0,
        "running_grace_seconds": 0.0,  # RUNNING at once
    }
    worker = Worker(
        bus,
        gate.catalog(),
        clock,
        WorkerConfig(**(settings | config)),
        FakeCancelSignals(),
        timer=clock,
        slots=slots,
    )
    task = asyncio.create_task(worker.run(), name="worker under test")
    try:
        async with asyncio.timeout(5):
            await worker.ready.wait()
        yield Rig(bus, gate, slots, worker)
    finally:
        gate.release.set()
        worker.stop()
        bus.wake()
        async with asyncio.timeout(10):
            await task


def limited(job_id: str, task_id: str = "block", **fields: Any) -> RunMessage:
    return run(task_id, job_id=job_id, concurrency_key="k", max_concurrent=1, **fields)


async def test_a_waiting_run_lets_the_worker_run_others() -> None:
    async with rig(concurrency=2, prefetch=0) as r:
        first = r.deliver(limited("j1"))
        await until(lambda: len(r.gate.started) == 1)
        second = r.deliver(limited("j2", task_id="ok"))
        await until(lambda: r.slots.waiters("alice", "k") == [second_id("j2")])
        other = r.deliver(run("ok", job_id="j3"))  # j2 waits without taking the second slot
        await until(lambda: other.settled == "ack")
        assert r.statuses("j2") == []
        assert first.settled is None

        r.gate.release.set()
        await until(lambda: second.settled == "ack")
        assert r.statuses("j1") == [S.RUNNING, S.SUCCEEDED]
        assert r.statuses("j2") == [S.RUNNING, S.SUCCEEDED]
        # the slot is given back after the outcome is reported, not before the ack returns
        await until(lambda: r.slots.holders("alice", "k") == r.slots.waiters("alice", "k") == [])


def second_id(job_id: str) -> str:
    return limited(job_id).execution_id


async def test_skip_policy_reports_skipped_and_terminates() -> None:
    async with rig() as r:
        r.deliver(limited("j1"))
        await until(lambda: len(r.gate.started) == 1)
        d = r.deliver(limited("j2", task_id="ok", concurrency_policy=ConcurrencyPolicy.SKIP))
        await until(lambda: d.settled == "term")
        [event] = [e for e in r.bus.statuses if e.job_id == "j2"]
        assert (event.status, event.attempt) == (S.SKIPPED, 0)
        assert event.error is not None and event.error.startswith("concurrency: all 1 slot(s)")


async def test_a_failed_attempt_gives_its_slot_back_for_the_retry() -> None:
    async with rig(retry_backoff_seconds=1.0) as r:
        d = r.deliver(limited("j1", task_id="fail"))
        await until(lambda: d.settled is not None and d.settled.startswith("nak"))
        assert r.statuses("j1") == [S.RUNNING, S.RETRYING]
        await until(lambda: r.slots.holders("alice", "k") == [])  # given back after the nak


async def test_another_users_backlog_does_not_hold_back_a_users_run() -> None:
    """Round-robin intake: bob's one run starts second, not after alice's whole backlog."""
    async with rig(concurrency=1, prefetch=50) as r:
        for i in range(20):  # all land before the worker's next fetch
            r.deliver(run("count", job_id=f"a{i}", parameters={"n": i}))
        bob = run("count", job_id="b0", parameters={"n": 99})
        r.deliver(msgspec.structs.replace(bob, owner="bob"))
        await until(lambda: len(r.gate.started) == 21)
        order = [ctx.job_id for ctx in r.gate.started]
        assert order.index("b0") == 1


async def test_without_prefetch_runs_start_in_stream_order() -> None:
    async with rig(concurrency=1, prefetch=0) as r:
        for i in range(5):
            r.deliver(run("count", job_id=f"a{i}", parameters={"n": i}))
        r.deliver(
            msgspec.structs.replace(run("count", job_id="b0", parameters={"n": 9}), owner="bob")
        )
        await until(lambda: len(r.gate.started) == 6)
        assert [ctx.job_id for ctx in r.gate.started][-1] == "b0"


async def test_a_per_user_cap_keeps_a_slot_for_another_user() -> None:
    async with rig(concurrency=2, prefetch=10, user_concurrency=1) as r:
        for i in range(3):
            r.deliver(run("block", job_id=f"a{i}"))
        await until(lambda: len(r.gate.started) == 1)
        r.deliver(msgspec.structs.replace(run("ok", job_id="b0"), owner="bob"))
        await until(lambda: len(r.gate.started) == 2)
        assert [ctx.job_id for ctx in r.gate.started] == ["a0", "b0"]


async def test_a_run_that_gets_its_slot_at_once_keeps_its_execution_slot() -> None:
    """Only a run that must wait gives its execution slot away: an uncontended one runs now,
    not after a run fetched behind it."""
    async with rig(concurrency=1, prefetch=5) as r:
        keyed = r.deliver(limited("j1", task_id="ok"))
        r.deliver(run("block", job_id="j2"))
        await until(lambda: keyed.settled == "ack")
        assert r.gate.started[0].job_id == "j1"
