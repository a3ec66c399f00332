"""The deploy/ manifests read as the tests see them: their documents, the
DaemonSet's containers, and the flags of the backend and of the uninstall."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def manifests(name: str = "kpng-py.yaml") -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def daemonset_containers(name: str = "kpng-py.yaml") -> dict[str, dict]:
    (ds,) = [m for m in manifests(name) if m["kind"] == "DaemonSet"]
    return {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}


def backend_args(name: str = "kpng-py.yaml") -> list[str]:
    """The kpng-py container's flags after `to-ebpf`."""
    args = daemonset_containers(name)["kpng-py"]["args"]
    return args[args.index("to-ebpf") + 1:]


def cleanup_args() -> list[str]:
    (ds,) = manifests("kpng-py-cleanup.yaml")
    (init,) = ds["spec"]["template"]["spec"]["initContainers"]
    return init["args"]
