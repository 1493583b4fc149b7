"""TLS to NATS (issue 12, "The bus"): on real nats-servers with certificates this test generates
(``trustme``: a CA, a server certificate for 127.0.0.1 and localhost, a client certificate).

What is defended against, each tried: a server whose certificate another CA signed, or that is
not for the host connected to; a plain-text client on a TLS server; a server (or a man in the
middle) that offers no TLS to a client that wants it, which must not receive the password; a
client without a certificate on a server that verifies clients. And the settings: every file
problem is a ConfigError naming the setting, at start-up, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from cryptography import x509

from bus.auth import Credentials
from bus.nats import Bus, BusConfig
from bus.natsconf import server_environment, write_secrets
from bus.tls import client_context
from core.errors import BusUnavailable, ConfigError
from core.model import RunMessage
from core.settings import Settings, load_settings
from jobsched.client import NatsJobschedClient
from jobsched.natsserver import NatsServer, ServerTls
from jobsched.runtime import Connection, bus_config, connected_bus

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "tlstest"


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing here: a client trusting only it must refuse the server."""


def write_certs(directory: Path, *server_names: str) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert(*server_names)
    client = ca.issue_cert("jobsched-worker")
    certs = Certs(*(directory / n for n in ("ca", "sc", "sk", "cc", "ck", "other-ca")))
    ca.cert_pem.write_to_path(str(certs.ca))
    server.private_key_pem.write_to_path(str(certs.server_key))
    client.private_key_pem.write_to_path(str(certs.client_key))
    for blob in server.cert_chain_pems:
        blob.write_to_path(str(certs.server_cert), append=True)
    for blob in client.cert_chain_pems:
        blob.write_to_path(str(certs.client_cert), append=True)
    trustme.CA().cert_pem.write_to_path(str(certs.other_ca))
    return certs


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return write_certs(tmp_path / "certs", "127.0.0.1", "localhost")


