"""The brain over a real unix socket, watched by the foundation's WatchClient,
while the test edits the state file."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from grpclib.exceptions import StreamTerminatedError
from grpclib.utils import Wrapper

from kpng_py.api import WATCH_METHOD, localv1
from kpng_py.brain.source import BrainSource
from kpng_py.serve.server import LocalApiServer, Reply, _WatchStreams
from kpng_py.transport import AddressError, ListenAddress
from tests.streams.build import reset, set_raw, sync
from tests.support.grpcio_server import RawWatch
from tests.support.state_files import (
    DNS,
    NODES,
    W1,
    W2,
    WAIT_SECONDS,
    Brain,
    StateFile,
    endpoint,
    op_kinds,
    port,
    service,
    state,
    wait_until,
    web,
)
from tests.support.watch import ScriptedSource, changeset

START = state(web(W1, W2), DNS, nodes=NODES)


def test_each_node_gets_its_own_view_and_live_edits(start_brain) -> None:
    brain: Brain = start_brain(START)
    n1, n2 = brain.client("n1"), brain.client("n2")

    first1, first2 = n1.next(), n2.next()
    assert first1.op_kinds() == [
        "Reset", "Set services/default/dns", "Set services/default/web",
        "Set endpoints/default/dns/d1", "Set endpoints/default/dns/d2",
        "Set endpoints/default/web/w1", "Set endpoints/default/web/w2", "Sync"]
    assert first1.changes.full
    assert first1.endpoints() == {
        "default/dns:dns/UDP": ["10.1.1.2:5353"],  # internal traffic stays on n1
        "default/web:http/TCP": ["10.1.1.1:8080", "10.1.2.1:8081", "[fd00:1::1]:8080"]}
    assert first2.endpoints()["default/dns:dns/UDP"] == ["10.1.2.2:5353"]
    assert first1.printed["servicePorts"][1]["clusterIPs"] == ["10.96.0.10", "fd00:96::10"]

    # Every endpoint with zone hints, one for zone z2 only: n2 gets it, n1
    # gets nothing at all (hints alone change no endpoint's bytes).
    w1, w2 = ({**info, "hints": {"zones": ["z1", "z2"]}} for info in (W1, W2))
    w3 = endpoint("10.1.2.3", node="n2", pod="w3", overrides={"http": 8082},
                  hints={"zones": ["z2"]})
    brain.state_file.write(state(web(w1, w2, w3), DNS, nodes=NODES))
    step = n2.next()
    assert step.op_kinds() == ["Set endpoints/default/web/w3", "Sync"]
    assert step.endpoints()["default/web:http/TCP"] == [
        "10.1.1.1:8080", "10.1.2.1:8081", "10.1.2.3:8082", "[fd00:1::1]:8080"]

    # w1 not ready, a new service with a port resolved by target port name.
    w1_not_ready = {**w1, "conditions": {"ready": False}}
    api = service("api", ("10.96.0.30",), [port("grpc", number=9000, targetportname="grpc-api")],
                  [endpoint("10.1.1.5", node="n1", pod="a1", overrides={"grpc-api": 9443})])
    brain.state_file.write(state(web(w1_not_ready, w2, w3), DNS, api, nodes=NODES))
    step = n1.next()  # the first change set n1 gets since the start
    assert step.op_kinds() == ["Set services/default/api", "Delete endpoints/default/web/w1",
                               "Set endpoints/default/api/a1", "Sync"]
    assert step.endpoints() == {
        "default/api:grpc/TCP": ["10.1.1.5:9443"],
        "default/dns:dns/UDP": ["10.1.1.2:5353"],
        "default/web:http/TCP": ["10.1.2.1:8081"]}
    assert n2.next().op_kinds() == ["Set services/default/api", "Delete endpoints/default/web/w1",
                                    "Set endpoints/default/api/a1", "Sync"]

    # A service removed: its endpoints are deleted first. The node that had
    # only one of them in its view is told about that one only.
    brain.state_file.write(state(web(w1_not_ready, w2, w3), api, nodes=NODES))
    step = n1.next()
    assert step.op_kinds() == ["Delete endpoints/default/dns/d1", "Delete endpoints/default/dns/d2",
                               "Delete services/default/dns", "Sync"]
    assert [c.name.name for c in step.changes.removed] == ["dns"]
    assert n2.next().op_kinds() == step.op_kinds()
    assert n1.pending() == n2.pending() == 0


def test_edits_that_change_nothing_send_nothing(start_brain) -> None:
    brain: Brain = start_brain(START)
    client = brain.client("n1")
    client.next()
    version = brain.watcher.snapshots.version
    brain.state_file.write("# the same state, another text\n" + brain.state_file.path.read_text())
    not_ready = endpoint("10.1.9.9", node="n1", pod="w9", conditions={"ready": False})
    brain.state_file.write(state(web(W1, W2, not_ready), DNS, nodes=NODES))
    brain.wait_version(version + 1)  # published, but nothing in n1's view changed
    brain.state_file.write(state(web(W1), DNS, nodes=NODES))
    assert client.next().op_kinds() == ["Delete endpoints/default/web/w2", "Sync"]


def test_a_bad_edit_changes_nothing_and_the_next_good_one_applies(
        start_brain, caplog: pytest.LogCaptureFixture) -> None:
    brain: Brain = start_brain(START)
    client = brain.client("n1")
    client.next()
    text = brain.state_file.path.read_text()
    brain.state_file.write(text.replace("10.1.2.1", "10.1.2.256"))
    wait_until(lambda: any(r.levelno == logging.ERROR for r in caplog.records),
               "the bad file's error")
    brain.state_file.write(state(web(W1), DNS, nodes=NODES))
    assert client.next().op_kinds() == ["Delete endpoints/default/web/w2", "Sync"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "'10.1.2.256' is not an IP address" in errors[0]


def test_a_client_that_reconnects_gets_the_full_state_again(start_brain) -> None:
    brain: Brain = start_brain(START)
    first = brain.client("n1")
    first.next()
    first.stop()
    again = brain.client("n1")
    applied = again.next()
    assert applied.op_kinds()[0] == "Reset"
    assert applied.changes.full and len(applied.changes.added) == 2


def test_a_brain_restart_is_churn_free_for_the_backend(start_brain) -> None:
    """The client resyncs on a new stream; its backend sees only what changed
    while the brain was away, not a flush and rebuild."""
    brain: Brain = start_brain(START)
    client = brain.client("n1")
    client.next()
    brain.stop_server()
    assert client.sink.stream_errors.get(timeout=WAIT_SECONDS)
    moved = {**W2, "endpoint": {"ips": {"v4": ["10.1.2.9"]},
                                "portoverrides": [{"name": "http", "port": 8081}]}}
    brain.state_file.write(state(web(W1, moved), DNS, nodes=NODES))
    brain.wait_version(2)
    brain.start_server()
    applied = client.next()
    assert applied.op_kinds()[0] == "Reset"  # a new stream starts over ...
    changes = applied.changes  # ... and the backend sees the one real change
    assert not changes.full and not changes.added and not changes.removed
    ((before, after),) = changes.updated
    assert str(after.name) == "default/web:http"
    assert [str(e) for e in after.cluster_endpoints()] == [
        "10.1.1.1:8080", "10.1.2.9:8081", "[fd00:1::1]:8080"]
    assert [str(e) for e in before.cluster_endpoints()] == [
        "10.1.1.1:8080", "10.1.2.1:8081", "[fd00:1::1]:8080"]


def test_the_unix_socket_is_owner_only_and_removed_on_stop(start_brain) -> None:
    brain: Brain = start_brain(START)
    assert stat.S_IMODE(os.stat(brain.socket).st_mode) == 0o600
    brain.stop_server()
    assert not brain.socket.exists()


def test_a_stale_socket_is_replaced(state_file: StateFile, socket_dir: Path) -> None:
    path = socket_dir / "brain.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: a crashed brain's leftover
    state_file.write(START)
    brain = Brain(state_file, path)
    try:
        assert brain.client("n1").next().changes.full
    finally:
        brain.close()


def test_a_live_socket_or_another_file_is_not_taken_over(
        start_brain, socket_dir: Path) -> None:
    brain: Brain = start_brain(START)
    source = BrainSource(brain.watcher.snapshots)
    with pytest.raises(AddressError, match="is in use by a running server"):
        LocalApiServer(source, ListenAddress(unix_path=brain.socket)).start()
    brain.client("n1").next()  # the running brain still serves
    other = socket_dir / "not-a-socket"
    other.write_text("data")
    with pytest.raises(AddressError, match="exists and is not a socket"):
        LocalApiServer(source, ListenAddress(unix_path=other)).start()
    assert other.read_text() == "data"


def _refuses_connections(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return True
    finally:
        probe.close()
    return False


def _big_reply() -> Reply:
    """A full state far larger than the transport's flow-control windows."""
    value = localv1.Service(Name="x" * 80).SerializeToString()
    return Reply((reset(), *(set_raw(localv1.ServicesSet, f"default/s{i}", value)
                             for i in range(80_000)), sync()))


