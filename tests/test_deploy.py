"""deploy/: the manifests validate against Kubernetes' schemas, the Dockerfile
lints clean, and what they run is what this tree's CLI accepts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from kpng_py.cmd.cli import build_parser
from kpng_py.cmd.version import record, tree_build

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


MANIFESTS = ("kpng-py.yaml", "kpng-py-cleanup.yaml")
# Where each manifest takes the image hack/image.sh printed (docs/deploy.md).
IMAGE_PLACEHOLDER = "kpng-py:TAG"


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
    args = [re.sub(r"\$\(NODE_NAME\)", "node-a", a)
            for a in daemonset_containers()["kpng-py"]["args"]]
    parsed = build_parser().parse_args(args)
    assert parsed.command == "local" and parsed.backend == "to-ebpf"
    assert parsed.healthz_bind_address.port == 10256


def test_dockerfile_lints_clean() -> None:
    result = subprocess.run([BIN / "hadolint", DEPLOY / "Dockerfile"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_copies_what_exists_and_runs_the_setup() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"COPY source {source} is missing"
    assert "hack/setup.sh runtime" in text
    result = subprocess.run(["bash", "-n", DEPLOY / "entrypoint.sh"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def pod_spec() -> dict:
    (ds,) = [m for m in manifests() if m["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["spec"]


def test_the_pod_runs_on_linux_nodes_without_cluster_dns() -> None:
    spec = pod_spec()
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["dnsPolicy"] == "Default" and spec["hostNetwork"]


def test_images_are_pinned_and_kpng_py_is_the_one_hack_image_sh_prints() -> None:
    """No tag in a manifest can name the build it is committed in: each says
    where the image hack/image.sh printed goes, and docs/deploy.md's commands
    put it there."""
    images = {c["name"]: c["image"] for c in daemonset_containers().values()}
    assert all(":" in image and not image.endswith(":latest") for image in images.values())
    assert images["kpng-py"] == IMAGE_PLACEHOLDER
    replace = f's|{IMAGE_PLACEHOLDER}|$IMAGE|'
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for name in MANIFESTS:
        assert f'sed "{replace}" deploy/{name} | kubectl apply -f -' in docs
        assert replace in (DEPLOY / name).read_text()
    for command in ("hack/image.sh", 'kubectl -n kube-system set image ds/kpng-py kpng-py="$IMAGE"',
                    "kubectl -n kube-system rollout undo ds/kpng-py"):
        assert command in docs


def dockerfile_instructions() -> list[str]:
    """deploy/Dockerfile's instructions, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_the_image_records_the_version_it_is_built_with_and_needs_one(tmp_path: Path) -> None:
    """The build context has no .git: the Dockerfile's RUN records
    KPNG_PY_VERSION, and stops a build that was given none."""
    instructions = dockerfile_instructions()
    (run,) = [i for i in instructions if i.startswith("RUN ") and "kpng_py.cmd.version" in i]
    assert instructions.index("ARG KPNG_PY_VERSION") < instructions.index(run)
    python = tmp_path / ".venv" / "bin" / "python"  # a stand-in that says how it was called
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$@" > called\n')
    python.chmod(0o755)
    script = ["bash", "-o", "pipefail", "-c", run.removeprefix("RUN ")]  # its SHELL
    env = {"PATH": os.environ["PATH"]}
    refused = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "build with hack/image.sh" in refused.stderr
    assert not (tmp_path / "called").exists()
    version = "0.1.0+332.g87621f711c83"
    subprocess.run(script, cwd=tmp_path, env={**env, "KPNG_PY_VERSION": version}, check=True)
    assert (tmp_path / "called").read_text().split() == [
        "-m", "kpng_py.cmd.version", "--record", version]


def fake_docker(tmp_path: Path) -> dict[str, str]:
    """An environment whose `docker` writes its arguments, one a line, to docker-args."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "docker-args"}\n')
    docker.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_hack_image_sh_builds_with_the_trees_version_and_prints_the_image(
        tmp_path: Path) -> None:
    build = tree_build(ROOT)
    image = f"registry.example/kpng-py:{build.image_tag}"
    done = subprocess.run([ROOT / "hack" / "image.sh", "registry.example/kpng-py"],
                          env=fake_docker(tmp_path), capture_output=True, text=True, check=True)
    assert done.stdout == image + "\n"
    assert (tmp_path / "docker-args").read_text().splitlines() == [
        "build", "-f", str(DEPLOY / "Dockerfile"),
        "--build-arg", f"KPNG_PY_VERSION={build.version}", "-t", image, str(ROOT)]
    # What the image's build records reads back as this checkout's build.
    assert record(build.version, tmp_path / "BUILD_VERSION") == build


def test_hack_image_sh_tag_only_builds_nothing(tmp_path: Path) -> None:
    done = subprocess.run([ROOT / "hack" / "image.sh", "--tag-only"], env=fake_docker(tmp_path),
                          capture_output=True, text=True, check=True)
    assert done.stdout == f"kpng-py:{tree_build(ROOT).image_tag}\n"
    assert not (tmp_path / "docker-args").exists()


def test_the_brain_gets_kpngs_protobuf_setting_and_kpng_py_a_memory_limit() -> None:
    containers = daemonset_containers()
    assert {"name": "GOLANG_PROTOBUF_REGISTRATION_CONFLICT", "value": "warn"} in \
        containers["brain"]["env"]
    # Its size: tests/test_doc_figures.py, from the peak docs/bench.md gives.
    assert containers["kpng-py"]["resources"]["limits"]["memory"]


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
    # It may be applied before the kpng-py pods are gone: it waits for them.
    assert parsed.wait >= 60 and not parsed.force
    (ds,) = manifests("kpng-py-cleanup.yaml")
    spec = ds["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["initContainers"] + spec["containers"]}
    assert images == {daemonset_containers()["kpng-py"]["image"]}
    assert spec["hostNetwork"] and spec["nodeSelector"] == pod_spec()["nodeSelector"]
