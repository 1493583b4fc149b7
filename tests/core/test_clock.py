"""core.clock: FakeClock.sleep_until wakes on the deadline or the wake event, never before.

Every wait is bounded by ``asyncio.timeout``. "Not yet" is checked after letting the event loop
run every ready callback a fixed number of times (``settle``): no wall-clock sleeping.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, tzinfo

import pytest

import core.clock
from core.clock import FakeClock, SystemClock

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
BOUND_SECONDS = 2.0


async def settle() -> None:
    """Let every task that can run, run (many event-loop iterations, no wall time)."""
    for _ in range(50):
        await asyncio.sleep(0)


class Sleeper:
    """A task sleeping on ``clock`` until ``deadline``; records the clock's time when it woke."""

    def __init__(self, clock: FakeClock, deadline: datetime, wake: asyncio.Event) -> None:
        self.clock = clock
        self.woke_at: datetime | None = None
        self.task = asyncio.create_task(self._run(deadline, wake), name="sleeper")

    async def _run(self, deadline: datetime, wake: asyncio.Event) -> None:
        await self.clock.sleep_until(deadline, wake)
        self.woke_at = self.clock.now()

    async def done(self) -> datetime:
        async with asyncio.timeout(BOUND_SECONDS):
            await self.task
        assert self.woke_at is not None
        return self.woke_at

    async def cancel(self) -> None:
        self.task.cancel()
        async with asyncio.timeout(BOUND_SECONDS):
            await asyncio.gather(self.task, return_exceptions=True)


async def test_now_is_the_start_truncated_to_milliseconds() -> None:
    clock = FakeClock(datetime(2026, 6, 1, 14, 0, 0, 123_456, tzinfo=UTC))

    assert clock.now() == datetime(2026, 6, 1, 14, 0, 0, 123_000, tzinfo=UTC)


async def test_advance_and_set_move_the_clock() -> None:
    clock = FakeClock(T0)

    await clock.advance(1.5)
    assert clock.now() == T0 + timedelta(seconds=1.5)
    await clock.advance(timedelta(minutes=1))
    assert clock.now() == T0 + timedelta(minutes=1, seconds=1.5)
    await clock.set(T0 - timedelta(hours=1))
    assert clock.now() == T0 - timedelta(hours=1)


async def test_sleep_until_returns_when_the_clock_passes_the_deadline_and_not_before() -> None:
    clock = FakeClock(T0)
    deadline = T0 + timedelta(seconds=25)
    sleeper = Sleeper(clock, deadline, asyncio.Event())
    await settle()

    for _ in range(2):
        await clock.advance(10)
        await settle()
        assert not sleeper.task.done(), f"woke at {clock.now()} before {deadline}"

    await clock.advance(10)

    assert await sleeper.done() == T0 + timedelta(seconds=30)


async def test_sleep_until_returns_when_the_clock_reaches_the_deadline_exactly() -> None:
    clock = FakeClock(T0)
    sleeper = Sleeper(clock, T0 + timedelta(seconds=5), asyncio.Event())
    await settle()

    await clock.set(T0 + timedelta(seconds=5))

    assert await sleeper.done() == T0 + timedelta(seconds=5)


async def test_a_clock_stepping_back_does_not_wake_a_sleeper() -> None:
    clock = FakeClock(T0)
    sleeper = Sleeper(clock, T0 + timedelta(seconds=5), asyncio.Event())
    await settle()

    await clock.set(T0 - timedelta(hours=1))
    await settle()

    assert not sleeper.task.done()
    await clock.set(T0 + timedelta(seconds=5))
    assert await sleeper.done() == T0 + timedelta(seconds=5)


async def test_sleep_until_returns_when_the_wake_event_is_set() -> None:
    clock = FakeClock(T0)
    wake = asyncio.Event()
    sleeper = Sleeper(clock, T0 + timedelta(hours=1), wake)
    await settle()
    assert not sleeper.task.done()

    wake.set()

    assert await sleeper.done() == T0


async def test_sleep_until_returns_at_once_when_due_or_woken() -> None:
    clock = FakeClock(T0)
    woken = asyncio.Event()
    woken.set()

    async with asyncio.timeout(BOUND_SECONDS):
        await clock.sleep_until(T0, asyncio.Event())
        await clock.sleep_until(T0 - timedelta(seconds=1), asyncio.Event())
        await clock.sleep_until(T0 + timedelta(days=1), woken)

    assert clock.now() == T0


async def test_one_advance_wakes_only_the_sleepers_it_passes() -> None:
    clock = FakeClock(T0)
    never = asyncio.Event()
    early = Sleeper(clock, T0 + timedelta(seconds=10), never)
    late = Sleeper(clock, T0 + timedelta(seconds=60), never)
    await settle()

    await clock.advance(30)

    assert await early.done() == T0 + timedelta(seconds=30)
    await settle()
    assert not late.task.done()
    await late.cancel()


async def test_a_cancelled_sleeper_leaves_no_task_behind() -> None:
    clock = FakeClock(T0)
    sleeper = Sleeper(clock, T0 + timedelta(hours=1), asyncio.Event())
    await settle()
    assert len(asyncio.all_tasks()) > 2  # this test, the sleeper and its waiters

    await sleeper.cancel()
    await settle()

    assert sleeper.task.cancelled()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_system_clock_now_is_aware_utc_milliseconds() -> None:
    now = SystemClock().now()

    assert now.utcoffset() == timedelta(0)
    assert now.microsecond % 1000 == 0


@pytest.mark.parametrize("woken", [True, False])
async def test_system_clock_sleep_until_a_past_deadline_or_when_woken(woken: bool) -> None:
    clock = SystemClock()
    wake = asyncio.Event()
    deadline = clock.now() - timedelta(seconds=1)
    if woken:
        wake.set()
        deadline = clock.now() + timedelta(hours=1)

    async with asyncio.timeout(BOUND_SECONDS):
        await clock.sleep_until(deadline, wake)


async def test_system_clock_sleep_until_is_not_stretched_by_a_wall_clock_step_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wall clock steps back 10 s while a 20 ms sleep runs: the sleep still ends after about
    20 ms of the loop's (monotonic) clock, not 10 s later; the caller sees the clock as it is."""
    real = datetime
    calls = 0

    class SteppedBack(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> SteppedBack:
            nonlocal calls
            calls += 1
            t = real.now(tz) - (timedelta(seconds=10) if calls > 1 else timedelta(0))
            return cls.fromtimestamp(t.timestamp(), tz)

    deadline = real.now(UTC) + timedelta(milliseconds=20)
    monkeypatch.setattr(core.clock, "datetime", SteppedBack)
    async with asyncio.timeout(BOUND_SECONDS):
        await SystemClock().sleep_until(deadline, asyncio.Event())
    assert calls == 2  # one look before the timer, one after it: no second sleep
