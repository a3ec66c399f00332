"""`kpng-py file -i STATE.yaml to-api|to-local ...`: the brain's two sinks."""

from __future__ import annotations

import threading
from pathlib import Path

from kpng_py import runner
from kpng_py.backend import Backend
from kpng_py.brain.source import BrainSource
from kpng_py.brain.watcher import StateFileWatcher
from kpng_py.health import Observability
from kpng_py.metrics import Metrics
from kpng_py.transport import ListenAddress, TLSFiles


def serve_file(state_file: Path, listen: ListenAddress, tls: TLSFiles) -> None:
    """Serve the file's state over localv1 until SIGTERM/SIGINT."""
    with StateFileWatcher(state_file) as watcher:
        runner.serve(BrainSource(watcher.snapshots), listen, tls)


def run_file_local(state_file: Path, node_name: str, backend: Backend, metrics: Metrics,
                   observability: Observability, exit_after: int = 0) -> None:
    """Program `backend` with the file's state as node `node_name` sees it,
    in this process, until SIGTERM/SIGINT (or `exit_after` change sets)."""
    stop = threading.Event()
    runner.on_termination(stop.set)
    with StateFileWatcher(state_file) as watcher:
        runner.run_in_process(BrainSource(watcher.snapshots), node_name, backend, metrics,
                              observability, stop, exit_after)
