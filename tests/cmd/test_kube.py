"""`kpng-py kube ...` as users run it, against a fake API server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.fake_apiserver import FakeApiServer
from tests.support.kube_objects import api_node, api_service, api_slice
from tests.support.process import NO_PROBES, Processes, wait_until


@pytest.fixture
def run(tmp_path: Path):
    with Processes(tmp_path) as processes:
        yield processes.start


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("nodes", api_node("node-a"))
    server.put("services", api_service("web", "10.96.0.10"))
    server.put("endpointslices", api_slice("web-abc", "web", ["10.244.0.5"]))
    yield server
    server.stop()


def _endpoints(line: str) -> dict[str, list[str]]:
    return {p["name"]: p["endpoints"] for p in json.loads(line)["servicePorts"]}


def test_to_local_programs_the_backend_and_follows_the_api_server(
        run, fake: FakeApiServer) -> None:
    local = run("kube", "--server", fake.url, "to-local", "--node-name", "node-a", *NO_PROBES,
                "to-print")
    assert _endpoints(local.line()) == {"default/web:http": ["10.244.0.5:8080"]}
    fake.put("endpointslices", api_slice("web-abc", "web", ["10.244.0.5", "10.244.0.6"]))
    assert _endpoints(local.line()) == {"default/web:http": ["10.244.0.5:8080",
                                                             "10.244.0.6:8080"]}
    fake.delete("services", "default", "web")
    assert json.loads(local.line())["servicePorts"] == []
    assert local.terminate() == 0
    assert "Traceback" not in local.stderr()


def test_to_api_serves_clients_and_its_metrics_say_the_api_server_is_followed(
        run, fake: FakeApiServer, tmp_path: Path) -> None:
    sock = tmp_path / "brain.sock"
    brain = run("kube", "--server", fake.url, "to-api", "--listen", f"unix://{sock}",
                "--metrics-bind-address", "127.0.0.1:0")
    wait_until(sock.exists, "the brain's socket")
    client = run("local", "--api", f"unix://{sock}", "--node-name", "node-a", "--exit-after",
                 "1", *NO_PROBES, "to-print")
    assert _endpoints(client.line()) == {"default/web:http": ["10.244.0.5:8080"]}
    assert client.wait() == 0
    assert brain.metric("kpng_py_api_server_connected") == 1
    assert brain.terminate() == 0
    assert not sock.exists()


def test_an_unreachable_api_server_at_start_is_waited_for_and_stops_on_sigterm(run) -> None:
    brain = run("kube", "--server", "http://127.0.0.1:1", "to-api", "--listen",
                "tcp://127.0.0.1:0")
    brain.wait_for_log("the API server cannot be reached")
    assert brain.terminate() == 0
    assert "Traceback" not in brain.stderr()


def test_no_api_server_at_all_is_one_clear_error(run, tmp_path: Path) -> None:
    done = run("kube", "--kubeconfig", str(tmp_path / "missing"), "to-api")
    assert done.wait() == 2
    assert done.stderr().strip() == (f"kpng-py: error: kubeconfig {tmp_path / 'missing'}: "
                                     "No such file or directory")
