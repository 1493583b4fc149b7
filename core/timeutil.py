"""Time helpers: every instant jobsched handles is an aware UTC datetime truncated to milliseconds.

Milliseconds because BSON dates keep milliseconds, so a value written to MongoDB or SQLite reads
back equal. Wall-clock "now" comes from a :class:`core.clock.Clock`, never from here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_utc_ms(t: datetime) -> datetime:
    """Convert an aware datetime to UTC and truncate it to whole milliseconds.

    Raises:
        ValueError: if ``t`` is naive (it has no offset, so its instant is unknown).
    """
    if t.tzinfo is not UTC:
        if t.tzinfo is None or t.utcoffset() is None:
            raise ValueError("naive datetime: an instant needs a UTC offset")
        t = t.astimezone(UTC)
    us = t.microsecond % 1000
    return t if us == 0 else t.replace(microsecond=t.microsecond - us)


def to_epoch_ms(t: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime (floored to the millisecond).

    Raises:
        ValueError: if ``t`` is naive.
    """
    if t.tzinfo is None or (t.tzinfo is not UTC and t.utcoffset() is None):
        raise ValueError("naive datetime: an instant needs a UTC offset")
    return (t - EPOCH) // _MS


def from_epoch_ms(ms: int) -> datetime:
    """The aware UTC datetime ``ms`` milliseconds after the Unix epoch."""
    return EPOCH + timedelta(milliseconds=ms)


def isoformat_z(t: datetime) -> str:
    """RFC 3339 in UTC with ``Z`` and milliseconds, e.g. ``2026-06-01T10:21:00.000Z``."""
    t = to_utc_ms(t)
    return (
        f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}."
        f"{t.microsecond // 1000:03d}Z"
    )
