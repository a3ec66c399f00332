"""`kpng-py file ...` as users run it, and the brain's stream through `record`
and `replay`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.process import NO_PROBES, Processes
from tests.support.state_files import (
    DNS,
    W1,
    W2,
    Brain,
    StateFile,
    endpoint,
    state,
    wait_until,
    web,
)

WEB = web(W1, W2)


@pytest.fixture
def run(tmp_path: Path):
    """run(*args) starts kpng-py; whatever is still running at the end is killed."""
    with Processes(tmp_path) as processes:
        yield processes.start


def _endpoints(line: str) -> dict[str, list[str]]:
    return {p["name"]: p["endpoints"] for p in json.loads(line)["servicePorts"]}


def test_to_api_serves_clients_and_stops_cleanly_on_sigterm(
        run, state_file: StateFile, socket_dir: Path) -> None:
    state_file.write(state(WEB, DNS))
    sock = socket_dir / "brain.sock"
    brain = run("file", "-i", str(state_file.path), "to-api", "--listen", f"unix://{sock}")
    wait_until(sock.exists, "the brain's socket")
    client = run("local", "--api", f"unix://{sock}", "--node-name", "n2", "--exit-after", "2",
                 *NO_PROBES, "to-print")
    assert _endpoints(client.line()) == {
        "default/dns:dns": ["10.1.2.2:5353"],
        "default/web:http": ["10.1.1.1:8080", "10.1.2.1:8081", "[fd00:1::1]:8080"]}
    state_file.write(state(WEB))
    assert _endpoints(client.line()) == {
        "default/web:http": ["10.1.1.1:8080", "10.1.2.1:8081", "[fd00:1::1]:8080"]}
    assert client.wait() == 0

    assert brain.terminate() == 0
    assert not sock.exists()
    assert "Traceback" not in brain.stderr()


def test_to_local_programs_the_backend_in_process(run, state_file: StateFile) -> None:
    state_file.write(state(WEB, DNS))
    local = run("file", "-i", str(state_file.path), "to-local", "--node-name", "n1", *NO_PROBES,
                "to-print")
    first = local.line()
    assert json.loads(first)["sync"] == 1
    assert _endpoints(first)["default/dns:dns"] == ["10.1.1.2:5353"]
    state_file.write(state(DNS))
    assert _endpoints(local.line()) == {"default/dns:dns": ["10.1.1.2:5353"]}
    assert local.terminate() == 0
    assert "Traceback" not in local.stderr()


@pytest.mark.parametrize("sink", [["to-api", "--listen", "tcp://127.0.0.1:0"],
                                  ["to-local", *NO_PROBES, "to-print"]])
def test_a_bad_state_file_at_start_is_a_clear_error(
        run, state_file: StateFile, sink: list[str]) -> None:
    state_file.write("services:\n- service: {name: web, ports: [{protocol: 1, port: 0}]}\n")
    process = run("file", "-i", str(state_file.path), *sink)
    assert process.wait() == 2
    assert process.stderr().strip().endswith(
        f"kpng-py: error: {state_file.path}:2: services[0].service.ports[0]: "
        "no port; set port to a number in 1..65535")


def test_replaying_a_recording_of_the_brain_prints_what_the_live_stream_did(
        run, start_brain, socket_dir: Path, tmp_path: Path) -> None:
    """`record` and `to-print` watch the brain side by side through live edits;
    `replay` of the recording must then print exactly what `to-print` did."""
    edits = [
        state(WEB, DNS),
        state(WEB),  # a service removed
        state(web(endpoint("10.1.1.1", "fd00:1::1", node="n1", pod="w1", overrides={"http": 9090}),
                  endpoint("10.1.3.1", "fd00:3::1", pod="w3", overrides={"http": 8083}))),
        state(),
    ]
    brain: Brain = start_brain(edits[0])
    api = f"unix://{brain.socket}"
    recording = tmp_path / "brain.jsonl"
    syncs = str(len(edits))
    recorder = run("record", "--api", api, "--node-name", "n1", "--exit-after", syncs,
                   "-o", str(recording))
    live = run("local", "--api", api, "--node-name", "n1", "--exit-after", syncs, *NO_PROBES,
               "to-print")
    printed = []
    for number, edit in enumerate(edits, 1):
        if number > 1:
            brain.state_file.write(edit)
        printed.append(live.line())
        wait_until(lambda: recording.exists()
                  and recording.read_text().count('"Sync"') == number, f"recorded sync {number}")
    assert recorder.wait() == 0 and live.wait() == 0
    assert _endpoints(printed[2]) == {"default/web:http": [
        "10.1.1.1:9090", "10.1.3.1:8083", "[fd00:1::1]:9090", "[fd00:3::1]:8083"]}

    replay_socket = socket_dir / "replay.sock"
    replay = run("replay", "-i", str(recording), "to-api", "--listen", f"unix://{replay_socket}")
    wait_until(replay_socket.exists, "the replay's socket")
    replayed = run("local", "--api", f"unix://{replay_socket}", "--node-name", "n1",
                   "--exit-after", syncs, *NO_PROBES, "to-print")
    assert [replayed.line() for _ in edits] == printed
    assert replayed.wait() == 0
    assert replay.terminate() == 0


@pytest.mark.parametrize("problem", ["too-big", "fifo"])
def test_a_state_file_that_is_not_read_at_start_is_a_clear_error(
        run, state_file: StateFile, problem: str) -> None:
    if problem == "fifo":
        os.mkfifo(state_file.path)
        flags, expected = [], "is a FIFO; the state file must be a regular file"
    else:
        state_file.write(state(WEB, DNS))
        size = state_file.path.stat().st_size
        flags = ["--max-file-size", "1k"]
        expected = f"{size} bytes is more than --max-file-size (1024 bytes); raise --max-file-size"
    process = run("file", "-i", str(state_file.path), *flags, "to-api",
                  "--listen", "tcp://127.0.0.1:0")
    assert process.wait() == 2
    assert process.stderr().strip().endswith(f"kpng-py: error: {state_file.path}: {expected}")


def test_the_readme_example_runs_without_root() -> None:
    """The README's first screen: the example state file through to-print."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "kpng_py.cmd.cli",
         "file", "-i", str(root / "docs/examples/state.yaml"),
         "to-local", "--node-name", "node-a", "--exit-after", "1",
         "--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0",
         "to-print"], capture_output=True, text=True, timeout=60, check=True)
    ports = {p["name"]: p["endpoints"] for p in json.loads(done.stdout)["servicePorts"]}
    assert ports == {"kube-system/dns:dns": ["10.244.0.53:53"],
                     "shop/web:http": ["10.244.0.5:8080", "10.244.1.7:8080",
                                       "[fd00:10:244::5]:8080"]}


def test_state_from_standard_input_is_read_once_and_served(tmp_path: Path) -> None:
    """`file -i -` reads standard input, as `file convert -i -` does (not a
    file named "-")."""
    state = (Path(__file__).resolve().parents[2] / "docs/examples/state.yaml").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "kpng_py.cmd.cli", "file", "-i", "-", "to-local", "--node-name",
         "node-a", "--exit-after", "1", *NO_PROBES, "to-print"],
        input=state, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    assert sorted(_endpoints(done.stdout)) == ["kube-system/dns:dns", "shop/web:http"]
    assert "state file loaded file=- version=1 nodes=1 services=2" in done.stderr


def test_standard_input_bigger_than_the_limit_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kpng_py.cmd.cli", "file", "-i", "-", "--max-file-size", "1k",
         "to-api", "--listen", f"unix://{tmp_path}/brain.sock"],
        input="services: []\n" + "#\n" * 1024, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.endswith("kpng-py: error: -: more than 1024 bytes is more than "
                                "--max-file-size (1024 bytes); raise --max-file-size\n")
