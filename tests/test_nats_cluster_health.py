"""compose.yaml's NATS health check, against the three real node configs of deploy/nats/ run as
a cluster on loopback (host names and ports substituted; no Docker).

The services wait for all three nodes to be healthy and then create R3 streams. A check that
answers 200 before the nodes elected a JetStream meta leader (``/healthz?js-enabled-only=true``
does, on a node alone) lets them start too early: stream creation fails, they exit, and only
``restart: unless-stopped`` heals the stack. The check must fail on a lone node and pass once all
three run, and then the scheduler's user (deploy/nats/auth.conf, its password hash in the
environment as compose's ``env_file`` sets it) can create jobsched's R3 streams.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bus.auth import credentials_file_name, read_credentials
from bus.nats import Bus, BusConfig
from bus.natsconf import server_environment, write_secrets

ROOT = Path(__file__).resolve().parents[1]
NODES = ("nats-1", "nats-2", "nats-3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def health_path() -> str:
    """The path and query compose.yaml's nats health check requests (the same on each node)."""
    services: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    paths = set()
    for node in NODES:
        command = " ".join(services[node]["healthcheck"]["test"])
        match = re.search(r"http://127\.0\.0\.1:8222(/\S*)", command)
        assert match, f"{node}: the health check must request the monitoring port: {command}"
        paths.add(match.group(1))
    assert len(paths) == 1, paths
    return paths.pop()


def substituted(text: str, replacements: list[tuple[str, str]]) -> str:
    """``text`` with each pattern replaced exactly as often as it occurs in the shipped config
    (at least once): if the config changes shape, this test fails instead of testing another."""
    for pattern, replacement in replacements:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert count >= 1, f"deploy/nats/common.conf no longer has {pattern!r}"
    return text


class Node:
    def __init__(
        self,
        name: str,
        binary: str,
        root: Path,
        ports: dict[str, dict[str, int]],
        env: dict[str, str],
    ):
        self.name = name
        self.env = env
        self.http = ports[name]["http"]
        self.client = ports[name]["client"]
        directory = root / name
        directory.mkdir()
        common = (ROOT / "deploy" / "nats" / "common.conf").read_text()
        routes = [(rf"nats://{n}:6222", f"nats://127.0.0.1:{ports[n]['cluster']}") for n in NODES]
        (directory / "common.conf").write_text(
            substituted(
                common,
                [
                    (r"^listen: 0\.0\.0\.0:4222", f"listen: 127.0.0.1:{self.client}"),
                    (r"^http: 0\.0\.0\.0:8222", f"http: 127.0.0.1:{self.http}"),
                    (r"store_dir: /data/jetstream", f"store_dir: {directory / 'jetstream'}"),
                    (r"listen: 0\.0\.0\.0:6222", f"listen: 127.0.0.1:{ports[name]['cluster']}"),
                    *routes,
                ],
            )
        )
        conf = directory / f"{name}.conf"
        conf.write_text((ROOT / "deploy" / "nats" / f"{name}.conf").read_text())
        (directory / "auth.conf").write_text((ROOT / "deploy" / "nats" / "auth.conf").read_text())
        self.command = [binary, "-c", str(conf)]
        self.log = directory / "nats.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def status(self, path: str) -> int:
        """The HTTP status of ``path`` on this node's monitoring port (0: not listening yet)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=2) as r:
                status: int = r.status
                return status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    """What ``jobsched nats-credentials secrets`` creates for compose."""
    write_secrets(tmp_path / "secrets", "jobsched")
    return tmp_path / "secrets"


@pytest.fixture
def cluster(nats_binary: str, tmp_path: Path, secrets_dir: Path) -> Iterator[dict[str, Node]]:
    ports = {n: {"client": free_port(), "http": free_port(), "cluster": free_port()} for n in NODES}
    env = server_environment(secrets_dir)
    nodes = {n: Node(n, nats_binary, tmp_path, ports, env) for n in NODES}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


async def until_status(
    nodes: list[Node], path: str, status: int, timeout_seconds: float = 30
) -> None:
    try:
        async with asyncio.timeout(timeout_seconds):
            while any(n.status(path) != status for n in nodes):
                await asyncio.sleep(0.1)
    except TimeoutError:
        seen = {n.name: n.status(path) for n in nodes}
        raise AssertionError(f"{path} did not answer {status} on every node: {seen}") from None


async def test_the_nats_health_check_waits_for_the_jetstream_meta_leader(
    cluster: dict[str, Node], secrets_dir: Path
) -> None:
    check = health_path()
    first = cluster["nats-1"]
    first.start()
    # The node is up and its JetStream is enabled: the old check passes here already...
    await until_status([first], "/healthz?js-enabled-only=true", 200)
    # ...but alone it can elect no meta leader (that takes two of three): the check must fail.
    assert first.status(check) == 503, f"{check} passes on a lone node: services would start"

    cluster["nats-2"].start()
    cluster["nats-3"].start()
    await until_status(list(cluster.values()), check, 200)

    # What the services do as soon as every node is healthy: the scheduler creates R3 streams.
    config = BusConfig(
        servers=[f"nats://127.0.0.1:{first.client}"],
        prefix="jobsched",
        replicas=3,
        credentials=read_credentials(secrets_dir / credentials_file_name("scheduler")),
    )
    bus = Bus(config, name="jobsched-scheduler")
    await bus.connect()
    try:
        await bus.ensure_streams()
        info = await bus.js.stream_info(config.work_stream)
        assert info.config.num_replicas == 3
    finally:
        await bus.close()
