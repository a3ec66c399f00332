"""`kpng-py file ... to-local to-userspace`: the built-in brain and the
userspace backend in one process, inside a network namespace of the test's.

The session API the brain serves is asyncio's, and pyroute2's IPRoute runs an
event loop of its own for every call: an apply that ran on a thread with a
running loop failed every time (and was retried for ever)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.names import unique_name
from lab.netns import netns
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

STATE = """\
nodes:
- name: n
services:
- service:
    namespace: default
    name: web
    ips:
      clusterips: {v4: [10.96.0.10], v6: ["fd00:96::10"]}
    ports:
    - {name: http, protocol: 1, port: 80, targetport: 8080}
  endpoints:
  - podname: web-0
    endpoint:
      ips: {v4: [10.244.0.5], v6: ["fd00:244::5"]}
    topology: {node: n}
"""


def test_the_built_in_brain_programs_the_userspace_backend_in_process(tmp_path: Path) -> None:
    require_root()
    state = tmp_path / "state.yaml"
    state.write_text(STATE)
    interface = unique_name("kpt")
    with netns() as ns:
        done = subprocess.run(ns.exec_args(
            sys.executable, "-m", "kpng_py.cmd.cli", "--log-format", "json",
            "file", "-i", str(state),
            "to-local", "--node-name", "n", "--exit-after", "1", "--healthz-bind-address", "",
            "--metrics-bind-address", "", "to-userspace", "--interface", interface),
            capture_output=True, text=True, timeout=60)
        addresses = json.loads(ns.ip("-j", "addr", "show", interface).stdout)[0]["addr_info"]
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["msg"] for line in lines if line["level"] == "error"] == []
    assert [line["added"] for line in lines if line["msg"] == "sync applied"] == [1]
    held = {(a["local"], a["prefixlen"]) for a in addresses if a["scope"] == "global"}
    assert held == {("10.96.0.10", 32), ("fd00:96::10", 128)}


LOAD_BALANCER = """\
nodes:
- name: n
services:
- service:
    namespace: default
    name: lb
    type: LoadBalancer
    externaltraffictolocal: true
    healthchecknodeport: 30100
    ips:
      clusterips: {v4: [10.96.0.20]}
    ports:
    - {name: http, protocol: 1, port: 80, targetport: 8080, nodeport: 30080}
  endpoints:
  - podname: lb-0
    endpoint:
      ips: {v4: [10.244.0.5]}
    topology: {node: n}
"""


def _health_check(ns) -> dict | None:
    done = subprocess.run(ns.exec_args("curl", "-sS", "-m", "2", "http://127.0.0.1:30100/"),
                          capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else None


def test_the_runner_tells_the_health_check_node_port_what_healthz_says(tmp_path: Path) -> None:
    """Through the real runner: once the first change set is applied, the
    healthCheckNodePort answers with serviceProxyHealthy true (N11). (Between
    the backend's apply and the applier's report it may answer 503 once.)"""
    require_root()
    state = tmp_path / "state.yaml"
    state.write_text(LOAD_BALANCER)
    with netns() as ns:
        proc = subprocess.Popen(ns.exec_args(
            sys.executable, "-m", "kpng_py.cmd.cli", "--log-format", "json",
            "file", "-i", str(state),
            "to-local", "--node-name", "n", "--healthz-bind-address", "",
            "--metrics-bind-address", "", "to-userspace", "--interface", unique_name("kpt")),
            stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        try:
            deadline = time.monotonic() + 30
            while (answer := _health_check(ns)) is None or not answer["serviceProxyHealthy"]:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "the health-check node port never answered"
                time.sleep(0.1)
            node_port = ns.run("ss", "-Hltn", "sport = :30080").stdout
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert answer == {"service": {"namespace": "default", "name": "lb"}, "localEndpoints": 1,
                      "serviceProxyHealthy": True}, proc.stderr.read()
    assert "127.0.0.1:30080" in node_port
