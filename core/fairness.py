"""Per-user fairness of a worker's intake, decided without I/O.

A worker fetches a bounded look-ahead of the shared work queue (its concurrency plus
``JOBSCHED_WORKER_PREFETCH`` messages) and starts them from a :class:`FairQueue`: one FIFO per
owner, served round-robin, so a user with a long backlog takes one start in turn with every
other user that has runs waiting, instead of all of them in stream order (deficit round-robin
with equal quanta; Shreedhar & Varghese, 1995). Within one owner, runs start in stream order.

Round-robin alone is work-conserving: when one user's runs fill every execution slot, another
user's run that arrives waits for the next slot to free. ``JOBSCHED_WORKER_USER_CONCURRENCY``
caps the runs one owner has in flight on a worker, keeping slots free for the others (a
reservation: with a cap, one user alone cannot use the whole worker).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """FIFO queues per owner, popped round-robin across owners. Not thread-safe (one event
    loop)."""

    __slots__ = ("_queues", "_size")

    def __init__(self) -> None:
        self._queues: collections.OrderedDict[str, collections.deque[T]] = collections.OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, owner: str, item: T) -> None:
        """Queue ``item`` behind ``owner``'s others; a new owner takes its turn last."""
        self._queues.setdefault(owner, collections.deque()).append(item)
        self._size += 1

    def pop(self, allowed: Callable[[str], bool] | None = None) -> T | None:
        """The oldest item of the owner whose turn it is (None: empty, or no owner
        ``allowed``); that owner's next turn comes after every other owner with items. An owner
        not ``allowed`` (at its in-flight cap) keeps its turn for when it is."""
        owner = next((o for o in self._queues if allowed is None or allowed(o)), None)
        if owner is None:
            return None
        queue = self._queues[owner]
        item = queue.popleft()
        self._size -= 1
        if queue:
            self._queues.move_to_end(owner)
        else:
            del self._queues[owner]
        return item

    def owners(self) -> dict[str, int]:
        """Items queued per owner, in turn order."""
        return {owner: len(q) for owner, q in self._queues.items()}

    def __iter__(self) -> Iterator[T]:
        for queue in self._queues.values():
            yield from queue

    def clear(self) -> list[T]:
        """Remove and return every item."""
        items = list(self)
        self._queues.clear()
        self._size = 0
        return items


def round_robin(items: Iterable[T], owner: Callable[[T], str]) -> list[T]:
    """``items`` in turns across their owners (the first item's owner first), each owner's in
    their given order: ``a1 a2 a3 b1`` → ``a1 b1 a2 a3``. The scheduler publishes the runs due
    in one wake-up in this order, so a burst of one user's runs due at once cannot put another
    user's run behind all of them in the shared work stream (and so beyond the workers'
    look-ahead)."""
    queue: FairQueue[T] = FairQueue()
    for item in items:
        queue.push(owner(item), item)
    out: list[T] = []
    while queue:
        turn = queue.pop()
        assert turn is not None
        out.append(turn)
    return out
