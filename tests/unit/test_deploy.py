"""The deployment files: every YAML parses, the Kubernetes manifests pass the official schemas offline,
and the pieces agree with each other and with the server (flags, ports, env vars, the Secret's tokens)."""

from __future__ import annotations

import argparse
import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cyclone_server import auth

from cyclone_server.cli import main as cli

from cyclone_server.listen import split_host_port
from cyclone_server.serve import metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# gRPC probes are GA from 1.27 (the oldest version we support); also the newest schemas shipped.
K8S_VERSIONS = ["1.27.0", "1.37.0"]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _manifests() -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for p in sorted((DEPLOY / "k8s").glob("*.yaml"))
            for d in _docs(p)}


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.y*ml")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    assert _docs(path)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_match_the_kubernetes_schemas(version: str) -> None:
    manifests = _manifests()
    assert set(manifests) == {"Deployment/cyclone-server", "Service/cyclone", "Service/cyclone-headless",
                              "Secret/cyclone", "PodDisruptionBudget/cyclone-server"}
    for name, doc in manifests.items():
        assert "namespace" not in doc["metadata"], f"{name}: manifests are namespace-less"
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_wrong_manifest() -> None:
    broken = copy.deepcopy(_manifests()["Deployment/cyclone-server"])
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["prot"] = 7233
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def _server_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    cli.add_server_flags(parser)  # every group of the settings table, security and metrics included
    return parser


def test_deployment_shape() -> None:
    m = _manifests()
    deployment, secret = m["Deployment/cyclone-server"], m["Secret/cyclone"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert deployment["spec"]["replicas"] >= 2
    for probe in ("livenessProbe", "startupProbe"):
        assert container[probe]["grpc"] == {"port": 7233}, probe
    # Readiness follows the database (a Cyclone service's health); liveness does not, so an
    # outage restarts no pod (app.CycloneServer._database).
    assert container["readinessProbe"]["grpc"] == {"port": 7233, "service": "cyclone.v1.Runs"}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    for var, key in (("CYCLONE_DATABASE_URL", "database-url"), ("CYCLONE_TOKENS", "tokens")):
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and key in secret["stringData"], var
    assert env["CYCLONE_LISTEN"]["value"] == "0.0.0.0:7233"
    metrics_port = split_host_port(env["CYCLONE_METRICS_LISTEN"]["value"], default_host="0.0.0.0")[1]
    assert metrics_port == metrics.DEFAULT_METRICS_PORT
    _server_parser().parse_args(container["args"])  # every flag exists in cyclone-server
    # The example tokens parse, and give every role.
    tokens = auth.parse_tokens(secret["stringData"]["tokens"], "secret.yaml")
    assert set().union(*tokens.values()) == auth.ROLES
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 7233, "metrics": metrics.DEFAULT_METRICS_PORT}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(_server_parser().parse_args(container["args"]).grace)


def test_services_and_pdb_select_the_pods() -> None:
    m = _manifests()
    labels = m["Deployment/cyclone-server"]["spec"]["template"]["metadata"]["labels"]
    (container,) = m["Deployment/cyclone-server"]["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"] for p in container["ports"]}
    for name in ("Service/cyclone", "Service/cyclone-headless"):
        spec = m[name]["spec"]
        assert spec["selector"].items() <= labels.items(), name
        assert {p["targetPort"] for p in spec["ports"]} <= container_ports, name
    assert m["Service/cyclone"]["spec"]["ports"][0]["port"] == 7233
    assert m["Service/cyclone-headless"]["spec"]["clusterIP"] == "None"
    pdb = m["PodDisruptionBudget/cyclone-server"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["minAvailable"] < m["Deployment/cyclone-server"]["spec"]["replicas"]


def _dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile() -> None:
    instructions = _dockerfile()
    get = lambda op: [arg for o, arg in instructions if o == op]  # noqa: E731
    assert get("FROM") == ["python:3.11-slim"]
    assert any("pip install" in run for run in get("RUN"))
    (user,) = get("USER")
    assert not user.startswith(("root", "0"))
    uid = int(user.split(":")[0])
    pod = _manifests()["Deployment/cyclone-server"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == uid  # runAsNonRoot can check a numeric uid
    assert {p for e in get("EXPOSE") for p in e.split()} == {"7233", str(metrics.DEFAULT_METRICS_PORT)}
    (entrypoint,) = get("ENTRYPOINT")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert yaml.safe_load(entrypoint) == ["cyclone-server"] and "cyclone-server" in scripts
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    assert "!cyclone_server/**" in ignore and "!pyproject.toml" in ignore


def test_compose_file() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "server-1", "server-2", "worker"}
    assert services["postgres"]["image"] == "postgres:15"
    assert "healthcheck" in services["postgres"]
    for name in ("server-1", "server-2", "worker"):
        build = services[name]["build"]
        assert (ROOT / "deploy" / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    for name in ("server-1", "server-2"):
        s = services[name]
        assert s["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "@postgres:5432/" in s["environment"]["CYCLONE_DATABASE_URL"]
        _server_parser().parse_args(s["command"])
        # No auth in this demo, so nothing may be published beyond loopback.
        assert s["environment"]["CYCLONE_INSECURE_ALLOW_NO_AUTH"] == "1"
        assert all(p.startswith("127.0.0.1:") for p in s["ports"]), name
        assert s["healthcheck"]["test"][:3] == ["CMD", "python", "-c"]
    worker = services["worker"]
    assert worker["entrypoint"] == ["python", "-m", "cyclone_worker.demo"]
    address = worker["command"][worker["command"].index("--address") + 1]
    assert address.split(":")[0] in services and worker["depends_on"][address.split(":")[0]]
    assert "pgdata" in compose["volumes"]


def test_env_vars_used_by_the_deployment_are_read_by_the_server() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "cyclone_server").rglob("*.py"))
    used = set(re.findall(r"\bCYCLONE_[A-Z_]+\b", "\n".join(
        p.read_text() for p in DEPLOY.rglob("*") if p.is_file())))
    assert used and {v for v in used if f'"{v}"' not in source} == set()


def test_compose_healthcheck_is_valid_python() -> None:
    test = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["x-server"]["healthcheck"]["test"]
    compile(test[3], "healthcheck", "exec")
