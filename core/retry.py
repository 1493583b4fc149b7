"""Retry pacing for the actors' loops: one policy object, one way to wait between attempts.

A loop that retries through an outage (NATS unreachable, the store down) keeps a
:class:`Backoff`: after each failure it waits the policy's next delay on the injected
:class:`core.clock.Clock` (so a fake clock drives it in tests), cut short by the actor's stop
event; after a success it starts again from the first delay. Cancellation always propagates:
the wait re-raises a cancellation that a library swallowed (:func:`raise_if_cancelling`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from datetime import timedelta

from core.backoff import retry_delay
from core.clock import Clock


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that a library swallowed.

    ``asyncio.wait_for`` (used inside nats-py) can lose a cancellation that races with its
    result on Python 3.11; a loop that calls such code checks this at its head, so a stop always
    ends it.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Delays between the attempts of one retried operation (:func:`core.backoff.retry_delay`).

    Attributes:
        first_seconds: delay after the first failure (seconds, > 0).
        max_seconds: largest delay (seconds, >= ``first_seconds``); ``first_seconds ==
            max_seconds`` is a fixed delay.
        factor: growth per consecutive failure.
        jitter: each delay is multiplied by a random factor in ``[1 - jitter, 1 + jitter]``
            (then capped at ``max_seconds``).
    """

    first_seconds: float
    max_seconds: float
    factor: float = 2.0
    jitter: float = 0.0

    def delay_seconds(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``failures`` consecutive failures (1-based).

        Raises:
            ValueError: ``failures < 1``, or bounds that are not positive.
        """
        return retry_delay(
            failures,
            base_seconds=self.first_seconds,
            max_seconds=self.max_seconds,
            factor=self.factor,
            jitter=self.jitter,
            rng=rng,
        )


class Backoff:
    """The retry state of one loop: consecutive failures and the wait after each.

    Args:
        policy: the delays.
        clock: the clock waits are measured on.
        stop: cuts a wait short when set (an actor's stopping event); None: waits are never
            cut short (a report that must go out even while the actor stops).
        log: where :meth:`wait` logs the failure.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        clock: Clock,
        *,
        stop: asyncio.Event | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.failures = 0
        self._stop = stop or asyncio.Event()
        self._log = log or logging.getLogger(__name__)

    def reset(self) -> None:
        """The operation succeeded: the next failure waits the first delay again."""
        self.failures = 0

    async def wait(self, what: str, error: BaseException, *, level: int = logging.WARNING) -> float:
        """Count a failure, log ``"<what>: <error>; retrying in <delay> s"`` and wait that delay
        (or until the stop event is set); the delay in seconds.

        Raises:
            asyncio.CancelledError: the task is being cancelled (also when a library lost it).
        """
        raise_if_cancelling()
        self.failures += 1
        delay = self.policy.delay_seconds(self.failures)
        self._log.log(level, "%s: %s; retrying in %.1f s", what, error, delay)
        await self.clock.sleep_until(self.clock.now() + timedelta(seconds=delay), self._stop)
        return delay
