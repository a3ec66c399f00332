"""`kpng-py file -i STATE.yaml to-api|to-local ...`: the brain's two sinks."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from kpng_py.brain.settings import STDIN
from kpng_py.brain.source import BrainSource, StateSnapshots
from kpng_py.brain.watcher import (
    DEFAULT_MAX_FILE_SIZE,
    Settle,
    StateFileWatcher,
    read_standard_input,
)
from kpng_py.cmd import runner
from kpng_py.dataplane.contract import Backend
from kpng_py.healthcheck.proxier_health import Observability
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.aio import ThreadsafeEvent
from kpng_py.runtime.termination import Termination
from kpng_py.state.limits import Limits
from kpng_py.transport import ListenAddress, TLSFiles


def serve_file(state_file: Path, listen: ListenAddress, tls: TLSFiles,
               max_file_size: int = DEFAULT_MAX_FILE_SIZE, settle: Settle = Settle()) -> None:
    """Serve the file's state over localv1 until SIGTERM/SIGINT."""
    with _snapshots(state_file, max_file_size, settle) as snapshots:
        runner.serve(BrainSource(snapshots), listen, tls)


def run_file_local(state_file: Path, node_name: str, backend: Backend, metrics: Metrics,
                   observability: Observability, exit_after: int = 0,
                   max_file_size: int = DEFAULT_MAX_FILE_SIZE, limits: Limits = Limits(),
                   settle: Settle = Settle()) -> None:
    """Program `backend` with the file's state as node `node_name` sees it,
    in this process, until SIGTERM/SIGINT (or `exit_after` change sets)."""
    stop = ThreadsafeEvent()
    with Termination(stop.set), _snapshots(state_file, max_file_size, settle) as snapshots:
        runner.run_in_process(BrainSource(snapshots), node_name, backend, metrics,
                              observability, stop, exit_after, limits)


@contextmanager
def _snapshots(state_file: Path, max_file_size: int, settle: Settle
               ) -> Iterator[StateSnapshots]:
    """The file's state, following its edits; standard input's (STDIN), read once."""
    if state_file == STDIN:
        yield read_standard_input(max_file_size)
        return
    with StateFileWatcher(state_file, max_size=max_file_size, settle=settle) as watcher:
        yield watcher.snapshots
