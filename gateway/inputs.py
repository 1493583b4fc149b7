"""Checks of HTTP input the decoders cannot make: the media type of a body, keys repeated in a
JSON object, query parameters given twice, a time range the wrong way round.

Each raises the project's errors (:mod:`core.errors`), answered as RFC 9457 problems that name
the offending header, field or parameter.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from multidict import MultiMapping

from core.errors import FieldError, InvalidRequest, UnsupportedMediaType

JSON_MEDIA_TYPES = ("application/json", "application/merge-patch+json")
"""The media types a JSON body may be sent as (any other ``application/*+json`` too: RFC 6839
structured syntax suffix)."""


def check_json_media_type(content_type: str | None) -> None:
    """Accept a JSON body's ``Content-Type``: a JSON media type, with no ``charset`` or
    ``charset=utf-8`` (JSON is UTF-8, RFC 8259 §8.1); an absent header is taken as JSON
    (RFC 9110 §8.3 leaves it to the recipient).

    Raises:
        UnsupportedMediaType: another media type (``text/plain``, a form,
            ``application/octet-stream`` …) or another charset: 415 (RFC 9110 §15.5.16).
    """
    if content_type is None or not content_type.strip():
        return
    media_type, _, parameters = content_type.partition(";")
    media_type = media_type.strip().lower()
    charsets = [
        value.strip().strip('"').lower()
        for name, _, value in (p.partition("=") for p in parameters.split(";"))
        if name.strip().lower() == "charset"
    ]
    utf8 = all(c in ("utf-8", "utf8") for c in charsets)
    if utf8 and (
        media_type in JSON_MEDIA_TYPES
        or (media_type.startswith("application/") and media_type.endswith("+json"))
    ):
        return
    shown = content_type.strip() if not utf8 else media_type
    raise UnsupportedMediaType(
        f"Content-Type {shown!r} is not supported here; send the body as "
        f"{' or '.join(JSON_MEDIA_TYPES)} (UTF-8)"
    )


def duplicate_key(body: bytes | str) -> str | None:
    """The path of the first key repeated within one JSON object of ``body``
    (``"labels.team"``, ``"parameters.items[2].id"``), or None when every object's keys are
    unique — or when ``body`` is not JSON (the decoder reports that).

    I-JSON (RFC 7493 §2.3) forbids repeated names; a decoder keeps one of them silently (the
    last, with msgspec), so a client would never learn that the other was dropped.
    """
    found: list[tuple[dict[str, Any], str]] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj and not found:
                found.append((obj, key))
            obj[key] = value
        return obj

    try:
        tree = json.loads(body, object_pairs_hook=pairs_hook)
    except (ValueError, RecursionError):
        return None
    if not found:
        return None
    target, key = found[0]
    return _join([*(_path_to(tree, target) or []), key])


def _path_to(node: Any, target: dict[str, Any]) -> list[str] | None:
    if node is target:
        return []
    children: Any = ()
    if isinstance(node, dict):
        children = node.items()
    elif isinstance(node, list):
        children = ((f"[{i}]", v) for i, v in enumerate(node))
    for segment, child in children:
        if isinstance(child, dict | list) and (rest := _path_to(child, target)) is not None:
            return [segment, *rest]
    return None


def _join(segments: list[str]) -> str:
    out = ""
    for segment in segments:
        out += segment if segment.startswith("[") or not out else f".{segment}"
    return out or "body"


def check_duplicate_keys(body: bytes | str) -> None:
    """Raises: InvalidRequest: naming the path of a key repeated in one object (422)."""
    path = duplicate_key(body)
    if path is not None:
        raise InvalidRequest(FieldError(path, "this key appears more than once in its object"))


def check_single_values(query: MultiMapping[str], multi: Collection[str] = ()) -> None:
    """Every query parameter but those in ``multi`` given at most once (``?status=A&status=B``
    is ambiguous: which one?).

    Raises:
        InvalidRequest: naming each repeated parameter (422).
    """
    repeated = sorted({k for k in query if k not in multi and len(query.getall(k)) > 1})
    if repeated:
        raise InvalidRequest(
            [FieldError(k, "given more than once; give it once") for k in repeated]
        )


def check_time_range(
    times: Mapping[str, datetime | None], start: str = "startTime", end: str = "endTime"
) -> None:
    """``times[start]`` not after ``times[end]`` (when both are given).

    Raises:
        InvalidRequest: naming ``start`` (422).
    """
    low, high = times.get(start), times.get(end)
    if low is not None and high is not None and low > high:
        raise InvalidRequest(FieldError(start, f"must not be after {end}"))
