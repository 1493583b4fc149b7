"""core.heap.FireHeap: earliest due first, one live entry per job, lazy deletion."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from core.heap import FireHeap

T0 = datetime(2026, 6, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def drain(heap: FireHeap) -> list[tuple[str, datetime]]:
    return heap.pop_due(at(10**9), limit=10**9)


def test_an_empty_heap() -> None:
    heap = FireHeap()

    assert len(heap) == 0
    assert heap.peek() is None
    assert heap.pop_due(at(10**6), limit=10) == []
    assert "job" not in heap


def test_jobs_come_out_earliest_first() -> None:
    heap = FireHeap()
    for job_id, due in [("c", 30), ("a", 10), ("d", 40), ("b", 20)]:
        heap.push(job_id, at(due))

    assert len(heap) == 4
    assert heap.peek() == at(10)
    assert drain(heap) == [("a", at(10)), ("b", at(20)), ("c", at(30)), ("d", at(40))]
    assert len(heap) == 0


def test_equal_due_times_come_out_in_push_order() -> None:
    heap = FireHeap()
    for job_id in ["z", "a", "m"]:
        heap.push(job_id, at(5))

    assert [job_id for job_id, _ in drain(heap)] == ["z", "a", "m"]


def test_pop_due_takes_only_what_is_due_including_now() -> None:
    heap = FireHeap()
    for job_id, due in [("a", 10), ("b", 20), ("c", 30)]:
        heap.push(job_id, at(due))

    assert heap.pop_due(at(9.999), limit=10) == []
    assert heap.pop_due(at(20), limit=10) == [("a", at(10)), ("b", at(20))]
    assert "a" not in heap
    assert "c" in heap
    assert heap.peek() == at(30)


def test_pop_due_respects_the_limit() -> None:
    heap = FireHeap()
    for i in range(5):
        heap.push(f"job-{i}", at(i))

    assert [j for j, _ in heap.pop_due(at(100), limit=2)] == ["job-0", "job-1"]
    assert [j for j, _ in heap.pop_due(at(100), limit=2)] == ["job-2", "job-3"]
    assert heap.pop_due(at(100), limit=0) == []
    assert len(heap) == 1


def test_pushing_a_job_again_replaces_its_due_time() -> None:
    heap = FireHeap()
    heap.push("a", at(10))
    heap.push("b", at(20))

    heap.push("a", at(30))  # later: its old entry must not fire at 10

    assert len(heap) == 2
    assert heap.peek() == at(20)
    assert heap.pop_due(at(25), limit=10) == [("b", at(20))]
    assert heap.pop_due(at(100), limit=10) == [("a", at(30))]

    heap.push("c", at(50))
    heap.push("c", at(5))  # earlier

    assert heap.pop_due(at(100), limit=10) == [("c", at(5))]


def test_moving_a_job_back_to_an_earlier_due_time_fires_it_once() -> None:
    heap = FireHeap()
    heap.push("a", at(10))
    heap.push("a", at(20))
    heap.push("a", at(10))

    assert drain(heap) == [("a", at(10))]


def test_discard_forgets_a_job() -> None:
    heap = FireHeap()
    heap.push("a", at(10))
    heap.push("b", at(20))

    heap.discard("a")
    heap.discard("never-pushed")

    assert "a" not in heap
    assert len(heap) == 1
    assert heap.peek() == at(20)
    assert drain(heap) == [("b", at(20))]


def test_a_discarded_job_can_be_pushed_again_at_its_old_time() -> None:
    heap = FireHeap()
    heap.push("a", at(10))
    heap.discard("a")
    heap.push("a", at(10))

    assert drain(heap) == [("a", at(10))]


def test_a_popped_job_can_be_pushed_again() -> None:
    heap = FireHeap()
    heap.push("a", at(10))
    heap.push("a", at(20))
    assert heap.pop_due(at(15), limit=10) == []
    assert heap.pop_due(at(20), limit=10) == [("a", at(20))]

    heap.push("a", at(20))

    assert drain(heap) == [("a", at(20))]


def test_due_times_are_aware_utc_milliseconds() -> None:
    heap = FireHeap()
    heap.push("a", datetime(2026, 6, 1, 2, 0, 0, 123_456, tzinfo=UTC))

    due = heap.peek()

    assert due == datetime(2026, 6, 1, 2, 0, 0, 123_000, tzinfo=UTC)
    assert due is not None
    assert due.utcoffset() == timedelta(0)


def test_clear_empties_the_heap() -> None:
    heap = FireHeap()
    heap.push("a", at(1))
    heap.clear()

    assert len(heap) == 0
    assert heap.peek() is None


def test_many_replacements_keep_one_live_entry_per_job() -> None:
    rng = random.Random(7)
    heap = FireHeap()
    latest: dict[str, float] = {}
    for _ in range(20_000):  # enough stale entries to trigger compaction several times
        job_id = f"job-{rng.randrange(50)}"
        due = rng.randrange(100_000) / 10
        heap.push(job_id, at(due))
        latest[job_id] = due
        if rng.random() < 0.05:
            heap.discard(job_id)
            del latest[job_id]

    assert len(heap) == len(latest)
    out = drain(heap)
    assert len(out) == len(latest)
    assert dict(out) == {job_id: at(due) for job_id, due in latest.items()}
    assert [due for _, due in out] == sorted(due for _, due in out)
