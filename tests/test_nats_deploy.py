"""The bus users of the deployments (compose's ``deploy/nats/``, Kubernetes'
``deploy/kubernetes/nats/``) and the secrets that go with them (:mod:`bus.natsconf`).

- The committed configs are what ``jobsched nats-config`` produces now from ``bus/auth.py``, for
  the prefix and queues the deployments use: a permission changed in code and not regenerated
  (``make nats-config``) fails here instead of silently diverging from what runs.
- Each compose node's config parses with ``nats-server -t`` once the password variables are set
  (tests/test_compose.py), and is refused, naming the variable, without them.
- A real nats-server with the committed users admits each connection of a jobsched process with
  the files of ``jobsched nats-credentials`` (through ``jobsched.runtime.bus_config``, as the
  services read ``JOBSCHED_NATS_CREDENTIALS_DIR``), refuses a client without credentials or with
  a wrong password, and enforces the permissions (a worker may not publish a run).
- ``jobsched nats-credentials`` creates the secrets once (private directory, random passwords,
  bcrypt hashes that verify them) and changes nothing when run again; its ``--kubernetes``
  Secrets follow Kubernetes' schema.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import kubernetes_validate
import nats
import nats.errors
import pytest
import yaml
from click.testing import CliRunner
from nats.aio.client import Client

from bus.auth import ROLES, credentials_file_name, read_credentials
from bus.callout import ISSUER_SEED_FILE, read_issuer
from bus.nats import Bus
from bus.natsconf import (
    AUTH_CONF_KEY,
    CALLOUT_ISSUER_VARIABLE,
    DEPLOYED_ROLES,
    SERVER_ENV_FILE,
    password_variable,
    server_environment,
    user_name,
    write_secrets,
)
from core.settings import load_settings
from jobsched.cli import NATS_SECRET, NATS_SERVER_SECRET, main
from jobsched.client import NatsJobschedClient
from jobsched.natsserver import NatsServer
from jobsched.runtime import Connection, Roles, bus_config, connections_of
from tests.conftest import TEST_SECRET
from tests.support import start_stack

ROOT = Path(__file__).resolve().parents[1]
NATS_DIR = ROOT / "deploy" / "nats"
AUTH_CONF = NATS_DIR / "auth.conf"
HELM_VALUES = ROOT / "deploy" / "kubernetes" / "nats" / "auth-values.yaml"
NODES = ("nats-1", "nats-2", "nats-3")
PREFIX, QUEUES = "jobsched", "default"  # compose.yaml and configmap.yaml; checked below


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("deploy") / "secrets"
    cli("nats-credentials", str(directory), "--prefix", PREFIX)
    return directory


# --- the committed files against the generator -------------------------------------------------


def test_the_deployments_use_the_prefix_and_queues_the_files_were_generated_for() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    worker = load_settings(compose["services"]["worker"]["environment"])
    config_map = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "configmap.yaml").read_text())
    k8s_worker = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "worker.yaml").read_text())
    (container,) = k8s_worker["spec"]["template"]["spec"]["containers"]
    queues = {v["name"]: v.get("value") for v in container["env"]}["JOBSCHED_QUEUES"]
    assert (worker.nats.subject_prefix, ",".join(worker.worker.queues)) == (PREFIX, QUEUES)
    assert (config_map["data"]["JOBSCHED_SUBJECT_PREFIX"], queues) == (PREFIX, QUEUES)


def test_the_committed_users_are_what_the_generator_produces_now() -> None:
    args = ("nats-config", "--prefix", PREFIX, "--queues", QUEUES)
    assert AUTH_CONF.read_text() == cli(*args)
    assert HELM_VALUES.read_text() == cli(*args, "--helm", NATS_SERVER_SECRET)
    makefile = (ROOT / "Makefile").read_text()  # `make nats-config` writes both
    assert f"jobsched {shlex.join(args)} > deploy/nats/auth.conf" in makefile


def test_the_generator_follows_a_permission_change() -> None:
    other = cli("nats-config", "--prefix", PREFIX, "--queues", "default,reports")
    assert other != AUTH_CONF.read_text()
    assert "workers-reports" in other and "workers-reports" not in AUTH_CONF.read_text()


def test_every_role_is_a_user_with_permissions_and_nobody_is_anonymous() -> None:
    """Every role but ``api`` is a static user; every other connection goes to the callout."""
    text = AUTH_CONF.read_text()
    users = re.findall(
        r'^ +\{"user": "([^"]+)", "password": \$(\w+), "permissions": \{', text, re.M
    )
    assert users == [(user_name(PREFIX, r), password_variable(r)) for r in DEPLOYED_ROLES]
    assert set(ROLES) - set(DEPLOYED_ROLES) == {"api"}
    callout = re.search(r"auth_callout \{\n +issuer: \$(\w+)\n +auth_users: (.+)\n", text)
    assert callout is not None and callout[1] == CALLOUT_ISSUER_VARIABLE
    assert json.loads(callout[2]) == [user for user, _ in users]
    for conf in NATS_DIR.glob("*.conf"):
        body = conf.read_text()
        assert "no_auth_user" not in body, conf.name
        assert ("authorization" in body) == (conf == AUTH_CONF), conf.name
    for node in NODES:
        assert "include ./auth.conf" in (NATS_DIR / f"{node}.conf").read_text()


def test_the_helm_values_carry_the_same_users_and_every_password_variable() -> None:
    values = yaml.safe_load(HELM_VALUES.read_text())
    assert values["configMap"]["merge"]["data"][AUTH_CONF_KEY] == AUTH_CONF.read_text()
    assert values["config"]["merge"] == {"00$include": AUTH_CONF_KEY}
    referenced = set(re.findall(r"\"password\": \$(\w+)", AUTH_CONF.read_text()))
    env = values["container"]["env"]
    assert set(env) == referenced | {CALLOUT_ISSUER_VARIABLE}
    for name, var in env.items():
        assert var["valueFrom"]["secretKeyRef"] == {"name": NATS_SERVER_SECRET, "key": name}


# --- nats-server parses them -------------------------------------------------------------------


def parse(binary: str, node: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "-t", "-c", str(NATS_DIR / f"{node}.conf")],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_without_the_passwords_a_node_refuses_to_start_naming_the_variable(
    nats_binary: str, secrets_dir: Path
) -> None:
    env = server_environment(secrets_dir)
    missing = password_variable(ROLES[-1])
    del env[missing]
    result = parse(nats_binary, "nats-1", env)
    assert result.returncode != 0
    assert f"variable reference for '{missing}'" in result.stderr + result.stdout
    assert "can not be found" in result.stderr + result.stdout


# --- a real server with the committed users ----------------------------------------------------


@pytest.fixture
def deployed(
    nats_binary: str, secrets_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[NatsServer]:
    """A nats-server with deploy/nats/auth.conf, its password variables set as compose sets
    them (``env_file: secrets/nats-server.env``)."""
    for name, value in server_environment(secrets_dir).items():
        monkeypatch.setenv(name, value)
    server = NatsServer(
        nats_binary,
        tmp_path / "nats",
        log_file=tmp_path / "nats.log",
        authorization=AUTH_CONF.read_text(),
    )
    server.start()
    yield server
    server.stop()


async def test_each_connection_of_a_process_authenticates_with_its_own_file(
    deployed: NatsServer, secrets_dir: Path
) -> None:
    settings = load_settings(
        {"JOBSCHED_NATS_CREDENTIALS_DIR": str(secrets_dir), "JOBSCHED_SUBJECT_PREFIX": PREFIX}
    )
    processes = (
        Roles(gateway=True),
        Roles(scheduler=True),
        Roles(worker=True),
        Roles(notifier=True),
    )
    opened = {c for roles in processes for c in connections_of(roles, callout=roles.gateway)}
    assert opened == set(Connection)
    for connection in sorted(opened):
        config = bus_config(settings.nats, deployed.url, connection)
        assert config.credentials is not None
        assert config.credentials.user == user_name(PREFIX, connection)
        bus = Bus(config, name=f"jobsched-{connection}")
        await bus.connect()
        try:
            if connection is Connection.CALLOUT:
                await bus.nc.flush()  # it may not use JetStream: a round trip proves it is in
            else:
                await bus.ping()  # a JetStream request: raises BusUnavailable if refused
        finally:
            await bus.close()


async def test_a_gateway_with_the_deployment_secrets_admits_api_clients_by_their_token(
    deployed: NatsServer, secrets_dir: Path, tmp_path: Path
) -> None:
    """The deployments' API clients have no static user: a gateway started as compose and
    Kubernetes start it (the secrets directory's callout user and issuer seed) admits a client
    by its bearer token, which then gets its replies. Refused (the callout says no): no
    credentials, a role's user with a wrong password, or with its hash as the password."""
    settings = load_settings(
        {},
        nats_url=deployed.url,
        subject_prefix=PREFIX,
        data_dir=str(tmp_path / "data"),
        auth_secret=TEST_SECRET,
        http_port=0,
        nats_credentials_dir=str(secrets_dir),
        nats_callout_issuer_seed_file=str(secrets_dir / ISSUER_SEED_FILE),
    )
    async with start_stack(settings, Roles(gateway=True)) as stack:
        async with NatsJobschedClient(deployed.url, stack.token("alice"), prefix=PREFIX) as api:
            assert (await api.list_jobs()).items == []
        worker = read_credentials(secrets_dir / credentials_file_name("worker"))
        hashed = server_environment(secrets_dir)[password_variable("worker")].strip('"')
        for user, password in [(None, None), (worker.user, worker.password + "0")]:
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await connect(deployed.url, user=user, password=password)
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await connect(deployed.url, user=worker.user, password=hashed)  # not a password


async def connect(url: str, user: str | None = None, password: str | None = None) -> None:
    nc = Client()
    try:
        async with asyncio.timeout(10):
            await nc.connect(url, allow_reconnect=False, user=user, password=password)
    finally:
        await nc.close()  # nats-py leaves a refused socket open otherwise


async def test_the_permissions_are_in_force(deployed: NatsServer, secrets_dir: Path) -> None:
    """A worker's user may not publish a run (the attack of issue 12); the attack suite tries
    the rest against the same :func:`bus.auth.role_permissions`."""
    worker = read_credentials(secrets_dir / credentials_file_name("worker"))
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e).lower())

    nc = await nats.connect(
        deployed.url,
        user=worker.user,
        password=worker.password,
        inbox_prefix=worker.inbox_prefix,
        error_cb=on_error,
        max_reconnect_attempts=0,
    )
    try:
        await nc.publish(f"{PREFIX}.work.default.forged", b"{}")
        async with asyncio.timeout(5):
            while not any("permissions violation for publish" in e for e in errors):
                await nc.flush()
                await asyncio.sleep(0.02)
    finally:
        await nc.close()


