"""Run `to-print` against a replay of a recording, in-process over a real
unix socket: the watch client against the grpcio reference server
(tests/support/watch.py) serving `replay`'s source. `kpng-py replay` itself
(kpng-py's own server) is run in tests/test_streams.py."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from kpng_py.cmd.runner import ApplierSink, StopAfter
from kpng_py.dataplane.applier import ChangeSetApplier
from kpng_py.dataplane.print_backend import PrintBackend
from kpng_py.metrics.metrics import Metrics
from kpng_py.serve.recording import read_segments
from kpng_py.serve.replay import ReplaySource
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from kpng_py.watch.client import ClientConfig, WatchClient
from tests.support.watch import start


def replay_to_print(recording: Path, socket_dir: Path, metrics: Metrics | None = None,
                    staged_batch: int = ClientConfig.staged_batch) -> list[str]:
    """The lines `to-print` writes for the whole recording, the client
    handing ops over `staged_batch` at a time before their Sync."""
    segments = read_segments(recording)
    syncs = sum(1 for s in segments if s.disconnect is None)
    server, target = start(ReplaySource(segments), socket_dir)
    out = io.StringIO()
    metrics = metrics or Metrics()
    applier = ChangeSetApplier(PrintBackend(out), NodeState(Skips(metrics)), metrics)
    sink = StopAfter(ApplierSink(applier), syncs)
    client = WatchClient(ClientConfig(target=target, node_name="node-a", error_delay=0.05,
                                      staged_batch=staged_batch), sink, metrics)
    sink.client = client
    worker = threading.Thread(target=client.run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    server.stop(grace=0)
    assert not worker.is_alive(), f"replay of {recording.name} did not finish"
    return out.getvalue().splitlines()
