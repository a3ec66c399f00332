"""The watch client: one localv1 Watch stream to a brain, kept up forever.

It sends WatchReq, collects ops up to the Sync, hands the change set to its
sink and only then asks for the next one. On any stream or connection error it
reconnects with backoff (first retry after `error_delay`, doubling up to
`max_error_delay`, each stretched by up to a quarter at random); the new stream
starts with Reset and the full state, which `NodeState` turns into real
differences only.

What a brain can send is bounded here, before anything is decoded further:
each message is decoded on its own (an undecodable one is one `bad-op` skip,
the stream goes on); a change set must keep making progress once it started
(`changeset_stall_timeout` between two of its messages) and stay within
`max_changeset_size` bytes, or the stream is dropped and retried with backoff;
gRPC keepalive notices a brain that stopped answering at all (a SIGSTOPped
process, a dead peer behind a live connection). A first message sent very
slowly cannot be told from a quiet brain: grpcio hands over whole messages
only, so a change set starts when its first message is complete.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import grpc
from google.protobuf.message import DecodeError

from kpng_py.api import WATCH_METHOD, localv1
from kpng_py.logs import fields
from kpng_py.metrics import Metrics
from kpng_py.skips import SkipReason, Skips
from kpng_py.transport import TLSFiles

log = logging.getLogger(__name__)

# What grpcio's status details say when a message is over the local
# max_receive_message_length (a brain's own RESOURCE_EXHAUSTED says something else).
_LOCAL_SIZE_LIMIT = "Received message larger than max"
# Retry delays are stretched by a random factor in [1, 1 + JITTER): upward
# only, so --error-delay stays the shortest delay.
JITTER = 0.25


class SinkFailed(Exception):
    """Raised by a sink that cannot go on (its output is gone): the watch
    ends and `WatchClient.run` raises it. Any other exception of a sink is
    taken for a bug downstream, and the client resyncs."""


class OpsSink(Protocol):
    def on_changeset_started(self) -> None:
        """The first message of a change set arrived (its Sync has not)."""

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        """A complete change set, ending with its Sync."""

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        """The stream failed; `partial` holds ops received after the last Sync."""


@dataclass(frozen=True)
class ClientConfig:
    target: str
    node_name: str
    tls: TLSFiles = field(default_factory=TLSFiles)
    max_msg_size: int = 4 << 20
    error_delay: float = 1.0
    max_error_delay: float = 30.0
    # KPNG's brain is a grpc-go server with default settings: it answers pings
    # sent closer than 5 minutes apart on an idle stream with GOAWAY
    # "too_many_pings", so the default stays at 5 minutes.
    keepalive_time: float = 300.0
    keepalive_timeout: float = 20.0
    changeset_stall_timeout: float = 30.0
    max_changeset_size: int = 256 << 20


class Backoff:
    """Retry delays: `first`, then doubling up to `cap`, each times a random
    factor in [1, 1 + JITTER); `reset` starts again from `first`."""

    def __init__(self, first: float, cap: float,
                 random_unit: Callable[[], float] = random.random) -> None:
        self._first, self._cap = first, max(cap, first)
        self._next = first
        self._random_unit = random_unit

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self._cap)
        return delay * (1 + JITTER * self._random_unit())

    def reset(self) -> None:
        self._next = self._first


class _StreamCut(Exception):
    """The client gives up on a stream; `reason` is logged, `skip` counted."""

    def __init__(self, reason: str, skip: SkipReason | None) -> None:
        super().__init__(reason)
        self.reason, self.skip = reason, skip


class _StallGuard:
    """Cancels a stream whose change set stopped making progress: once a
    change set's first message arrived, each next one must come within
    `timeout`. Between change sets (waiting for the brain's next one, or while
    the sink applies) there is no deadline."""

    def __init__(self, call: grpc.Future, timeout: float,
                 clock: Callable[[], float]) -> None:
        self._call, self._timeout, self._clock = call, timeout, clock
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._closed = threading.Event()
        self.tripped = False
        threading.Thread(target=self._run, name="stall-guard", daemon=True).start()

    def progress(self) -> None:
        """A message of a change set arrived (a plain store: once per op)."""
        self._deadline = self._clock() + self._timeout

    def changeset_done(self) -> None:
        with self._lock:  # so that a Sync just in time is never cancelled
            self._deadline = None

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        period = min(max(self._timeout / 4, 0.01), 1.0)  # precise enough, never a busy loop
        while not self._closed.wait(period):
            with self._lock:
                deadline = self._deadline
                if deadline is not None and self._clock() > deadline:
                    self.tripped = True
                    self._call.cancel()
                    return


class WatchClient:
    def __init__(self, config: ClientConfig, sink: OpsSink, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic,
                 random_unit: Callable[[], float] = random.random) -> None:
        self._config = config
        self._sink = sink
        self._metrics = metrics
        self._skips = Skips(metrics)
        self._clock = clock
        self._random_unit = random_unit
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._call: grpc.Future | None = None

    def stop(self) -> None:
        """Stop from any thread; `run` returns soon after. Not from a signal
        handler (it takes a lock): see kpng_py/termination.py."""
        self._stopping.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def run(self) -> None:
        """Watch until `stop()`; never raises for stream or brain errors (only
        SinkFailed, from the sink).

        Backoff starts again from `error_delay` only after a stream that
        applied a change set and stayed up for at least `max_error_delay`: a
        stream that keeps failing soon after its full state (an oversized or
        undecodable message later on, a brain in a crash loop) is then retried
        at most once per `max_error_delay`, each retry being a full resync."""
        config = self._config
        backoff = Backoff(config.error_delay, config.max_error_delay, self._random_unit)
        streams = 0
        while not self._stopping.is_set():
            if streams:
                self._metrics.brain_reconnects.inc()
            streams += 1
            opened = self._clock()
            applied = self._watch_once()
            self._metrics.brain_connected.set(0)
            if self._stopping.is_set():
                break
            if applied and self._clock() - opened >= config.max_error_delay:
                backoff.reset()
            wait = backoff.next()
            log.info("reconnecting to the brain", extra=fields(
                target=config.target, retry_in_s=round(wait, 3)))
            self._stopping.wait(wait)

    def _channel(self) -> grpc.Channel:
        config = self._config
        options = [
            ("grpc.max_receive_message_length", config.max_msg_size),
            ("grpc.max_send_message_length", config.max_msg_size),
            ("grpc.keepalive_time_ms", _milliseconds(config.keepalive_time)),
            ("grpc.keepalive_timeout_ms", _milliseconds(config.keepalive_timeout)),
            # grpcio 1.85 waits for a ping's answer this long (60 s by default),
            # whatever keepalive_timeout_ms says.
            ("grpc.http2.ping_timeout_ms", _milliseconds(config.keepalive_timeout)),
            # A watch stream is idle for hours between change sets: keep pinging.
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if config.tls.enabled:
            return grpc.secure_channel(config.target, config.tls.channel_credentials(), options)
        return grpc.insecure_channel(config.target, options)

    def _watch_once(self) -> bool:
        """One stream. True if it applied at least one change set."""
        requests: queue.SimpleQueue[localv1.WatchReq | None] = queue.SimpleQueue()
        request = localv1.WatchReq(NodeName=self._config.node_name)
        changeset = _ChangeSet(self._config.max_changeset_size)
        applied = False
        guard: _StallGuard | None = None
        with self._channel() as channel:
            # No deserializer: an undecodable message must not fail the call.
            watch = channel.stream_stream(
                WATCH_METHOD, request_serializer=localv1.WatchReq.SerializeToString)
            try:
                with self._lock:
                    if self._stopping.is_set():
                        return applied
                    responses = watch(_until_none(requests))
                    self._call = responses
                guard = _StallGuard(responses, self._config.changeset_stall_timeout, self._clock)
                requests.put(request)
                for message in responses:
                    if not applied and changeset.empty:  # the stream's first message: it is up
                        self._metrics.brain_connected.set(1)
                    if changeset.empty:
                        self._sink.on_changeset_started()
                    guard.progress()
                    if not self._add(changeset, message):
                        continue
                    guard.changeset_done()
                    ops, changeset = changeset.ops, _ChangeSet(self._config.max_changeset_size)
                    self._sink.on_changeset(ops)  # returns once the dataplane has it
                    applied = True
                    if self._stopping.is_set():
                        break
                    requests.put(request)
                else:
                    self._stream_failed("the brain closed the stream", changeset.ops)
            except SinkFailed:
                raise
            except _StreamCut as cut:
                self._stream_failed(cut.reason, changeset.ops, cut.skip)
            except grpc.RpcError as err:
                if not self._stopping.is_set():
                    reason, skip = self._rpc_failure(err, guard)
                    self._stream_failed(reason, changeset.ops, skip)
            except Exception:  # a bug downstream must not stop the watch: resync instead
                log.exception("applying a change set failed; re-opening the stream to resync")
                self._metrics.dataplane_errors.labels("changeset").inc()
            finally:
                if guard is not None:
                    guard.close()
                requests.put(None)
                with self._lock:
                    self._call = None
        return applied

    def _add(self, changeset: _ChangeSet, message: bytes) -> bool:
        """Adds one message to the change set; True when it was its Sync."""
        if not changeset.count(len(message)):
            limit = self._config.max_changeset_size
            raise _StreamCut(
                f"the change set's ops passed --max-changeset-size ({limit} bytes) before its "
                "Sync; dropped and retried (raise the flag if the brain's full state is "
                "really that large)", SkipReason.OVERSIZED_CHANGESET)
        try:
            op = localv1.OpItem.FromString(message)
        except DecodeError as err:
            self._skips.skip(SkipReason.BAD_OP, f"message {changeset.messages} of a change set",
                             f"not an OpItem ({err}); its {len(message)} bytes are dropped, "
                             "the rest of the change set is applied")
            return False
        changeset.ops.append(op)
        return op.WhichOneof("Op") == "Sync"

    def _rpc_failure(self, err: grpc.RpcError,
                     guard: _StallGuard | None) -> tuple[str, SkipReason | None]:
        """What a failed call is reported as, and counted as (beyond a cut-short
        change set)."""
        if guard is not None and guard.tripped:
            return (f"no message for {self._config.changeset_stall_timeout:g} s in the middle "
                    "of a change set (--changeset-stall-timeout)", None)
        reason = f"{err.code().name}: {err.details()}"
        if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and _LOCAL_SIZE_LIMIT in (
                err.details() or ""):
            return (reason + " (raise --max-msg-size above the brain's largest message)",
                    SkipReason.OVERSIZED_MESSAGE)
        if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return "the brain answered " + reason, None
        return reason, None

    def _stream_failed(self, reason: str, partial: list[localv1.OpItem],
                       skip: SkipReason | None = None) -> None:
        """One log line. A message over the size limit, a change set over its
        size limit, or else a change set cut short (ops without their Sync),
        is also counted as skipped: it is never applied, the next stream's
        full state supersedes it."""
        skip = skip or (SkipReason.INCOMPLETE_CHANGESET if partial else None)
        log.warning("watch stream to the brain failed", extra=fields(
            target=self._config.target, node=self._config.node_name, error=reason,
            discarded_ops=len(partial), reason=skip.value if skip else None))
        if skip is not None:
            self._metrics.skipped.labels(skip.value).inc()
        self._sink.on_stream_error(reason, partial)


class _ChangeSet:
    """The messages of one change set so far, and their size in bytes."""

    def __init__(self, max_size: int) -> None:
        self.ops: list[localv1.OpItem] = []
        self.messages = 0
        self._size, self._max_size = 0, max_size

    @property
    def empty(self) -> bool:
        return self.messages == 0

    def count(self, size: int) -> bool:
        """Counts one more message of `size` bytes; False once past the limit."""
        self.messages += 1
        self._size += size
        return self._size <= self._max_size


def _milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))  # 0 would mean something else to grpc


def _until_none(requests: queue.SimpleQueue) -> Iterator[localv1.WatchReq]:
    while (item := requests.get()) is not None:
        yield item
