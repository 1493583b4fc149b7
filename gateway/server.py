"""The HTTP server under the app: requests aiohttp rejects before any middleware runs.

aiohttp 3 answers a request its parser rejects (a header over the limit, a NUL in a header,
both ``Content-Length`` and ``Transfer-Encoding``, a bad method token …) itself, from
``RequestHandler.handle_error``: plain text, always 400, logged at ERROR with a traceback, so
any client could fill the log. Neither middlewares nor ``on_response_prepare`` see those
requests (aio-libs/aiohttp#3287; aiohttp 4 routes them through the middlewares instead).
:class:`GatewayRunner` runs the app on a connection handler that answers them as the rest of
the API does:

* an RFC 9457 problem body with the status that fits — 414 for a request target over
  :data:`MAX_URL_BYTES`, 431 for a header field over :data:`MAX_FIELD_BYTES` or more than
  :data:`MAX_HEADERS` of them (RFC 6585 §5), 415 for an unsupported content coding, 400
  otherwise — and a fresh ``X-Request-Id``; the connection is closed after it;
* one INFO line per bad request, without a traceback and without the client's bytes (logger
  ``gateway.server``).

Client faults aiohttp logs elsewhere (a body whose framing or coding breaks after the app
answered, a client gone mid-request) are logged the same way; real server errors keep
aiohttp's ERROR with the traceback.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError, LineTooLong

from gateway.problems import describe, problem

log = logging.getLogger(__name__)

MAX_URL_BYTES = 8000
"""Longest request target (path and query) accepted, in bytes: the request-line length RFC 9112
§3 recommends every recipient to support. Longer: 414."""

MAX_FIELD_BYTES = 8190
"""Longest header field (name and value) accepted, in bytes (aiohttp's and Apache's default).
Longer: 431. It differs from :data:`MAX_URL_BYTES`, which tells aiohttp's two line-too-long
errors apart."""

MAX_HEADERS = 128
"""Most header fields accepted in one request (aiohttp's default). More: 431."""


def parser_error_status(
    exc: HttpProcessingError, *, max_url_bytes: int, max_field_bytes: int, max_headers: int
) -> tuple[int, str, str]:
    """``(status, code, detail)`` answering a request aiohttp's parser rejected with ``exc``.

    The limits are the ones the parser ran with; a line-too-long error is a 414 or a 431 by
    the limit it names.
    """
    if isinstance(exc, LineTooLong):
        limit = exc.args[1]
        if limit == max_url_bytes != max_field_bytes:
            return 414, "uri_too_long", f"the request target is longer than {limit} bytes"
        if limit == max_field_bytes:
            return 431, "header_fields_too_large", f"a header field is longer than {limit} bytes"
        return 400, "malformed_request", f"a line is longer than {limit} bytes"
    detail = describe(exc)
    if detail.startswith("Too many headers"):
        return 431, "header_fields_too_large", f"more than {max_headers} header fields"
    if isinstance(exc, ContentEncodingError):
        return 415, "unsupported_content_encoding", detail
    return 400, "malformed_request", detail


class ProblemRequestHandler(web.RequestHandler):
    """aiohttp's per-connection protocol, answering what it rejects itself with problems."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A problem response for a request the parser rejected (``exc`` an
        :class:`HttpProcessingError`) or an error that escaped the app (aiohttp's own logging).

        Raises:
            ConnectionError: part of a response was sent already (as aiohttp does).
        """
        request_id = uuid.uuid4().hex
        if not isinstance(exc, HttpProcessingError):
            status = super().handle_error(request, status, exc, message).status
            detail = "an unexpected error; see the server log"
            code = {500: "internal_error", 504: "timeout"}.get(status, "http_error")
            resp = problem(status, code, detail)
        else:
            status, code, detail = parser_error_status(
                exc,
                max_url_bytes=self.max_line_size,
                max_field_bytes=self.max_field_size,
                max_headers=self.max_headers,
            )
            log.info(
                "%d %s from %s: %s (request %s)", status, code, request.remote, detail, request_id
            )
            if request.writer.output_size > 0:
                raise ConnectionError("a response was sent already; cannot send the error")
            resp = problem(status, code, detail, request_id=request_id)
        resp.headers["X-Request-Id"] = request_id
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's ERROR log with a traceback, except for a client's fault: one INFO line."""
        exc = kw.get("exc_info")
        if isinstance(exc, BaseException) and self._client_fault(exc):
            peer = self.peername
            remote = peer[0] if isinstance(peer, tuple) else peer
            log.info("client error on a connection from %s: %s", remote, describe(exc))
            return
        super().log_exception(*args, **kw)

    def _client_fault(self, exc: BaseException) -> bool:
        if isinstance(exc, HttpProcessingError | web.RequestPayloadError):
            return True
        return isinstance(exc, ConnectionError) and self.transport is None


class _ProblemServer(web.Server):
    """aiohttp's connection factory, making :class:`ProblemRequestHandler` connections."""

    def __call__(self) -> web.RequestHandler:
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` for the gateway: its connections answer malformed requests with
    problems (see the module docstring). Takes AppRunner's arguments; the parser limits are
    :data:`MAX_URL_BYTES`, :data:`MAX_FIELD_BYTES` and :data:`MAX_HEADERS`."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("max_line_size", MAX_URL_BYTES)
        kwargs.setdefault("max_field_size", MAX_FIELD_BYTES)
        kwargs.setdefault("max_headers", MAX_HEADERS)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _ProblemServer(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
