"""A brain that stops answering (SIGSTOP: its sockets stay open, nothing
reads them) is noticed through gRPC keepalive, over a unix socket and over
TCP: the stream fails within keepalive time + timeout, the backend retries,
and it is back in sync once the brain runs again. Real processes: the
built-in brain (`kpng-py file ... to-api`) and `kpng-py local ... to-print`."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest

from tests.support.process import LOOPBACK_PROBES, Processes
from tests.support.state_files import StateFile, endpoint, state, web

KEEPALIVE_TIME, KEEPALIVE_TIMEOUT = 1.0, 2.0
# Generous: the machine is two shared cores.
NOTICED_WITHIN = KEEPALIVE_TIME + KEEPALIVE_TIMEOUT + 20


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(params=["unix", "tcp"])
def listen(request, tmp_path: Path) -> tuple[str, str]:
    """The brain's --listen and the backend's --api."""
    if request.param == "unix":
        sock = tmp_path / "brain.sock"
        return f"unix://{sock}", f"unix://{sock}"
    port = free_tcp_port()
    return f"tcp://127.0.0.1:{port}", f"127.0.0.1:{port}"


def test_a_stopped_brain_is_noticed_and_the_backend_resyncs(
        tmp_path: Path, listen: tuple[str, str]) -> None:
    state_file = StateFile(tmp_path / "state.yaml")
    state_file.write(state(web(endpoint("10.1.1.1", pod="w1", overrides={"http": 8080}))))
    state_file.date_back()
    listen_spec, api = listen
    with Processes(tmp_path) as processes:
        brain = processes.start("file", "-i", str(state_file.path), "to-api",
                                "--listen", listen_spec)
        brain.wait_for_log("serving localv1")
        backend = processes.start(
            "local", "--api", api, "--node-name", "n1", "--error-delay", "0.1",
            "--max-error-delay", "0.5", "--keepalive-time", str(KEEPALIVE_TIME),
            "--keepalive-timeout", str(KEEPALIVE_TIMEOUT), *LOOPBACK_PROBES, "to-print")
        backend.line()  # the first sync
        # Idle pings every second are accepted: the stream outlives several.
        time.sleep(3 * KEEPALIVE_TIME)
        assert backend.log_lines("watch stream to the brain failed") == []

        brain.popen.send_signal(signal.SIGSTOP)
        try:
            (failure,) = backend.wait_for_log("watch stream to the brain failed",
                                              seconds=NOTICED_WITHIN)
            backend.wait_for_log("reconnecting to the brain", seconds=NOTICED_WITHIN)
        finally:
            brain.popen.send_signal(signal.SIGCONT)
        assert "UNAVAILABLE" in failure
        backend.wait_for_log("sync applied", count=2, seconds=NOTICED_WITHIN)
        assert brain.terminate() == 0
    assert "Traceback" not in backend.stderr()
