"""The Kubernetes manifests of ``deploy/kubernetes/``, checked offline (nothing is applied to a
cluster: there is none here).

- The core resources (Namespace, ConfigMap, Deployments, Service, PodDisruptionBudgets, the
  example Secret) against Kubernetes' own OpenAPI schemas, strict (unknown fields rejected, as
  ``kubectl apply``'s default server-side field validation does), through PyPI's
  ``kubernetes-validate``, for the oldest Kubernetes the manifests need and a recent one.
- The KEDA ScaledObject against KEDA's ScaledObject CRD as cloudcoil publishes it on PyPI
  (``cloudcoil.models.keda``: Pydantic models generated from KEDA's released CRDs), turned into
  a JSON schema closed to unknown fields; and its ``nats-jetstream`` trigger against the
  parameters KEDA documents for that scaler (the CRD types trigger metadata as any string map).
- What no schema knows: every variable is a setting and loads; the probes hit the port and path
  each process serves; the Secret references resolve; each Deployment mounts the NATS users of
  its own connections, and only those (tests/test_nats_deploy.py checks the NATS servers' side,
  ``nats/auth-values.yaml``); the PodDisruptionBudgets and the Service
  select the pods; and the trigger's stream and consumer are the ones the code creates for the
  worker Deployment's settings (``jobsched.runtime.bus_config``), so that a rename cannot
  silently break autoscaling. Last, the trigger's query is run against a real nats-server's
  monitoring endpoint, as KEDA makes it.

Each schema check has a test that breaks a manifest and expects the check to reject it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jsonschema
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject

from bus.auth import credentials_file_name
from bus.callout import ISSUER_SEED_FILE
from bus.nats import Bus
from bus.natsconf import DEPLOYED_ROLES, user_name
from core.settings import Settings, load_settings
from jobsched.natsserver import NatsServer
from jobsched.runtime import Roles, bus_config, connections_of

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
KEDA = K8S / "keda"
SECRET_EXAMPLE = "secret.example.yaml"
KUBERNETES_VERSIONS = ("1.30", "1.35")
"""1.30: the oldest the manifests need (the preStop ``sleep`` action); 1.35: a recent one."""
ROLES = ("gateway", "scheduler", "worker", "notifier")
NATS_PING_TIMEOUT_SECONDS = 2  # Bus.ping
MONITORING_PORT = 8222

Doc = dict[str, Any]


def documents(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def copy(doc: Doc) -> Doc:
    result: Doc = json.loads(json.dumps(doc))
    return result


@pytest.fixture(scope="module")
def core() -> list[Doc]:
    """What ``kubectl apply -k deploy/kubernetes`` applies, plus the example Secret."""
    kustomization = documents(K8S / "kustomization.yaml")[0]
    files = [*kustomization["resources"], SECRET_EXAMPLE]
    return [d for f in files for d in documents(K8S / f)]


@pytest.fixture(scope="module")
def scaled_objects() -> list[Doc]:
    kustomization = documents(KEDA / "kustomization.yaml")[0]
    return [d for f in kustomization["resources"] for d in documents(KEDA / f)]


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def container(deployment: Doc) -> Doc:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    result: Doc = c
    return result


def role_of(deployment: Doc) -> str:
    role: str = container(deployment)["args"][0]
    return role


def deployments(core: list[Doc], role: str | None = None) -> list[Doc]:
    return [d for d in of_kind(core, "Deployment") if role is None or role_of(d) == role]


def environment(deployment: Doc, core: list[Doc]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: the ConfigMaps of ``envFrom``,
    then ``env`` (Secret references resolved against the example Secret)."""
    c = container(deployment)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        (kind, ref), *_ = source.items()
        assert kind == "configMapRef", source
        env.update(named(core, "ConfigMap", ref["name"])["data"])
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = named(core, "Secret", ref["name"])["stringData"][ref["key"]]
    return env


def settings_of(deployment: Doc, core: list[Doc]) -> Settings:
    return load_settings(environment(deployment, core))