def test_a_stopping_brain_leaves_the_socket_of_its_successor(socket_dir: Path) -> None:
    """The old brain stops listening, then drains a reply to a slow client for
    its grace period; meanwhile a new brain, finding the socket no longer
    answered, replaces it. When the old one is done it must not remove the new
    one's socket (grpcio itself unlinks the path it bound): backends must be
    able to reach the new brain."""
    path = socket_dir / "brain.sock"
    old_source = ScriptedSource([_big_reply()])
    old = LocalApiServer(old_source, ListenAddress(unix_path=path))
    old.start()
    slow = grpc.insecure_channel(f"unix://{path}")
    requests: queue.Queue[localv1.WatchReq | None] = queue.Queue()
    requests.put(localv1.WatchReq(NodeName="n1"))
    unread = slow.stream_stream(WATCH_METHOD,
                                request_serializer=localv1.WatchReq.SerializeToString,
                                response_deserializer=localv1.OpItem.FromString)(
        iter(requests.get, None))  # never read: the reply stalls on flow control
    successor: LocalApiServer | None = None
    try:
        wait_until(lambda: bool(old_source.requests), "the old brain to answer")
        stopping = threading.Thread(target=old.stop, kwargs={"grace": 3.0})
        stopping.start()
        wait_until(lambda: _refuses_connections(path), "the old brain to stop listening")
        successor = LocalApiServer(ScriptedSource([changeset("new")]),
                                   ListenAddress(unix_path=path))
        successor.start()
        assert stopping.is_alive()  # the race of the issue: the old one is still stopping
        stopping.join(WAIT_SECONDS)
        assert not stopping.is_alive()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        with grpc.insecure_channel(f"unix://{path}") as channel:
            watch = channel.stream_stream(WATCH_METHOD,
                                          request_serializer=localv1.WatchReq.SerializeToString,
                                          response_deserializer=localv1.OpItem.FromString)
            answer = watch(iter([localv1.WatchReq(NodeName="n1")]), timeout=WAIT_SECONDS)
            assert op_kinds(answer) == ["Reset", "Set services/default/new", "Sync"]
    finally:
        requests.put(None)
        unread.cancel()
        slow.close()
        old.stop(grace=0)
        if successor is not None:
            successor.stop(grace=0)
    assert not path.exists()  # the successor removes its own


