"""The eBPF backend's stage timings in the `sync applied` line: its planning
and map writes nested within its apply (the rest of the line:
tests/bench/test_sync_stages.py)."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import DatapathConfig, cleanup
from kpng_py.metrics.metrics import Metrics
from kpng_py.state.skips import Skips
from lab.cgroups import cgroup
from lab.socket_lab import unique_bpffs_dir
from tests.support.kernel import require_root_bpf
from tests.support.sync_stages import (
    ROUNDING_MS,
    check_nesting,
    full_state,
    one_endpoint_added,
    sync_lines,
)

pytestmark = pytest.mark.kernel

SMALL_MAPS = {"services": 1024, "backends": 1024, "reverse_nat": 1024, "affinity": 256}


@pytest.fixture
def ebpf_backend() -> Iterator[EbpfBackend]:
    require_root_bpf()
    with cgroup() as group:
        bpffs_dir = unique_bpffs_dir()
        try:
            backend = EbpfBackend(DatapathConfig(bpffs_dir, group.path, SMALL_MAPS), Metrics(),
                                  Skips(Metrics()))
            backend.setup()
            try:
                yield backend
            finally:
                backend.close()
        finally:
            cleanup(bpffs_dir, group.path)


def test_the_ebpf_backend_adds_its_planning_and_map_writes_within_its_apply(
        new_sink, ebpf_backend: EbpfBackend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kpng_py.dataplane.applier")
    assert not any(ebpf_backend.apply_stages().values())  # nothing applied yet
    sink = new_sink(ebpf_backend)
    sink.on_changeset_started()
    sink.on_changeset(full_state())
    sink.on_changeset_started()
    sink.on_changeset(one_endpoint_added())

    lines = sync_lines(caplog)
    assert [line["full"] for line in lines] == [True, False]
    for line in lines:
        check_nesting(line)
        assert line["plan_ms"] >= 0 and line["write_ms"] >= 0, line
        assert line["plan_ms"] + line["write_ms"] <= line["backend_ms"] + ROUNDING_MS, line
    assert set(ebpf_backend.apply_stages()) == {"plan_ms", "write_ms"}
