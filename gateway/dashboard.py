"""The web dashboard under ``/ui``: static files of our own, served by the gateway.

The files (``gateway/ui/``: one HTML page, JavaScript modules, one stylesheet) are public; they
hold no data. The page asks the user for a bearer token, keeps it in ``sessionStorage`` and sends
it as ``Authorization: Bearer`` on every ``fetch`` of the JSON API and as the first message of
``GET /ws`` — so every piece of data goes through the authenticated API, scoped to the token's
user as for any client. No cookie carries a credential, so a cross-site request cannot act as the
user (no CSRF exposure), and no token ever stands in a URL.

Routes: ``/ui`` redirects to ``/ui/``; ``/ui/assets/<name>`` is a file of ``gateway/ui/assets``
(only names present when the app was built; no path is ever joined from the request);
every other ``/ui/…`` path answers the page itself, whose script routes on the path (``/ui/``
jobs, ``/ui/jobs/<id>`` a job, ``/ui/jobs/<id>/runs/<execution id>`` a run). Every answer carries
:data:`CSP`: scripts, styles and connections from this origin only, no inline script.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

UI_DIR = Path(__file__).parent / "ui"
ASSETS_DIR = UI_DIR / "assets"
INDEX = UI_DIR / "index.html"

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",  # CSP Level 3: 'self' covers ws:/wss: to this host too
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
"""The Content-Security-Policy of every ``/ui`` answer (W3C CSP Level 3)."""

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate (ETag / Last-Modified): a new release shows at once
}

CONTENT_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
}

ROUTE_PATHS = frozenset({"/ui", "/ui/assets/{name}", "/ui/{path}"})
"""The routes' canonical paths (not JSON API operations: the OpenAPI test leaves them out)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def redirect(request: web.Request) -> web.StreamResponse:
    """``GET /ui``: to ``/ui/`` (the page's relative paths need the slash)."""
    raise web.HTTPPermanentRedirect("/ui/")


async def page(request: web.Request) -> web.StreamResponse:
    """``GET /ui/…``: the dashboard's one HTML page (its script shows what the path names)."""
    return _file(INDEX)


def _file(path: Path) -> web.FileResponse:
    content_type = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
    headers = {**HEADERS, "Content-Type": f"{content_type}; charset=utf-8"}
    return web.FileResponse(path, headers=headers)


def _assets_handler(names: frozenset[str]) -> Handler:
    async def asset(request: web.Request) -> web.StreamResponse:
        """``GET /ui/assets/<name>``: one of the files listed when the app was built."""
        name = request.match_info["name"]
        if name not in names:
            raise web.HTTPNotFound()
        return _file(ASSETS_DIR / name)

    return asset


def add_routes(app: web.Application) -> None:
    """Register the dashboard's routes on ``app`` (see the module docstring)."""
    names = frozenset(p.name for p in ASSETS_DIR.iterdir() if p.is_file())
    app.router.add_get("/ui", redirect)
    app.router.add_get("/ui/assets/{name}", _assets_handler(names))
    app.router.add_get("/ui/{path:.*}", page)


def is_public(request: web.Request) -> bool:
    """Whether ``request`` was routed to the dashboard's files (no bearer token needed).

    Decided by the route it matched, not by a path prefix, so no API route can be reached
    through a path that merely starts with ``/ui``.
    """
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in ROUTE_PATHS
