"""The gateway's HTTP server metrics: request durations and requests in flight, named as
OpenTelemetry's semantic conventions for HTTP servers (``http.server.request.duration``,
``http.server.active_requests``) in Prometheus form, as its exporters write them.

Labels are bounded: the method (one of the standard ones, else ``_OTHER``, as the conventions
say), the route *template* (``/jobs/{job_id}``, never a job id; ``unmatched`` for a path no route
serves) and the status code.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from actors.metrics import Metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
)
UNMATCHED = "unmatched"


def route_template(request: web.Request) -> str:
    """The template of the route that serves ``request`` (``/jobs/{job_id}``), or ``unmatched``."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED


def http_metrics_middleware(metrics: Metrics) -> Middleware:
    """A middleware observing every request into ``metrics`` (put it first: it then sees the
    status the client gets, problem responses included; a WebSocket is observed until its
    upgrade only, its connection being ``jobsched_ws_connections``)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        method = request.method if request.method in METHODS else "_OTHER"
        active = metrics.http_active_requests.labels(http_request_method=method)
        active.inc()
        began = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            active.dec()
            metrics.http_request_duration.labels(
                http_request_method=method,
                http_route=route_template(request),
                http_response_status_code=str(status),
            ).observe(time.perf_counter() - began)

    return middleware
