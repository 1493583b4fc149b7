"""Request-reply services on NATS: nats-py ``micro``, the NATS services protocol (ADR-32).

:class:`MicroHost` serves the endpoints of a :class:`core.ports.ServiceSpec` on
``<prefix>.<group>.<endpoint>`` in the spec's queue group; every instance is discoverable
(``$SRV.PING``, ``$SRV.INFO``, ``$SRV.STATS``). An endpoint's :class:`core.ports.Reply` with an
``error_code`` is sent as a service error (headers ``Nats-Service-Error-Code`` and
``Nats-Service-Error``); an exception it raises is answered ``500`` and logged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

from nats.micro import add_service
from nats.micro.request import Request

from bus.nats import Bus, translated
from core.ports import Reply, ServiceHandler, ServiceSpec

log = logging.getLogger(__name__)


class MicroHost:
    """Hosts request-reply services on the connection of ``bus``.

    Args:
        bus: a connected NATS adapter whose user may subscribe to the endpoints' subjects and
            ``$SRV.>`` (:mod:`bus.auth`).
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    @asynccontextmanager
    async def serve(
        self, spec: ServiceSpec, endpoints: Mapping[str, ServiceHandler]
    ) -> AsyncIterator[None]:
        with translated(f"start service {spec.name}"):
            svc = await add_service(
                self.bus.nc,
                name=spec.name,
                version=spec.version,
                description=spec.description,
                queue_group=spec.queue_group,
            )
        try:
            group = svc.add_group(name=f"{self.bus.config.prefix}.{spec.group}")
            for name, handler in endpoints.items():
                await group.add_endpoint(name=name, handler=_answering(name, handler))
            yield
        finally:
            await svc.stop()


def _answering(name: str, handler: ServiceHandler) -> Callable[[Request], Awaitable[None]]:
    async def handle(req: Request) -> None:
        try:
            reply = await handler(req.data, dict(req.headers or {}))
        except Exception:
            log.exception("service endpoint %s failed", name)
            reply = Reply(b"", error_code="500", error="an unexpected error; see the server log")
        headers = dict(reply.headers) if reply.headers else None
        if reply.error_code is None:
            await req.respond(reply.data, headers=headers)
        else:
            await req.respond_error(
                reply.error_code, reply.error or "", data=reply.data, headers=headers
            )

    return handle
