"""``bus.nats.Bus`` against a real nats-server."""

from __future__ import annotations

import asyncio

from bus.nats import Bus, BusConfig
from jobsched.natsserver import NatsServer


async def test_cancelled_pings_leave_the_connection_working(
    nats_server: NatsServer, prefix: str
) -> None:
    """Readiness probes get cancelled (client gone, timeouts); the connection must survive it."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        for _ in range(20):
            probe = asyncio.create_task(bus.ping())
            await asyncio.sleep(0)  # let it send its request, then give up on it
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)

        async with asyncio.timeout(5):
            await bus.ping()
            await bus.ensure_streams()
        assert bus.is_connected
    finally:
        await bus.close()


async def test_cancelled_flushes_leave_the_connection_working(
    nats_server: NatsServer, prefix: str
) -> None:
    """A flush cancelled before its PONG (a shutdown, an interrupted NATS micro service start)
    must not end the client's read loop: later requests and a drain still complete."""
    bus = Bus(BusConfig(servers=[nats_server.url], prefix=prefix))
    await bus.connect()
    try:
        for _ in range(5):
            flush = asyncio.create_task(bus.nc.flush())
            await asyncio.sleep(0)  # the PING is on its way; give up on its PONG
            flush.cancel()
            await asyncio.gather(flush, return_exceptions=True)

        async with asyncio.timeout(5):
            await bus.nc.flush()
            await bus.ensure_streams()
    finally:
        async with asyncio.timeout(5):
            await bus.close()
