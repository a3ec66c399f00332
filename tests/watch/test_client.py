"""The watch client against a real gRPC server (grpcio's, the
compatibility reference): credit, reconnects with backoff, stop, node name,
keepalive while the sink applies, and TLS."""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from pathlib import Path

import pytest

from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.logs import record_fields
from kpng_py.serve.server import Reply
from kpng_py.transport import TLSFiles
from kpng_py.watch.client import ClientConfig, WatchClient
from lab.localv1_servers import H2Brain, framed
from tests.streams.build import reset, service, set_service, sync
from tests.support.tls import make_ca, make_leaf
from tests.support.watch import (
    RecordingSink,
    ScriptedSource,
    WholeChangeSets,
    changeset,
    run_client,
    start,
)


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


def applied_then_failed(streams: int) -> list[Reply]:
    """Each stream applies its full state, then fails at the next WatchReq."""
    return [reply for _ in range(streams)
            for reply in (changeset("a"), Reply((), close_reason="UNAVAILABLE: test"))]


def watch_retries(replies: list[Reply], sink: RecordingSink, changesets: int, tmp_path: Path,
                  caplog: pytest.LogCaptureFixture, **client_args) -> list[float]:
    """The retry delays a client logs until it applied `changesets`; no jitter."""
    sink.source = ScriptedSource(replies)
    server, target = start(sink.source, tmp_path)
    sink.stop_after = changesets
    config = ClientConfig(target, "n", error_delay=0.05, max_error_delay=0.2)
    try:
        with caplog.at_level(logging.INFO, logger="kpng_py.watch.client"):
            run_client(config, sink, 30, random_unit=lambda: 0.0, **client_args)
    finally:
        server.stop(0)
    assert len(sink.changesets) == changesets
    return [record_fields(r)["retry_in_s"] for r in caplog.records
            if r.getMessage() == "reconnecting to the brain"]