def without_nats_users(settings: Settings) -> Settings:
    """``settings`` without its NATS credentials (mounted in the pod only): for the stream and
    consumer names, or a connection to this test's own server."""
    return settings.changed(nats_credentials_dir="", nats_credentials_file="")


# --- the files --------------------------------------------------------------------------------


def test_the_kustomizations_list_every_manifest() -> None:
    base = set(documents(K8S / "kustomization.yaml")[0]["resources"])
    assert base == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", SECRET_EXAMPLE}
    keda = set(documents(KEDA / "kustomization.yaml")[0]["resources"])
    assert keda == {p.name for p in KEDA.glob("*.yaml")} - {"kustomization.yaml"}


def test_the_topology_is_the_one_of_compose(core: list[Doc]) -> None:
    assert sorted(role_of(d) for d in deployments(core)) == sorted(ROLES)
    assert {d["kind"] for d in core} == {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }
    assert all(
        d["metadata"].get("namespace") == "jobsched" for d in core if d["kind"] != "Namespace"
    )


def kind_and_name(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def test_kubectl_kustomize_builds_the_manifests_unchanged(
    core: list[Doc], scaled_objects: list[Doc]
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on this machine")
    for directory, expected in (
        (K8S, [d for d in core if d["kind"] != "Secret"]),
        (KEDA, scaled_objects),
    ):
        result = subprocess.run(
            [kubectl, "kustomize", str(directory)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        built = [d for d in yaml.safe_load_all(result.stdout) if d]
        assert sorted(built, key=kind_and_name) == sorted(expected, key=kind_and_name)


# --- Kubernetes' schemas ----------------------------------------------------------------------


def kubernetes_schema_error(doc: Doc, version: str) -> str | None:
    """The first place where ``doc`` breaks Kubernetes ``version``'s strict schema, or None."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{'.'.join(map(str, e.path)) or '(top)'}: {e.message}"
    return None


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_resources_follow_the_kubernetes_schema(core: list[Doc], version: str) -> None:
    errors = {
        f"{d['kind']}/{d['metadata']['name']}": kubernetes_schema_error(d, version) for d in core
    }
    assert {k: v for k, v in errors.items() if v} == {}


Breakage = tuple[Callable[[Doc], object], str]
"""How a test breaks a manifest, and what the schema check must then say."""

BREAKAGES: dict[str, Breakage] = {
    "replicas as a string": (
        lambda d: d["spec"].update(replicas="2"),
        "spec.replicas: '2' is not of type",
    ),
    "a misspelt probe field": (
        lambda d: container(d).update(livenessprobe=container(d).pop("livenessProbe")),
        "'livenessprobe' was unexpected",
    ),
    "a port name as a number": (
        lambda d: container(d)["readinessProbe"]["httpGet"].update(port=[8080]),
        "readinessProbe.httpGet.port",
    ),
}


@pytest.mark.parametrize("breakage", BREAKAGES, ids=list(BREAKAGES))
def test_the_kubernetes_schema_check_rejects_a_broken_manifest(
    core: list[Doc], breakage: str
) -> None:
    break_it, expected = BREAKAGES[breakage]
    broken = copy(deployments(core, "gateway")[0])
    break_it(broken)
    error = kubernetes_schema_error(broken, KUBERNETES_VERSIONS[0])
    assert error is not None and expected in error, error


# --- KEDA's schemas ---------------------------------------------------------------------------


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its properties
    and says nothing else: the API server rejects unknown fields of a structural CRD under
    ``kubectl apply``'s default strict field validation, while Pydantic's schema allows them."""
    if not isinstance(schema, dict):
        return schema
    if "properties" in schema:
        schema.setdefault("additionalProperties", False)
    for key in ("properties", "$defs", "patternProperties"):
        for sub in schema.get(key, {}).values():
            closed(sub)
    for key in ("items", "additionalProperties", "not"):
        closed(schema.get(key))
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        for sub in schema.get(key, []):
            closed(sub)
    return schema


SCALED_OBJECT_SCHEMA = closed(ScaledObject.model_json_schema(by_alias=True))

GO_BOOLEANS = ["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"]
"""What Go's ``strconv.ParseBool`` accepts."""

NATS_JETSTREAM_METADATA = {
    # The parameters of KEDA's nats-jetstream scaler, written from its documentation
    # (keda.sh/docs/2.16/scalers/nats-jetstream) and parsing (strconv.ParseInt/ParseBool):
    # weaker than a published schema, and stricter in one way: the endpoint and the account may
    # come from a TriggerAuthentication instead, which these manifests do not use.
    "type": "object",
    "required": ["natsServerMonitoringEndpoint", "account", "stream", "consumer"],
    "additionalProperties": False,  # KEDA ignores unknown keys: `lagTreshold` would be lost
    "properties": {
        "natsServerMonitoringEndpoint": {
            "type": "string",
            "pattern": r"^[A-Za-z0-9.-]+(:[0-9]+)?$",  # host[:port]; KEDA adds http(s)://
        },
        "account": {"type": "string", "minLength": 1},
        "stream": {"type": "string", "minLength": 1},
        "consumer": {"type": "string", "minLength": 1},
        "lagThreshold": {"type": "string", "pattern": r"^[1-9][0-9]*$"},
        "activationLagThreshold": {"type": "string", "pattern": r"^[0-9]+$"},
        "useHttps": {"enum": GO_BOOLEANS},
    },
}


def nats_triggers(scaled_object: Doc) -> list[Doc]:
    return [t for t in scaled_object["spec"]["triggers"] if t["type"] == "nats-jetstream"]


def keda_schema_errors(doc: Doc) -> list[str]:
    """Where ``doc`` breaks the ScaledObject CRD or a nats-jetstream trigger's parameters, as
    ``path: message`` lines."""
    errors = [
        (list(e.absolute_path), e.message)
        for e in jsonschema.Draft202012Validator(SCALED_OBJECT_SCHEMA).iter_errors(doc)
    ]
    if not errors:
        validator = jsonschema.Draft202012Validator(NATS_JETSTREAM_METADATA)
        for i, trigger in enumerate(doc["spec"]["triggers"]):
            if trigger["type"] == "nats-jetstream":
                path = ["spec", "triggers", i, "metadata"]
                errors += [
                    ([*path, *e.absolute_path], e.message)
                    for e in validator.iter_errors(trigger["metadata"])
                ]
    return [f"{'/'.join(map(str, p)) or '(top)'}: {m}" for p, m in errors]


def test_the_scaled_objects_follow_kedas_schemas(scaled_objects: list[Doc]) -> None:
    assert scaled_objects
    for doc in scaled_objects:
        assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["kind"] == "ScaledObject"
        assert keda_schema_errors(doc) == []
        assert nats_triggers(doc)


KEDA_BREAKAGES: dict[str, Breakage] = {
    "an unquoted lagThreshold": (
        lambda d: d["spec"]["triggers"][0]["metadata"].update(lagThreshold=64),
        "spec/triggers/0/metadata/lagThreshold: 64 is not of type 'string'",
    ),
    "no scale target": (
        lambda d: d["spec"].pop("scaleTargetRef"),
        "spec: 'scaleTargetRef' is a required property",
    ),
    "HPA's field name": (
        lambda d: d["spec"].update(minReplicas=d["spec"].pop("minReplicaCount")),
        "'minReplicas' was unexpected",
    ),
    "a misspelt scaler parameter": (
        lambda d: d["spec"]["triggers"][0]["metadata"].update(
            lagTreshold=d["spec"]["triggers"][0]["metadata"].pop("lagThreshold")
        ),
        "'lagTreshold' was unexpected",
    ),
    "a URL as the monitoring endpoint": (
        lambda d: d["spec"]["triggers"][0]["metadata"].update(
            natsServerMonitoringEndpoint="http://nats-headless.nats.svc.cluster.local:8222"
        ),
        "natsServerMonitoringEndpoint: 'http://",
    ),
    "no consumer": (
        lambda d: d["spec"]["triggers"][0]["metadata"].pop("consumer"),
        "spec/triggers/0/metadata: 'consumer' is a required property",
    ),
}


@pytest.mark.parametrize("breakage", KEDA_BREAKAGES, ids=list(KEDA_BREAKAGES))
def test_the_keda_schema_check_rejects_a_broken_scaled_object(
    scaled_objects: list[Doc], breakage: str
) -> None:
    break_it, expected = KEDA_BREAKAGES[breakage]
    broken = copy(scaled_objects[0])
    break_it(broken)
    errors = keda_schema_errors(broken)
    assert len(errors) == 1 and expected in errors[0], errors


# --- what the schemas cannot know -------------------------------------------------------------


def test_every_jobsched_variable_is_a_setting_and_loads(core: list[Doc]) -> None:
    for deployment in deployments(core):
        env = environment(deployment, core)
        assert set(env) <= Settings.env_names(), set(env) - Settings.env_names()
        settings_of(deployment, core)  # raises ConfigError naming a bad value
    for config_map in of_kind(core, "ConfigMap"):
        assert set(config_map["data"]) <= Settings.env_names()


def test_the_deployments_run_the_roles_from_one_pinned_image(core: list[Doc]) -> None:
    images = {container(d)["image"] for d in deployments(core)}
    assert len(images) == 1, images
    (image,) = images
    assert re.fullmatch(r"[^:]+:\d+\.\d+\.\d+", image), f"{image}: pin a version tag"
    for deployment in deployments(core):
        c = container(deployment)
        assert "command" not in c  # the image's ENTRYPOINT is jobsched
        assert c["args"] == [c["name"]]
        assert c["name"] in ROLES
        spec = deployment["spec"]
        labels = spec["template"]["metadata"]["labels"]
        selector = spec["selector"]["matchLabels"]
        assert selector.items() <= labels.items()  # the API server rejects anything else
        assert labels["app.kubernetes.io/component"] == c["name"]


def test_the_processes_are_configured_for_the_cluster(core: list[Doc]) -> None:
    for deployment in deployments(core):
        settings = settings_of(deployment, core)
        assert settings.nats.stream_replicas == 3
        assert settings.http.host == "0.0.0.0"
        assert settings.log_format == "json"
        role = role_of(deployment)
        if role != "worker":
            assert settings.resolved_store_url.startswith("mongodb://")
            assert "replicaSet=" in settings.resolved_store_url
        if role == "worker":
            assert settings.worker.cpu_slots >= 1, "0 counts the node's cores, not the pod's"
        assert (role == "gateway") == bool(settings.gateway.auth_secret)


def probe_port(deployment: Doc, probe: Doc) -> int:
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container(deployment)["ports"] if p["name"] == port]
    result: int = number
    return result


def test_every_role_is_probed_on_healthz_and_readyz_where_it_serves_them(
    core: list[Doc],
) -> None:
    for deployment in deployments(core):
        c = container(deployment)
        settings = settings_of(deployment, core)
        serves = settings.http.port if role_of(deployment) == "gateway" else settings.metrics.port
        assert serves, f"{c['name']} serves no probe endpoint"
        paths = {
            "startupProbe": "/healthz",
            "livenessProbe": "/healthz",
            "readinessProbe": "/readyz",
        }
        for kind, path in paths.items():
            probe = c[kind]
            assert probe["httpGet"]["path"] == path, (c["name"], kind)
            assert probe_port(deployment, probe) == serves, (c["name"], kind)
        checks: list[float] = [NATS_PING_TIMEOUT_SECONDS]
        if role_of(deployment) != "worker":
            checks.append(settings.store.timeout_seconds)
        assert c["readinessProbe"]["timeoutSeconds"] > max(checks), c["name"]


def test_every_container_requests_resources_and_runs_restricted(core: list[Doc]) -> None:
    found = re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert found is not None, "the Dockerfile creates its user with --uid"
    uid = int(found[1])
    for deployment in deployments(core):
        pod = deployment["spec"]["template"]["spec"]
        c = container(deployment)
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
        assert "memory" in c["resources"]["limits"], c["name"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == uid
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/tmp", settings_of(deployment, core).data_dir} <= mounts, c["name"]


def test_the_grace_period_covers_the_drain(core: list[Doc]) -> None:
    for deployment in deployments(core):
        pod = deployment["spec"]["template"]["spec"]
        pre_stop = container(deployment).get("lifecycle", {}).get("preStop", {})
        needed = settings_of(deployment, core).worker.drain_timeout_seconds
        needed += pre_stop.get("sleep", {}).get("seconds", 0)
        assert pod["terminationGracePeriodSeconds"] >= needed + 5, container(deployment)["name"]


def selects(selector: dict[str, str], deployment: Doc) -> bool:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return selector.items() <= labels.items()


def test_one_disruption_budget_per_role_lets_one_pod_go_at_a_time(core: list[Doc]) -> None:
    budgets = of_kind(core, "PodDisruptionBudget")
    for deployment in deployments(core):
        (budget,) = [
            b for b in budgets if selects(b["spec"]["selector"]["matchLabels"], deployment)
        ]
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert len(budgets) == len(deployments(core))


def test_the_service_reaches_the_gateways(core: list[Doc]) -> None:
    (service,) = of_kind(core, "Service")
    (gateway,) = deployments(core, "gateway")
    assert selects(service["spec"]["selector"], gateway)
    assert not any(selects(service["spec"]["selector"], d) for d in deployments(core, "worker"))
    names = {p["name"] for p in container(gateway)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


def test_secrets_are_secret_references_and_only_where_needed(core: list[Doc]) -> None:
    secret = named(core, "Secret", "jobsched")
    for deployment in deployments(core):
        for var in container(deployment)["env"]:
            if var["name"] in secret["stringData"]:
                ref = var["valueFrom"]["secretKeyRef"]
                assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], var["name"])
    for config_map in of_kind(core, "ConfigMap"):
        assert not set(config_map["data"]) & set(secret["stringData"])
    referenced = {
        role_of(d): {v["name"] for v in container(d)["env"] if "valueFrom" in v}
        for d in deployments(core)
    }
    assert referenced == {
        "gateway": {"JOBSCHED_AUTH_SECRET", "JOBSCHED_STORE_URL"},
        "scheduler": {"JOBSCHED_STORE_URL"},
        "worker": set(),
        "notifier": {"JOBSCHED_STORE_URL"},
    }


NATS_SECRET = "jobsched-nats"


def nats_volume(deployment: Doc) -> tuple[Doc, Doc]:
    """The Deployment's volume of the Secret ``jobsched-nats`` and the container's mount of it."""
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == NATS_SECRET]
    (mount,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == volume["name"]]
    return volume, mount


def test_each_role_mounts_the_nats_users_of_its_own_connections_only(core: list[Doc]) -> None:
    for deployment in deployments(core):
        role = role_of(deployment)
        volume, mount = nats_volume(deployment)
        settings = settings_of(deployment, core)
        assert settings.nats.credentials_dir == mount["mountPath"], role
        assert not settings.nats.credentials_file
        assert mount["readOnly"] is True
        assert volume["secret"]["defaultMode"] == 0o440  # root:fsGroup, not world-readable
        roles = Roles(**{role: True})
        expected = {credentials_file_name(c) for c in connections_of(roles, callout=roles.gateway)}
        if roles.gateway:  # the auth callout's issuer seed, where the setting points
            expected.add(ISSUER_SEED_FILE)
            seed = f"{mount['mountPath']}/{ISSUER_SEED_FILE}"
            assert settings.nats.callout_issuer_seed_file == seed
        items = volume["secret"]["items"]
        assert all(i["key"] == i["path"] for i in items), role
        assert {i["key"] for i in items} == expected, role


def test_the_example_nats_secret_has_every_role_s_user(core: list[Doc]) -> None:
    secret = named(core, "Secret", NATS_SECRET)
    prefix = of_kind(core, "ConfigMap")[0]["data"]["JOBSCHED_SUBJECT_PREFIX"]
    files = {credentials_file_name(r) for r in DEPLOYED_ROLES}
    assert set(secret["stringData"]) == files | {ISSUER_SEED_FILE}
    for role in DEPLOYED_ROLES:
        creds = json.loads(secret["stringData"][credentials_file_name(role)])
        assert creds["user"] == user_name(prefix, role)
    mounted = {i["key"] for d in deployments(core) for i in nats_volume(d)[0]["secret"]["items"]}
    assert mounted <= set(secret["stringData"])


# --- the autoscaler against the code ----------------------------------------------------------


def autoscaling_problems(core: list[Doc], scaled_objects: list[Doc]) -> list[str]:
    """What would break KEDA's scaling of the workers: for every worker Deployment, one
    ScaledObject with a nats-jetstream trigger for exactly the stream and durable consumers the
    code creates for the Deployment's settings (``bus_config(settings.nats)``), a lag threshold of
    one worker's concurrency, and no ``replicas`` of its own."""
    problems = []
    workers = {d["metadata"]["name"]: d for d in deployments(core, "worker")}
    targeted = {}
    for so in scaled_objects:
        ref = so["spec"]["scaleTargetRef"]
        name = so["metadata"]["name"]
        if ref.get("kind", "Deployment") != "Deployment" or ref["name"] not in workers:
            problems.append(f"{name}: targets {ref}, not a worker Deployment")
            continue
        targeted[ref["name"]] = name
        deployment = workers[ref["name"]]
        settings = settings_of(deployment, core)
        bus = bus_config(without_nats_users(settings).nats)
        expected = {(bus.work_stream, bus.work_consumer(q)) for q in settings.worker.queues}
        triggers = nats_triggers(so)
        found = {(t["metadata"]["stream"], t["metadata"]["consumer"]) for t in triggers}
        if found != expected:
            problems.append(
                f"{name}: triggers on {sorted(found)}, the code uses {sorted(expected)}"
            )
        for t in triggers:
            if t["metadata"].get("lagThreshold") != str(settings.worker.concurrency):
                problems.append(
                    f"{name}: lagThreshold {t['metadata'].get('lagThreshold')} is not one "
                    f"worker's JOBSCHED_WORKER_CONCURRENCY ({settings.worker.concurrency})"
                )
        if "replicas" in deployment["spec"]:
            problems.append(f"{ref['name']}: sets replicas, which fights {name}")
    problems += [f"{w}: no ScaledObject" for w in workers if w not in targeted]
    return problems


def test_the_autoscaler_follows_the_streams_and_consumers_the_code_creates(
    core: list[Doc], scaled_objects: list[Doc]
) -> None:
    assert autoscaling_problems(core, scaled_objects) == []


def set_env(deployment: Doc, name: str, value: str) -> None:
    (var,) = [v for v in container(deployment)["env"] if v["name"] == name]
    var["value"] = value


def rename_queue(core: list[Doc]) -> None:
    set_env(deployments(core, "worker")[0], "JOBSCHED_QUEUES", "reports")


def add_queue(core: list[Doc]) -> None:
    set_env(deployments(core, "worker")[0], "JOBSCHED_QUEUES", "default,reports")


def change_prefix(core: list[Doc]) -> None:
    of_kind(core, "ConfigMap")[0]["data"]["JOBSCHED_SUBJECT_PREFIX"] = "acme"


def double_concurrency(core: list[Doc]) -> None:
    set_env(deployments(core, "worker")[0], "JOBSCHED_WORKER_CONCURRENCY", "128")


def pin_replicas(core: list[Doc]) -> None:
    deployments(core, "worker")[0]["spec"]["replicas"] = 2


def rename_deployment(core: list[Doc]) -> None:
    deployments(core, "worker")[0]["metadata"]["name"] = "jobsched-worker-default"


RENAMES = {
    "queue renamed": (rename_queue, "the code uses [('JOBSCHED_WORK', 'workers-reports')]"),
    "queue added": (add_queue, "('JOBSCHED_WORK', 'workers-reports')]"),
    "prefix changed": (change_prefix, "the code uses [('ACME_WORK', 'workers-default')]"),
    "concurrency changed": (double_concurrency, "JOBSCHED_WORKER_CONCURRENCY (128)"),
    "replicas pinned": (pin_replicas, "jobsched-worker: sets replicas"),
    "deployment renamed": (rename_deployment, "not a worker Deployment"),
}


@pytest.mark.parametrize("change", RENAMES, ids=list(RENAMES))
def test_a_change_on_one_side_only_breaks_the_autoscaling_check(
    core: list[Doc], scaled_objects: list[Doc], change: str
) -> None:
    apply, expected = RENAMES[change]
    changed = [copy(d) for d in core]
    apply(changed)
    problems = autoscaling_problems(changed, scaled_objects)
    assert problems and expected in problems[0], problems


def test_keda_reads_the_monitoring_port_of_the_nats_the_processes_use(
    core: list[Doc], scaled_objects: list[Doc]
) -> None:
    (worker,) = deployments(core, "worker")
    clients = [urlsplit(u.strip()) for u in settings_of(worker, core).nats.url.split(",")]
    for so in scaled_objects:
        for trigger in nats_triggers(so):
            host, _, port = trigger["metadata"]["natsServerMonitoringEndpoint"].rpartition(":")
            assert int(port) == MONITORING_PORT
            assert all(int(port) != (c.port or 4222) for c in clients)
            # The same NATS deployment: the endpoint is a service of the clients' namespace.
            assert any(
                c.hostname is not None and host.split(".", 1)[1] == c.hostname.split(".", 1)[1]
                for c in clients
            )
            assert trigger["metadata"]["account"] == "$G"  # NATS without accounts (deploy/nats)


def jsz_lag(jsz: Doc, account: str, stream: str, consumer: str) -> int | None:
    """num_pending + num_ack_pending of ``consumer`` in a ``/jsz`` answer, as KEDA's
    nats-jetstream scaler reads it (None: not there)."""
    for acc in jsz.get("account_details", []):
        if acc["name"] != account:
            continue
        for s in acc.get("stream_detail", []):
            if s["name"] != stream:
                continue
            for c in s.get("consumer_detail", []):
                if c["name"] == consumer:
                    return int(c.get("num_pending", 0)) + int(c.get("num_ack_pending", 0))
    return None


@pytest.fixture
def monitored_nats(nats_binary: str, tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test with its HTTP monitoring endpoint (as KEDA reads it)."""
    server = NatsServer(nats_binary, tmp_path / "nats", monitor=True)
    server.start()
    yield server
    server.stop()


async def test_the_trigger_reads_the_queue_depth_from_a_real_nats_server(
    core: list[Doc], scaled_objects: list[Doc], monitored_nats: NatsServer
) -> None:
    (worker,) = deployments(core, "worker")
    (trigger,) = nats_triggers(scaled_objects[0])
    meta = trigger["metadata"]
    # The worker's settings, on one server of this test (R1: one node cannot hold R3 streams).
    settings = without_nats_users(settings_of(worker, core)).changed(
        nats_url=monitored_nats.url, stream_replicas=1
    )
    (queue,) = settings.worker.queues
    bus = Bus(bus_config(settings.nats), name="keda-test")
    await bus.connect()
    try:
        await bus.ensure_streams()
        consumer = await bus.work_consumer(queue)  # as a worker creates it
        for i in range(3):
            await bus.js.publish(bus.config.work_subject(queue, f"e{i}"), b"{}")
        (held,) = await consumer.fetch(1, timeout_seconds=5)  # one running, two waiting
        # KEDA's query (natsServerMonitoringEndpoint → this server's monitoring address).
        url = f"{monitored_nats.monitor_url}/jsz?acc={meta['account']}&consumers=true&config=true"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            assert resp.status == 200
            jsz = await resp.json()
        lag = jsz_lag(jsz, meta["account"], meta["stream"], meta["consumer"])
        assert lag == 3 == await bus.queue_depth(queue)
        assert jsz_lag(jsz, meta["account"], meta["stream"], "workers-typo") is None
        await held.ack()
        await consumer.close()
    finally:
        await bus.close()
