"""Our server (grpclib) against grpcio, the compatibility reference: a raw
grpcio client gets, message for message, the bytes that grpcio's own server
sends for the same source (the brain, `replay` of recordings, scripted
failures), over a unix socket, TCP and TLS with client certificates; a
failed stream's status and details are grpcio's too. Also what a listener
binds, and that a reply is serialized once however many streams get it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import grpc
import pytest
import yaml

from kpng_py.api import LEGACY_WATCH_METHOD, localv1
from kpng_py.brain.source import BrainSource, StateSnapshots
from kpng_py.brain.statefile import ClusterState, parse_state
from kpng_py.serve.recording import read_segments
from kpng_py.serve.replay import ReplaySource
from kpng_py.serve.server import ChangeSetSource, LocalApiServer, Reply
from kpng_py.transport import ListenAddress, TLSFiles
from lab.localv1_servers import GrpcioBrain, grpcio_channel_credentials
from tests.streams.build import reset, set_service
from tests.streams.build import service as service_message
from tests.support.grpcio_server import RawWatch
from tests.support.state_files import NODES, endpoint, op_kinds, port, service, state
from tests.support.tls import make_ca, make_leaf
from tests.support.watch import ScriptedSource, changeset

STREAMS = Path(__file__).parent.parent / "streams"


def _services(count: int) -> list[dict]:
    """`count` services of three endpoints on n1 and n2, one hinted for z2
    only (the others for z1 and z2: every endpoint has hints)."""
    both = {"zones": ["z1", "z2"]}
    return [service(f"s{i:03}", (f"10.96.{i // 250}.{i % 250 + 1}",), [port("http")], [
        endpoint(f"10.1.{i // 250}.{i % 250 + 1}", node="n1", pod=f"a{i}", hints=both),
        endpoint(f"10.2.{i // 250}.{i % 250 + 1}", node="n2", pod=f"b{i}", hints=both),
        endpoint(f"10.3.{i // 250}.{i % 250 + 1}", node="n2", pod=f"c{i}",
                 hints={"zones": ["z2"]})]) for i in range(count)]


def _state(services: list[dict]) -> ClusterState:
    return parse_state(yaml.safe_dump(state(*services, nodes=NODES)).encode(), "state.yaml")


@dataclass(frozen=True)
class Served:
    """One source served by grpcio and by us, and a raw client of each."""

    ours: LocalApiServer
    reference: GrpcioBrain
    reference_port: int
    channels: tuple[grpc.Channel, grpc.Channel]

    def watches(self, method: str | None = None) -> tuple[RawWatch, RawWatch]:
        args = () if method is None else (method,)
        return RawWatch(self.channels[0], *args), RawWatch(self.channels[1], *args)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, TLSFiles]:
    ca = make_ca(tmp_path, "ca")
    return {"server": make_leaf(tmp_path, "server", ca),
            "client": make_leaf(tmp_path, "client", ca)}


@pytest.fixture(params=["unix", "tcp", "tls"])
def serve(request, socket_dir: Path, pki: dict[str, TLSFiles]) -> Iterator:
    """serve(ours, reference) starts both sources on the transport, each with
    a grpcio channel to it."""
    started: list[Served] = []

    def start(ours_source: ChangeSetSource, reference_source: ChangeSetSource) -> Served:
        tls = pki["server"] if request.param == "tls" else None
        if request.param == "unix":
            listen = ListenAddress.parse(f"unix://{socket_dir / 'ours.sock'}")
            reference_address = f"unix:{socket_dir / 'reference.sock'}"
        else:
            listen = ListenAddress.parse("tcp://127.0.0.1:0")
            reference_address = "127.0.0.1:0"
        ours = LocalApiServer(ours_source, listen, tls)
        ours.start()
        reference = GrpcioBrain(reference_source, reference_address, tls)
        reference_port = reference.start()
        if request.param == "unix":
            targets = (f"unix://{socket_dir / 'ours.sock'}",
                       f"unix://{socket_dir / 'reference.sock'}")
        else:
            targets = (f"127.0.0.1:{ours.port}", f"127.0.0.1:{reference_port}")
        credentials = None if tls is None else grpcio_channel_credentials(pki["client"])

        def channel(target: str) -> grpc.Channel:
            if credentials is None:
                return grpc.insecure_channel(target)
            return grpc.secure_channel(target, credentials)

        served = Served(ours, reference, reference_port, (channel(targets[0]), channel(targets[1])))
        started.append(served)
        return served

    yield start
    for served in started:
        for channel in served.channels:
            channel.close()
        served.ours.stop(grace=0)
        served.reference.stop()


def test_the_brains_answers_are_grpcios_bytes(serve: Callable[..., Served]) -> None:
    first, second = _state(_services(300)), _state(_services(299)[1:] + _services(302)[299:])
    ours, reference = StateSnapshots(first), StateSnapshots(first)
    served = serve(BrainSource(ours), BrainSource(reference))
    (n1, n1_reference), (n2, n2_reference) = served.watches(), served.watches()
    try:
        for watch in (n1, n1_reference, n2, n2_reference):
            watch.ask("n1" if watch in (n1, n1_reference) else "n2")
        full = n1.changeset()
        assert len(full) == 1 + 300 + 600 + 1
        assert full == n1_reference.changeset()
        assert n2.changeset() == n2_reference.changeset()
        for snapshots in (ours, reference):
            snapshots.publish(second)
        for watch in (n1, n1_reference):
            watch.ask("n1")
        difference = n1.changeset()
        assert op_kinds(localv1.OpItem.FromString(m) for m in difference) == [
            "Set services/default/s300", "Set services/default/s301",
            "Delete endpoints/default/s000/a0", "Delete endpoints/default/s000/b0",
            "Set endpoints/default/s300/a300", "Set endpoints/default/s300/b300",
            "Set endpoints/default/s301/a301", "Set endpoints/default/s301/b301",
            "Delete services/default/s000", "Sync"]
        assert difference == n1_reference.changeset()
    finally:
        for watch in (n1, n1_reference, n2, n2_reference):
            watch.close()


def _replayed(watch_factory: Callable[[], RawWatch], segments: int) -> list[object]:
    """What a raw client gets for each of `segments` WatchReqs: the messages
    of each change set, and each stream failure's code and details (then a
    new stream continues)."""
    got: list[object] = []
    watch = watch_factory()
    try:
        for _ in range(segments):
            watch.ask("node-a")
            messages: list[bytes] = []
            try:
                while not messages or \
                        localv1.OpItem.FromString(messages[-1]).WhichOneof("Op") != "Sync":
                    messages.append(watch.next())
            except grpc.RpcError as failure:
                got += [messages, (failure.code(), failure.details())]
                watch.close()
                watch = watch_factory()
            else:
                got.append(messages)
    finally:
        watch.close()
    return got


@pytest.mark.parametrize("name", ["reconnect", "large-state", "bad-inputs"])
def test_replayed_recordings_are_grpcios_bytes(serve: Callable[..., Served], name: str) -> None:
    segments = read_segments(STREAMS / f"{name}.jsonl")
    served = serve(ReplaySource(segments), ReplaySource(segments))
    ours = _replayed(lambda: RawWatch(served.channels[0]), len(segments))
    reference = _replayed(lambda: RawWatch(served.channels[1]), len(segments))
    assert ours == reference
    recorded = [[op.SerializeToString() for op in s.ops] for s in segments]
    assert [m for m in ours if isinstance(m, list)] == recorded


def test_a_failed_stream_has_grpcios_status_and_details(serve: Callable[..., Served]) -> None:
    def script() -> ScriptedSource:
        cut_short = Reply((reset(), set_service(service_message("lost"))),
                          close_reason="brain crashed")
        return ScriptedSource([cut_short, Reply((), close_reason="UNAVAILABLE: at once")])

    served = serve(script(), script())
    ours = _replayed(lambda: RawWatch(served.channels[0]), 2)
    reference = _replayed(lambda: RawWatch(served.channels[1]), 2)
    assert ours == reference
    assert ours[1] == (grpc.StatusCode.UNAVAILABLE, "brain crashed")
    assert ours[2:] == [[], (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE: at once")]


def test_the_legacy_method_gets_the_same_bytes(serve: Callable[..., Served]) -> None:
    served = serve(ScriptedSource([changeset("web")]), ScriptedSource([changeset("other")]))
    legacy, _ = served.watches(LEGACY_WATCH_METHOD)
    try:
        legacy.ask("n1")
        assert legacy.changeset() == [op.SerializeToString() for op in changeset("web").ops]
    finally:
        legacy.close()


class _CountedOps(tuple):
    """A reply's ops that count how often they are gone through."""

    def __iter__(self):  # noqa: ANN204 - tuple's
        self.passes += 1
        return super().__iter__()

    passes = 0


