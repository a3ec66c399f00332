"""`to-print` against `replay` of every recorded scenario in tests/streams/:
each recording is what its builder makes, and what `to-print` prints for it,
through the real watch client and `replay` server, is its reviewed
`.expected.jsonl`, line by line, one line per Sync."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kpng_py.metrics.metrics import Metrics
from tests.streams.build import SCENARIOS, render
from tests.support.replay import replay_to_print

STREAMS = Path(__file__).parent / "streams"
KPNG_PY = Path(sys.executable).parent / "kpng-py"


def expected_lines(name: str) -> list[str]:
    return (STREAMS / f"{name}.expected.jsonl").read_text().splitlines()


def test_every_recording_is_a_scenario_with_its_expected_output() -> None:
    """No recording or expected output is left out of the tests below."""
    recordings = {p.name.removesuffix(".jsonl") for p in STREAMS.glob("*.jsonl")
                  if not p.name.endswith(".expected.jsonl")}
    expected = {p.name.removesuffix(".expected.jsonl")
                for p in STREAMS.glob("*.expected.jsonl")}
    assert recordings == expected == SCENARIOS.keys()
    assert len(SCENARIOS) >= 10


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_expected_output_has_one_line_per_sync(name: str) -> None:
    syncs = sum(1 for item in SCENARIOS[name]()
                if not isinstance(item, str) and item.WhichOneof("Op") == "Sync")
    lines = [json.loads(line) for line in expected_lines(name)]
    assert [line["sync"] for line in lines] == list(range(1, syncs + 1))


def test_large_state_is_what_its_builder_says() -> None:
    """1000 services x 2 endpoints, then a one-endpoint change."""
    first, second = (json.loads(line)["servicePorts"] for line in expected_lines("large-state"))
    assert len(first) == 1000 and all(len(p["endpoints"]) == 2 for p in first)
    changed = [(a, b) for a, b in zip(first, second) if a != b]
    assert [a["name"] for a, _ in changed] == ["default/svc-0500:http"]
    assert set(changed[0][1]["endpoints"]) < set(changed[0][0]["endpoints"])
    assert len(changed[0][1]["endpoints"]) == 1


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_recording_matches_its_builder(name: str) -> None:
    """The committed recording is exactly what tests/streams/build.py makes."""
    assert (STREAMS / f"{name}.jsonl").read_text() == render(SCENARIOS[name])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_replay_to_print(name: str, tmp_path: Path) -> None:
    assert replay_to_print(STREAMS / f"{name}.jsonl", tmp_path) == expected_lines(name)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ops_staged_one_at_a_time_print_the_same(name: str, tmp_path: Path) -> None:
    """Every op taken into the state as it arrives, cut-short change sets
    included: the dataplane sees the same change sets."""
    assert replay_to_print(STREAMS / f"{name}.jsonl", tmp_path,
                           staged_batch=1) == expected_lines(name)


def test_bad_inputs_are_counted_by_reason(tmp_path: Path) -> None:
    metrics = Metrics()
    replay_to_print(STREAMS / "bad-inputs.jsonl", tmp_path, metrics)

    def skipped(reason: str) -> float:
        return metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": reason}) or 0

    assert skipped("bad-bytes") == 3  # new service, endpoint, replacement of a good service
    assert skipped("bad-ip") == 3  # the ClusterIP, the wrong-family and the non-IP endpoint IPs
    assert skipped("no-cluster-ip") == 0  # the bad ClusterIP's own line says it all
    assert skipped("bad-port") == 2
    assert skipped("unsupported-protocol") == 2  # SCTP and protocol 7
    assert skipped("headless") == 1
    assert skipped("external-name") == 1
    assert skipped("unknown-set") == 2
    assert skipped("bad-path") == 2
    assert skipped("unknown-delete") == 2
    assert skipped("unknown-service") == 1  # the endpoint of a service never sent
    assert skipped("duplicate-endpoint") == 1


def test_reconnect_is_counted(tmp_path: Path) -> None:
    metrics = Metrics()
    replay_to_print(STREAMS / "reconnect.jsonl", tmp_path, metrics)
    assert metrics.registry.get_sample_value("kpng_py_brain_reconnects_total") == 1


# `python -O` strips asserts: the commands must not depend on them.
KPNG_PY_OPTIMIZED = [sys.executable, "-O", "-m", "kpng_py.cmd.cli"]


def test_cli_replay_to_print(tmp_path: Path) -> None:
    """The same through the real commands, as separate processes, run with
    `python -O`."""
    sock = tmp_path / "brain.sock"
    server = subprocess.Popen(
        [*KPNG_PY_OPTIMIZED, "replay", "-i", STREAMS / "endpoints-churn.jsonl", "to-api",
         "--listen", f"unix://{sock}"], stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert server.poll() is None, server.stderr.read()
            assert time.monotonic() < deadline, "replay did not start listening"
            time.sleep(0.05)
        assert sock.stat().st_mode & 0o777 == 0o600
        printed = subprocess.run(
            [*KPNG_PY_OPTIMIZED, "local", "--api", f"unix://{sock}", "--exit-after", "4",
             "--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0",
             "to-print"],
            capture_output=True, text=True, timeout=60, check=True)
        assert printed.stdout.splitlines() == expected_lines("endpoints-churn")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
    assert server.returncode == 0
    assert not sock.exists(), "the server removes its socket on SIGTERM"


def test_record_of_a_replay_replays_the_same(tmp_path: Path) -> None:
    """`record` keeps everything, the broken stream included: replaying what it
    wrote prints the same as replaying the original."""
    from kpng_py.serve.recording import read_segments

    original = STREAMS / "reconnect.jsonl"
    sock = tmp_path / "brain.sock"
    server = subprocess.Popen([KPNG_PY, "replay", "-i", original, "to-api",
                               "--listen", f"unix://{sock}"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline, "replay did not start listening"
            time.sleep(0.05)
        recording = tmp_path / "recorded.jsonl"
        subprocess.run([KPNG_PY, "record", "--api", f"unix://{sock}", "--error-delay", "0.05",
                        "--exit-after", "2", "-o", recording],
                       check=True, timeout=60, capture_output=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
    recorded, source = read_segments(recording), read_segments(original)
    assert [s.ops for s in recorded] == [s.ops for s in source]
    assert [s.disconnect is None for s in recorded] == [s.disconnect is None for s in source]
    assert replay_to_print(recording, tmp_path) == expected_lines("reconnect")