def test_a_stream_that_fails_soon_after_its_full_state_does_not_reset_the_backoff(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As a brain that sends something the client cannot take later in every
    stream: the retries (each a full resync) slow down to --max-error-delay."""
    delays = watch_retries(applied_then_failed(5), RecordingSink(), 5, tmp_path, caplog)
    assert delays == [0.05, 0.1, 0.2, 0.2]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_stream_that_stayed_up_resets_the_backoff(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Up for --max-error-delay after its full state (the clock is moved on
    while each change set is applied): the next retry is --error-delay again."""
    clock = FakeClock()

    class AgingSink(RecordingSink):
        def on_changeset(self, ops):
            clock.now += 0.2
            super().on_changeset(ops)

    replies = [Reply((), close_reason="UNAVAILABLE: before")] * 2 + applied_then_failed(3)
    delays = watch_retries(replies, AgingSink(), 3, tmp_path, caplog, clock=clock)
    assert delays == [0.05, 0.1, 0.05, 0.05]


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


class ThreadCheckingSink(RecordingSink):
    """Notes the thread each change set is applied on, whether an event loop
    runs there, and when each apply ended."""

    def __init__(self, source: ScriptedSource, apply_seconds: float = 0.0) -> None:
        super().__init__(source, apply_seconds)
        self.threads: set[int] = set()
        self.loop_running: list[bool] = []
        self.applied_at: list[float] = []

    def on_changeset(self, ops):
        self.threads.add(threading.get_ident())
        try:
            asyncio.get_running_loop()
            self.loop_running.append(True)
        except RuntimeError:
            self.loop_running.append(False)
        super().on_changeset(ops)
        self.applied_at.append(time.monotonic())


def test_the_sink_runs_on_one_thread_without_an_event_loop(tmp_path: Path) -> None:
    """pyroute2 runs an event loop of its own in every call: a backend's
    apply must not run where one is running."""
    source = ScriptedSource([changeset("a"), changeset("b"), changeset("c")])
    server, target = start(source, tmp_path)
    sink = ThreadCheckingSink(source)
    sink.stop_after = 3
    try:
        run_client(ClientConfig(target, "n"), sink, 20)
    finally:
        server.stop(0)
    assert len(sink.threads) == 1 and sink.loop_running == [False] * 3


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


class HandOverSink:
    """Records each hand-over: its kind, the ops' kinds, and whether it ran
    where an event loop runs; stops the client at the first Sync or error."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], bool]] = []
        self.client: WatchClient | None = None

    def on_changeset_started(self) -> None:
        pass

    def on_ops(self, ops: list[L.OpItem]) -> None:
        self.calls.append(("ops", [op.WhichOneof("Op") for op in ops], _on_a_loop()))

    def on_changeset(self, ops: list[L.OpItem]) -> None:
        self.calls.append(("changeset", [op.WhichOneof("Op") for op in ops], _on_a_loop()))
        self._stop_client()

    def on_stream_error(self, reason: str, partial: list[L.OpItem]) -> None:
        self.calls.append(("error", [op.WhichOneof("Op") for op in partial], _on_a_loop()))
        self._stop_client()

    def _stop_client(self) -> None:
        assert self.client is not None, "run_hand_over gives the sink its client"
        self.client.stop()


def run_hand_over(target: str, staged_batch: int, metrics: Metrics) -> HandOverSink:
    sink = HandOverSink()
    sink.client = WatchClient(ClientConfig(target, "n", staged_batch=staged_batch,
                                           error_delay=600), sink, metrics)
    worker = threading.Thread(target=sink.client.run, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive()
    return sink


def test_ops_are_handed_over_in_batches_on_the_loop_and_the_sync_on_the_sink_thread(
        tmp_path: Path) -> None:
    sets = [set_service(service(f"s{i}", v4=[f"10.96.0.{i + 1}"])) for i in range(5)]
    source = ScriptedSource([Reply((reset(), *sets, sync()))])
    server, target = start(source, tmp_path)
    try:
        sink = run_hand_over(target, 2, Metrics())
    finally:
        server.stop(0)
    assert sink.calls == [("ops", ["Reset", "Set"], True), ("ops", ["Set", "Set"], True),
                          ("ops", ["Set", "Set"], True), ("changeset", ["Sync"], False)]


def test_a_cut_change_set_counts_its_staged_ops_and_hands_over_only_the_rest(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sets = [set_service(service(f"s{i}", v4=[f"10.96.0.{i + 1}"])) for i in range(2)]
    brain = H2Brain(framed(reset(), *sets), end_status=(14, "brain crashed"))
    target = brain.start(tmp_path / "h2.sock")
    metrics = Metrics()
    try:
        sink = run_hand_over(target, 2, metrics)
    finally:
        brain.stop()
    assert sink.calls == [("ops", ["Reset", "Set"], True), ("error", ["Set"], False)]
    failed = [r for r in caplog.records if r.getMessage() == "watch stream to the brain failed"]
    assert [record_fields(r)["discarded_ops"] for r in failed] == [3]
    assert metrics.registry.get_sample_value(
        "kpng_py_skipped_total", {"reason": "incomplete-changeset"}) == 1


def test_whole_change_sets_gives_the_ops_held_with_the_rest() -> None:
    inner = RecordingSink()
    sink = WholeChangeSets(inner)
    first, second = (set_service(service(name, v4=["10.96.0.1"])) for name in ("a", "b"))
    sink.on_ops([reset(), first])
    sink.on_changeset([second, sync()])
    sink.on_ops([reset()])
    sink.on_stream_error("cut", [first])
    assert inner.changesets == [[reset(), first, second, sync()]]
    assert inner.partials == [[reset(), first]]


def test_keepalive_goes_on_while_the_sink_applies(tmp_path: Path) -> None:
    """An apply much longer than keepalive time + timeout: the client's
    pings are still answered and their answers read, so the stream stays up
    and the next change set comes on it."""
    source = ScriptedSource([changeset("a"), changeset("b")])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source, apply_seconds=4.0)
    sink.stop_after = 2
    try:
        run_client(ClientConfig(target, "n", keepalive_time=1.0, keepalive_timeout=1.0),
                   sink, 30)
    finally:
        server.stop(0)
    assert len(sink.changesets) == 2 and sink.errors == [] and len(source.streams) == 1


def test_stop_during_an_apply_returns_once_the_apply_is_done(tmp_path: Path) -> None:
    """What runs after `run` (the applier's and backend's close) never
    overlaps a change set still being applied."""
    source = ScriptedSource([changeset("a")])
    server, target = start(source, tmp_path)
    sink = ThreadCheckingSink(source, apply_seconds=1.0)
    try:
        client_thread = threading.Thread(target=run_client,
                                         args=(ClientConfig(target, "n"), sink, 0.5))
        client_thread.start()  # run_client stops the client after 0.5 s, mid-apply
        client_thread.join(30)
        returned = time.monotonic()
    finally:
        server.stop(0)
    assert not client_thread.is_alive()
    assert len(sink.applied_at) == 1 and sink.applied_at[0] <= returned


def test_messages_split_anywhere_or_packed_into_one_frame_all_arrive(tmp_path: Path) -> None:
    """How a brain frames its messages is its business (grpc-go packs them,
    a slow link splits them): 7-byte DATA frames cut every prefix and body."""
    names = [f"svc-{i}" for i in range(20)]
    ops = [set_service(service(name, v4=[f"10.96.0.{i + 1}"])) for i, name in enumerate(names)]
    payload = framed(reset(), *ops[:10], sync(), *ops[10:], sync())
    for frame_size in (7, len(payload)):
        brain = H2Brain(payload, frame_size)
        target = brain.start(tmp_path / f"h2-{frame_size}.sock")
        sink = RecordingSink()
        sink.stop_after = 2
        try:
            run_client(ClientConfig(target, "n"), sink, 20)
        finally:
            brain.stop()
        paths = [[op.Set.Ref.Path for op in ops if op.HasField("Set")] for ops in sink.changesets]
        assert paths == [[f"default/{n}" for n in names[:10]], [f"default/{n}" for n in names[10:]]]
        assert sink.errors == [] and brain.streams == 1


def test_a_length_prefix_over_the_limit_is_refused_before_its_bytes_come(
        tmp_path: Path) -> None:
    """A brain that claims a 1 GiB message and sends 10 bytes of it: the
    client refuses it from the prefix (one oversized-message count) instead
    of waiting for, or buffering, a gigabyte."""
    brain = H2Brain(framed(reset()) + struct.pack(">?I", False, 1 << 30) + b"x" * 10)
    target = brain.start(tmp_path / "h2.sock")

    sink, metrics = RecordingSink(stop_at_error=True), Metrics()
    try:
        run_client(ClientConfig(target, "n", max_msg_size=4096, changeset_stall_timeout=600,
                                error_delay=600), sink, 20, metrics)
    finally:
        brain.stop()
    assert len(sink.errors) == 1 and "a message of 1073741824 bytes" in sink.errors[0]
    assert "raise --max-msg-size" in sink.errors[0]
    assert metrics.registry.get_sample_value(
        "kpng_py_skipped_total", {"reason": "oversized-message"}) == 1


def test_a_change_set_before_a_bad_prefix_in_the_same_read_is_applied(tmp_path: Path) -> None:
    """Messages are split out of everything received at once: a whole change
    set followed by a prefix over the limit is still handed over, and then
    the stream fails."""
    web = set_service(service("web", v4=["10.96.0.1"]))
    brain = H2Brain(framed(reset(), web, sync()) + struct.pack(">?I", False, 1 << 30))
    target = brain.start(tmp_path / "h2.sock")

    sink = RecordingSink(stop_at_error=True)
    try:
        run_client(ClientConfig(target, "n", max_msg_size=4096, error_delay=600), sink, 20)
    finally:
        brain.stop()
    assert sink.changesets == [[reset(), web, sync()]]
    assert len(sink.errors) == 1 and "a message of 1073741824 bytes" in sink.errors[0]


def test_ops_before_a_status_and_reset_read_at_once_are_a_cut_short_change_set(
        tmp_path: Path) -> None:
    """A brain that fails mid change set, its ops, status and reset arriving
    in one read, before the client has looked at its headers: the ops were
    received, so they are a change set cut short (one count, the brain's
    reason), not lost as if nothing had come."""
    lost = set_service(service("lost", v4=["10.96.0.1"]))
    brain = H2Brain(framed(reset(), lost), end_status=(14, "brain crashed"))
    target = brain.start(tmp_path / "h2.sock")

    sink, metrics = RecordingSink(stop_at_error=True), Metrics()
    try:
        run_client(ClientConfig(target, "n", error_delay=600), sink, 20, metrics)
    finally:
        brain.stop()
    assert sink.errors == ["UNAVAILABLE: brain crashed"] and [len(p) for p in sink.partials] == [2]
    assert metrics.registry.get_sample_value(
        "kpng_py_skipped_total", {"reason": "incomplete-changeset"}) == 1


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, TLSFiles]:
    ca = make_ca(tmp_path, "ca")
    other_ca = make_ca(tmp_path, "other-ca")
    return {
        "server": make_leaf(tmp_path, "server", ca),
        "client": make_leaf(tmp_path, "client", ca),
        "stranger": make_leaf(tmp_path, "stranger", other_ca),
    }


@pytest.mark.parametrize("tcp", [True, False], ids=["tcp", "unix"])
def test_tls_with_kpng_style_flags(tmp_path: Path, pki: dict[str, TLSFiles], tcp: bool) -> None:
    """Over a unix socket the server's certificate is checked for localhost."""
    source = ScriptedSource([changeset("a")])
    server, target = start(source, tmp_path, tls=pki["server"], tcp=tcp)
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


def test_one_warning_per_brain_outage_and_one_line_when_it_ends(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three failed streams in a row are one outage: a warning, then info
    lines; the change set applied after it ends it; the next failure is a
    new outage, so a warning again."""
    failure = Reply((), close_reason="UNAVAILABLE: brain restarting")
    source = ScriptedSource([failure, failure, failure, changeset("a"), failure,
                             changeset("b")])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    sink.stop_after = 2
    try:
        with caplog.at_level(logging.INFO, logger="kpng_py.watch.client"):
            run_client(ClientConfig(target, "n", error_delay=0.05, max_error_delay=0.05),
                       sink, 20)
    finally:
        server.stop(0)
    told = [(r.levelname, r.getMessage(), record_fields(r).get("failures_in_outage"))
            for r in caplog.records if r.name == "kpng_py.watch.client"
            and r.getMessage() != "reconnecting to the brain"]
    assert told == [
        ("WARNING", "watch stream to the brain failed", None),
        ("INFO", "watch stream to the brain failed", 2),
        ("INFO", "watch stream to the brain failed", 3),
        ("INFO", "watch stream to the brain is back", None),
        ("WARNING", "watch stream to the brain failed", None),
        ("INFO", "watch stream to the brain is back", None),
    ]
    back = [record_fields(r) for r in caplog.records if r.getMessage().endswith("is back")]
    assert [b["failed_streams"] for b in back] == [3, 1] and all(b["outage_s"] > 0 for b in back)
