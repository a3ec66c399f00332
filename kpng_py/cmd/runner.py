"""Wiring of the commands: a source of change sets, the state, a backend."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from kpng_py.api import localv1
from kpng_py.cmd.output_file import OutputFile
from kpng_py.cmd.setup_alongside import SetUpAlongside
from kpng_py.dataplane.applier import ChangeSetApplier
from kpng_py.dataplane.contract import Backend
from kpng_py.healthcheck.proxier_health import HealthSink, Observability, SyncHealth
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.aio import ThreadsafeEvent
from kpng_py.runtime.termination import Termination
from kpng_py.serve.recording import RecordingWriter
from kpng_py.serve.server import ChangeSetSource, LocalApiServer, StreamSession
from kpng_py.state.limits import Limits
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from kpng_py.transport import ListenAddress, TLSFiles
from kpng_py.watch.client import ClientConfig, OpsSink, SinkFailed, WatchClient


class StopAfter:
    """Passes change sets on and stops the client after `limit` of them (0: never)."""

    def __init__(self, sink: OpsSink, limit: int) -> None:
        self._sink = sink
        self._limit = limit
        self._seen = 0
        self.client: WatchClient | None = None

    def on_changeset_started(self) -> None:
        self._sink.on_changeset_started()

    def on_ops(self, ops: list[localv1.OpItem]) -> None:
        self._sink.on_ops(ops)

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        self._sink.on_changeset(ops)
        self._seen += 1
        if self._limit and self._seen >= self._limit and self.client is not None:
            self.client.stop()

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        self._sink.on_stream_error(reason, partial)


class ApplierSink:
    """Feeds change sets to the applier as they arrive, with the time their
    messages took (from the first to the Sync); the dataplane gets a change
    set only with its Sync, never one cut short (the next stream's Reset and
    full state supersede it)."""

    def __init__(self, applier: ChangeSetApplier) -> None:
        self._applier = applier
        self._receiving_since: float | None = None

    def on_changeset_started(self) -> None:
        if self._receiving_since is None:  # told again for a message that adds no op
            self._receiving_since = time.monotonic()
            self._applier.changeset_queued()

    def on_ops(self, ops: list[localv1.OpItem]) -> None:
        self._applier.stage_ops(ops)

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        since, self._receiving_since = self._receiving_since, None
        received = 0.0 if since is None else time.monotonic() - since  # None: no transport
        self._applier.apply_ops(ops, received)

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        del reason, partial  # the client logged it; the dataplane stays as it is
        self._receiving_since = None
        self._applier.changeset_cut()


def _watch_client(config: ClientConfig, sink: OpsSink, metrics: Metrics,
                  exit_after: int) -> WatchClient:
    """A watch client that stops after `exit_after` change sets (0: never)."""
    limited = StopAfter(sink, exit_after)
    client = WatchClient(config, limited, metrics)
    limited.client = client
    return client


def watch(config: ClientConfig, sink: OpsSink, metrics: Metrics, exit_after: int = 0) -> None:
    """Run a watch client until a signal (or `exit_after` change sets)."""
    client = _watch_client(config, sink, metrics, exit_after)
    with Termination(client.stop):
        client.run()


def _backend_pipeline(backend: Backend, metrics: Metrics, observability: Observability,
                      limits: Limits, dataplane: object,
                      source_health: Callable[[SyncHealth], None] | None = None,
                      ) -> tuple[OpsSink, ChangeSetApplier]:
    """Change sets to `backend`, reported to /healthz; and the applier (which
    tells /healthz what the dataplane did; close it before the backend).
    A `dataplane` (the backend itself, unwrapped) with `use_health` is handed
    what /healthz says, before its setup: healthCheckNodePort answers carry it;
    so is `source_health`, a source in this process that tells /healthz of
    its own upstream (`kube ... to-local`: the API server)."""
    health = observability.start(metrics)
    if source_health is not None:
        source_health(health)
    use_health = getattr(dataplane, "use_health", None)
    if use_health is not None:
        use_health(health)
    applier = ChangeSetApplier(backend, NodeState(Skips(metrics), limits), metrics, listener=health)
    return HealthSink(ApplierSink(applier), health), applier


def run_backend(config: ClientConfig, backend: Backend, metrics: Metrics,
                observability: Observability, exit_after: int = 0,
                limits: Limits = Limits()) -> None:
    """`kpng-py local ... to-<backend>`. The backend is set up while the
    client connects and receives the first change set (setup_alongside.py)."""
    alongside = SetUpAlongside(backend)
    sink, applier = _backend_pipeline(alongside, metrics, observability, limits, backend)
    client = _watch_client(config, sink, metrics, exit_after)
    with Termination(client.stop):  # from the start: a backend's setup may take seconds
        alongside.start(on_failure=client.stop)
        try:
            client.run()
        finally:
            applier.close()
            alongside.close()
    alongside.raise_failure()


def run_in_process(source: ChangeSetSource, node_name: str, backend: Backend,
                   metrics: Metrics, observability: Observability, stop: ThreadsafeEvent,
                   exit_after: int = 0, limits: Limits = Limits(),
                   source_health: Callable[[SyncHealth], None] | None = None) -> None:
    """Brain and backend in one process (KPNG's `to-local`): the source's change
    sets for `node_name` go straight to the applier, without gRPC. As over the
    wire, the next change set is asked for only once `apply` has returned.
    Runs until `stop` is set (or `exit_after` change sets were applied)."""
    sink, applier = _backend_pipeline(backend, metrics, observability, limits, backend,
                                      source_health)
    metrics.brain_connected.set(1)  # the brain is this process: never away
    backend.setup()
    try:
        asyncio.run(_apply_until_stopped(source.open_stream(), node_name, sink, applier,
                                         stop, exit_after))
    finally:
        applier.close()
        backend.close()


async def _apply_until_stopped(session: StreamSession, node_name: str, sink: OpsSink,
                               applier: ChangeSetApplier, stop: ThreadsafeEvent,
                               exit_after: int) -> None:
    """The session API is asyncio's (the server's). The backend's apply is
    synchronous and must not run where an event loop is running (pyroute2's
    IPRoute runs one of its own for every call), so it runs on one thread of
    its own, always the same; the next reply is awaited only once it returned."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="apply") as apply_thread:
        async def apply_replies() -> None:
            try:
                while not exit_after or applier.syncs < exit_after:
                    reply = await session.next_reply(node_name)
                    await loop.run_in_executor(apply_thread, sink.on_changeset, list(reply.ops))
            finally:
                session.close()

        applying = asyncio.ensure_future(apply_replies())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((applying, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            applying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await applying  # raises what the backend raised


class RecordSink:
    """`kpng-py record`: writes every op, and each stream failure, as received.
    The recording is opened (an existing file truncated) at the first op: a
    stream failure before it is only logged by the client, so a record that
    never reaches its brain leaves its file as it was. A failed write (disk
    full, a closed pipe) ends the recording."""

    def __init__(self, output: OutputFile) -> None:
        self._output = output
        self._writer: RecordingWriter | None = None

    def on_changeset_started(self) -> None:
        pass  # ops are written as they come, and flushed at the Sync or the failure

    def on_ops(self, ops: list[localv1.OpItem]) -> None:
        if not ops:
            return
        with self._writing():
            writer = self._recording()
            for op in ops:
                writer.op(op)

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        self.on_ops(ops)
        if self._writer is not None:
            with self._writing():
                self._writer.flush()

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        if self._writer is None and not partial:
            return  # nothing recorded yet
        self.on_ops(partial)
        with self._writing():
            self._recording().disconnect(reason)

    def close(self) -> None:
        with self._writing():
            self._output.close()

    def _recording(self) -> RecordingWriter:
        if self._writer is None:
            self._writer = RecordingWriter(self._output.open())
        return self._writer

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        except OSError as err:
            raise SinkFailed(f"writing the recording {self._output.path} failed: "
                             f"{err.strerror}") from err


def record(config: ClientConfig, output: OutputFile, metrics: Metrics,
           exit_after: int = 0) -> None:
    """`kpng-py record`: the stream into `output` (closed at the end)."""
    sink = RecordSink(output)
    try:
        watch(config, sink, metrics, exit_after)
    except SinkFailed:
        with contextlib.suppress(OSError):  # what could not be written is lost either way
            output.close()
        raise
    sink.close()


def serve(source: ChangeSetSource, listen: ListenAddress, tls: TLSFiles,
          until: threading.Event | None = None) -> None:
    """Serve localv1 until SIGTERM/SIGINT (or `until` is set)."""
    server = LocalApiServer(source, listen, tls)
    stop = until or threading.Event()
    with Termination(stop.set):
        server.start()
        try:
            stop.wait()
        finally:
            server.stop()
