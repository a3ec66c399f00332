"""Logs: text or JSON lines with structured fields, one line per applied sync."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


KPNG_PY = Path(sys.executable).parent / "kpng-py"


def to_local(tmp_path: Path, *flags: str) -> list[str]:
    """`kpng-py file ... to-local to-print` on the dual-stack example: stderr lines."""
    state = tmp_path / "state.yaml"
    state.write_text("""
services:
- service:
    name: web
    type: ClusterIP
    ips: {clusterips: {v4: [10.96.0.10]}}
    ports: [{name: http, protocol: 1, port: 80, targetport: 8080}]
  endpoints:
  - endpoint: {ips: {v4: [10.244.0.5]}}
- service:
    name: none
    type: ClusterIP
    ips: {headless: true}
    ports: [{name: http, protocol: 1, port: 80}]
""")
    done = subprocess.run(
        [KPNG_PY, *flags, "file", "-i", state, "to-local", "--node-name", "n", "--exit-after",
         "1", "--healthz-bind-address", "", "--metrics-bind-address", "", "to-print"],
        capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout)["servicePorts"][0]["endpoints"] == ["10.244.0.5:8080"]
    return done.stderr.splitlines()


def test_json_logs_with_fields(tmp_path: Path) -> None:
    lines = [json.loads(line) for line in to_local(tmp_path, "--log-format", "json")]
    syncs = [line for line in lines if line["msg"] == "sync applied"]
    assert len(syncs) == 1
    sync = syncs[0]
    assert {"ts", "level", "logger"} <= set(sync) and sync["level"] == "info"
    assert (sync["sync"], sync["full"], sync["added"], sync["removed"]) == (1, True, 1, 0)
    assert isinstance(sync["duration_ms"], float)
    (skip,) = [line for line in lines if line["msg"].startswith("skipped")]
    assert skip["reason"] == "headless" and skip["object"] == "service default/none"


def test_text_logs_and_verbosity(tmp_path: Path) -> None:
    quiet = to_local(tmp_path)
    assert sum("sync applied sync=1 full=True added=1" in line for line in quiet) == 1
    assert not any(" DEBUG " in line for line in quiet)
    verbose = to_local(tmp_path, "-v")
    assert any(" DEBUG kpng_py.backend: service port added service_port=default/web:http "
               "protocol=TCP endpoints=1" in line for line in verbose), verbose
