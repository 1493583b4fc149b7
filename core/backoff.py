"""Retry delays: exponential backoff with bounded jitter."""

from __future__ import annotations

import random


def retry_delay(
    attempt: int,
    *,
    base_seconds: float,
    max_seconds: float,
    factor: float = 2.0,
    jitter: float = 0.2,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based) before the next one.

    ``base_seconds * factor ** (attempt - 1)`` multiplied by a random factor in
    ``[1 - jitter, 1 + jitter]``, then capped at ``max_seconds`` (the largest delay there is). With
    ``factor=2`` and ``jitter=0.2`` consecutive delays always grow until the cap, while retries
    of many runs that failed together still spread out: AWS's "exponential backoff and jitter"
    with a bounded rather than a full jitter.

    Raises:
        ValueError: if ``attempt < 1`` or the bounds are not positive.
    """
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    if base_seconds <= 0 or max_seconds <= 0 or not 0 <= jitter < 1:
        raise ValueError("base_seconds and max_seconds must be > 0 and 0 <= jitter < 1")
    r = (rng or random).uniform(1 - jitter, 1 + jitter)
    return min(max_seconds, base_seconds * factor ** min(attempt - 1, 64) * r)
