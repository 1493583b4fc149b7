"""Input the JSON handlers never see: a body that does not say it is JSON, a JSON object with a
key twice, a query parameter given twice.

Each one is ambiguous rather than wrong — a form or ``text/plain`` body that happens to parse, a
duplicate key whose last value would silently win (RFC 8259 §4: "the names within an object
SHOULD be unique"; parsers disagree on which one counts), ``?status=A&status=B`` of which a
handler would read one — so each is refused before any handler acts:

- a body on an operation that takes JSON with another ``Content-Type`` than ``application/json``
  (or ``application/<x>+json``; ``charset``, when given, ``utf-8``): **415** (RFC 9110 §15.5.16);
- a JSON object with a duplicate key: **422** naming it (``parameters.region``);
- a repeated query parameter of an operation that takes query parameters: **422** naming it.

Which operations take a JSON body or query parameters is read from :data:`gateway.openapi.ROUTES`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from core.errors import FieldError, InvalidRequest, UnsupportedMediaType
from gateway.openapi import ROUTES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

JSON_BODIES = frozenset((r.method.upper(), r.path) for r in ROUTES if r.body is not None)
"""(method, route template) of every operation that takes a JSON body."""
QUERIES = frozenset(
    (r.method.upper(), r.path) for r in ROUTES if any(p.where == "query" for p in r.params)
)
"""(method, route template) of every operation that takes query parameters."""


def is_json(content_type: str, charset: str | None) -> bool:
    """Whether a ``Content-Type`` (its media type lower-cased, and its charset) says JSON."""
    media = content_type.lower()
    json_type = media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )
    return json_type and (charset is None or charset.lower() in ("utf-8", "utf8"))


class _Pairs(dict[str, Any]):
    """A JSON object as parsed, with the keys it held more than once."""

    duplicates: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(pairs)
    obj.duplicates = []
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                obj.duplicates.append(key)
            seen.add(key)
    return obj


def duplicate_key(body: bytes) -> str | None:
    """The dotted path of the first key that a JSON object of ``body`` holds twice, or None
    (also None when ``body`` is no JSON: the handler's decoder says why)."""
    try:
        doc = json.loads(body, object_pairs_hook=_object)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, value = stack.pop(0)
        if isinstance(value, _Pairs):
            if value.duplicates:
                return f"{path}{value.duplicates[0]}"
            stack += [(f"{path}{k}.", v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{path[:-1]}[{i}].", v) for i, v in enumerate(value)]
    return None


def repeated_query_parameters(request: web.Request) -> list[str]:
    """The query parameters given more than once, in order."""
    return sorted(k for k in set(request.query) if len(request.query.getall(k)) > 1)


@web.middleware
async def strict_input_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse the ambiguous input of the module docstring (put it inside the problem and auth
    middlewares: the problems are rendered by the first, and unauthenticated requests are
    answered 401 before any body is read)."""
    resource = request.match_info.route.resource
    operation = (request.method, resource.canonical if resource is not None else None)
    repeated = repeated_query_parameters(request) if operation in QUERIES else []
    if repeated:
        raise InvalidRequest(
            [FieldError(k, "repeated query parameter; give it once") for k in repeated]
        )
    if operation in JSON_BODIES and request.body_exists:
        body = await request.read()  # cached: the handler reads it again for free
        if body and not is_json(request.content_type, request.charset):
            raise UnsupportedMediaType(
                f"the body is {request.content_type}; send JSON with Content-Type: application/json"
            )
        key = duplicate_key(body) if body else None
        if key is not None:
            raise InvalidRequest(FieldError(key, "duplicate key; give each key once"))
    return await handler(request)
