"""Streams that hold the brain's attention and do nothing must not keep a
real backend from its state, nor cost the brain a thread each; keepalive
pings as often as every second are welcome."""

from __future__ import annotations

import asyncio
import json
import queue
import re
import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from kpng_py.api import WATCH_METHOD, localv1
from tests.support.process import Processes
from tests.support.state_files import (
    DNS,
    W1,
    W2,
    WAIT_SECONDS,
    Brain,
    StateFile,
    op_kinds,
    state,
    web,
)

START = state(web(W1, W2), DNS)
NO_PROBES = ("--healthz-bind-address", "", "--metrics-bind-address", "")
# Far more than grpcio's thread-pool server had workers (128).
IDLE_STREAMS = 500
IDLE_CONNECTIONS = 50
# What the brain may run however many streams it serves: its main thread,
# the server's event loop, the file watcher, the signal thread (4 with
# grpclib's server; 11 with grpcio's, whose small pool did not grow either).
MAX_BRAIN_THREADS = 32


class IdleStreams:
    """Raw grpcio Watch streams on an event loop of their own, spread over
    several connections: a third never send a WatchReq; the others send one,
    take the answer's first op, and never send the next."""

    def __init__(self, target: str, streams: int, connections: int) -> None:
        self._target = target
        self._streams, self._connections = streams, connections
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._channels: list[grpc.aio.Channel] = []
        self._calls: list[grpc.aio.StreamStreamCall[localv1.WatchReq, localv1.OpItem]] = []

    def open(self) -> None:
        self._run(self._open())

    def still_open(self) -> int:
        return sum(1 for call in self._calls if not call.done())

    def close(self) -> None:
        self._run(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_SECONDS)
        self._loop.close()

    def _run(self, coroutine) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    async def _open(self) -> None:
        # A local subchannel pool: one connection per channel, not one shared.
        self._channels = [grpc.aio.insecure_channel(self._target, options=[
            ("grpc.use_local_subchannel_pool", 1)]) for _ in range(self._connections)]
        for index in range(self._streams):
            channel = self._channels[index % self._connections]
            watch: grpc.aio.StreamStreamMultiCallable[localv1.WatchReq, localv1.OpItem] = (
                channel.stream_stream(
                    WATCH_METHOD, request_serializer=localv1.WatchReq.SerializeToString,
                    response_deserializer=localv1.OpItem.FromString))
            self._calls.append(watch())
        await asyncio.gather(*(self._start(index, call) for index, call in enumerate(self._calls)))

    async def _start(self, index: int,
                     call: grpc.aio.StreamStreamCall[localv1.WatchReq, localv1.OpItem]) -> None:
        if index % 3 == 0:
            await call.wait_for_connection()
            return
        await call.write(localv1.WatchReq(NodeName=f"idle-{index}"))
        first = await call.read()
        assert isinstance(first, localv1.OpItem) and first.WhichOneof("Op") == "Reset"

    async def _close(self) -> None:
        for call in self._calls:
            call.cancel()
        await asyncio.gather(*(channel.close() for channel in self._channels))
        # What grpcio leaves running for the calls ends here, not with the loop.
        leftovers = asyncio.all_tasks() - {asyncio.current_task()}
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    threads = re.search(r"^Threads:\s+(\d+)$", status, re.MULTILINE)
    assert threads, status
    return int(threads.group(1))


@pytest.fixture
def run(tmp_path: Path) -> Iterator:
    with Processes(tmp_path) as processes:
        yield processes.start


def test_idle_streams_neither_starve_a_real_backend_nor_cost_threads(
        run, state_file: StateFile, socket_dir: Path) -> None:
    state_file.write(START)
    sock = socket_dir / "brain.sock"
    brain = run("file", "-i", str(state_file.path), "to-api", "--listen", f"unix://{sock}")
    brain.wait_for_log("serving localv1")
    threads_before = _threads(brain.pid)
    idle = IdleStreams(f"unix://{sock}", IDLE_STREAMS, IDLE_CONNECTIONS)
    try:
        idle.open()
        backend = run("local", "--api", f"unix://{sock}", "--node-name", "n1",
                      "--exit-after", "2", *NO_PROBES, "to-print")
        first = json.loads(backend.line())
        assert [p["name"] for p in first["servicePorts"]] == ["default/dns:dns",
                                                              "default/web:http"]
        state_file.write(state(web(W1, W2)))
        later = json.loads(backend.line())
        assert [p["name"] for p in later["servicePorts"]] == ["default/web:http"]
        assert backend.wait() == 0
        threads_with_streams = _threads(brain.pid)
        assert idle.still_open() == IDLE_STREAMS
    finally:
        idle.close()
    print(f"brain threads: {threads_before} before, {threads_with_streams} with "
          f"{IDLE_STREAMS} idle streams")
    assert threads_with_streams <= MAX_BRAIN_THREADS
    assert brain.terminate() == 0
    assert "Traceback" not in brain.stderr()


def test_keepalive_pings_every_second_are_accepted(start_brain) -> None:
    """A client pinging an idle stream every second (`--keepalive-time 1`) is
    not sent away with GOAWAY "too_many_pings" (grpc's default policy allows
    a ping every 5 minutes, and 2 strikes): its stream stays up and gets the
    next change."""
    brain: Brain = start_brain(START)
    channel = grpc.insecure_channel(f"unix://{brain.socket}", options=[
        ("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.http2.max_pings_without_data", 0), ("grpc.keepalive_permit_without_calls", 1)])
    requests: queue.Queue[localv1.WatchReq | None] = queue.Queue()
    watch = channel.stream_stream(WATCH_METHOD,
                                  request_serializer=localv1.WatchReq.SerializeToString,
                                  response_deserializer=localv1.OpItem.FromString)
    responses = watch(iter(requests.get, None))
    try:
        requests.put(localv1.WatchReq(NodeName="n1"))
        first = _changeset(responses)
        assert op_kinds(first)[0] == "Reset"
        requests.put(localv1.WatchReq(NodeName="n1"))  # and then idle, pinged, for a while
        time.sleep(6)  # 6 pings: 3 would be enough for a GOAWAY
        brain.state_file.write(state(web(W1, W2)))
        assert op_kinds(_changeset(responses)) == [
            "Delete endpoints/default/dns/d1", "Delete endpoints/default/dns/d2",
            "Delete services/default/dns", "Sync"]
    finally:
        requests.put(None)
        responses.cancel()
        channel.close()


def _changeset(responses: Iterator[localv1.OpItem]) -> list[localv1.OpItem]:
    ops = []
    for op in responses:
        ops.append(op)
        if op.WhichOneof("Op") == "Sync":
            return ops
    raise AssertionError("the stream ended")


def test_the_legacy_method_name_is_served(start_brain) -> None:
    brain: Brain = start_brain(START)
    with grpc.insecure_channel(f"unix://{brain.socket}") as channel:
        watch = channel.stream_stream("/localnetv1.Endpoints/Watch",
                                      request_serializer=localv1.WatchReq.SerializeToString,
                                      response_deserializer=localv1.OpItem.FromString)
        responses = watch(iter([localv1.WatchReq(NodeName="n1")]))
        assert op_kinds(_changeset(responses))[:2] == ["Reset", "Set services/default/dns"]
        responses.cancel()