# --- the secrets -------------------------------------------------------------------------------


def test_the_secrets_are_private_random_and_their_hashes_verify(secrets_dir: Path) -> None:
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((secrets_dir / SERVER_ENV_FILE).stat().st_mode) == 0o600
    env = server_environment(secrets_dir)
    assert set(env) == {password_variable(r) for r in DEPLOYED_ROLES} | {CALLOUT_ISSUER_VARIABLE}
    passwords = set()
    for role in DEPLOYED_ROLES:
        path = secrets_dir / credentials_file_name(role)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # for the container's user (README)
        creds = read_credentials(path)
        assert creds.user == user_name(PREFIX, role)
        assert re.fullmatch(r"[0-9a-f]{64}", creds.password)
        passwords.add(creds.password)
        quoted = env[password_variable(role)]
        assert quoted.startswith('"$2b$11$') and quoted.endswith('"')
        assert bcrypt.checkpw(creds.password.encode(), quoted.strip('"').encode())
    assert len(passwords) == len(DEPLOYED_ROLES)
    assert not (secrets_dir / credentials_file_name("api")).exists()  # the callout's clients
    seed = secrets_dir / ISSUER_SEED_FILE
    assert stat.S_IMODE(seed.stat().st_mode) == 0o644
    assert env[CALLOUT_ISSUER_VARIABLE] == json.dumps(read_issuer(seed).public_key)


