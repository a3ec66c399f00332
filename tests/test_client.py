"""The watch client against a real gRPC server: credit, reconnects with
backoff, stop, node name, and TLS."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from kpng_py.client import Backoff, ClientConfig
from kpng_py.server import Reply
from kpng_py.transport import TLSFiles
from tests.support.watch import RecordingSink, ScriptedSource, changeset, run_client, start


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
