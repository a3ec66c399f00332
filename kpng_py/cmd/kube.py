"""`kpng-py kube ... to-api|to-local ...`: the API server's state through the
file brain's two sinks (a localv1 server, or a backend in this process)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from kpng_py.brain.kube.access import AccessFlags, resolve
from kpng_py.brain.kube.client import ApiServerClient
from kpng_py.brain.kube.watcher import ApiServerReport, KubeWatcher
from kpng_py.brain.settings import Coalesce
from kpng_py.brain.source import BrainSource, StateSnapshots
from kpng_py.cmd import runner
from kpng_py.dataplane.contract import Backend
from kpng_py.healthcheck.proxier_health import Observability
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.aio import ThreadsafeEvent
from kpng_py.runtime.termination import Termination
from kpng_py.state.limits import Limits
from kpng_py.transport import ListenAddress, TLSFiles


def serve_kube(flags: AccessFlags, listen: ListenAddress, tls: TLSFiles, metrics: Metrics,
               observability: Observability, coalesce: Coalesce = Coalesce()) -> None:
    """Serve the API server's state over localv1 until SIGTERM/SIGINT; its
    /healthz (when asked for) tells whether the served state follows the
    API server."""
    stop = threading.Event()
    report = ApiServerReport(metrics)
    report.attach(observability.start(metrics), serving=True)
    with Termination(stop.set), _following(flags, metrics, report, coalesce, stop) as snapshots:
        if snapshots is not None:
            runner.serve(BrainSource(snapshots), listen, tls, until=stop)


def run_kube_local(flags: AccessFlags, node_name: str, backend: Backend, metrics: Metrics,
                   observability: Observability, exit_after: int = 0,
                   limits: Limits = Limits(), coalesce: Coalesce = Coalesce()) -> None:
    """Program `backend` with the API server's state as node `node_name`
    sees it, in this process, until SIGTERM/SIGINT (or `exit_after` change
    sets)."""
    stop = ThreadsafeEvent()
    report = ApiServerReport(metrics)
    with Termination(stop.set), _following(flags, metrics, report, coalesce, stop) as snapshots:
        if snapshots is not None:
            runner.run_in_process(BrainSource(snapshots), node_name, backend, metrics,
                                  observability, stop, exit_after, limits,
                                  source_health=lambda health: report.attach(health, False))


@contextmanager
def _following(flags: AccessFlags, metrics: Metrics, report: ApiServerReport,
               coalesce: Coalesce, stop: threading.Event | ThreadsafeEvent
               ) -> Iterator[StateSnapshots | None]:
    """The API server's state once listed, following it; None if stopped first."""
    watcher = KubeWatcher(ApiServerClient(resolve(flags)), metrics, report, coalesce)
    watcher.start()
    try:
        yield watcher.wait_synced(stop)
    finally:
        watcher.stop()
