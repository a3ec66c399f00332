"""The lab's real control plane for kernel tests (lab/kube_control_plane.py),
and the pods they make."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from typing import Iterator

import pytest

from lab.kube_control_plane import KubeApi, KubeControlPlane, missing_binaries
from lab.names import RunNames
from tests.support.kernel import require_root_bpf

SERVICE_CIDRS = ("10.96.0.0/16", "fd00:10:96::/112")


def require_components() -> None:
    require_root_bpf()
    missing = missing_binaries()
    if missing:
        pytest.skip(f"{', '.join(missing)} not built: run hack/setup.sh")


@contextmanager
def started_control_plane() -> Iterator[KubeControlPlane]:
    """A control plane of this run, dual-stack, started; removed at the end."""
    require_components()
    names = RunNames.for_this_process()
    workdir = names.make_workdir()
    control = KubeControlPlane(names, workdir, SERVICE_CIDRS)
    try:
        control.start()
        yield control
    finally:
        control.stop()
        shutil.rmtree(workdir)


@contextmanager
def control_plane() -> Iterator[KubeApi]:
    """The API of a control plane of this run (started_control_plane)."""
    with started_control_plane() as control:
        assert control.api is not None
        yield control.api


def web_pod(name: str) -> dict:
    """A pod of app `web` on node-a, its port 8080 named http."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": "node-a", "containers": [{
                "name": "web", "image": "lab.invalid/web:1",
                "ports": [{"name": "http", "containerPort": 8080}]}]}}
