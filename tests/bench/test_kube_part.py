"""The bench's kube part without its control plane: the probe that follows a
brain's Syncs, the choice of the part, and the changes it makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import kube_brain
from bench.env import KPNG_PY, ROOT
from bench.run import _resolve, build_parser

STATE = """\
services:
- service: {name: web, ips: {clusterips: {v4: [10.96.0.1]}}, ports: [{protocol: 1, port: 80}]}
  endpoints:
  - {podname: web-0, endpoint: {ips: {v4: [10.244.0.1]}}}
"""


def test_the_probe_writes_a_line_at_each_sync_and_stops_at_the_last(tmp_path: Path) -> None:
    state, socket = tmp_path / "state.yaml", tmp_path / "brain.sock"
    state.write_text(STATE)
    settled = time.time() - 10  # a file modified just now is waited for
    os.utime(state, (settled, settled))
    probe = subprocess.Popen(
        [sys.executable, "-m", "bench.brain_probe", "--socket", str(socket), "--node-name",
         "node-a", "--syncs", "2", "--timeout", "60"], stdout=subprocess.PIPE, text=True,
        cwd=ROOT)
    brain = subprocess.Popen([KPNG_PY, "file", "-i", str(state), "to-api", "--listen",
                              f"unix://{socket}"], stderr=subprocess.DEVNULL)
    try:
        assert probe.stdout is not None
        first = json.loads(probe.stdout.readline())
        assert first["ops"] == 4 and first["first_message"] <= first["first_sync"]
        edited = tmp_path / "edited.yaml"
        edited.write_text(STATE.replace("10.244.0.1", "10.244.0.2"))
        edited.replace(state)
        assert json.loads(probe.stdout.readline())["sync"] > first["first_sync"]
        assert probe.wait(30) == 0
    finally:
        probe.kill()
        brain.terminate()
        brain.wait(30)


def test_the_kube_part_is_chosen_and_has_its_own_n() -> None:
    args = _resolve(build_parser().parse_args(["--parts", "kube"]))
    assert (args.parts, args.kube_n, args.kube_reps, args.kube_changes) == (
        ("kube",), (10_000,), 2, 20)
    quick = _resolve(build_parser().parse_args(["--quick", "--kube-n", "500"]))
    assert "kube" in quick.parts and quick.kube_n == (500,) and quick.kube_changes == 10


class _Recorder:
    """A Poster that keeps what is sent, and a probe whose Syncs follow at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict]] = []

    def send(self, method: str, path: str, obj: dict, content_type: str) -> None:
        self.sent.append((method, path, obj))

    def wait_for(self, count: int, timeout: float) -> float:
        return time.monotonic()


def test_each_change_moves_an_endpoint_to_an_address_no_change_gave_before() -> None:
    """A patch to what a slice holds already changes nothing (no Sync would
    come): every change of a run, in every rep, is a new address."""
    recorder = _Recorder()
    plan = kube_brain.KubePlan((3,), 2, 2, 4, 1.0)
    for rep in range(plan.reps):
        # The recorder stands in for the Poster and the probe, which _changes
        # takes as classes.
        kube_brain._changes(recorder, recorder, plan, 3, rep * plan.changes)  # type: ignore[arg-type]
    addresses = [obj["endpoints"][0]["addresses"][0] for _, _, obj in recorder.sent]
    assert len(set(addresses)) == len(addresses) == 8
    assert {method for method, _, _ in recorder.sent} == {"PATCH"}
    assert {path.rsplit("/", 1)[1] for _, path, _ in recorder.sent} == {
        f"svc-{index}-abcde" for index in range(3)}