def test_a_reply_given_to_several_streams_is_serialized_once(
        socket_dir: Path) -> None:
    ops = _CountedOps(changeset("web").ops)
    shared = Reply(ops)
    path = socket_dir / "b.sock"
    server = LocalApiServer(ScriptedSource([shared, shared, shared]),
                            ListenAddress(unix_path=path))
    server.start()
    watches: list[RawWatch] = []
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            watches = [RawWatch(channel) for _ in range(3)]
            for watch in watches:
                watch.ask("n1")
            answers = [watch.changeset() for watch in watches]
            for watch in watches:
                watch.close()
    finally:
        server.stop(grace=0)
    assert answers == [[op.SerializeToString() for op in changeset("web").ops]] * 3
    assert ops.passes == 1


@pytest.mark.parametrize("request_bytes, compression, code, details", [
    (b"\xff\xff\xff", None, grpc.StatusCode.INVALID_ARGUMENT, "not a localv1 WatchReq"),
    (b"\x0a" + b"\xff" * 5, None, grpc.StatusCode.INVALID_ARGUMENT, "not a localv1 WatchReq"),
    (localv1.WatchReq(NodeName="n" * 5_000_000).SerializeToString(), None,
     grpc.StatusCode.RESOURCE_EXHAUSTED, "a request of 5000005 bytes, more than 4194304"),
    (localv1.WatchReq(NodeName="n" * 5_000_000).SerializeToString(), grpc.Compression.Gzip,
     grpc.StatusCode.RESOURCE_EXHAUSTED, "a compressed request of more than 4194304 bytes"),
])
def test_a_bad_request_fails_its_stream_only(
        socket_dir: Path, request_bytes: bytes, compression: grpc.Compression | None,
        code: grpc.StatusCode, details: str, caplog: pytest.LogCaptureFixture) -> None:
    path = socket_dir / "b.sock"
    server = LocalApiServer(ScriptedSource([changeset("web")]), ListenAddress(unix_path=path))
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            # No (de)serializer: bytes both ways.
            raw: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
                "/localv1.Sets/Watch")
            with pytest.raises(grpc.RpcError) as failure:
                list(raw(iter([request_bytes]), timeout=10, compression=compression))
            assert failure.value.code() == code
            assert details in str(failure.value.details())
            good = RawWatch(channel)
            good.ask("n1")
            assert len(good.changeset()) == 3
            good.close()
    finally:
        server.stop(grace=0)
    assert "Traceback" not in caplog.text and not [
        r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_a_compressed_watchreq_is_answered(socket_dir: Path,
                                           compression: grpc.Compression) -> None:
    path = socket_dir / "b.sock"
    source = ScriptedSource([changeset("web")])
    server = LocalApiServer(source, ListenAddress(unix_path=path))
    server.start()
    node = "node-" + "n" * 10_000  # long enough for grpcio to compress it
    try:
        with grpc.insecure_channel(f"unix://{path}", compression=compression) as channel:
            watch = RawWatch(channel)
            watch.ask(node)
            assert len(watch.changeset()) == 3
            watch.close()
    finally:
        server.stop(grace=0)
    assert source.requests == [(node, False)]


def test_tls_with_a_ca_requires_a_client_certificate(
        socket_dir: Path, pki: dict[str, TLSFiles]) -> None:
    source = ScriptedSource([changeset("web")])
    server = LocalApiServer(source, ListenAddress.parse("tcp://127.0.0.1:0"), pki["server"])
    server.start()
    try:
        only_ca = grpcio_channel_credentials(TLSFiles(ca=pki["client"].ca))
        with grpc.secure_channel(f"127.0.0.1:{server.port}", only_ca) as channel:
            watch = RawWatch(channel)
            watch.ask("n1")
            with pytest.raises(grpc.RpcError) as failure:
                watch.changeset()
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            watch.close()
    finally:
        server.stop(grace=0)
    assert source.requests == []


def _answers(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        watch = RawWatch(channel)
        watch.ask("n1")
        try:
            return len(watch.changeset())
        finally:
            watch.close()


@pytest.mark.parametrize("spec, targets", [
    ("tcp://:0", ("127.0.0.1", "[::1]")),  # grpcio's [::]: one dual-stack socket
    ("tcp://localhost:0", ("127.0.0.1",)),  # a name: the addresses it resolves to
])
def test_tcp_listens_on_every_address_of_its_host(spec: str, targets: tuple[str, ...]) -> None:
    server = LocalApiServer(ScriptedSource([changeset("web"), changeset("web")]),
                            ListenAddress.parse(spec))
    server.start()
    try:
        assert server.port != 0
        assert [_answers(f"{host}:{server.port}") for host in targets] == [3] * len(targets)
    finally:
        server.stop(grace=0)
