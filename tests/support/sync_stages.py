"""The `sync applied` line's stage timings as their tests read them: the
states applied, the lines logged, their nesting, and a sink to a backend
(tests/bench/test_sync_stages.py and its eBPF half in tests/kernel/bench/)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Iterator

import pytest

from kpng_py.api import localv1 as L
from kpng_py.cmd.runner import ApplierSink
from kpng_py.dataplane.applier import ChangeSetApplier
from kpng_py.dataplane.contract import Backend
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
