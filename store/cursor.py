"""Opaque keyset cursors shared by every store.

A cursor is the sort key of the last item of a page: ``(instant in epoch ms, id)``, encoded as
unpadded base64url JSON. Keyset (not offset) pagination stays correct while items are inserted.
"""

from __future__ import annotations

import base64
import binascii

import msgspec

from core.errors import FieldError, InvalidRequest

MAX_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: no instant jobsched stores is later."""

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
