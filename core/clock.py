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


class SystemClock:
    """The host's clock (``datetime.now(UTC)``)."""

    def now(self) -> datetime:
        return to_utc_ms(datetime.now(UTC))

    async def sleep_until(self, deadline: datetime, wake: asyncio.Event) -> None:
        delay = (deadline - datetime.now(UTC)).total_seconds()
        if delay <= 0 or wake.is_set():
            return
        try:
            async with asyncio.timeout(delay):
                await wake.wait()
        except TimeoutError:
            return


class FakeClock:
    """A clock that only moves when told to; sleepers wake when it passes their deadline.

    Args:
        start: the initial instant (aware).
    """

    def __init__(self, start: datetime) -> None:
        self._now = to_utc_ms(start)
        self._moved = asyncio.Event()

    def now(self) -> datetime:
        return self._now

    async def advance(self, delta: timedelta | float) -> None:
        """Move the clock forward by ``delta`` (a timedelta or seconds) and wake sleepers."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        await self.set(self._now + step)

    async def set(self, t: datetime) -> None:
        """Jump to ``t`` (may go backwards, to test clock steps) and wake sleepers."""
        self._now = to_utc_ms(t.astimezone(UTC))
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
        await asyncio.sleep(0)

    async def sleep_until(self, deadline: datetime, wake: asyncio.Event) -> None:
        while self._now < deadline and not wake.is_set():
            moved = self._moved
            waiters = {asyncio.ensure_future(moved.wait()), asyncio.ensure_future(wake.wait())}
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
