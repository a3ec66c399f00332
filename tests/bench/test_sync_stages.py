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
from pathlib import Path

import pytest

from kpng_py.dataplane.print_backend import PrintBackend
from tests.streams.build import reset
from tests.support.sync_stages import check_nesting, full_state, one_endpoint_added, sync_lines


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
