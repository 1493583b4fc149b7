"""Which status and problem code answer a request aiohttp's parser rejected (the decision alone;
tests/e2e/test_http_edges.py sends the real bytes to a real gateway process)."""

from __future__ import annotations

import pytest
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    ContentEncodingError,
    HttpProcessingError,
    LineTooLong,
)
from aiohttp.web import RequestPayloadError

from gateway.problems import describe
from gateway.server import MAX_FIELD_BYTES, MAX_HEADERS, MAX_URL_BYTES, parser_error_status

LIMITS = {
    "max_url_bytes": MAX_URL_BYTES,
    "max_field_bytes": MAX_FIELD_BYTES,
    "max_headers": MAX_HEADERS,
}


@pytest.mark.parametrize(
    ("exc", "status", "code", "detail"),
    [
        (
            LineTooLong(b"/aaa...", MAX_URL_BYTES),
            414,
            "uri_too_long",
            f"the request target is longer than {MAX_URL_BYTES} bytes",
        ),
        (
            LineTooLong(b"aaa...", MAX_FIELD_BYTES),
            431,
            "header_fields_too_large",
            f"a header field is longer than {MAX_FIELD_BYTES} bytes",
        ),
        (
            BadHttpMessage("Too many headers received"),
            431,
            "header_fields_too_large",
            f"more than {MAX_HEADERS} header fields",
        ),
        (
            ContentEncodingError("Can not decode content-encoding: brotli (br). Install it"),
            415,
            "unsupported_content_encoding",
            "Can not decode content-encoding: brotli (br). Install it",
        ),
        (
            BadHttpMessage("Invalid header value char:\n\n  b'X-A: a\\x00b'\n          ^"),
            400,
            "malformed_request",
            "Invalid header value char",
        ),
        (
            BadStatusLine(
                error="Bad status line:\n  Invalid HTTP version:\n\n  b'GET / HTTP/9.9'\n  ^"
            ),
            400,
            "malformed_request",
            "Bad status line: Invalid HTTP version",
        ),
        (
            BadHttpMethod(error="Invalid method encountered:\n\n  b'G@T / HTTP/1.1'\n     ^"),
            400,
            "malformed_request",
            "Invalid method encountered",
        ),
    ],
)
def test_a_parser_error_maps_to_a_4xx_without_the_clients_bytes(
    exc: HttpProcessingError, status: int, code: str, detail: str
) -> None:
    assert parser_error_status(exc, **LIMITS) == (status, code, detail)


def test_equal_line_limits_never_call_a_long_header_a_long_uri() -> None:
    same = {"max_url_bytes": 8190, "max_field_bytes": 8190, "max_headers": 128}
    assert parser_error_status(LineTooLong(b"a", 8190), **same)[0] == 431


def test_a_payload_error_is_described_by_its_cause() -> None:
    err = RequestPayloadError("400, message:\n  Can not decode content-encoding: gzip")
    err.__cause__ = ContentEncodingError("Can not decode content-encoding: gzip")
    assert describe(err) == "Can not decode content-encoding: gzip"
