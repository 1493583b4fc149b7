"""One bad row never stops a loop that serves everyone: both stores read the actors' batches
(due jobs, stale runs, the jobs and runs of a batch) through :class:`RowReader`.

A row can be unreadable when it was written by a newer jobsched (a schedule type or status this
version does not know: a rolling upgrade, a downgrade) or edited by hand. Raising would stop the
scheduler on every start, and with it every partition it owns; skipping the row holds back only
that job, and says so once in the log (the row's id, what is wrong) for an operator to fix.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

import msgspec

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")

UNREADABLE = (msgspec.DecodeError, ValueError, TypeError, KeyError)
"""What decoding a row raises when it does not fit the schema (``msgspec.ValidationError`` is a
``DecodeError``; an unknown enum value a ``ValueError``; a missing column or field the others)."""


class RowReader:
    """Decodes rows, skipping and reporting (once per row) those that cannot be read.

    Args:
        store: the store's name, for the log.
        remember: how many reported rows it remembers (bounded, oldest forgotten first).
    """

    def __init__(self, store: str, *, remember: int = 10_000) -> None:
        self.store = store
        self.skipped = 0
        self._remember = remember
        self._reported: collections.OrderedDict[str, None] = collections.OrderedDict()

    def decode(
        self,
        rows: Iterable[R],
        decode: Callable[[R], T],
        *,
        what: str,
        key: Callable[[R], object],
    ) -> list[T]:
        """``decode`` of each row, in order, without the rows it cannot decode."""
        out: list[T] = []
        for row in rows:
            try:
                out.append(decode(row))
            except UNREADABLE as e:
                self._skip(what, str(key(row)), e)
        return out

    def _skip(self, what: str, row_id: str, error: BaseException) -> None:
        self.skipped += 1
        name = f"{what} {row_id}"
        if name in self._reported:
            log.debug("%s: %s still cannot be read; skipped", self.store, name)
            return
        self._reported[name] = None
        while len(self._reported) > self._remember:
            self._reported.popitem(last=False)
        log.error(
            "%s: %s cannot be read and is skipped; the other rows are served. Fix or delete it "
            "(%s: %s)",
            self.store,
            name,
            type(error).__name__,
            error,
        )
