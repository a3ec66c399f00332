"""The lab's real Kubernetes control plane (lab/kube_control_plane.py):
etcd, kube-apiserver and kube-controller-manager as hack/setup.sh builds
them, on loopback. Pods registered as a kubelet would get EndpointSlices
from the real controller; a run killed outright leaves nothing the sweep
does not remove."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest

from lab import teardown
from lab.kube_control_plane import (
    BINARIES,
    ControlPlaneError,
    KubeApi,
    KubeControlPlane,
    slice_endpoints,
    version_of,
)
from lab.names import RunNames, process_exists
from lab.netns import netns
from lab.procs import spawn, wait_until
from tests.support.kube import SERVICE_CIDRS, require_components, started_control_plane, web_pod

pytestmark = pytest.mark.kernel

POD_IPS = {"web-0": ("10.244.0.5", "fd00:10:244::5"), "web-1": ("10.244.0.6", "fd00:10:244::6")}


@pytest.fixture(scope="module")
def control() -> Iterator[KubeControlPlane]:
    with started_control_plane() as started:
        yield started


@pytest.fixture(scope="module")
def api(control: KubeControlPlane) -> KubeApi:
    assert control.api is not None
    return control.api


def _ready(api: KubeApi) -> dict[str, bool]:
    return {address: bool(conditions.get("ready"))
            for address, conditions in slice_endpoints(api.endpoint_slices("default", "web"))}


def _until(api: KubeApi, wanted: dict[str, bool], what: str) -> None:
    wait_until(what, lambda: _ready(api) == wanted, 30.0)


def test_the_versions_are_the_pinned_ones() -> None:
    require_components()
    assert version_of("kube-apiserver") == "Kubernetes v1.37.2"
    assert version_of("kube-controller-manager") == "Kubernetes v1.37.2"
    assert version_of("etcd").startswith("etcd Version: 3.6.")


def test_the_api_servers_own_service_has_no_endpoint(api: KubeApi) -> None:
    """The API server would publish the machine's address as the endpoint of
    default/kubernetes: a brain would program traffic out of the lab."""
    deadline = time.monotonic() + 2.0  # with one, it is there within half a second
    while time.monotonic() < deadline:
        assert list(slice_endpoints(api.endpoint_slices("default", "kubernetes"))) == []
        time.sleep(0.2)


def test_pods_written_as_a_kubelet_would_get_endpoint_slices(api: KubeApi) -> None:
    api.register_node("node-a", ["10.0.0.1", "fd00::1"], zone="zone-a")
    api.create("/api/v1/namespaces/default/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ipFamilyPolicy": "RequireDualStack",
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    for name, ips in POD_IPS.items():
        api.create("/api/v1/namespaces/default/pods", web_pod(name))
        api.pod_status("default", name, ips, ready=True)
    every = {ip: True for ips in POD_IPS.values() for ip in ips}
    _until(api, every, "both pods ready in both families")
    (v4,) = [s for s in api.endpoint_slices("default", "web") if s["addressType"] == "IPv4"]
    assert v4["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert {e["zone"] for e in v4["endpoints"]} == {"zone-a"}

    api.pod_status("default", "web-1", POD_IPS["web-1"], ready=False)
    _until(api, {**every, **{ip: False for ip in POD_IPS["web-1"]}}, "web-1 not ready")
    # A graceful delete marks web-0 terminating (no kubelet ends it here)...
    api.delete("/api/v1/namespaces/default/pods/web-0")
    wait_until("web-0 terminating", lambda: {
        address: bool(conditions.get("terminating"))
        for address, conditions in slice_endpoints(api.endpoint_slices("default", "web"))
    } == {**{ip: True for ip in POD_IPS["web-0"]}, **{ip: False for ip in POD_IPS["web-1"]}},
        30.0)
    # ... and the lab ends it as a kubelet would: then it is gone.
    api.delete("/api/v1/namespaces/default/pods/web-0", grace_seconds=0)
    _until(api, {ip: False for ip in POD_IPS["web-1"]}, "web-0 gone")


def test_the_relay_brings_the_api_server_into_a_namespace_without_a_route_to_it(
        control: KubeControlPlane, api: KubeApi, tmp_path) -> None:
    """A lab node's namespace reaches the API server with the same
    kubeconfig (its URL, CA and token) through the relay."""
    command = control.relay_command()
    readyz = ["curl", "--silent", "--max-time", "5", "--cacert", str(api.access.ca),
              "--header", f"Authorization: Bearer {api.access.token}",
              f"{api.access.url}/readyz"]
    with netns("kpr") as ns:
        def ask() -> subprocess.CompletedProcess[str]:
            return subprocess.run(ns.exec_args(*readyz), capture_output=True, text=True)

        assert ask().returncode != 0  # no route: not without the relay
        relay = spawn("relay", ns.exec_args(*command), tmp_path / "relay.log")
        try:
            wait_until("the API server through the relay", lambda: ask().stdout == "ok", 10.0)
            assert control.relay_command() == command  # one far end for every namespace
        finally:
            relay.stop()


def test_a_missing_component_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path) -> None:
    monkeypatch.setattr("lab.kube_control_plane.COMPONENTS", tmp_path)
    with pytest.raises(ControlPlaneError, match=rf"{', '.join(BINARIES)} not built under "
                                                rf"{tmp_path}: run hack/setup.sh"):
        KubeControlPlane(RunNames(1), tmp_path, SERVICE_CIDRS).start()


_KILLED_RUN = """
import sys, time
from lab.kube_control_plane import KubeControlPlane
from lab.names import RunNames
names = RunNames.for_this_process()
control = KubeControlPlane(names, names.make_workdir(), ["10.96.0.0/16"])
control.start()
print(" ".join(map(str, control.pids())), flush=True)
time.sleep(600)
"""


def test_the_sweep_removes_a_control_plane_whose_run_was_killed() -> None:
    require_components()
    run = subprocess.Popen([sys.executable, "-c", _KILLED_RUN], stdout=subprocess.PIPE,
                           text=True, cwd=os.getcwd())
    assert run.stdout is not None
    pids = [int(pid) for pid in run.stdout.readline().split()]
    assert len(pids) == 3 and all(process_exists(pid) for pid in pids)
    names = RunNames(run.pid)
    run.send_signal(signal.SIGKILL)  # no clean-up of any kind runs
    run.wait()
    assert any(path for path in teardown.leftovers(names))
    report = teardown.remove_stale_runs()
    assert any(names.tag in line for line in report), report
    deadline = time.monotonic() + 10
    while any(process_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(process_exists(pid) for pid in pids)
    assert teardown.leftovers(names) == []
