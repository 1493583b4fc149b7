"""Fair division of partitions among live schedulers (pure; the lease loop applies it)."""

from __future__ import annotations

import zlib
from collections.abc import Collection
from dataclasses import dataclass


def quota(member: str, members: Collection[str], partitions: int) -> int:
    """How many partitions ``member`` should hold among the live ``members``.

    ``partitions // len(members)`` each, and one more for the first ``partitions % len(members)``
    members in id order, so that the quotas add up to exactly ``partitions`` and every scheduler
    computes the same split from the same membership.
    """
    everyone = sorted(set(members) | {member})
    base, extra = divmod(partitions, len(everyone))
    return base + (1 if everyone.index(member) < extra else 0)


def preference(member: str, partitions: int) -> list[int]:
    """The order in which ``member`` tries partitions: all of them, rotated by ``crc32(member)``,
    so that schedulers starting together reach for different partitions first."""
    start = zlib.crc32(member.encode()) % partitions
    return [(start + i) % partitions for i in range(partitions)]


@dataclass(frozen=True, slots=True)
class Rebalance:
    """What one scheduler should do now: give ``release`` back, try to take ``acquire``."""

    release: tuple[int, ...]
    acquire: tuple[int, ...]


def rebalance(
    member: str,
    owned: Collection[int],
    taken: Collection[int],
    partitions: int,
    members: Collection[str],
) -> Rebalance:
    """Move ``member`` toward its :func:`quota`.

    Over its quota it releases the partitions it prefers least; under it, it tries free
    partitions (not ``taken`` by anyone) in its preference order. ``members`` are the live
    schedulers (``member`` counts as live).
    """
    share = quota(member, members, partitions)
    order = preference(member, partitions)
    if len(owned) > share:
        mine = [p for p in order if p in owned]
        return Rebalance(release=tuple(mine[share:]), acquire=())
    want = share - len(owned)
    free = [p for p in order if p not in taken and p not in owned]
    return Rebalance(release=(), acquire=tuple(free[:want]))
