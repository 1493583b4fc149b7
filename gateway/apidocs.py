"""``/docs``: the OpenAPI document rendered by Swagger UI, with "Try it out".

Swagger UI's files come from the ``swagger-ui-py`` package (PyPI; Swagger UI's own release
files, Apache-2.0), served under ``/docs/assets/`` beside this package's ``docs/docs.js``, which
starts it on ``/openapi.json``. Nothing third-party is copied into this repository, and nothing
is loaded from another site. Without JavaScript the page shows the server-side listing of
:func:`gateway.openapi.docs_body` instead.

Every answer carries :data:`CSP`: scripts and connections from this origin only, no inline
script (Swagger UI sets inline styles, so ``style-src`` allows them). The token a user gives to
"Authorize" stays in the page's memory.
"""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.openapi import docs_body

OWN_DIR = Path(__file__).parent / "docs"
SWAGGER_UI = Path(str(resources.files("swagger_ui") / "static"))
SWAGGER_FILES = ("swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png")
"""The files of Swagger UI the page uses (only these are served)."""

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
"""The Content-Security-Policy of ``/docs`` and its assets (W3C CSP Level 3)."""

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
ROUTE_PATHS = frozenset({"/docs", "/docs/assets/{name}"})
"""The routes' canonical paths (public; not JSON API operations)."""


def page(doc: dict[str, Any]) -> web.Response:
    """The ``/docs`` page for ``doc`` (the document ``/openapi.json`` serves)."""
    title = html.escape(doc["info"]["title"])
    text = "\n".join(
        [
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>{title} API</title>",
            "<link rel='icon' href='/docs/assets/favicon-32x32.png'>",
            "<link rel='stylesheet' href='/docs/assets/swagger-ui.css'>",
            "<script src='/docs/assets/swagger-ui-bundle.js' defer></script>",
            "<script src='/docs/assets/docs.js' defer></script>",
            "</head><body><div id='swagger-ui'></div>",
            f"<noscript>{docs_body(doc)}</noscript>",
            "</body></html>",
        ]
    )
    return web.Response(text=text, content_type="text/html", headers=HEADERS)


def _asset_path(name: str) -> Path | None:
    if name in SWAGGER_FILES:
        return SWAGGER_UI / name
    if name == "docs.js":
        return OWN_DIR / name
    return None


async def asset(request: web.Request) -> web.StreamResponse:
    """``GET /docs/assets/<name>``: one of :data:`SWAGGER_FILES` or ``docs.js``."""
    name = request.match_info["name"]
    path = _asset_path(name)
    if path is None:
        raise web.HTTPNotFound()
    suffix = Path(name).suffix
    content_type = CONTENT_TYPES[suffix]
    charset = "" if suffix == ".png" else "; charset=utf-8"
    headers = {**HEADERS, "Content-Type": content_type + charset, "Cache-Control": "no-cache"}
    return web.FileResponse(path, headers=headers)


def add_routes(app: web.Application) -> None:
    """Register ``/docs/assets/<name>`` (``/docs`` itself is the app's, which knows the task
    catalog the document lists)."""
    app.router.add_get("/docs/assets/{name}", asset)


def is_public(request: web.Request) -> bool:
    """Whether ``request`` was routed to ``/docs`` or its assets (no bearer token needed)."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in ROUTE_PATHS