@contextlib.contextmanager
def tls_server(binary: str, root: Path, tls: ServerTls) -> Iterator[NatsServer]:
    server = NatsServer(
        binary, root / "nats", log_file=root / "nats.log", monitor=True, tls=tls, name="tls"
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def server(nats_binary: str, tmp_path: Path, certs: Certs) -> Iterator[NatsServer]:
    """A server that requires TLS and does not ask for client certificates."""
    with tls_server(nats_binary, tmp_path, ServerTls(certs.server_cert, certs.server_key)) as s:
        yield s


@pytest.fixture
def mtls_server(nats_binary: str, tmp_path: Path, certs: Certs) -> Iterator[NatsServer]:
    """A server that requires TLS and a client certificate signed by the test CA."""
    tls = ServerTls(certs.server_cert, certs.server_key, ca_file=certs.ca, verify=True)
    with tls_server(nats_binary, tmp_path, tls) as s:
        yield s


def connz(server: NatsServer) -> list[dict[str, Any]]:
    """The server's own view of its client connections (``/connz``)."""
    with urllib.request.urlopen(f"{server.monitor_url}/connz", timeout=5) as reply:
        body: dict[str, Any] = json.load(reply)
    connections: list[dict[str, Any]] = body.get("connections") or []
    return connections


def clients(server: NatsServer) -> list[str]:
    """The names of the server's clients that got as far as ``CONNECT``."""
    return [c["name"] for c in connz(server) if c.get("name")]


def tls_bus(url: str, ca: Path, *, cert: Path | None = None, key: Path | None = None) -> Bus:
    context = client_context(ca_file=str(ca), cert_file=str(cert or ""), key_file=str(key or ""))
    return Bus(BusConfig(servers=[url], prefix=PREFIX, tls=context), name="jobsched-tls-test")


def a_run() -> RunMessage:
    now = datetime.now(UTC)
    return RunMessage(
        execution_id="tls-1",
        job_id="job-tls",
        owner="alice",
        partition=0,
        task_id="noop",
        queue="default",
        parameters={},
        scheduled_for=now,
        published_at=now,
        max_attempts=1,
    )


async def refused_with(bus: Bus, *words: str) -> str:
    """Connect ``bus`` (one attempt), expect a refusal whose message has ``words``, return it."""
    with pytest.raises(BusUnavailable) as refusal:
        await bus.connect(timeout_seconds=0.5)
    await bus.close()
    message = str(refusal.value)
    for word in words:
        assert word in message.lower(), message
    return message


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_the_bus_works_over_verified_tls(server: NatsServer, certs: Certs, host: str) -> None:
    """A JetStream round trip (streams, a run published and found) and core pub/sub, over a
    connection that the server itself reports as TLS 1.2+."""
    assert server.url.startswith("tls://")
    url = server.url.replace("127.0.0.1", host)
    bus = tls_bus(url, certs.ca)
    await bus.connect()
    try:
        await bus.ensure_streams()
        run = a_run()
        assert await bus.publish_runs([run]) == [None]
        assert await bus.run_in_stream("default", run.execution_id)
        nc = bus.nc
        sub = await nc.subscribe(f"{PREFIX}.echo")
        await nc.publish(f"{PREFIX}.echo", b"over tls")
        got = await sub.next_msg(timeout=5)
        assert got.data == b"over tls"
        (conn,) = [c for c in connz(server) if c.get("name") == "jobsched-tls-test"]
        assert conn["tls_version"] in ("1.2", "1.3"), conn
    finally:
        await bus.close()


async def test_the_bus_reconnects_over_tls_and_never_to_a_plain_text_server(
    mtls_server: NatsServer,
    certs: Certs,
    nats_binary: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A restarted TLS server gets the connection back over TLS; a plain-text server put in its
    place (same address) gets nothing: every reconnect is refused before ``CONNECT``."""
    lost = asyncio.Event()
    context = client_context(
        ca_file=str(certs.ca), cert_file=str(certs.client_cert), key_file=str(certs.client_key)
    )
    config = BusConfig(servers=[mtls_server.url], prefix=PREFIX, tls=context)
    bus = Bus(config, name="jobsched-tls-test", on_disconnect=lost.set)
    await bus.connect()
    try:
        mtls_server.restart()
        async with asyncio.timeout(10):
            await lost.wait()
            await bus.connected.wait()
        await bus.ping()
        (conn,) = [c for c in connz(mtls_server) if c.get("name") == "jobsched-tls-test"]
        assert conn["tls_version"] in ("1.2", "1.3"), conn
        mtls_server.stop()
        impostor = NatsServer(
            nats_binary, tmp_path / "plain", port=mtls_server.port, monitor=True, name="plain"
        )
        impostor.start()
        try:
            async with asyncio.timeout(10):
                while "secure connection not available" not in caplog.text:
                    await asyncio.sleep(0.02)
            assert not bus.is_connected
            assert clients(impostor) == []
        finally:
            impostor.stop()
    finally:
        await bus.close()


async def test_the_nats_api_client_connects_with_tls(server: NatsServer, certs: Certs) -> None:
    async with NatsJobschedClient(
        server.url, "token", prefix=PREFIX, tls=client_context(ca_file=str(certs.ca))
    ):
        (conn,) = connz(server)
        assert conn["tls_version"] in ("1.2", "1.3"), conn


async def test_a_server_signed_by_another_ca_is_refused(server: NatsServer, certs: Certs) -> None:
    await refused_with(tls_bus(server.url, certs.other_ca), "certificate verify failed")
    assert clients(server) == []


async def test_a_server_certificate_for_another_host_is_refused(
    nats_binary: str, tmp_path: Path
) -> None:
    """The hostname is verified: a certificate of the right CA, but for ``nats.example`` only,
    is refused on 127.0.0.1."""
    certs = write_certs(tmp_path / "certs", "nats.example")
    with tls_server(
        nats_binary, tmp_path, ServerTls(certs.server_cert, certs.server_key)
    ) as server:
        message = await refused_with(tls_bus(server.url, certs.ca), "certificate verify failed")
        assert "127.0.0.1" in message


async def test_a_plain_text_client_is_refused_by_a_tls_server(server: NatsServer) -> None:
    """A client that ignores the server's ``tls_required`` and sends ``CONNECT`` in the clear
    gets an error and the connection is closed: nothing it sent was taken."""
    host, port = server.url.removeprefix("tls://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        async with asyncio.timeout(10):
            info = json.loads((await reader.readline()).removeprefix(b"INFO "))
            assert info["tls_required"] is True
            writer.write(b'CONNECT {"verbose":false}\r\nPING\r\nSUB > 1\r\n')
            await writer.drain()
            rest = await reader.read()  # until the server closes the connection
    finally:
        writer.close()
    assert b"PONG" not in rest
    assert clients(server) == []


async def test_a_client_that_wants_tls_never_sends_its_password_in_the_clear(
    certs: Certs,
) -> None:
    """A server (or a man in the middle) whose ``INFO`` offers no TLS: the client refuses it
    before it sends anything (nats-py alone would send ``CONNECT`` with the password)."""
    received = bytearray()
    closed = asyncio.Event()

    async def fake_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        info = {"server_id": "fake", "version": "2.15.1", "proto": 1, "max_payload": 1048576}
        writer.write(b"INFO " + json.dumps({**info, "auth_required": True}).encode() + b"\r\n")
        await writer.drain()
        received.extend(await reader.read())
        writer.close()
        closed.set()

    fake = await asyncio.start_server(fake_server, "127.0.0.1", 0)
    port = fake.sockets[0].getsockname()[1]
    config = BusConfig(
        servers=[f"nats://127.0.0.1:{port}"],
        prefix=PREFIX,
        credentials=Credentials(user="jobsched-worker", password="s3cret-password"),
        tls=client_context(ca_file=str(certs.ca)),
    )
    try:
        await refused_with(Bus(config), "secure connection not available")
        async with asyncio.timeout(5):
            await closed.wait()
    finally:
        fake.close()
        await fake.wait_closed()
    assert bytes(received) == b""


async def test_a_tls_url_refuses_a_plain_text_server(own_nats: NatsServer) -> None:
    """``tls://`` alone (no CA file: the system's trust store) wants TLS too."""
    url = own_nats.url.replace("nats://", "tls://")
    bus = Bus(BusConfig(servers=[url], prefix=PREFIX))
    await refused_with(bus, "secure connection not available")


async def test_a_verifying_server_refuses_a_client_without_a_certificate(
    mtls_server: NatsServer, certs: Certs
) -> None:
    await refused_with(tls_bus(mtls_server.url, certs.ca), "cannot connect")
    assert clients(mtls_server) == []
    log = (mtls_server.store_dir.parent / "nats.log").read_text()
    assert "TLS handshake error: tls: client didn't provide a certificate" in log


async def test_a_verifying_server_accepts_a_client_certificate(
    mtls_server: NatsServer, certs: Certs
) -> None:
    bus = tls_bus(mtls_server.url, certs.ca, cert=certs.client_cert, key=certs.client_key)
    await bus.connect()
    try:
        await bus.ensure_streams()
        assert await bus.status_last_seq() == 0
    finally:
        await bus.close()


async def test_a_jobsched_process_connects_with_tls_from_its_settings(
    mtls_server: NatsServer, certs: Certs, tmp_path: Path
) -> None:
    """The path every role's connection takes: ``JOBSCHED_*`` variables → Settings →
    ``connected_bus`` (here the scheduler's, creating the streams), with a client certificate
    on a server that verifies clients."""
    env = {
        "JOBSCHED_NATS_URL": mtls_server.url,
        "JOBSCHED_SUBJECT_PREFIX": PREFIX,
        "JOBSCHED_DATA_DIR": str(tmp_path / "data"),
        "JOBSCHED_NATS_TLS_CA_FILE": str(certs.ca),
        "JOBSCHED_NATS_TLS_CERT_FILE": str(certs.client_cert),
        "JOBSCHED_NATS_TLS_KEY_FILE": str(certs.client_key),
    }
    settings = load_settings(env)
    async with connected_bus(settings, Connection.SCHEDULER) as bus:
        await bus.ensure_streams()
        assert await bus.status_last_seq() == 0
        (conn,) = [c for c in connz(mtls_server) if c.get("name") == "jobsched-scheduler"]
        assert conn["tls_version"] in ("1.2", "1.3"), conn


# --- settings ---------------------------------------------------------------------------------


def tls_settings_error(**files: str) -> str:
    settings = load_settings({f"JOBSCHED_NATS_TLS_{k.upper()}": v for k, v in files.items()})
    with pytest.raises(ConfigError) as error:
        bus_config(settings.nats)
    return error.value.message


def test_a_certificate_without_its_key_or_a_key_without_its_certificate(certs: Certs) -> None:
    message = tls_settings_error(cert_file=str(certs.client_cert))
    assert "JOBSCHED_NATS_TLS_KEY_FILE is not set" in message
    message = tls_settings_error(key_file=str(certs.client_key))
    assert "JOBSCHED_NATS_TLS_CERT_FILE is not set" in message


@pytest.mark.parametrize("setting", ["ca_file", "cert_file", "key_file"])
def test_a_file_that_cannot_be_read_names_its_setting(
    certs: Certs, tmp_path: Path, setting: str
) -> None:
    files = {"ca_file": str(certs.ca), "cert_file": str(certs.client_cert)}
    files["key_file"] = str(certs.client_key)
    for unreadable in (tmp_path / "missing.pem", tmp_path):  # no such file; a directory
        message = tls_settings_error(**{**files, setting: str(unreadable)})
        assert message.startswith(f"JOBSCHED_NATS_TLS_{setting.upper()}={unreadable}: "), message
        assert "cannot be read" in message


def test_files_that_are_not_what_they_should_be(certs: Certs, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    message = tls_settings_error(ca_file=str(garbage))
    assert message.startswith(f"JOBSCHED_NATS_TLS_CA_FILE={garbage}: no PEM CA certificate")
    key = certs.server_key.read_text()
    message = tls_settings_error(cert_file=str(certs.client_cert), key_file=str(certs.server_key))
    assert "JOBSCHED_NATS_TLS_CERT_FILE=" in message and "JOBSCHED_NATS_TLS_KEY_FILE=" in message
    assert key.splitlines()[1] not in message  # never the key itself
    message = tls_settings_error(cert_file=str(garbage), key_file=str(certs.client_key))
    assert "not a PEM certificate and its unencrypted private key" in message


def test_a_misconfigured_process_stops_with_one_line_naming_the_setting(
    certs: Certs, tmp_path: Path
) -> None:
    """``jobsched worker`` with a certificate but no key exits 1 at start-up with the message,
    not a traceback, and without trying to connect."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOBSCHED_")},
        "JOBSCHED_NATS_URL": "tls://127.0.0.1:1",
        "JOBSCHED_DATA_DIR": str(tmp_path / "data"),
        "JOBSCHED_NATS_TLS_CERT_FILE": str(certs.client_cert),
    }
    result = subprocess.run(
        [sys.executable, "-m", "jobsched", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 1, result.stderr
    assert "JOBSCHED_NATS_TLS_KEY_FILE is not set" in result.stderr
    assert "Traceback" not in result.stderr
    assert "cannot connect" not in result.stderr


# --- compose ---------------------------------------------------------------------------------

CERT_FILES = ("ca.pem", "server-cert.pem", "server-key.pem", "client-cert.pem", "client-key.pem")
"""What deploy/nats/gen-certs.sh writes, tls.conf and compose.tls.yaml read."""


def compose_certs(directory: Path) -> dict[str, Path]:
    """Certificates for the compose host names, under the names of :data:`CERT_FILES`."""
    certs = write_certs(directory, "nats-1", "nats-2", "nats-3", "localhost", "127.0.0.1")
    paths = (certs.ca, certs.server_cert, certs.server_key, certs.client_cert, certs.client_key)
    return dict(zip(CERT_FILES, paths, strict=True))


def node_configs_with_certs(tmp_path: Path, certs: dict[str, Path]) -> Path:
    """A copy of deploy/nats whose tls.conf names ``certs`` instead of /etc/nats/certs/."""
    conf_dir = tmp_path / "nats"
    shutil.copytree(ROOT / "deploy" / "nats", conf_dir, ignore=shutil.ignore_patterns("certs"))
    text = (conf_dir / "tls.conf").read_text()
    for name in ("ca.pem", "server-cert.pem", "server-key.pem"):
        assert f"_file: /etc/nats/certs/{name}" in text
        text = text.replace(f"/etc/nats/certs/{name}", str(certs[name]))
    assert "verify: true" in text
    (conf_dir / "tls.conf").write_text(text)
    return conf_dir


def config_check(binary: str, conf: Path) -> subprocess.CompletedProcess[str]:
    """``nats-server -t`` on ``conf``, the bus users' password hashes in the environment as
    compose sets them (``secrets/nats-server.env``, deploy/nats/auth.conf)."""
    secrets_dir = conf.parent.parent / "secrets"
    if not secrets_dir.exists():
        write_secrets(secrets_dir, "jobsched")
    return subprocess.run(
        [binary, "-t", "-c", str(conf)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env=server_environment(secrets_dir),
    )


@pytest.mark.parametrize("node", ["nats-1", "nats-2", "nats-3"])
def test_the_compose_tls_node_configs_parse(nats_binary: str, tmp_path: Path, node: str) -> None:
    """``nats-N-tls.conf`` (the node's own config and ``tls.conf``) with certificates for the
    compose host names. ``nats-server -t`` loads the certificates: a missing key fails."""
    certs = compose_certs(tmp_path / "certs")
    conf_dir = node_configs_with_certs(tmp_path, certs)
    tls_conf = conf_dir / f"{node}-tls.conf"
    assert f"include ./{node}.conf" in tls_conf.read_text()
    result = config_check(nats_binary, tls_conf)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (conf_dir / "tls.conf").read_text()
    (conf_dir / "tls.conf").write_text(text.replace(str(certs["server-key.pem"]), "/no/such.pem"))
    result = config_check(nats_binary, tls_conf)
    assert result.returncode != 0 and "/no/such.pem" in result.stdout + result.stderr


def test_the_compose_tls_override() -> None:
    """compose.tls.yaml merged over compose.yaml is a valid Compose file in which every jobsched
    service connects with TLS to the same three nodes, with the CA and client certificate as
    secrets from deploy/nats/certs/, and every node runs its TLS config."""
    from tests.test_compose import compose_schema_errors, environment

    base = yaml.safe_load((ROOT / "compose.yaml").read_text())
    override = yaml.safe_load((ROOT / "compose.tls.yaml").read_text())
    assert compose_schema_errors(override) == []
    merged = json.loads(json.dumps(base))
    for name, service in override["services"].items():
        target = merged["services"][name]  # only services of compose.yaml
        if "command" in service:
            target["command"] = service["command"]
        target.setdefault("environment", {}).update(service.get("environment", {}))
        target["secrets"] = [*target.get("secrets", []), *service.get("secrets", [])]
    merged["secrets"] = {**base.get("secrets", {}), **override["secrets"]}
    assert compose_schema_errors(merged) == []
    for node in ("nats-1", "nats-2", "nats-3"):
        command = merged["services"][node]["command"]
        assert command == ["-c", f"/etc/nats/{node}-tls.conf"]
        assert (ROOT / "deploy" / "nats" / f"{node}-tls.conf").is_file()
    files = {name: s["file"] for name, s in override["secrets"].items()}
    certs_dir = "./deploy/nats/certs"
    assert sorted(files.values()) == [f"{certs_dir}/{f}" for f in ("ca.pem", *CERT_FILES[3:])]
    for role in ("gateway", "scheduler", "worker"):
        service = merged["services"][role]
        env = environment(service)
        assert set(env) <= Settings.env_names()
        plain = environment(base["services"][role])["JOBSCHED_NATS_URL"]
        assert env["JOBSCHED_NATS_URL"] == plain.replace("nats://", "tls://")
        for setting in ("CA_FILE", "CERT_FILE", "KEY_FILE"):
            secret = env[f"JOBSCHED_NATS_TLS_{setting}"].removeprefix("/run/secrets/")
            assert secret in service["secrets"] and secret in files


@pytest.fixture
def script_certs(tmp_path: Path) -> Path:
    """What deploy/nats/gen-certs.sh (openssl) writes."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl on this machine")
    out = tmp_path / "certs"
    script = ROOT / "deploy" / "nats" / "gen-certs.sh"
    subprocess.run([script, out], check=True, capture_output=True, timeout=60)
    return out


async def test_the_certificate_script_makes_certificates_that_work(
    nats_binary: str, tmp_path: Path, script_certs: Path
) -> None:
    """deploy/nats/gen-certs.sh: the nodes' certificate names the compose hosts, a server and a
    client with its files talk mutual TLS, the keys are private and no CA key is left behind."""
    out = script_certs
    assert sorted(p.name for p in out.iterdir()) == sorted(CERT_FILES)
    for key in ("server-key.pem", "client-key.pem"):
        assert (out / key).stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate((out / "server-cert.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        "nats-1",
        "nats-2",
        "nats-3",
        "localhost",
    }
    tls = ServerTls(
        out / "server-cert.pem", out / "server-key.pem", ca_file=out / "ca.pem", verify=True
    )
    with tls_server(nats_binary, tmp_path, tls) as server:
        url = server.url.replace("127.0.0.1", "localhost")
        bus = tls_bus(url, out / "ca.pem", cert=out / "client-cert.pem", key=out / "client-key.pem")
        await bus.connect(timeout_seconds=5)
        try:
            await bus.ping()
            (conn,) = [c for c in connz(server) if c.get("name") == "jobsched-tls-test"]
            assert conn["tls_version"] in ("1.2", "1.3"), conn
        finally:
            await bus.close()
