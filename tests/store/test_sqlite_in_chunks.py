"""``store.sqlite.schema.in_chunks``: the chunked ``IN (…)`` lists of the SQLite store."""

from __future__ import annotations

import sqlite3

import pytest

from store.sqlite.schema import IN_CHUNK, in_chunks

OLD_CAP = 999
"""``SQLITE_MAX_VARIABLE_NUMBER`` of SQLite before 3.32.0, which :data:`IN_CHUNK` stays under."""


def test_no_values_no_statement() -> None:
    assert list(in_chunks([])) == []


def test_exactly_the_limit_is_one_statement() -> None:
    values = [f"id-{i}" for i in range(IN_CHUNK)]
    [(marks, chunk)] = in_chunks(values)
    assert chunk == values
    assert marks == ", ".join(["?"] * IN_CHUNK)


def test_one_past_the_limit_is_a_second_statement_of_one() -> None:
    values = [f"id-{i}" for i in range(IN_CHUNK + 1)]
    chunks = list(in_chunks(values))
    assert [len(chunk) for _, chunk in chunks] == [IN_CHUNK, 1]
    assert [v for _, chunk in chunks for v in chunk] == values
    assert [marks.count("?") for marks, _ in chunks] == [IN_CHUNK, 1]
    assert chunks[1][0] == "?"


def test_every_statement_binds_under_the_old_cap_with_room_for_more() -> None:
    """On a connection capped as SQLite before 3.32.0 is, one statement of all the values is
    refused, the chunked ones (each with 499 further parameters) are not."""
    db = sqlite3.connect(":memory:")
    db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, OLD_CAP)
    db.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    values = list(range(2 * IN_CHUNK + 1))
    db.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    with pytest.raises(sqlite3.OperationalError, match="too many SQL variables"):
        db.execute(f"SELECT x FROM t WHERE x IN ({', '.join('?' * len(values))})", values)
    others = [-1] * (OLD_CAP - IN_CHUNK)
    found: list[int] = []
    for marks, chunk in in_chunks(values):
        sql = f"SELECT x FROM t WHERE x IN ({marks}) AND x NOT IN ({', '.join('?' * len(others))})"
        found += [r[0] for r in db.execute(sql + " ORDER BY x", [*chunk, *others])]
    db.close()
    assert found == values
