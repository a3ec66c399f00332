"""The watch client: one localv1 Watch stream to a brain, kept up forever.

It sends WatchReq, collects ops up to the Sync, hands the change set to its
sink and only then asks for the next one. On any stream or connection error it
reconnects with backoff (first retry after `error_delay`, doubling up to
`max_error_delay`); the new stream starts with Reset and the full state, which
`NodeState` turns into real differences only.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import grpc

from kpng_py.api import WATCH_METHOD, localv1
from kpng_py.logs import fields
from kpng_py.metrics import Metrics
from kpng_py.skips import SkipReason
from kpng_py.transport import TLSFiles

log = logging.getLogger(__name__)


class OpsSink(Protocol):
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


class Backoff:
    """Retry delays: `first`, then doubling up to `cap`; reset after a stream
    that worked."""

    def __init__(self, first: float, cap: float) -> None:
        self._first, self._cap = first, max(cap, first)
        self._next = first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self._cap)
        return delay

    def reset(self) -> None:
        self._next = self._first


class WatchClient:
    def __init__(self, config: ClientConfig, sink: OpsSink, metrics: Metrics) -> None:
        self._config = config
        self._sink = sink
        self._metrics = metrics
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._call: grpc.Future | None = None

    def stop(self) -> None:
        """Stop from any thread (or a signal handler); `run` returns soon after."""
        self._stopping.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def run(self) -> None:
        """Watch until `stop()`; never raises for stream or brain errors."""
        backoff = Backoff(self._config.error_delay, self._config.max_error_delay)
        streams = 0
        while not self._stopping.is_set():
            if streams:
                self._metrics.brain_reconnects.inc()
            streams += 1
            healthy = self._watch_once()
            self._metrics.brain_connected.set(0)
            if self._stopping.is_set():
                break
            if healthy:
                backoff.reset()
            wait = backoff.next()
            log.info("reconnecting to the brain", extra=fields(
                target=self._config.target, retry_in_s=wait))
            self._stopping.wait(wait)

    def _channel(self) -> grpc.Channel:
        size = self._config.max_msg_size
        options = [("grpc.max_receive_message_length", size),
                   ("grpc.max_send_message_length", size)]
        if self._config.tls.enabled:
            return grpc.secure_channel(self._config.target,
                                       self._config.tls.channel_credentials(), options)
        return grpc.insecure_channel(self._config.target, options)

    def _watch_once(self) -> bool:
        """One stream. True if it applied at least one change set."""
        requests: queue.SimpleQueue[localv1.WatchReq | None] = queue.SimpleQueue()
        request = localv1.WatchReq(NodeName=self._config.node_name)
        partial: list[localv1.OpItem] = []
        applied = False
        with self._channel() as channel:
            watch = channel.stream_stream(
                WATCH_METHOD,
                request_serializer=localv1.WatchReq.SerializeToString,
                response_deserializer=localv1.OpItem.FromString,
            )
            try:
                with self._lock:
                    if self._stopping.is_set():
                        return applied
                    responses = watch(_until_none(requests))
                    self._call = responses
                requests.put(request)
                for op in responses:
                    if not applied and not partial:  # the stream's first op: it is up
                        self._metrics.brain_connected.set(1)
                    partial.append(op)
                    if op.WhichOneof("Op") != "Sync":
                        continue
                    ops, partial = partial, []
                    self._sink.on_changeset(ops)  # returns once the dataplane has it
                    applied = True
                    if self._stopping.is_set():
                        break
                    requests.put(request)
                else:
                    self._stream_failed("the brain closed the stream", partial)
            except grpc.RpcError as err:
                if not self._stopping.is_set():
                    reason = f"{err.code().name}: {err.details()}"
                    skip = None
                    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        reason += " (raise --max-msg-size above the brain's largest message)"
                        skip = SkipReason.OVERSIZED_MESSAGE
                    self._stream_failed(reason, partial, skip)
            except Exception:  # a bug downstream must not stop the watch: resync instead
                log.exception("applying a change set failed; re-opening the stream to resync")
                self._metrics.dataplane_errors.labels("changeset").inc()
            finally:
                requests.put(None)
                with self._lock:
                    self._call = None
        return applied

    def _stream_failed(self, reason: str, partial: list[localv1.OpItem],
                       skip: SkipReason | None = None) -> None:
        """One log line. A message over the size limit, or else a change set
        cut short (ops without their Sync), is also counted as skipped: it is
        never applied, the next stream's full state supersedes it."""
        skip = skip or (SkipReason.INCOMPLETE_CHANGESET if partial else None)
        log.warning("watch stream to the brain failed", extra=fields(
            target=self._config.target, node=self._config.node_name, error=reason,
            discarded_ops=len(partial), reason=skip.value if skip else None))
        if skip is not None:
            self._metrics.skipped.labels(skip.value).inc()
        self._sink.on_stream_error(reason, partial)


def _until_none(requests: queue.SimpleQueue) -> Iterator[localv1.WatchReq]:
    while (item := requests.get()) is not None:
        yield item
