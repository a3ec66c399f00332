"""The commands' wiring (kpng_py/cmd/runner.py): `to-local`, brain and
backend in one process without gRPC, and a client stopped after a number of
change sets."""

from __future__ import annotations

import json
import queue
import threading
from typing import cast

import pytest

from kpng_py.api import localv1
from kpng_py.brain.source import BrainSource
from kpng_py.brain.watcher import StateFileWatcher
from kpng_py.cmd.runner import StopAfter, run_in_process
from kpng_py.dataplane.print_backend import PrintBackend
from kpng_py.healthcheck.proxier_health import Observability
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.aio import ThreadsafeEvent
from kpng_py.watch.client import WatchClient
from tests.support.state_files import WAIT_SECONDS, StateFile, endpoint, port, service, state

NO_PROBES = Observability(healthz=None, metrics=None)  # no /healthz or /metrics server


class _Lines:
    """A text stream whose complete lines a test can wait for."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self._partial = ""

    def write(self, text: str) -> int:
        *complete, self._partial = (self._partial + text).split("\n")
        for line in complete:
            self.lines.put(line)
        return len(text)

    def flush(self) -> None:
        pass

    def next(self) -> dict:
        return json.loads(self.lines.get(timeout=WAIT_SECONDS))


def _endpoints(printed: dict) -> dict[str, list[str]]:
    return {p["name"]: p["endpoints"] for p in printed["servicePorts"]}


def test_the_backend_gets_the_nodes_view_and_each_edit(state_file: StateFile) -> None:
    web = service("web", ("10.96.0.10",), [port("http", targetport=8080)], [
        endpoint("10.1.1.1", node="n1", pod="w1"), endpoint("10.1.2.1", node="n2", pod="w2")],
        internaltraffictolocal=True)
    state_file.write(state(web))
    out = _Lines()
    stop = ThreadsafeEvent()
    with StateFileWatcher(state_file.path, poll_seconds=0.05) as watcher:
        runner = threading.Thread(target=run_in_process, args=(
            BrainSource(watcher.snapshots), "n1", PrintBackend(out), Metrics(), NO_PROBES,
            stop))
        runner.start()
        try:
            first = out.next()
            assert first["sync"] == 1
            assert _endpoints(first) == {"default/web:http": ["10.1.1.1:8080"]}

            web["endpoints"].append(endpoint("10.1.1.3", node="n1", pod="w3"))
            state_file.write(state(web))
            assert _endpoints(out.next()) == {"default/web:http": ["10.1.1.1:8080",
                                                                   "10.1.1.3:8080"]}
            state_file.write(state())
            assert out.next() == {"sync": 3, "servicePorts": []}
        finally:
            stop.set()
            runner.join(WAIT_SECONDS)
    assert not runner.is_alive()
    assert out.lines.empty()


def test_exit_after_stops_after_that_many_change_sets(state_file: StateFile) -> None:
    state_file.write(state(service("web", ("10.96.0.10",), [port()])))
    out = _Lines()
    metrics = Metrics()
    with StateFileWatcher(state_file.path) as watcher:
        run_in_process(BrainSource(watcher.snapshots), "n1", PrintBackend(out), metrics,
                       NO_PROBES, ThreadsafeEvent(), exit_after=1)
    assert _endpoints(out.next()) == {"default/web": []}
    # The brain runs in this process: it is connected (issue 31: it read 0).
    assert metrics.registry.get_sample_value("kpng_py_brain_connected") == 1


class _Told:
    """A sink and a client that note what they are told."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stops = 0

    def on_changeset_started(self) -> None:
        self.calls.append("started")

    def on_ops(self, ops: list[localv1.OpItem]) -> None:
        self.calls.append(f"ops {len(ops)}")

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        self.calls.append(f"changeset {len(ops)}")

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        self.calls.append(f"error {reason}")

    def stop(self) -> None:
        self.stops += 1


@pytest.mark.parametrize("limit, stops", [(0, 0), (2, 2), (4, 0)])
def test_stop_after_passes_everything_on_and_stops_the_client_at_the_limit(
        limit: int, stops: int) -> None:
    told = _Told()
    limited = StopAfter(told, limit)
    limited.client = cast(WatchClient, told)
    sync = [localv1.OpItem(Sync=localv1.EmptyOp())]
    limited.on_changeset_started()
    limited.on_ops(sync)
    limited.on_stream_error("cut", [])
    for _ in range(3):
        limited.on_changeset(sync)
    assert told.calls == ["started", "ops 1", "error cut", *["changeset 1"] * 3]
    assert told.stops == stops  # at the limit's change set and each one after
