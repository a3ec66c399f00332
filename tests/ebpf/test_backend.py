"""The eBPF backend (backends/ebpf/backend.py) before its datapath is set
up: `apply` is a real check (not an assert, which python -O strips) that
names the backend and the fix. With a datapath: tests/kernel/ebpf/."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.ebpf.backend import BackendNotReadyError, EbpfBackend
from backends.ebpf.datapath.loader import DatapathConfig
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.state.skips import Skips


def test_apply_before_setup_names_the_backend_and_the_fix() -> None:
    """A check of its own (an assert would raise AssertionError, or under -O
    an AttributeError half-way through)."""
    metrics = Metrics()
    backend = EbpfBackend(DatapathConfig(Path("/nonexistent/bpffs"), Path("/nonexistent/cgroup")),
                          metrics, Skips(metrics))
    with pytest.raises(BackendNotReadyError, match=r"cgroup /nonexistent/cgroup .*call setup\(\)"):
        backend.apply(ServicePortChanges(full=True))
    backend.close()
    with pytest.raises(BackendNotReadyError):
        backend.apply(ServicePortChanges(full=True))
