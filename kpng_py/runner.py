"""Wiring of the commands: a source of change sets, the state, a backend."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Callable, IO

from kpng_py.api import localv1
from kpng_py.backend import Backend, ChangeSetApplier
from kpng_py.client import ClientConfig, OpsSink, WatchClient
from kpng_py.health import HealthSink, Observability
from kpng_py.logs import fields
from kpng_py.metrics import Metrics
from kpng_py.recording import RecordingWriter
from kpng_py.server import ChangeSetSource, LocalApiServer
from kpng_py.skips import Skips
from kpng_py.state import NodeState
from kpng_py.transport import ListenAddress, TLSFiles

log = logging.getLogger(__name__)


def on_termination(handler: Callable[[], None]) -> None:
    """Run `handler` on SIGTERM and SIGINT (from the main thread)."""
    def _handle(signum: int, _frame: object) -> None:
        log.info("stopping", extra=fields(signal=signal.Signals(signum).name))
        handler()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)


class StopAfter:
    """Passes change sets on and stops the client after `limit` of them (0: never)."""

    def __init__(self, sink: OpsSink, limit: int) -> None:
        self._sink = sink
        self._limit = limit
        self._seen = 0
        self.client: WatchClient | None = None

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        self._sink.on_changeset(ops)
        self._seen += 1
        if self._limit and self._seen >= self._limit and self.client is not None:
            self.client.stop()

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        self._sink.on_stream_error(reason, partial)


class ApplierSink:
    """Feeds complete change sets to the applier; partial ones are dropped (the
    next stream's Reset and full state supersede them)."""

    def __init__(self, applier: ChangeSetApplier) -> None:
        self._applier = applier

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        self._applier.apply_ops(ops)

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        del reason, partial  # the client logged it; the dataplane stays as it is


def watch(config: ClientConfig, sink: OpsSink, metrics: Metrics, exit_after: int = 0) -> None:
    """Run a watch client until a signal (or `exit_after` change sets)."""
    limited = StopAfter(sink, exit_after)
    client = WatchClient(config, limited, metrics)
    limited.client = client
    on_termination(client.stop)
    client.run()


def _backend_pipeline(backend: Backend, metrics: Metrics,
                      observability: Observability) -> tuple[OpsSink, ChangeSetApplier]:
    """Change sets to `backend`, reported to /healthz; and the applier."""
    health = observability.start(metrics)
    applier = ChangeSetApplier(backend, NodeState(Skips(metrics)), metrics)
    return HealthSink(ApplierSink(applier), health), applier


def run_backend(config: ClientConfig, backend: Backend, metrics: Metrics,
                observability: Observability, exit_after: int = 0) -> None:
    """`kpng-py local ... to-<backend>`."""
    sink, _ = _backend_pipeline(backend, metrics, observability)
    backend.setup()
    try:
        watch(config, sink, metrics, exit_after)
    finally:
        backend.close()


def run_in_process(source: ChangeSetSource, node_name: str, backend: Backend,
                   metrics: Metrics, observability: Observability, stop: threading.Event,
                   exit_after: int = 0) -> None:
    """Brain and backend in one process (KPNG's `to-local`): the source's change
    sets for `node_name` go straight to the applier, without gRPC. As over the
    wire, the next change set is asked for only once `apply` has returned.
    Runs until `stop` is set (or `exit_after` change sets were applied)."""
    sink, applier = _backend_pipeline(backend, metrics, observability)
    session = source.open_stream()
    backend.setup()
    try:
        while (reply := session.next_reply(node_name, stop)) is not None:
            sink.on_changeset(list(reply.ops))
            if exit_after and applier.syncs >= exit_after:
                break
    finally:
        session.close()
        backend.close()


class RecordSink:
    """`kpng-py record`: writes every op, and each stream failure, as received."""

    def __init__(self, out: IO[str]) -> None:
        self._writer = RecordingWriter(out)

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        for op in ops:
            self._writer.op(op)
        self._writer.flush()

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        for op in partial:
            self._writer.op(op)
        self._writer.disconnect(reason)


def record(config: ClientConfig, output: Path, metrics: Metrics, exit_after: int = 0) -> None:
    with output.open("w", encoding="utf-8") as out:
        watch(config, RecordSink(out), metrics, exit_after)


def serve(source: ChangeSetSource, listen: ListenAddress, tls: TLSFiles,
          until: threading.Event | None = None) -> None:
    """Serve localv1 until SIGTERM/SIGINT (or `until` is set)."""
    server = LocalApiServer(source, listen, tls)
    stop = until or threading.Event()
    on_termination(stop.set)
    server.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
