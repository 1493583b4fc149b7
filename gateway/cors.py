"""Cross-origin requests (CORS, the WHATWG Fetch standard) for browser apps on other origins,
with aiohttp-cors: the origins, methods and request headers the deployment allows (settings
``cors_allowed_origins`` / ``_methods`` / ``_headers`` of :class:`core.settings.GatewayConfig`).

None by default: a browser page from another origin cannot call the API. The dashboard at
``/ui`` is same-origin and needs none. Credentials are bearer tokens in a header, never cookies,
so ``Access-Control-Allow-Credentials`` is never sent and cross-site request forgery has nothing
to ride on. A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) needs no token.
"""

from __future__ import annotations

import aiohttp_cors
from aiohttp import hdrs, web

from core.settings import GatewayConfig

EXPOSED_HEADERS = ("X-Request-Id", "Retry-After", "Idempotent-Replayed", "Location")
"""Response headers a cross-origin page may read (besides the CORS-safelisted ones)."""
MAX_AGE_SECONDS = 600
"""How long a browser may cache a preflight's answer (seconds)."""


def is_preflight(request: web.Request) -> bool:
    """A CORS preflight: answered without authentication (it carries no token by design)."""
    return (
        request.method == hdrs.METH_OPTIONS
        and hdrs.ORIGIN in request.headers
        and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers
    )


def enable_cors(app: web.Application, config: GatewayConfig) -> None:
    """Answer preflights and mark responses for the allowed origins, on every route of ``app``
    (call it after the routes are added). Nothing when no origin is allowed."""
    if not config.cors_allowed_origins:
        return
    options = aiohttp_cors.ResourceOptions(  # type: ignore[no-untyped-call]
        allow_credentials=False,
        expose_headers=EXPOSED_HEADERS,
        allow_headers=config.cors_allowed_headers,
        allow_methods=config.cors_allowed_methods,
        max_age=MAX_AGE_SECONDS,
    )
    cors = aiohttp_cors.setup(app, defaults=dict.fromkeys(config.cors_allowed_origins, options))
    for route in list(app.router.routes()):
        if route.method != hdrs.METH_OPTIONS:
            cors.add(route)
    app.on_response_prepare.append(_vary_on_origin)


async def _vary_on_origin(request: web.Request, response: web.StreamResponse) -> None:
    """Caches must not serve one origin's answer to another (Fetch standard, CORS protocol)."""
    if hdrs.ACCESS_CONTROL_ALLOW_ORIGIN in response.headers:
        vary = response.headers.get(hdrs.VARY)
        response.headers[hdrs.VARY] = f"{vary}, Origin" if vary else "Origin"
