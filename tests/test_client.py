"""The watch client against a real gRPC server: credit, reconnects with
backoff, stop, node name, and TLS."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kpng_py.api import localv1 as L
from kpng_py.client import Backoff, ClientConfig, WatchClient
from kpng_py.metrics import Metrics
from kpng_py.server import LocalApiServer, Reply
from kpng_py.transport import ListenAddress, TLSFiles
from tests.streams.build import reset, set_service, service, port, sync


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

    def next_reply(self, node_name, cancelled):
        self.requests.append((node_name, self.sink_busy.is_set()))
        if not self.replies:
            cancelled.wait()
            return None
        return self.replies.pop(0)

    def close(self):
        pass


class RecordingSink:
    def __init__(self, source: ScriptedSource, apply_seconds: float = 0.0) -> None:
        self.source, self.apply_seconds = source, apply_seconds
        self.changesets: list[list[L.OpItem]] = []
        self.errors: list[str] = []
        self.client: WatchClient | None = None
        self.stop_after = 0

    def on_changeset(self, ops):
        self.source.sink_busy.set()
        time.sleep(self.apply_seconds)
        self.changesets.append(ops)
        self.source.sink_busy.clear()
        if self.stop_after and len(self.changesets) >= self.stop_after:
            self.client.stop()

    def on_stream_error(self, reason, partial):
        self.errors.append(reason)


def changeset(name: str) -> Reply:
    svc = service(name, v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    return Reply((reset(), set_service(svc), sync()))


def start(source, tmp_path: Path, tls: TLSFiles | None = None, tcp: bool = False):
    listen = ListenAddress.parse("tcp://127.0.0.1:0" if tcp else f"unix://{tmp_path / 'b.sock'}")
    server = LocalApiServer(source, listen, tls)
    server.start()
    target = f"127.0.0.1:{server.port}" if tcp else f"unix://{tmp_path / 'b.sock'}"
    return server, target


def run_client(config: ClientConfig, sink: RecordingSink, seconds: float,
               metrics: Metrics | None = None) -> WatchClient:
    client = WatchClient(config, sink, metrics or Metrics())
    sink.client = client
    worker = threading.Thread(target=client.run, daemon=True)
    worker.start()
    worker.join(seconds)
    client.stop()
    worker.join(10)
    assert not worker.is_alive(), "client did not stop"
    return client


def test_next_request_only_after_the_change_set_is_applied(tmp_path: Path) -> None:
    source = ScriptedSource([changeset("a"), changeset("b"), changeset("c")])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source, apply_seconds=0.2)
    sink.stop_after = 3
    try:
        run_client(ClientConfig(target, "node-x"), sink, 20)
    finally:
        server.stop(0)
    assert len(sink.changesets) == 3
    assert source.requests[:3] == [("node-x", False)] * 3  # never while the sink was busy


def test_reconnects_with_doubling_backoff(tmp_path: Path) -> None:
    failures = [Reply((), close_reason="UNAVAILABLE: test") for _ in range(3)]
    source = ScriptedSource(failures + [changeset("a")])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    sink.stop_after = 1
    try:
        run_client(ClientConfig(target, "n", error_delay=0.1, max_error_delay=0.3), sink, 20)
    finally:
        server.stop(0)
    assert len(sink.changesets) == 1 and len(sink.errors) == 3
    gaps = [b - a for a, b in zip(source.streams, source.streams[1:])]
    # at least 0.1 s, then the doubled 0.2 s, then the cap of 0.3 s
    assert all(gap >= delay * 0.95 for gap, delay in zip(gaps, (0.1, 0.2, 0.3))), gaps


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(1.0, 5.0)
    assert [backoff.next() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 1.0


def test_reconnects_when_no_brain_is_listening_yet(tmp_path: Path) -> None:
    source = ScriptedSource([changeset("a")])
    sink = RecordingSink(source)
    sink.stop_after = 1
    sock = tmp_path / "b.sock"
    client_thread = threading.Thread(target=run_client, args=(
        ClientConfig(f"unix://{sock}", "n", error_delay=0.05, max_error_delay=0.1), sink, 20))
    client_thread.start()
    time.sleep(0.3)  # the client retries against a missing socket meanwhile
    server, _ = start(source, tmp_path)
    client_thread.join(30)
    server.stop(0)
    assert len(sink.changesets) == 1


def test_stop_while_waiting_for_a_change_set(tmp_path: Path) -> None:
    source = ScriptedSource([changeset("a")])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    started = time.monotonic()
    try:
        run_client(ClientConfig(target, "n"), sink, 0.5)
    finally:
        server.stop(0)
    assert len(sink.changesets) == 1 and time.monotonic() - started < 5


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            f"/CN={name}", "-keyout", str(key), "-out", str(cert))
    return key, cert


def make_leaf(directory: Path, name: str, ca: tuple[Path, Path]) -> TLSFiles:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext = directory / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
            "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert))
    return TLSFiles(key, cert, ca[1])


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, TLSFiles]:
    ca = make_ca(tmp_path, "ca")
    other_ca = make_ca(tmp_path, "other-ca")
    return {
        "server": make_leaf(tmp_path, "server", ca),
        "client": make_leaf(tmp_path, "client", ca),
        "stranger": make_leaf(tmp_path, "stranger", other_ca),
    }


def test_tls_with_kpng_style_flags(tmp_path: Path, pki: dict[str, TLSFiles]) -> None:
    source = ScriptedSource([changeset("a")])
    server, target = start(source, tmp_path, tls=pki["server"], tcp=True)
    sink = RecordingSink(source)
    sink.stop_after = 1
    try:
        run_client(ClientConfig(target, "n", tls=pki["client"]), sink, 20)
    finally:
        server.stop(0)
    assert len(sink.changesets) == 1


def test_tls_fails_closed_with_a_wrong_ca(tmp_path: Path, pki: dict[str, TLSFiles]) -> None:
    source = ScriptedSource([changeset("a")])
    server, target = start(source, tmp_path, tls=pki["server"], tcp=True)
    sink = RecordingSink(source)
    try:
        run_client(ClientConfig(target, "n", tls=pki["stranger"], error_delay=0.1), sink, 1.5)
    finally:
        server.stop(0)
    assert sink.changesets == [] and source.requests == []
    assert sink.errors and all("UNAVAILABLE" in e for e in sink.errors)
