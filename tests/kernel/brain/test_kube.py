"""`kpng-py kube ... to-api` on the lab's real control plane: a Service and
its pods, made ready as a kubelet would, reach a backend (`kpng-py local
... to-print`) with their endpoints, and leave it when deleted."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from lab.kube_control_plane import KubeApi
from tests.support.kube import control_plane, web_pod
from tests.support.process import WAIT_SECONDS, Process, Processes

pytestmark = pytest.mark.kernel

NO_PROBES = ("--healthz-bind-address", "", "--metrics-bind-address", "")
PODS = {"web-0": "10.244.0.5", "web-1": "10.244.0.6"}


@pytest.fixture
def api() -> Iterator[KubeApi]:
    with control_plane() as started:
        yield started


def _printed_until(local: Process, wanted: Callable[[dict[str, list[str]]], bool],
                   what: str) -> dict[str, list[str]]:
    """The service ports of the first printed state that is `wanted`."""
    deadline = time.monotonic() + 3 * WAIT_SECONDS  # the controller takes its time too
    while time.monotonic() < deadline:
        try:
            line = local.line()
        except queue.Empty:
            continue
        ports = {p["name"]: p["endpoints"] for p in json.loads(line)["servicePorts"]}
        if wanted(ports):
            return ports
    raise AssertionError(f"no printed state with {what}; stderr:\n{local.stderr()}")


def test_a_service_and_its_ready_pods_reach_a_backend_and_leave_it(
        api: KubeApi, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.access.kubeconfig())
    api.register_node("node-a", ["10.0.0.1"], zone="zone-a")
    sock = tmp_path / "brain.sock"
    with Processes(tmp_path) as processes:
        brain = processes.start("kube", "--kubeconfig", str(kubeconfig), "to-api", "--listen",
                                f"unix://{sock}")
        brain.wait_for_log("state from the API server published")
        local = processes.start("local", "--api", f"unix://{sock}", "--node-name", "node-a",
                                *NO_PROBES, "to-print")
        api.create("/api/v1/namespaces/default/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
        for name, ip in PODS.items():
            api.create("/api/v1/namespaces/default/pods", web_pod(name))
            api.pod_status("default", name, [ip], ready=True)
        both = sorted(f"{ip}:8080" for ip in PODS.values())
        _printed_until(local, lambda ports: ports.get("default/web:http") == both,
                       "web's two endpoints")

        for name in PODS:
            api.delete(f"/api/v1/namespaces/default/pods/{name}", grace_seconds=0)
        api.delete("/api/v1/namespaces/default/services/web")
        _printed_until(local, lambda ports: "default/web:http" not in ports, "web gone")
        assert local.terminate() == 0
        assert brain.terminate() == 0
        assert "Traceback" not in brain.stderr()
