"""Keyset pagination, shared by every store and every paginated listing (jobs, runs, audit).

A listing is sorted newest first by ``(instant, id)``. Its cursor is the sort key of the last item
of a page: ``(instant in epoch ms, id)``, encoded as unpadded base64url JSON. Keyset (not offset)
pagination stays correct while items are inserted. A store asks for one row more than the page
holds; that row, if it comes, says that another page follows.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import msgspec

from core.errors import FieldError, InvalidRequest
from core.model import Page
from core.timeutil import to_epoch_ms

MAX_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: no instant jobsched stores is later."""

R = TypeVar("R")
T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(tuple[int, str])


def encode_cursor(sort_ms: int, item_id: str) -> str:
    """The cursor that continues after the item with sort key ``(sort_ms, item_id)``."""
    return base64.urlsafe_b64encode(_encoder.encode((sort_ms, item_id))).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """The sort key inside ``cursor``.

    Raises:
        InvalidRequest: on field ``cursor`` when it was not produced by :func:`encode_cursor`.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        sort_ms, item_id = _decoder.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        sort_ms, item_id = -1, ""
    if not 0 <= sort_ms <= MAX_MS or not 0 < len(item_id) <= 256:
        raise InvalidRequest(FieldError("cursor", "is not a cursor returned by this API"))
    return sort_ms, item_id


@dataclass(frozen=True, slots=True)
class Keyset:
    """One page of a newest-first listing: where it starts and how many rows to fetch.

    Attributes:
        limit: the most items the page holds.
        after: the sort key ``(epoch ms, id)`` of the previous page's last item, None for the
            first page; the page holds the items strictly before it.
    """

    limit: int
    after: tuple[int, str] | None

    @classmethod
    def of(cls, limit: int, cursor: str | None) -> Keyset:
        """The page that ``cursor`` (None: the first) continues with.

        Raises:
            InvalidRequest: on field ``cursor`` (see :func:`decode_cursor`).
        """
        return cls(limit, None if cursor is None else decode_cursor(cursor))

    @property
    def fetch(self) -> int:
        """How many rows to ask for: one more than the page holds."""
        return self.limit + 1

    def page(
        self,
        rows: Sequence[R],
        decode: Callable[[R], T],
        key: Callable[[T], tuple[datetime, str]],
    ) -> Page[T]:
        """The page of ``rows`` (at most :attr:`fetch`, in listing order): the first ``limit``
        decoded, and the cursor after the last of them if more rows came."""
        items = [decode(r) for r in rows[: self.limit]]
        if len(rows) <= self.limit or not items:
            return Page(items=items, next_cursor=None)
        at, item_id = key(items[-1])
        return Page(items=items, next_cursor=encode_cursor(to_epoch_ms(at), item_id))
