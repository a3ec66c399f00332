"""`kpng-py local ... to-userspace` as operators run it, fed by `kpng-py replay`."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kpng_py.api import localv1
from kpng_py.serve.recording import RecordingWriter
from lab.proxy_node import ENDPOINT_PORT, REPO, SERVER_V4

pytestmark = pytest.mark.kernel

VIP = "10.96.0.30"
KPNG_PY = [sys.executable, "-m", "kpng_py.cmd.cli"]


def _set(kind: int, path: str, message) -> localv1.OpItem:
    return localv1.OpItem(Set=localv1.Value(Ref=localv1.Ref(Set=kind, Path=path),
                                            Bytes=message.SerializeToString()))


def _endpoint(ip: str) -> localv1.Endpoint:
    return localv1.Endpoint(IPs=localv1.IPSet(V4=[ip]),
                            Scopes=localv1.EndpointScopes(Internal=True, External=True))


def _write_recording(path: Path) -> None:
    """Two change sets: a service with two endpoints, then one endpoint goes."""
    service = localv1.Service(
        Namespace="default", Name="web", Type="ClusterIP",
        IPs=localv1.ServiceIPs(ClusterIPs=localv1.IPSet(V4=[VIP])),
        Ports=[localv1.PortMapping(Name="http", Protocol=localv1.TCP, Port=80,
                                   TargetPort=ENDPOINT_PORT)])
    with path.open("w") as out:
        writer = RecordingWriter(out)
        for op in (localv1.OpItem(Reset=localv1.EmptyOp()),
                   _set(localv1.ServicesSet, "default/web", service),
                   _set(localv1.EndpointsSet, "default/web/a", _endpoint(SERVER_V4[0])),
                   _set(localv1.EndpointsSet, "default/web/b", _endpoint(SERVER_V4[1])),
                   localv1.OpItem(Sync=localv1.EmptyOp()),
                   localv1.OpItem(Delete=localv1.Ref(Set=localv1.EndpointsSet,
                                                     Path="default/web/a")),
                   localv1.OpItem(Sync=localv1.EmptyOp())):
            writer.op(op)


def _served_only_by(client, endpoint: str, deadline_s: float = 15) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        results = client("tcp_echo", host=VIP, port=80, count=10)
        if isinstance(results, list) and {r["endpoint"] for r in results} == {endpoint}:
            return True
        time.sleep(0.1)
    return False


def test_local_to_userspace_against_replay(tmp_path, netns_cluster, client):
    recording = tmp_path / "web.jsonl"
    _write_recording(recording)
    sock = tmp_path / "brain.sock"
    replay = subprocess.Popen([*KPNG_PY, "replay", "-i", str(recording), "to-api",
                               "--listen", f"unix://{sock}"], cwd=REPO)
    backend = None
    try:
        backend = subprocess.Popen(netns_cluster.node.exec_args(
            *KPNG_PY, "local", "--api", f"unix://{sock}", "--error-delay", "0.1",
            "to-userspace", "--interface", "kpng-cli0"), cwd=REPO, stderr=subprocess.PIPE,
            text=True)
        assert _served_only_by(client, SERVER_V4[1]), "the backend never served the service"
        backend.send_signal(signal.SIGTERM)
        _, log = backend.communicate(timeout=10)
        assert backend.returncode == 0, log
        assert "sync applied" in log
        # Stopped: nothing listens, but the ClusterIP stays so clients are
        # refused by the node until the next run takes over.
        assert client("tcp_echo", host=VIP, port=80, count=1) == {"error": "ECONNREFUSED"}
        assert VIP in netns_cluster.node.ip("-br", "addr", "show", "dev", "kpng-cli0").stdout
    finally:
        for proc in (backend, replay):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
