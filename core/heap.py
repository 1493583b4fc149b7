"""The scheduler's fire-time heap: which job is due next, with lazy invalidation."""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime
from typing import Generic, TypeVar

from core.timeutil import from_epoch_ms, to_epoch_ms

T = TypeVar("T")


class FireHeap:
    """Min-heap of (due time, job id); at most one live entry per job.

    Pushing a job again replaces its due time; the old entry stays in the heap and is skipped
    when it surfaces (lazy deletion), so push and pop are O(log n).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str]] = []
        self._due: dict[str, int] = {}
        self._partition: dict[str, int] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._due

    def push(self, job_id: str, due: datetime, partition: int = -1) -> None:
        """Schedule ``job_id`` (of ``partition``) at ``due`` (aware), replacing its old entry."""
        ms = to_epoch_ms(due)
        self._partition[job_id] = partition
        if self._due.get(job_id) == ms:
            return
        self._due[job_id] = ms
        heapq.heappush(self._heap, (ms, next(self._seq), job_id))
        if len(self._heap) > 2 * len(self._due) + 1024:
            self._compact()

    def discard(self, job_id: str) -> None:
        """Forget ``job_id`` (its entry is skipped when it surfaces)."""
        self._due.pop(job_id, None)
        self._partition.pop(job_id, None)

    def drop_partitions(self, partitions: frozenset[int]) -> int:
        """Forget every job of ``partitions``; how many were dropped."""
        gone = [j for j, p in self._partition.items() if p in partitions]
        for job_id in gone:
            self.discard(job_id)
        return len(gone)

    def peek(self) -> datetime | None:
        """Due time of the earliest live entry, or None when empty."""
        self._skip_stale()
        return from_epoch_ms(self._heap[0][0]) if self._heap else None

    def pop_due(self, now: datetime, limit: int) -> list[tuple[str, datetime]]:
        """Remove and return up to ``limit`` entries due at or before ``now``, earliest first."""
        now_ms = to_epoch_ms(now)
        out: list[tuple[str, datetime]] = []
        while len(out) < limit:
            self._skip_stale()
            if not self._heap or self._heap[0][0] > now_ms:
                break
            ms, _, job_id = heapq.heappop(self._heap)
            del self._due[job_id]
            self._partition.pop(job_id, None)
            out.append((job_id, from_epoch_ms(ms)))
        return out

    def clear(self) -> None:
        self._heap.clear()
        self._due.clear()
        self._partition.clear()

    def _skip_stale(self) -> None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._due.get(e[2]) == e[0]]
        heapq.heapify(self._heap)


class TimedQueue(Generic[T]):
    """Items released at their time (earliest first): runs recorded ahead, published when due."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, at: datetime, item: T) -> None:
        heapq.heappush(self._heap, (to_epoch_ms(at), next(self._seq), item))

    def peek(self) -> datetime | None:
        """Time of the earliest item, or None when empty."""
        return from_epoch_ms(self._heap[0][0]) if self._heap else None

    def pop_due(self, now: datetime) -> list[T]:
        """Remove and return every item whose time is at or before ``now``, earliest first."""
        now_ms = to_epoch_ms(now)
        out: list[T] = []
        while self._heap and self._heap[0][0] <= now_ms:
            out.append(heapq.heappop(self._heap)[2])
        return out
