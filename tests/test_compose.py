"""The production-like stack of ``compose.yaml`` (with ``Dockerfile`` and ``deploy/``), checked
statically: services, commands, health checks, restart policies, loopback-only ports, versions,
the one-member MongoDB replica set, the NATS cluster, its users (every service that talks to
NATS gets the credentials of its own connections, and only those; the servers get the password
hashes; nothing in the repository holds a password), and that every ``JOBSCHED_*`` variable it
sets is a setting. The file is validated against the Compose Specification's JSON schema
(``tests/data/compose-spec.json``, Apache-2.0, the copy shipped in docker-compose 1.29.2 as
``compose/config/compose_spec.json``); ``docker compose config -q`` runs too when a docker CLI
with compose exists (it needs no engine). Nothing here starts a container.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from bus.auth import credentials_file_name
from bus.callout import ISSUER_SEED_FILE
from bus.natsconf import SERVER_ENV_FILE, password_variable, server_environment, write_secrets
from core.settings import Settings, load_settings
from jobsched.runtime import Roles, connections_of

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
COMPOSE_SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
JOBSCHED_ROLES = {"gateway": 1, "scheduler": 2, "worker": 2, "notifier": 1}
NATS_NODES = ("nats-1", "nats-2", "nats-3")
SECRETS = "./secrets"  # `jobsched nats-credentials secrets`, never committed


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def version_of(image: str) -> tuple[int, ...]:
    tag = image.partition(":")[2]
    match = re.match(r"(\d+(?:\.\d+)*)", tag)
    assert match, f"{image}: pin a version tag"
    return tuple(int(p) for p in match.group(1).split("."))


def test_the_services_of_the_stack(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {"mongo", *NATS_NODES, *JOBSCHED_ROLES}


@pytest.mark.parametrize(("role", "replicas"), JOBSCHED_ROLES.items())
def test_jobsched_roles_run_the_cli_from_the_service_image(
    services: dict[str, dict[str, Any]], role: str, replicas: int
) -> None:
    service = services[role]
    assert service["build"] == "."
    assert service["command"] == [role]  # ENTRYPOINT jobsched: `jobsched <role>`
    assert service.get("deploy", {}).get("replicas", 1) == replicas
    assert all(c["condition"] == "service_healthy" for c in service["depends_on"].values())
    assert set(NATS_NODES) <= set(service["depends_on"])
    assert ("mongo" in service["depends_on"]) == (role != "worker")


def test_every_service_has_a_health_check_and_a_restart_policy(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert {"interval", "timeout", "retries"} <= set(check), name
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name
    gateway = " ".join(services["gateway"]["healthcheck"]["test"])
    assert "/readyz" in gateway and ":8080" in gateway
    scheduler = " ".join(services["scheduler"]["healthcheck"]["test"])
    assert "27017" in scheduler and "4222" in scheduler
    worker = " ".join(services["worker"]["healthcheck"]["test"])
    assert "4222" in worker and "27017" not in worker
    for node in NATS_NODES:
        assert "/healthz" in " ".join(services[node]["healthcheck"]["test"])


def test_health_check_scripts_are_valid_python(services: dict[str, dict[str, Any]]) -> None:
    for name in JOBSCHED_ROLES:
        test = services[name]["healthcheck"]["test"]
        assert test[1:3] == ["python", "-c"], name
        compile(test[3], f"<{name} healthcheck>", "exec")


def test_ports_are_published_on_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    published = 0
    for name, service in services.items():
        for port in service.get("ports", []):
            published += 1
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", (name, port)
            else:
                assert str(port).startswith("127.0.0.1:"), (name, port)
    assert published >= 3
    assert "127.0.0.1:8080:8080" in services["gateway"]["ports"]


def test_nats_is_a_three_node_jetstream_cluster_on_2_12_or_later(
    services: dict[str, dict[str, Any]],
) -> None:
    for node in NATS_NODES:
        service = services[node]
        image = service["image"]
        assert image.startswith("nats:")
        version = version_of(image)
        assert version >= (2, 12), image
        assert not ((2, 10, 20) <= version <= (2, 10, 22)), image
        conf = f"/etc/nats/{node}.conf"
        assert service["command"] == ["-c", conf]
        assert "./deploy/nats:/etc/nats:ro" in service["volumes"]
        assert any(v.startswith(f"{node}-data:") for v in service["volumes"])
        text = (ROOT / "deploy" / "nats" / f"{node}.conf").read_text()
        assert f"server_name: {node}" in text and "include ./common.conf" in text
    common = (ROOT / "deploy" / "nats" / "common.conf").read_text()
    assert "jetstream" in common and "store_dir: /data/jetstream" in common
    for node in NATS_NODES:
        assert f"nats://{node}:6222" in common


def test_nats_configs_parse(nats_binary: str, tmp_path: Path) -> None:
    """With the password hashes in the environment, as ``env_file`` sets them (tests/
    test_nats_deploy.py also checks that a node without them refuses to start)."""
    write_secrets(tmp_path, "jobsched")
    env = server_environment(tmp_path)
    for node in NATS_NODES:
        conf = ROOT / "deploy" / "nats" / f"{node}.conf"
        result = subprocess.run(
            [nats_binary, "-t", "-c", str(conf)],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_nats_node_authenticates_with_the_hashes_of_the_secrets_directory(
    services: dict[str, dict[str, Any]],
) -> None:
    for node in NATS_NODES:
        service = services[node]
        assert service["env_file"] == f"{SECRETS}/{SERVER_ENV_FILE}", node
        assert not any(k.startswith("NATS_") for k in environment(service)), node
    text = (ROOT / "deploy" / "nats" / "auth.conf").read_text()
    assert f'"password": ${password_variable("worker")}' in text


@pytest.mark.parametrize("role", JOBSCHED_ROLES)
def test_each_service_has_the_credentials_of_its_own_connections_only(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], role: str
) -> None:
    service = services[role]
    settings = load_settings(environment(service))
    assert settings.nats.credentials_dir == "/run/secrets"  # where compose mounts secrets
    assert not settings.nats.credentials_file
    roles = Roles(**{role: True})
    expected = {credentials_file_name(c) for c in connections_of(roles, callout=roles.gateway)}
    if roles.gateway:  # the callout's issuer seed, where the setting points
        expected.add(ISSUER_SEED_FILE)
        assert settings.nats.callout_issuer_seed_file == f"/run/secrets/{ISSUER_SEED_FILE}"
    assert set(service["secrets"]) == expected
    for name in expected:
        assert compose["secrets"][name] == {"file": f"{SECRETS}/{name}"}


def test_every_secret_is_used_and_none_is_in_the_repository_or_the_image(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    used = {s for service in services.values() for s in service.get("secrets", [])}
    assert used == set(compose["secrets"])
    assert "secrets/" in (ROOT / ".gitignore").read_text().split()
    assert "secrets" in (ROOT / ".dockerignore").read_text().split()


def test_mongodb_is_a_one_member_replica_set(services: dict[str, dict[str, Any]]) -> None:
    mongo = services["mongo"]
    assert version_of(mongo["image"])[0] == 8 and mongo["image"].startswith("mongo:")
    command = mongo["command"]
    assert command[command.index("--replSet") + 1] == "rs0"
    assert "mongosh" in mongo["healthcheck"]["test"]
    script = (ROOT / "deploy" / "mongo" / "init-replica-set.js").read_text()
    assert "rs.initiate(" in script and "rs.status()" in script  # idempotent initiation
    assert re.search(r"members: \[\{ _id: 0, host: \"mongo:27017\" \}\]", script)
    assert "isWritablePrimary" in script
    assert any("init-replica-set.js" in v for v in mongo["volumes"])


def test_the_services_use_the_cluster(services: dict[str, dict[str, Any]]) -> None:
    for role in JOBSCHED_ROLES:
        env = environment(services[role])
        assert env["JOBSCHED_NATS_URL"].split(",") == [f"nats://{n}:4222" for n in NATS_NODES]
        assert env["JOBSCHED_STREAM_REPLICAS"] == "3"
        assert env["JOBSCHED_STORE_URL"].startswith("mongodb://mongo:27017/")
        assert "replicaSet=rs0" in env["JOBSCHED_STORE_URL"]
    gateway = environment(services["gateway"])
    assert gateway["JOBSCHED_HTTP_HOST"] == "0.0.0.0"
    assert re.fullmatch(r"\$\{JOBSCHED_AUTH_SECRET:\?[^}]+\}", gateway["JOBSCHED_AUTH_SECRET"])
    assert "JOBSCHED_AUTH_SECRET" not in environment(services["worker"])


def test_every_jobsched_variable_is_a_setting(services: dict[str, dict[str, Any]]) -> None:
    names = {k for s in services.values() for k in environment(s) if k.startswith("JOBSCHED_")}
    assert names
    assert names <= Settings.env_names(), names - Settings.env_names()
    for service in services.values():  # configuration through JOBSCHED_* variables only
        assert all(k.startswith("JOBSCHED_") for k in environment(service) if service.get("build"))


def test_the_dockerfile_builds_a_non_root_service_image() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]
    assert lines[0] == "FROM python:3.11-slim"
    assert "RUN pip install . && rm -rf /src" in lines
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1] not in ("USER root", "USER 0")
    assert 'ENTRYPOINT ["jobsched"]' in lines
    for package in ("core", "store", "bus", "actors", "gateway", "jobsched"):
        assert f"COPY {package} ./{package}" in lines
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored and ".env" in ignored


def compose_schema_errors(doc: dict[str, Any]) -> list[str]:
    """Where ``doc`` breaks the Compose Specification schema, as ``path: message`` lines."""
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    # The top-level project `name` joined the specification after this copy of the schema.
    schema["properties"]["name"] = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]*$"}
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    assert compose_schema_errors(compose) == []


def test_the_schema_check_rejects_a_broken_compose_file(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["restart"] = ["unless-stopped"]
    broken["services"]["gateway"]["healthcheck"]["retries"] = "three"
    broken["services"]["gateway"]["volumes"] = "data:/data"
    errors = compose_schema_errors(broken)
    assert len(errors) == 3, errors
    assert all(e.startswith("services/gateway/") for e in errors), errors


def test_docker_compose_config_validates() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this machine")
    probe = subprocess.run(
        [docker, "compose", "version"], check=False, capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        pytest.skip("the docker CLI has no compose plugin (`docker compose version` failed)")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "-q"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"JOBSCHED_AUTH_SECRET": "x" * 64, "PATH": "/usr/bin:/bin:/usr/local/bin"},
        cwd=ROOT,
    )
    if not (ROOT / SECRETS / SERVER_ENV_FILE).exists():  # a new checkout: no secrets yet
        assert result.returncode != 0 and SERVER_ENV_FILE in result.stderr, result.stderr
        return
    assert result.returncode == 0, result.stderr
