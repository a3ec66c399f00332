"""deploy/: the manifests validate against Kubernetes' schemas, the Dockerfile
lints clean, and what they run is what this tree's CLI accepts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kpng_py.cmd.cli import build_parser
from kpng_py.cmd.version import record
from tests.support.deploy import (
    DEPLOY,
    ROOT,
    backend_args,
    cleanup_args,
    daemonset_containers,
    manifests,
)
from tests.support.version import checkout_build

BIN = Path(sys.executable).parent


MANIFESTS = ("kpng-py.yaml", "kpng-py-kube.yaml", "kpng-py-cleanup.yaml")
# Where each manifest takes the image hack/image.sh printed (docs/deploy.md).
IMAGE_PLACEHOLDER = "kpng-py:TAG"


def test_manifests_validate_strictly_against_kubernetes_schemas() -> None:
    for version in ("1.28.0", "1.31.0"):
        result = subprocess.run(
            [BIN / "kubernetes-validate", "--strict", "--quiet", "-k", version,
             *(DEPLOY / name for name in MANIFESTS)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


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


def pod_spec(name: str = "kpng-py.yaml") -> dict:
    (ds,) = [m for m in manifests(name) if m["kind"] == "DaemonSet"]
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
    build = checkout_build(ROOT)
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
    assert done.stdout == f"kpng-py:{checkout_build(ROOT).image_tag}\n"
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


# -- the one-container layout: `kpng-py kube to-local to-ebpf` ----------------------

KUBE = "kpng-py-kube.yaml"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_the_kube_layout_runs_kpng_pys_brain_and_backend_in_one_container() -> None:
    (container,) = daemonset_containers(KUBE).values()
    args = [a.replace("$(NODE_NAME)", "node-a") for a in container["args"]]
    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.sink, parsed.backend) == ("kube", "to-local", "to-ebpf")
    assert parsed.node_name == "node-a"
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in \
        container["env"]
    # The API server's real address, the service account's rotated token and CA.
    assert parsed.server.startswith("https://") and parsed.kubeconfig is None
    assert (str(parsed.token_file), str(parsed.certificate_authority)) == (
        f"{SERVICE_ACCOUNT}/token", f"{SERVICE_ACCOUNT}/ca.crt")
    assert pod_spec(KUBE)["serviceAccountName"] == "kpng-py"


def test_the_kube_layouts_container_is_the_sidecars_ebpf_container() -> None:
    """The same datapath (flags after to-ebpf), ports, probes, privileges and
    mounts as the eBPF container of the sidecar layout (but the brain's
    socket), and the same pod settings."""
    (kube,) = daemonset_containers(KUBE).values()
    sidecar = daemonset_containers()["kpng-py"]
    assert backend_args(KUBE) == backend_args()
    for key in ("image", "ports", "livenessProbe", "readinessProbe", "securityContext"):
        assert kube[key] == sidecar[key], key
    assert kube["volumeMounts"] == [m for m in sidecar["volumeMounts"] if m["name"] != "api"]
    flags = ("--healthz-bind-address", "--metrics-bind-address")
    assert flag_values(kube["args"], *flags) == flag_values(sidecar["args"], *flags)
    kube_pod, sidecar_pod = pod_spec(KUBE), pod_spec()
    for key in ("hostNetwork", "hostPID", "dnsPolicy", "nodeSelector", "tolerations",
                "priorityClassName"):
        assert kube_pod[key] == sidecar_pod[key], key
    assert {v["name"]: v for v in kube_pod["volumes"]} == {
        v["name"]: v for v in sidecar_pod["volumes"] if v["name"] in
        {m["name"] for m in kube["volumeMounts"]}}


def _node_requirements(name: str) -> list[dict]:
    (term,) = pod_spec(name)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return term["matchExpressions"]


def _matches(requirements: list[dict], labels: dict[str, str]) -> bool:
    operators = {"In": lambda key, values: labels.get(key) in values,
                 "NotIn": lambda key, values: labels.get(key) not in values}
    return all(operators[r["operator"]](r["key"], r["values"]) for r in requirements)


def test_each_node_runs_one_layout_chosen_by_its_label() -> None:
    """Exactly one DaemonSet wants any node, whatever its label; both take
    the node's ports (hostNetwork), so the scheduler places a node's new pod
    only once its old one is gone."""
    for labels in ({}, {"kpng-py/brain": "kube"}, {"kpng-py/brain": "kpng"}):
        wanted = [name for name in ("kpng-py.yaml", KUBE)
                  if _matches(_node_requirements(name), labels)]
        assert len(wanted) == 1, (labels, wanted)
    assert _matches(_node_requirements(KUBE), {"kpng-py/brain": "kube"})
    ports = [{p["containerPort"] for p in daemonset_containers(name)["kpng-py"]["ports"]}
             for name in ("kpng-py.yaml", KUBE)]
    assert ports[0] == ports[1] == {10249, 10256}
    assert pod_spec()["hostNetwork"] and pod_spec(KUBE)["hostNetwork"]


def test_the_kube_layouts_account_may_list_and_watch_what_the_brain_follows() -> None:
    objects = {m["kind"]: m for m in manifests(KUBE)}
    granted = {(group, resource, verb) for rule in objects["ClusterRole"]["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert granted == {(group, resource, verb) for group, resource in (
        ("", "services"), ("", "nodes"), ("discovery.k8s.io", "endpointslices"))
        for verb in ("list", "watch")}
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    account = objects["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]
    assert pod_spec(KUBE)["serviceAccountName"] == account["name"]