def test_creating_the_secrets_again_changes_nothing(secrets_dir: Path) -> None:
    before = {p.name: p.read_bytes() for p in secrets_dir.iterdir()}
    write_secrets(secrets_dir, PREFIX)
    assert {p.name: p.read_bytes() for p in secrets_dir.iterdir()} == before


def test_a_lost_hash_is_made_again_for_the_same_password(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    write_secrets(directory, PREFIX)
    (directory / SERVER_ENV_FILE).unlink()
    write_secrets(directory, PREFIX)
    creds = read_credentials(directory / credentials_file_name("scheduler"))
    hashed = server_environment(directory)[password_variable("scheduler")].strip('"')
    assert bcrypt.checkpw(creds.password.encode(), hashed.encode())


def test_a_broken_credentials_file_is_a_one_line_error(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir()
    directory.chmod(0o700)
    (directory / credentials_file_name("worker")).write_text("not json")
    result = CliRunner().invoke(main, ["nats-credentials", str(directory)])
    assert result.exit_code == 1
    assert "nats-worker.json is not readable JSON with user and password" in result.output
    assert "Traceback" not in result.output


def test_a_directory_open_to_others_is_refused_not_changed(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o755)
    result = CliRunner().invoke(main, ["nats-credentials", str(directory)])
    assert result.exit_code == 1
    assert f"{directory} is open to other users" in result.output
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755 and not any(directory.iterdir())


def test_another_prefix_s_secrets_are_refused(secrets_dir: Path) -> None:
    result = CliRunner().invoke(main, ["nats-credentials", str(secrets_dir), "--prefix", "acme"])
    assert result.exit_code == 1
    assert "is the user jobsched-" in result.output and "not acme-" in result.output


def test_the_kubernetes_secrets_follow_the_schema_and_hold_the_files(secrets_dir: Path) -> None:
    doc = json.loads(cli("nats-credentials", str(secrets_dir), "--kubernetes"))
    assert doc["kind"] == "List"
    clients, servers = doc["items"]
    for secret in (clients, servers):
        kubernetes_validate.validate(secret, "1.30", strict=True)
    assert (clients["metadata"]["name"], clients["metadata"]["namespace"]) == (
        NATS_SECRET,
        "jobsched",
    )
    assert clients["stringData"] == {
        name: (secrets_dir / name).read_text()
        for name in [*map(credentials_file_name, DEPLOYED_ROLES), ISSUER_SEED_FILE]
    }
    assert (servers["metadata"]["name"], servers["metadata"]["namespace"]) == (
        NATS_SERVER_SECRET,
        "nats",
    )
    assert servers["stringData"] == server_environment(secrets_dir)
