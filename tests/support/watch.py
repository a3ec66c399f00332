"""A scripted localv1 source served by grpcio and a recording watch client,
for tests of the watch client and of what it does with hostile or broken
streams.

The server is grpcio's (lab/localv1_servers.py), whatever kpng-py's own brain
serves with: it is the compatibility reference, what the watch client must
keep working against (as KPNG's brain is a grpc-go server, another gRPC
implementation)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.serve.server import Reply, wait_until_cancelled
from kpng_py.transport import TLSFiles
from kpng_py.watch.client import ChangeSetSink, ClientConfig, WatchClient
from lab.localv1_servers import GrpcioBrain
from tests.streams.build import port, reset, service, set_service, sync


@dataclass
class ScriptedSource:
    """Answers WatchReqs from a script of replies shared by every stream; a
    reply with close_reason fails the stream."""

    replies: list[Reply]
    streams: list[float] = field(default_factory=list)  # when each stream opened
    requests: list[tuple[str, bool]] = field(default_factory=list)  # (node, sink busy)
    sink_busy: threading.Event = field(default_factory=threading.Event)

    def open_stream(self):
        self.streams.append(time.monotonic())
        return self

    async def next_reply(self, node_name):
        self.requests.append((node_name, self.sink_busy.is_set()))
        if not self.replies:
            await wait_until_cancelled()
        return self.replies.pop(0)

    def close(self):
        pass


class WholeChangeSets:
    """An OpsSink for a sink that records change sets whole (the tests'
    recording sinks): holds the ops handed over early and gives them with
    the rest of their change set."""

    def __init__(self, sink: ChangeSetSink) -> None:
        self.sink = sink
        self._held: list[L.OpItem] = []

    def on_changeset_started(self) -> None:
        self.sink.on_changeset_started()

    def on_ops(self, ops: list[L.OpItem]) -> None:
        self._held += ops

    def on_changeset(self, ops: list[L.OpItem]) -> None:
        held, self._held = self._held, []
        self.sink.on_changeset(held + ops)

    def on_stream_error(self, reason: str, partial: list[L.OpItem]) -> None:
        held, self._held = self._held, []
        self.sink.on_stream_error(reason, held + partial)


class RecordingSink:
    """Keeps what the client hands over; tells a ScriptedSource (if given)
    while it is applying, so the source can check the client's credit.
    `stop_at_error`: stop the client at the first stream error."""

    def __init__(self, source: ScriptedSource | None = None, apply_seconds: float = 0.0,
                 stop_at_error: bool = False) -> None:
        self.source, self.apply_seconds = source, apply_seconds
        self.stop_at_error = stop_at_error
        self.changesets: list[list[L.OpItem]] = []
        self.errors: list[str] = []
        self.partials: list[list[L.OpItem]] = []  # the ops each error cut short
        self.started = 0  # change sets whose first message arrived
        self.client: WatchClient | None = None
        self.stop_after = 0

    def on_changeset_started(self) -> None:
        self.started += 1

    def on_changeset(self, ops: list[L.OpItem]) -> None:
        busy = self.source.sink_busy if self.source else threading.Event()
        busy.set()
        time.sleep(self.apply_seconds)
        self.changesets.append(ops)
        busy.clear()
        if self.stop_after and len(self.changesets) >= self.stop_after:
            self.stop_client()

    def on_stream_error(self, reason: str, partial: list[L.OpItem]) -> None:
        self.errors.append(reason)
        self.partials.append(partial)
        if self.stop_at_error:
            self.stop_client()

    def stop_client(self) -> None:
        """Stop the client that run_client made for this sink."""
        assert self.client is not None, "run_client gives the sink its client"
        self.client.stop()


def changeset(name: str) -> Reply:
    svc = service(name, v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    return Reply((reset(), set_service(svc), sync()))


def start(source, tmp_path: Path, tls: TLSFiles | None = None, tcp: bool = False):
    """A GrpcioBrain for `source` on a unix socket in `tmp_path` (or TCP on
    loopback) and the watch client's target for it."""
    sock = tmp_path / "b.sock"
    server = GrpcioBrain(source, "127.0.0.1:0" if tcp else f"unix:{sock}", tls)
    bound = server.start()
    return server, f"127.0.0.1:{bound}" if tcp else f"unix://{sock}"


def run_client(config: ClientConfig, sink: RecordingSink, seconds: float,
               metrics: Metrics | None = None, **client_args) -> WatchClient:
    """Run a WatchClient (with `client_args`, e.g. a clock) for at most
    `seconds`, or until the sink stops it."""
    client = WatchClient(config, WholeChangeSets(sink), metrics or Metrics(), **client_args)
    sink.client = client
    worker = threading.Thread(target=client.run, daemon=True)
    worker.start()
    worker.join(seconds)
    client.stop()
    worker.join(10)
    assert not worker.is_alive(), "client did not stop"
    return client
