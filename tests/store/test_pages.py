"""The keyset pagination that every store's listings share (``store.pages``), without a store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.errors import InvalidRequest
from core.timeutil import to_epoch_ms
from store.pages import Keyset, decode_cursor, encode_cursor

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
ROWS = [(T0 - timedelta(seconds=i), f"item-{i}") for i in range(5)]
"""Rows of a newest-first listing: (instant, id)."""


def key(item: tuple[datetime, str]) -> tuple[datetime, str]:
    return item


def test_a_page_asks_for_one_row_more_than_it_holds() -> None:
    page = Keyset.of(3, None)
    assert (page.after, page.fetch) == (None, 4)


def test_a_full_page_with_a_row_beyond_it_continues_after_its_last_item() -> None:
    first = Keyset.of(3, None).page(ROWS[:4], lambda r: r, key)
    assert first.items == ROWS[:3]
    assert first.next_cursor is not None
    second = Keyset.of(3, first.next_cursor)
    assert second.after == (to_epoch_ms(ROWS[2][0]), ROWS[2][1])


@pytest.mark.parametrize("rows", [0, 2, 3], ids=["none", "fewer", "exactly the limit"])
def test_a_page_without_a_row_beyond_it_is_the_last(rows: int) -> None:
    page = Keyset.of(3, None).page(ROWS[:rows], lambda r: r, key)
    assert (page.items, page.next_cursor) == (ROWS[:rows], None)


def test_only_the_items_of_the_page_are_decoded() -> None:
    decoded: list[str] = []

    def decode(row: tuple[datetime, str]) -> tuple[datetime, str]:
        decoded.append(row[1])
        return row

    Keyset.of(2, None).page(ROWS[:3], decode, key)
    assert decoded == ["item-0", "item-1"]


def test_a_cursor_round_trips_its_sort_key() -> None:
    assert decode_cursor(encode_cursor(1_780_000_000_123, "job-1")) == (1_780_000_000_123, "job-1")


@pytest.mark.parametrize("cursor", ["", "not base64 !", encode_cursor(-1, "x"), "WzEsIiJd"])
def test_a_cursor_the_api_did_not_give_is_refused_on_the_cursor_field(cursor: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        Keyset.of(10, cursor)
    assert [e.field for e in info.value.errors] == ["cursor"]
