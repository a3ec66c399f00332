"""Run `to-print` against `replay` of a recording, in-process over a real
unix socket (the same gRPC path as the CLI)."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from kpng_py.backend import ChangeSetApplier
from kpng_py.client import ClientConfig, WatchClient
from kpng_py.metrics import Metrics
from kpng_py.print_backend import PrintBackend
from kpng_py.recording import read_segments
from kpng_py.replay import ReplaySource
from kpng_py.runner import ApplierSink, StopAfter
from kpng_py.server import LocalApiServer
from kpng_py.skips import Skips
from kpng_py.state import NodeState
from kpng_py.transport import ListenAddress


def replay_to_print(recording: Path, socket_dir: Path,
                    metrics: Metrics | None = None) -> list[str]:
    """The lines `to-print` writes for the whole recording."""
    segments = read_segments(recording)
    syncs = sum(1 for s in segments if s.disconnect is None)
    listen = ListenAddress.parse(f"unix://{socket_dir / 'replay.sock'}")
    server = LocalApiServer(ReplaySource(segments), listen)
    server.start()
    out = io.StringIO()
    metrics = metrics or Metrics()
    applier = ChangeSetApplier(PrintBackend(out), NodeState(Skips(metrics)), metrics)
    sink = StopAfter(ApplierSink(applier), syncs)
    client = WatchClient(ClientConfig(target=listen.grpc_address().replace("unix:", "unix://"),
                                      node_name="node-a", error_delay=0.05), sink, metrics)
    sink.client = client
    worker = threading.Thread(target=client.run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    server.stop(grace=0)
    assert not worker.is_alive(), f"replay of {recording.name} did not finish"
    return out.getvalue().splitlines()
