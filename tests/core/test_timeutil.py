"""``core.timeutil``: instants as aware UTC datetimes truncated to milliseconds.

Checked on random instants in several zones against integer arithmetic on microseconds, the
reference that the fast paths (UTC input, already-whole milliseconds) must agree with.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from core.timeutil import from_epoch_ms, isoformat_z, to_epoch_ms, to_utc_ms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ZONES = [
    UTC,
    timezone(timedelta(hours=-5, minutes=-30)),
    ZoneInfo("Europe/Berlin"),
    timezone(timedelta(0)),
]


def random_instants(n: int, seed: int) -> list[tuple[datetime, int]]:
    """(instant in a random zone, its microseconds since the epoch), years 1000-9999."""
    rnd = random.Random(seed)
    lo = (datetime(1000, 1, 2, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)
    hi = (datetime(9999, 12, 30, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)
    out = []
    for _ in range(n):
        us = rnd.randint(lo, hi)
        if rnd.random() < 0.3:
            us -= us % 1000  # whole milliseconds: the fast path
        t = (EPOCH + timedelta(microseconds=us)).astimezone(rnd.choice(ZONES))
        out.append((t, us))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_conversions_agree_with_integer_arithmetic(seed: int) -> None:
    for t, us in random_instants(5000, seed):
        ms = us // 1000
        assert to_epoch_ms(t) == ms
        utc = to_utc_ms(t)
        assert utc.tzinfo is UTC
        assert utc == from_epoch_ms(ms)
        assert utc.microsecond % 1000 == 0
        expected = utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
        assert isoformat_z(t) == expected


def test_an_instant_before_the_epoch_floors_to_the_earlier_millisecond() -> None:
    t = EPOCH - timedelta(microseconds=1)
    assert to_epoch_ms(t) == -1
    assert to_utc_ms(t) == EPOCH - timedelta(milliseconds=1)


def test_isoformat_pads_the_year_to_four_digits() -> None:
    assert isoformat_z(datetime(999, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)) == "0999-01-02T03:04:05.006Z"


@pytest.mark.parametrize("convert", [to_utc_ms, to_epoch_ms, isoformat_z])
def test_a_naive_datetime_is_refused(convert: Callable[[datetime], object]) -> None:
    with pytest.raises(ValueError, match="naive"):
        convert(datetime(2026, 1, 1))
