"""Liveness and readiness of a jobsched process: ``GET /healthz`` and ``GET /readyz``.

The gateway serves both on its API port; scheduler and worker processes on their metrics port
(:class:`actors.metrics.MetricsServer`, ``JOBSCHED_METRICS_PORT``), so every role can carry the
same Kubernetes probes (``deploy/kubernetes/``):

- ``/healthz`` answers 200 while the process serves HTTP: a liveness probe. It checks no
  dependency, since restarting a process does not bring NATS or the store back (each reconnects
  by itself).
- ``/readyz`` answers 200 when every check passes, else 503; the body names each check and why
  it failed (``{"status": "unavailable", "checks": {"nats": "ok", "store": "…"}}``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import msgspec
from aiohttp import web

from core.errors import Unavailable
from core.model import Health

Check = Callable[[], Awaitable[None]]
"""A readiness check: returns when the dependency answers, raises :class:`Unavailable` if not."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_encoder = msgspec.json.Encoder()


class Starting(Protocol):
    """What the start-up check needs of an actor."""

    name: str
    ready: asyncio.Event


async def readiness(checks: Mapping[str, Check]) -> Health:
    """Run ``checks`` concurrently (so the slowest bounds the answer, not their sum).

    Returns:
        ``Health(status="ok")`` when all passed, else ``status="unavailable"``; ``checks`` maps
        each name to ``"ok"`` or the :class:`Unavailable` message it raised.
    """
    names = list(checks)
    results = await asyncio.gather(*(checks[n]() for n in names), return_exceptions=True)
    outcome: dict[str, str] = {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, Unavailable):
            outcome[name] = result.message
        elif isinstance(result, BaseException):
            raise result
        else:
            outcome[name] = "ok"
    ok = all(v == "ok" for v in outcome.values())
    return Health(status="ok" if ok else "unavailable", checks=outcome)


def started(actors: Sequence[Starting]) -> Check:
    """A check that passes once every actor of ``actors`` has set its ``ready`` event.

    The sequence is read at each call, so actors appended after this was built are included.
    """

    async def check() -> None:
        waiting = [a.name for a in actors if not a.ready.is_set()]
        if waiting:
            raise Unavailable(f"starting: {', '.join(waiting)}")

    return check


def health_response(health: Health) -> web.Response:
    """``health`` as JSON: 200 when ok, 503 otherwise."""
    return web.Response(
        status=200 if health.status == "ok" else 503,
        body=_encoder.encode(health),
        content_type="application/json",
    )


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: the process is alive (200, ``{"status": "ok"}``)."""
    return health_response(Health(status="ok"))


def readyz_handler(checks: Mapping[str, Check]) -> Handler:
    """An aiohttp handler for ``GET /readyz`` answering :func:`readiness` of ``checks``."""

    async def readyz(request: web.Request) -> web.Response:
        return health_response(await readiness(checks))

    return readyz
