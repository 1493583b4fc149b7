"""A token bucket: a rate limit with a bounded burst, on a clock the caller passes in."""

from __future__ import annotations


class TokenBucket:
    """Tokens accrue at ``rate_per_second`` up to ``burst``; a taker reserves tokens and learns how
    long to wait before using them. Reservations may run the bucket into debt, so concurrent
    takers queue up in reservation order and the long-run rate never exceeds ``rate_per_second``.

    Args:
        rate_per_second: tokens per second (> 0).
        burst: most tokens saved up while nobody takes any (> 0).
        now: the current time (seconds, a monotonic clock).

    Raises:
        ValueError: a bound is not positive.
    """

    def __init__(self, rate_per_second: float, burst: float, now: float) -> None:
        if rate_per_second <= 0 or burst <= 0:
            raise ValueError("rate_per_second and burst must be > 0")
        self.rate_per_second = rate_per_second
        self.burst = burst
        self.tokens = burst
        self._updated = now

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self.tokens = min(
                self.burst, self.tokens + (now - self._updated) * self.rate_per_second
            )
            self._updated = now

    def reserve(self, n: float, now: float) -> float:
        """Take ``n`` tokens; the seconds to wait (from ``now``) until they are covered."""
        self._refill(now)
        self.tokens -= n
        return max(0.0, -self.tokens / self.rate_per_second)

    def refund(self, n: float, now: float) -> None:
        """Give back ``n`` reserved tokens that were not used (never above ``burst``)."""
        self._refill(now)
        self.tokens = min(self.burst, self.tokens + n)
