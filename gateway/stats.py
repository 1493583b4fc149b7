"""The dashboard's data endpoints: ``GET /stats/overview``, ``GET /stats/upcoming`` and (admins)
``GET /cluster``, registered by :func:`add_routes`.

Each answers one request with a page's whole data. The statistics are scoped as every listing
is: the caller's own runs; an admin's choice of ``owner``'s or (``allUsers=true``) everyone's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core import heatmap
from core.cluster import cluster_view
from core.cron import resolve_timezone
from core.errors import FieldError, Forbidden, InvalidRequest, Unavailable
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


UPCOMING_PARAMS = frozenset({"owner", "allUsers", "timezone"})
MAX_UPCOMING_GROUPS = 20_000
"""At most this many (schedule, next run) groups of jobs are read for one heatmap (earliest
next run first); more: truncated."""


async def stats_upcoming(request: web.Request) -> web.Response:
    """``GET /stats/upcoming?timezone=Europe/Berlin``: :class:`core.heatmap.UpcomingHeatmap`
    of the next 7 days, in the wall-clock hours of ``timezone`` (default UTC).

    Raises:
        Forbidden: no ``jobs:read``; another user's or everyone's asked by a non-admin.
        InvalidRequest: on ``timezone`` (not an IANA zone), an unknown parameter, ``allUsers``.
    """
    q = request.query
    gw._only(q, UPCOMING_PARAMS)
    who = request[gw.PRINCIPAL]
    who.require_read()
    owner = who.owner_filter(q.get("owner") or None, all_users=gw._bool_param(q, "allUsers"))
    name = q.get("timezone") or "UTC"
    try:
        display = resolve_timezone(name)
    except InvalidRequest as e:
        reason = e.errors[0].reason if e.errors else "is not an IANA time zone"
        raise InvalidRequest(FieldError("timezone", reason)) from None
    store = _stats_store(request)
    start, end = heatmap.window(request.app[gw.DEPS].clock.now())
    groups = await store.scheduled_groups(owner, end, limit=MAX_UPCOMING_GROUPS)
    data = heatmap.heatmap(
        groups,
        start=start,
        end=end,
        display=display,
        display_name=name,
        truncated=len(groups) >= MAX_UPCOMING_GROUPS,
    )
    return gw.json_response(data)


MAX_RUNNING = 1000
"""At most this many in-flight runs on the Cluster page (more: ``truncated``)."""


async def cluster(request: web.Request) -> web.Response:
    """``GET /cluster`` (admins): :class:`core.cluster.ClusterView` — schedulers and their
    leases (with expiry), queues and their depth, workers and their in-flight runs.

    Raises:
        Forbidden: the caller is not an admin (or has no ``jobs:read``).
        BusUnavailable: NATS did not answer (503).
    """
    gw._only(request.query, frozenset())
    who = request[gw.PRINCIPAL]
    who.require_read()
    if not who.admin:
        raise Forbidden("only an admin may see the cluster")
    deps = request.app[gw.DEPS]
    source = deps.cluster
    bus_view = await source.bus_view() if source is not None else None
    runs = await _stats_store(request).running_runs(limit=MAX_RUNNING + 1)
    view = cluster_view(
        deps.clock.now(), bus_view, runs[:MAX_RUNNING], truncated=len(runs) > MAX_RUNNING
    )
    return gw.json_response(view)


def _stats_store(request: web.Request) -> StatsStore:
    store: Any = request.app[gw.DEPS].store
    if not isinstance(store, StatsStore):
        raise Unavailable("this store keeps no statistics")
    return store


def add_routes(app: web.Application) -> None:
    """Register the statistics routes on ``app``."""
    app.router.add_get("/stats/overview", stats_overview)
    app.router.add_get("/stats/upcoming", stats_upcoming)
    app.router.add_get("/cluster", cluster)
