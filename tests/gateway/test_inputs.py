"""gateway/inputs: media types, repeated keys and parameters, time ranges (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from multidict import MultiDict

from core.errors import InvalidRequest, UnsupportedMediaType
from gateway.inputs import (
    check_json_media_type,
    check_single_values,
    check_time_range,
    duplicate_key,
)


@pytest.mark.parametrize(
    "content_type",
    [None, "", "application/json", "Application/JSON; charset=utf-8",
     "application/merge-patch+json", "application/problem+json"],
)  # fmt: skip
def test_json_media_types(content_type: str | None) -> None:
    check_json_media_type(content_type)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b",
     "application/octet-stream", "text/json+plain", "application/jsonx"],
)  # fmt: skip
def test_other_media_types_are_415(content_type: str) -> None:
    with pytest.raises(UnsupportedMediaType) as e:
        check_json_media_type(content_type)
    assert e.value.status == 415


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (b'{"a": 1, "b": 2}', None),
        (b'{"a": {"x": 1}, "b": {"x": 2}}', None),  # the same key in two objects is fine
        (b'{"a": 1, "a": 2}', "a"),
        (b'{"a": {"b": {"c": 1, "c": 1}}}', "a.b.c"),
        (b'{"a": [1, {"k": 1}, {"k": 1, "k": 2}]}', "a[2].k"),
        (b'[{"k": 1, "k": 1}]', "[0].k"),
        (b'{"a": [[{"k": 0, "k": 0}]]}', "a[0][0].k"),
        (b'{"a": 1, "a"', None),  # not JSON: the decoder says so
        (b"\xff", None),
    ],
)
def test_duplicate_key_paths(body: bytes, path: str | None) -> None:
    assert duplicate_key(body) == path


def test_repeated_query_parameters_are_named() -> None:
    check_single_values(MultiDict([("a", "1"), ("b", "2")]))
    with pytest.raises(InvalidRequest) as e:
        check_single_values(MultiDict([("b", "1"), ("a", "1"), ("b", "2"), ("a", "3")]))
    assert [f.field for f in e.value.errors] == ["a", "b"]
    check_single_values(MultiDict([("status", "A"), ("status", "B")]), multi={"status"})


def test_time_range() -> None:
    early, late = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    check_time_range({"startTime": early, "endTime": late})
    check_time_range({"startTime": late, "endTime": None})
    check_time_range({"startTime": early, "endTime": early})
    with pytest.raises(InvalidRequest) as e:
        check_time_range({"startTime": late, "endTime": early})
    assert [f.field for f in e.value.errors] == ["startTime"]
