"""Partition quotas and rebalancing (pure)."""

from __future__ import annotations

import pytest

from core.partitions import preference, quota, rebalance


@pytest.mark.parametrize(
    ("partitions", "members"), [(64, 1), (64, 2), (64, 3), (16, 3), (7, 5), (3, 5)]
)
def test_quotas_add_up_to_every_partition(partitions: int, members: int) -> None:
    ids = [f"s{i}" for i in range(members)]
    quotas = [quota(m, ids, partitions) for m in ids]
    assert sum(quotas) == partitions
    assert max(quotas) - min(quotas) <= 1


def test_preference_is_a_rotation_that_differs_between_members() -> None:
    a, b = preference("scheduler-a", 64), preference("scheduler-b", 64)
    assert sorted(a) == sorted(b) == list(range(64))
    assert a[0] != b[0]


def test_an_owner_above_its_quota_releases_its_least_preferred_partitions() -> None:
    owned = set(range(16))
    plan = rebalance("s1", owned, taken=owned, partitions=16, members={"s1", "s2"})
    assert plan.acquire == ()
    assert len(plan.release) == 8
    order = preference("s1", 16)
    assert set(plan.release) == set(order[8:])


def test_a_member_below_its_quota_takes_only_free_partitions() -> None:
    taken = set(range(10))
    plan = rebalance("s2", owned=set(), taken=taken, partitions=16, members={"s1", "s2"})
    assert plan.release == ()
    assert set(plan.acquire) <= set(range(10, 16))
    assert len(plan.acquire) == 6


def test_three_members_converge_to_an_exact_split() -> None:
    members = {"a", "b", "c"}
    owners: dict[int, str] = {}
    for _ in range(10):
        for m in sorted(members):
            mine = {p for p, o in owners.items() if o == m}
            plan = rebalance(m, mine, set(owners), 16, members)
            for p in plan.release:
                del owners[p]
            for p in plan.acquire:
                owners[p] = m
    counts = sorted(list(owners.values()).count(m) for m in members)
    assert len(owners) == 16
    assert counts == [5, 5, 6]