def test_a_stopping_brain_closes_waiting_streams_with_unavailable(start_brain) -> None:
    brain: Brain = start_brain(START)
    with grpc.insecure_channel(f"unix://{brain.socket}") as channel:
        requests: queue.Queue[localv1.WatchReq | None] = queue.Queue()
        watch = channel.stream_stream(WATCH_METHOD,
                                      request_serializer=localv1.WatchReq.SerializeToString,
                                      response_deserializer=localv1.OpItem.FromString)
        responses = watch(iter(requests.get, None))
        requests.put(localv1.WatchReq(NodeName="n1"))
        for op in responses:
            if op.WhichOneof("Op") == "Sync":
                break
        brain.stop_server()  # grace 0; the stream waits for the client's next WatchReq
        with pytest.raises(grpc.RpcError) as failure:
            next(responses)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert failure.value.details() == "the brain is stopping"
        requests.put(None)


def test_a_stopping_brain_finishes_the_reply_it_is_sending(socket_dir: Path) -> None:
    """Stopped while a full state far larger than the flow-control windows
    is on its way, the server stops listening at once and still sends the
    client every op of it (within its grace period), then UNAVAILABLE."""
    path = socket_dir / "brain.sock"
    reply = _big_reply()
    server = LocalApiServer(ScriptedSource([reply]), ListenAddress(unix_path=path))
    server.start()
    stopping = threading.Thread(target=server.stop, kwargs={"grace": 4 * WAIT_SECONDS})
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            watch = RawWatch(channel)
            watch.ask("n1")
            first = watch.next()  # the rest waits for the client to read
            stopping.start()
            wait_until(lambda: _refuses_connections(path), "the server to stop listening")
            rest = watch.changeset()
            with pytest.raises(grpc.RpcError) as failure:
                watch.next()
            watch.close()
    finally:
        if stopping.is_alive():
            stopping.join(WAIT_SECONDS)
        else:
            server.stop(grace=0)  # nothing to do once stopped
    assert [first, *rest] == [op.SerializeToString() for op in reply.ops]
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert failure.value.details() == "the brain is stopping"


class _WaitingH2Stream:
    """What the handler reads a WatchReq from: nothing comes."""

    def __init__(self, wrapper: Wrapper) -> None:
        self.wrapper = wrapper

    async def recv_data(self, size: int) -> bytes:
        await asyncio.Event().wait()
        return b""


def test_a_client_reset_as_the_brain_stops_is_not_answered_with_a_status() -> None:
    """The client resets a waiting stream in the moment the brain stops:
    grpclib cancels the handler through the stream's wrapper; raising
    "the brain is stopping" into that cancellation is what grpclib logs as
    "Failed to handle cancellation" (with three tracebacks; seen in CI)."""
    async def scenario() -> Wrapper:
        streams = _WatchStreams(ScriptedSource([]))
        wrapper = Wrapper()
        stream = SimpleNamespace(_stream=_WaitingH2Stream(wrapper), peer=None)

        async def handle() -> None:  # as grpclib's request_handler runs a method
            with wrapper:
                # A stand-in with only what watch reads of grpclib's Stream.
                await streams.watch(stream)  # type: ignore[arg-type]

        handler = asyncio.ensure_future(handle())
        await asyncio.sleep(0)  # waiting for the WatchReq
        wrapper.cancel(StreamTerminatedError("Stream reset by remote party, error_code: 8"))
        streams.stop()
        with pytest.raises(StreamTerminatedError):
            await handler
        return wrapper

    assert asyncio.run(scenario()).cancel_failed is False
