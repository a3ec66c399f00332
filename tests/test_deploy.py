"""deploy/: the manifests validate against Kubernetes' schemas, the Dockerfile
lints clean, and what they run is what this tree's CLI accepts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from kpng_py.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def manifests() -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "kpng-py.yaml").read_text()) if doc]


def test_manifests_validate_strictly_against_kubernetes_schemas() -> None:
    for version in ("1.28.0", "1.31.0"):
        result = subprocess.run(
            [BIN / "kubernetes-validate", "--strict", "--quiet", "-k", version,
             DEPLOY / "kpng-py.yaml"], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def daemonset_containers() -> dict[str, dict]:
    (ds,) = [m for m in manifests() if m["kind"] == "DaemonSet"]
    return {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}


def test_split_layout_shares_the_brain_socket() -> None:
    containers = daemonset_containers()
    brain, backend = containers["brain"], containers["kpng-py"]
    assert "--listen=unix:///k8s/proxy.sock" in brain["args"]
    assert "--api=unix:///k8s/proxy.sock" in backend["args"]
    for container in (brain, backend):
        assert {"name": "api", "mountPath": "/k8s"} in container["volumeMounts"]
    assert backend["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert backend["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert "ALL" in backend["securityContext"]["capabilities"]["drop"]
    assert not backend["securityContext"].get("privileged", False)


def test_the_backend_args_are_accepted_by_this_cli() -> None:
    args = [re.sub(r"\$\(NODE_NAME\)", "node-a", a) for a in daemonset_containers()["kpng-py"]["args"]]
    parsed = build_parser().parse_args(args)
    assert parsed.command == "local" and parsed.backend == "to-ebpf"
    assert parsed.healthz_bind_address.port == 10256


def test_dockerfile_lints_clean() -> None:
    result = subprocess.run([BIN / "hadolint", DEPLOY / "Dockerfile"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_copies_what_exists_and_runs_the_setup() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"COPY source {source} is missing"
    assert "hack/setup.sh runtime" in text
    result = subprocess.run(["bash", "-n", DEPLOY / "entrypoint.sh"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
