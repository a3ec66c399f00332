"""`kpng-py file -i STATE.yaml to-api|to-local ...`: the brain's two sinks."""

from __future__ import annotations

from pathlib import Path

from kpng_py import runner
from kpng_py.aio import ThreadsafeEvent
from kpng_py.backend import Backend
from kpng_py.brain.source import BrainSource
from kpng_py.brain.watcher import DEFAULT_MAX_FILE_SIZE, Settle, StateFileWatcher
from kpng_py.health import Observability
from kpng_py.limits import Limits
from kpng_py.metrics import Metrics
from kpng_py.termination import Termination
from kpng_py.transport import ListenAddress, TLSFiles


def serve_file(state_file: Path, listen: ListenAddress, tls: TLSFiles,
               max_file_size: int = DEFAULT_MAX_FILE_SIZE, settle: Settle = Settle()) -> None:
    """Serve the file's state over localv1 until SIGTERM/SIGINT."""
    with StateFileWatcher(state_file, max_size=max_file_size, settle=settle) as watcher:
        runner.serve(BrainSource(watcher.snapshots), listen, tls)


def run_file_local(state_file: Path, node_name: str, backend: Backend, metrics: Metrics,
                   observability: Observability, exit_after: int = 0,
                   max_file_size: int = DEFAULT_MAX_FILE_SIZE, limits: Limits = Limits(),
                   settle: Settle = Settle()) -> None:
    """Program `backend` with the file's state as node `node_name` sees it,
    in this process, until SIGTERM/SIGINT (or `exit_after` change sets)."""
    stop = ThreadsafeEvent()
    with Termination(stop.set), StateFileWatcher(state_file, max_size=max_file_size,
                                                 settle=settle) as watcher:
        runner.run_in_process(BrainSource(watcher.snapshots), node_name, backend, metrics,
                              observability, stop, exit_after, limits)
