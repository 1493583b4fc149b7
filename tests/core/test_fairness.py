"""core/fairness: round-robin across owners, FIFO within one."""

from __future__ import annotations

from core.fairness import FairQueue, round_robin


def test_a_backlog_takes_turns_with_a_small_user() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(10):
        q.push("big", f"b{i}")
    q.push("small", "s0")
    q.push("small", "s1")
    order = [q.pop() for _ in range(6)]
    assert order == ["b0", "s0", "b1", "s1", "b2", "b3"]
    assert len(q) == 6
    assert q.owners() == {"big": 6}


def test_a_user_arriving_later_is_served_next_round() -> None:
    q: FairQueue[int] = FairQueue()
    for i in range(3):
        q.push("a", i)
    assert q.pop() == 0
    q.push("b", 100)
    assert [q.pop(), q.pop(), q.pop(), q.pop()] == [1, 100, 2, None]


def test_clear_returns_everything_in_turn_order() -> None:
    q: FairQueue[int] = FairQueue()
    q.push("a", 1)
    q.push("b", 2)
    q.push("a", 3)
    assert list(q) == [1, 3, 2]
    assert q.clear() == [1, 3, 2]
    assert len(q) == 0 and q.pop() is None


def test_an_owner_at_its_cap_keeps_its_turn() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.push("big", f"b{i}")
    q.push("small", "s0")
    assert q.pop(lambda owner: owner != "big") == "s0"
    assert q.pop(lambda owner: owner != "big") is None
    assert q.pop() == "b0"


def test_round_robin_takes_owners_in_turns_keeping_each_owners_order() -> None:
    items = ["a1", "a2", "a3", "b1", "a4", "c1", "b2"]
    assert round_robin(items, lambda x: x[0]) == ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]
    assert round_robin([], lambda x: x) == []
