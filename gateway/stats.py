"""The dashboard's statistics endpoints: ``GET /stats/overview`` (and, in the same module, the
upcoming-fire-times heatmap and the cluster view once registered by :func:`add_routes`).

Each answers one request with a page's whole data, scoped as every listing is: the caller's own
runs; an admin's choice of ``owner``'s or (``allUsers=true``) everyone's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.errors import Unavailable
from core.stats import StatsStore, overview, window
from gateway import app as gw  # a cycle: app registers these routes; names are read per call

OVERVIEW_PARAMS = frozenset({"owner", "allUsers"})


async def stats_overview(request: web.Request) -> web.Response:
    """``GET /stats/overview``: :class:`core.stats.StatsOverview` of the last hour.

    Raises:
        Forbidden: no ``jobs:read``; another user's or everyone's asked by a non-admin.
        InvalidRequest: an unknown query parameter, ``allUsers`` not true/false.
    """
    q = request.query
    gw._only(q, OVERVIEW_PARAMS)
    who = request[gw.PRINCIPAL]
    who.require_read()
    owner = who.owner_filter(q.get("owner") or None, all_users=gw._bool_param(q, "allUsers"))
    store = _stats_store(request)
    since, until = window(request.app[gw.DEPS].clock.now())
    stats = await store.run_stats(owner, since, until)
    return gw.json_response(overview(stats, since, until))


def _stats_store(request: web.Request) -> StatsStore:
    store: Any = request.app[gw.DEPS].store
    if not isinstance(store, StatsStore):
        raise Unavailable("this store keeps no statistics")
    return store


def add_routes(app: web.Application) -> None:
    """Register the statistics routes on ``app``."""
    app.router.add_get("/stats/overview", stats_overview)
