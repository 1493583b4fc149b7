"""A 3-node nats-server cluster on loopback (JetStream, R3-capable) for fault tests and benchmarks.

Each node is a :class:`jobsched.natsserver.NatsServer` with its own storage, client port and
cluster port; the routes name all three. A node can be SIGKILLed and started again on its own
storage, and :meth:`NatsCluster.leader_of` tells which node leads a stream (so a test can kill the
leader and force an election).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import nats.errors
import nats.js.errors

from bus.auth import Credentials
from tests.natsauth import ADMIN_USER, AuthedNatsServer

NODES = ("n1", "n2", "n3")


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class NatsCluster:
    """Three routed nats-servers named n1, n2, n3 (see module docstring)."""

    def __init__(self, binary: str, root: Path) -> None:
        cluster_ports = _free_ports(len(NODES))
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in cluster_ports)
        admin = Credentials(ADMIN_USER, secrets.token_hex(16))  # the same on every node
        self.nodes = {
            name: AuthedNatsServer(
                binary,
                root / name,
                log_file=root / f"{name}.log",
                name=name,
                monitor=True,
                admin=admin,
                extra_config=(
                    "cluster {\n  name: jobsched\n"
                    f'  listen: "127.0.0.1:{port}"\n'
                    f"  routes: {json.dumps(routes.split(','))}\n}}\n"
                ),
            )
            for name, port in zip(NODES, cluster_ports, strict=True)
        }

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (as ``JOBSCHED_NATS_URL`` takes them)."""
        return ",".join(n.url for n in self.nodes.values() if n.url)

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    async def wait_ready(self, timeout_seconds: float = 30.0) -> None:
        """Wait until JetStream answers through the cluster (a meta leader is elected)."""
        nc = await nats.connect(self.url.split(","))
        try:
            async with asyncio.timeout(timeout_seconds):
                while True:
                    try:
                        await nc.jetstream(timeout=1).account_info()
                        return
                    except (nats.errors.Error, nats.js.errors.Error):
                        await asyncio.sleep(0.2)
        finally:
            await nc.close()

    async def leader_of(self, stream: str) -> str:
        """Name of the node that leads ``stream`` now."""
        nc = await nats.connect(self.url.split(","))
        try:
            info = await nc.jetstream(timeout=5).stream_info(stream)
        finally:
            await nc.close()
        assert info.cluster is not None and info.cluster.leader, info
        return info.cluster.leader

    async def move_leader(self, stream: str, to: str, tries: int = 20) -> None:
        """Step ``stream``'s leader down until ``to`` leads it (elections pick at random)."""
        nc = await nats.connect(self.url.split(","))
        try:
            js = nc.jetstream(timeout=5)
            for _ in range(tries):
                info = await js.stream_info(stream)
                if info.cluster is not None and info.cluster.leader == to:
                    return
                await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
                async with asyncio.timeout(15):
                    while True:
                        await asyncio.sleep(0.2)
                        try:
                            info = await js.stream_info(stream)
                        except (nats.errors.Error, nats.js.errors.Error):
                            continue
                        if info.cluster is not None and info.cluster.leader:
                            break
        finally:
            await nc.close()
        raise RuntimeError(f"{to} did not become the leader of {stream} in {tries} elections")


@asynccontextmanager
async def nats_cluster(binary: str, root: Path) -> AsyncIterator[NatsCluster]:
    c = NatsCluster(binary, root)
    try:
        c.start()
        await c.wait_ready()
        yield c
    finally:
        c.stop()
