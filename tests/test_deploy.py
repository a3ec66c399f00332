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


MANIFESTS = ("kpng-py.yaml", "kpng-py-cleanup.yaml")


def manifests(name: str = "kpng-py.yaml") -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def test_manifests_validate_strictly_against_kubernetes_schemas() -> None:
    for version in ("1.28.0", "1.31.0"):
        result = subprocess.run(
            [BIN / "kubernetes-validate", "--strict", "--quiet", "-k", version,
             *(DEPLOY / name for name in MANIFESTS)], capture_output=True, text=True)
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


def pod_spec() -> dict:
    (ds,) = [m for m in manifests() if m["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["spec"]


def test_the_pod_runs_on_linux_nodes_without_cluster_dns() -> None:
    spec = pod_spec()
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["dnsPolicy"] == "Default" and spec["hostNetwork"]


def test_images_are_pinned_and_kpng_py_carries_this_trees_version() -> None:
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(),
                        re.M).group(1)
    images = {c["name"]: c["image"] for c in daemonset_containers().values()}
    assert all(":" in image and not image.endswith(":latest") for image in images.values())
    assert images["kpng-py"] == f"kpng-py:{version}"


def test_the_brain_gets_kpngs_protobuf_setting_and_kpng_py_a_memory_limit() -> None:
    containers = daemonset_containers()
    assert {"name": "GOLANG_PROTOBUF_REGISTRATION_CONFLICT", "value": "warn"} in \
        containers["brain"]["env"]
    resources = containers["kpng-py"]["resources"]
    mib = {"Mi": 1, "Gi": 1024}
    limit = int(resources["limits"]["memory"][:-2]) * mib[resources["limits"]["memory"][-2:]]
    request = int(resources["requests"]["memory"][:-2]) * mib[resources["requests"]["memory"][-2:]]
    assert 161 < request <= limit and limit > 361  # the peak RSS docs/bench.md gives


def flag_values(args: list[str], *flags: str) -> dict[str, str]:
    return {flag: arg.split("=", 1)[1] for arg in args for flag in flags
            if arg.startswith(flag + "=")}


def backend_args() -> list[str]:
    """The kpng-py container's flags after `to-ebpf`."""
    args = daemonset_containers()["kpng-py"]["args"]
    return args[args.index("to-ebpf") + 1:]


def cleanup_args() -> list[str]:
    (ds,) = manifests("kpng-py-cleanup.yaml")
    (init,) = ds["spec"]["template"]["spec"]["initContainers"]
    return init["args"]


def test_the_uninstall_cleans_where_the_install_puts_its_datapath() -> None:
    """Same --cgroup and --bpffs-dir, the same image, and a command this CLI takes."""
    where = ("--cgroup", "--bpffs-dir")
    assert flag_values(cleanup_args(), *where) == flag_values(backend_args(), *where)
    assert len(flag_values(backend_args(), *where)) == 2
    parsed = build_parser().parse_args(cleanup_args())
    assert (parsed.command, parsed.ebpf_action) == ("ebpf", "cleanup")
    (ds,) = manifests("kpng-py-cleanup.yaml")
    spec = ds["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["initContainers"] + spec["containers"]}
    assert images == {daemonset_containers()["kpng-py"]["image"]}
    assert spec["hostNetwork"] and spec["nodeSelector"] == pod_spec()["nodeSelector"]
