"""``core.ratelimit.TokenBucket`` on a fake clock."""

from __future__ import annotations

import pytest

from core.ratelimit import TokenBucket


def test_a_full_bucket_lets_its_burst_through_then_paces_at_its_rate() -> None:
    bucket = TokenBucket(100.0, 50.0, now=0.0)
    assert bucket.reserve(50, now=0.0) == 0.0
    assert bucket.reserve(10, now=0.0) == pytest.approx(0.1)
    assert bucket.reserve(10, now=0.0) == pytest.approx(0.2), "takers queue up behind the debt"
    assert bucket.reserve(10, now=0.3) == pytest.approx(0.0)


def test_it_never_saves_up_more_than_its_burst() -> None:
    bucket = TokenBucket(100.0, 50.0, now=0.0)
    assert bucket.reserve(50, now=0.0) == 0.0
    assert bucket.reserve(50, now=3600.0) == 0.0
    assert bucket.reserve(1, now=3600.0) == pytest.approx(0.01)


def test_unused_tokens_come_back_up_to_the_burst() -> None:
    bucket = TokenBucket(100.0, 50.0, now=0.0)
    assert bucket.reserve(50, now=0.0) == 0.0
    bucket.refund(40, now=0.0)
    assert bucket.reserve(40, now=0.0) == 0.0
    bucket.refund(1000, now=0.0)
    assert bucket.tokens == 50.0


def test_the_long_run_rate_is_the_rate() -> None:
    bucket, now, taken = TokenBucket(1000.0, 128.0, now=0.0), 0.0, 0
    while now < 10.0:
        now += bucket.reserve(128, now)
        taken += 128
    assert taken / now == pytest.approx(1000.0, rel=0.02)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)])
def test_bounds_must_be_positive(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst, now=0.0)
