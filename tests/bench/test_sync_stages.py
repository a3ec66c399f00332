"""The stage timings of the `sync applied` line (the bench's stage breakdown):
present, non-negative, and nested as measured (the state model and the backend
within the whole apply; the eBPF backend's planning and map writes within its
apply). Durations are never compared with a threshold: only with each other,
and with a sleep that happened in between (a lower bound). The eBPF
backend's, which needs BPF: tests/kernel/bench/test_sync_stages.py."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Iterator

import pytest

from kpng_py.api import localv1 as L
from kpng_py.cmd.runner import ApplierSink
from kpng_py.dataplane.applier import ChangeSetApplier
from kpng_py.dataplane.contract import Backend
from kpng_py.dataplane.print_backend import PrintBackend
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.logs import record_fields
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from tests.streams.build import endpoint, port, reset, service, set_endpoint, set_service, sync

# Rounding: each field is rounded to 0.01 ms on its own.
ROUNDING_MS = 0.02
STAGES = ("duration_ms", "receive_ms", "state_ms", "backend_ms")


def full_state(services: int = 20) -> list[L.OpItem]:
    ops = [reset()]
    for i in range(services):
        ops.append(set_service(service(f"web-{i}", v4=[f"10.96.1.{i + 1}"],
                                       ports=[port("http", 80, target=8080)])))
        ops.append(set_endpoint("default", f"web-{i}", "a", endpoint([f"10.244.1.{i + 1}"])))
    return ops + [sync()]


def one_endpoint_added() -> list[L.OpItem]:
    return [set_endpoint("default", "web-3", "b", endpoint(["10.244.2.1"])), sync()]


def sync_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [record_fields(r) for r in caplog.records if r.getMessage() == "sync applied"]


def check_nesting(line: dict) -> None:
    for stage in STAGES:
        assert line[stage] >= 0, line
    assert line["state_ms"] + line["backend_ms"] <= line["duration_ms"] + ROUNDING_MS, line


@pytest.fixture
def new_sink() -> Iterator:
    with ExitStack() as stack:
        def make(backend: Backend) -> ApplierSink:
            metrics = Metrics()
            applier = ChangeSetApplier(backend, NodeState(Skips(metrics)), metrics)
            stack.callback(applier.close)
            return ApplierSink(applier)
        yield make


def test_the_sync_line_times_receiving_the_state_model_and_the_backend(
        new_sink, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kpng_py.dataplane.applier")
    sink = new_sink(PrintBackend(io.StringIO()))
    sink.on_changeset_started()
    pause = 0.05
    time.sleep(pause)
    sink.on_changeset_started()  # a message that added no op: still the same change set
    sink.on_changeset(full_state())
    sink.on_changeset(one_endpoint_added())  # told no start: nothing was received

    first, second = sync_lines(caplog)
    for line in (first, second):
        check_nesting(line)
        assert "plan_ms" not in line and "write_ms" not in line  # the print backend has none
    assert first["receive_ms"] >= pause * 1000, first
    assert second["receive_ms"] == 0, second


def _resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_the_sync_line_carries_the_processs_own_peak_memory(
        new_sink, caplog: pytest.LogCaptureFixture) -> None:
    """Its own: a child that was bigger (as the eBPF backend's BCC build
    is) and has been waited for does not count."""
    caplog.set_level(logging.INFO, logger="kpng_py.dataplane.applier")
    subprocess.run([sys.executable, "-c", "bytearray(400 * 1024 * 1024)"], check=True)
    sink = new_sink(PrintBackend(io.StringIO()))
    resident = _resident_mib()
    sink.on_changeset(full_state())
    sink.on_changeset(one_endpoint_added())
    first, second = sync_lines(caplog)
    # The kernel's counts of resident pages lag by a few pages per thread.
    assert resident - 1 <= first["peak_rss_mib"] <= second["peak_rss_mib"] < 400


def test_a_stream_error_ends_the_change_set_being_received(
        new_sink, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kpng_py.dataplane.applier")
    sink = new_sink(PrintBackend(io.StringIO()))
    sink.on_changeset_started()
    sink.on_stream_error("cut", [reset()])
    sink.on_changeset(full_state())  # a replayed stream told no start
    assert sync_lines(caplog)[0]["receive_ms"] == 0
