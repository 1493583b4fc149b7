"""RFC 9457 problem responses (``application/problem+json``), for the app's error middleware and
for the requests aiohttp rejects before any middleware runs (:mod:`gateway.server`)."""

from __future__ import annotations

import math

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from core.errors import FieldError, QuotaExceeded
from core.model import Problem, ProblemField, ProblemLimit

PROBLEM_BASE = "https://jobsched.dev/problems/"
PROBLEM_JSON = "application/problem+json"

TITLES = {
    400: "Malformed request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    414: "URI too long",
    415: "Unsupported media type",
    422: "Invalid request",
    429: "Too many requests",
    431: "Request header fields too large",
    500: "Internal error",
    503: "Service unavailable",
    504: "Gateway timeout",
}

encoder = msgspec.json.Encoder()


def problem(
    status: int,
    code: str,
    detail: str | None,
    *,
    title: str | None = None,
    instance: str | None = None,
    request_id: str | None = None,
    errors: list[FieldError] | None = None,
    quota: QuotaExceeded | None = None,
    replay_id: str | None = None,
) -> web.Response:
    """An RFC 9457 problem response: ``type`` is :data:`PROBLEM_BASE` + ``code``; ``title``
    defaults to the status's entry in :data:`TITLES`. A 401 carries ``WWW-Authenticate``, a 503
    ``Retry-After: 1``; a 429 of a ``quota`` its ``limit`` and, when waiting helps,
    ``Retry-After`` (:func:`retry_after`)."""
    body = Problem(
        type=PROBLEM_BASE + code,
        title=title or TITLES.get(status, "Error"),
        status=status,
        detail=detail,
        instance=instance,
        code=code,
        request_id=request_id,
        errors=[ProblemField(field=e.field, reason=e.reason) for e in errors] if errors else None,
        limit=quota_limit(quota),
        replay_id=replay_id,
    )
    resp = web.Response(status=status, body=encoder.encode(body), content_type=PROBLEM_JSON)
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="jobsched"'
    if status == 503:
        resp.headers["Retry-After"] = "1"
    if quota is not None and quota.retry_after_seconds is not None:
        resp.headers["Retry-After"] = retry_after(quota.retry_after_seconds)
    return resp


def quota_limit(quota: QuotaExceeded | None) -> ProblemLimit | None:
    """The ``limit`` member of a ``quota_exceeded`` problem."""
    if quota is None:
        return None
    value = quota.value
    return ProblemLimit(name=quota.limit, value=int(value) if float(value).is_integer() else value)


def retry_after(seconds: float) -> str:
    """``Retry-After`` as delay-seconds (RFC 9110 §10.2.3: a non-negative integer), rounded up so
    a client that waits that long finds the quota ready; at least 1."""
    return str(max(1, math.ceil(seconds)))


def describe(exc: BaseException, limit: int = 200) -> str:
    """A one-line description of an HTTP parser or payload error, without the client's bytes.

    aiohttp's messages quote the offending input over several lines (``Invalid header value
    char:`` / ``b'X-A: a\\x00b'`` / ``^``); this keeps the words and drops the quote and the
    pointer, so a client cannot write arbitrary text into the log or another client's view.
    """
    cause = exc.__cause__
    if not isinstance(exc, HttpProcessingError) and isinstance(cause, HttpProcessingError):
        exc = cause
    text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
    words = (line.strip().rstrip(":").strip() for line in text.splitlines())
    kept = [w for w in words if w.strip("^ ") and not w.startswith(("b'", 'b"', "bytearray("))]
    return ": ".join(kept)[:limit] or type(exc).__name__
