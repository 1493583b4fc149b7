"""Injected wall clock, so time logic can be tested with a fake one.

Deadlines inside a process (ack-wait fractions, drain timeouts) use ``time.monotonic`` via the
event loop; only *what time it is* (due times, timestamps written to the store) comes from a Clock.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol

from core.timeutil import to_utc_ms


class Clock(Protocol):
    """Source of the current wall-clock time."""

    def now(self) -> datetime:
        """The current instant, aware UTC, truncated to milliseconds."""
        ...

    async def sleep_until(self, deadline: datetime, wake: asyncio.Event) -> None:
        """Return when ``deadline`` (aware) has passed or ``wake`` is set, whichever comes first."""
        ...


RESLEEP_SECONDS = 0.001
"""The shortest second sleep of :meth:`SystemClock.sleep_until` after an early timer."""
EARLY_FIRE_SECONDS = 0.005
"""How early a loop timer may fire (seconds) for :meth:`SystemClock.sleep_until` to sleep again:
more left than that once the timer fired means the wall clock stepped back meanwhile."""


class SystemClock:
    """The host's clock (``datetime.now(UTC)``)."""

    def now(self) -> datetime:
        return to_utc_ms(datetime.now(UTC))

    async def sleep_until(self, deadline: datetime, wake: asyncio.Event) -> None:
        """Returns once the host's clock has passed ``deadline``: a loop timer that fires early
        (uvloop's have whole-millisecond resolution on a clock cached per iteration, so they fire
        up to about a millisecond early) is followed by one more sleep of at least
        :data:`RESLEEP_SECONDS`, instead of a wake-up of the caller per iteration of the loop
        until the deadline (measured: 4.7 wake-ups per deadline under uvloop, 1.8 under asyncio).

        Only a timer that fired at most :data:`EARLY_FIRE_SECONDS` early is slept again: if the
        wall clock stepped back during the sleep, it returns after the delay it was given (on
        the loop's monotonic clock) and the caller decides, so a step back never stretches a
        short wait (a linger, a grace, a heartbeat) by the step."""
        least = 0.0
        while True:
            delay = (deadline - datetime.now(UTC)).total_seconds()
            if delay <= 0 or wake.is_set() or (least and delay > EARLY_FIRE_SECONDS):
                return
            try:
                async with asyncio.timeout(max(delay, least)):
                    await wake.wait()
                return
            except TimeoutError:
                least = RESLEEP_SECONDS


class FakeClock:
    """A clock that only moves when told to; sleepers wake when it passes their deadline.

    It also knows who sleeps on it: :meth:`until_asleep` waits until a number of tasks sleep
    having seen the current time (an actor has done everything it can do now), and
    :meth:`deadlines` tells when they want to wake (the delay a retry chose).

    Args:
        start: the initial instant (aware).
    """

    def __init__(self, start: datetime) -> None:
        self._now = to_utc_ms(start)
        self._moved = asyncio.Event()
        self._asleep: dict[asyncio.Task[object], tuple[datetime, asyncio.Event]] = {}
        self._asleep_changed = asyncio.Event()

    def now(self) -> datetime:
        return self._now

    async def advance(self, delta: timedelta | float) -> None:
        """Move the clock forward by ``delta`` (a timedelta or seconds) and wake sleepers."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        await self.set(self._now + step)

    async def set(self, t: datetime) -> None:
        """Jump to ``t`` (may go backwards, to test clock steps) and wake sleepers."""
        self._now = to_utc_ms(t.astimezone(UTC))
        self._asleep.clear()  # each sleeper has to see the new time before it counts again
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
        await asyncio.sleep(0)

    async def sleep_until(self, deadline: datetime, wake: asyncio.Event) -> None:
        me = asyncio.current_task()
        try:
            while self._now < deadline and not wake.is_set():
                moved = self._moved
                if me is not None:
                    self._asleep[me] = (deadline, wake)
                    self._asleep_changed.set()
                waiters = {asyncio.ensure_future(moved.wait()), asyncio.ensure_future(wake.wait())}
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
        finally:
            if me is not None:
                self._asleep.pop(me, None)

    def deadlines(self) -> list[datetime]:
        """When the tasks asleep on this clock (having seen its current time) want to wake,
        earliest first."""
        return sorted(d for d, wake in self._asleep.values() if not wake.is_set())

    async def until_asleep(self, count: int, *, timeout_seconds: float = 5.0) -> None:
        """Wait until ``count`` tasks sleep on this clock having seen its current time and
        with their wake event clear: they have done all they can until it moves.

        Raises:
            TimeoutError: they did not within ``timeout_seconds`` seconds (of real time).
        """
        async with asyncio.timeout(timeout_seconds):
            while len(self.deadlines()) < count:
                self._asleep_changed.clear()
                try:
                    async with asyncio.timeout(0.01):  # a wake event set elsewhere is not seen
                        await self._asleep_changed.wait()
                except TimeoutError:
                    continue
