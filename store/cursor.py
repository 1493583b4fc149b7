"""Opaque keyset cursors shared by every store.

A cursor is the sort key of the last item of a page: ``(instant in epoch ms, id)``, encoded as
unpadded base64url JSON. Keyset (not offset) pagination stays correct while items are inserted.
"""

from __future__ import annotations

import base64
import binascii

import msgspec

from core.errors import FieldError, InvalidRequest

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
        return _decoder.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise InvalidRequest(FieldError("cursor", "is not a cursor returned by this API")) from None
