"""A localv1 server that sends raw bytes: what a hostile or broken brain can
put on the wire that kpng-py's own server never would (undecodable messages,
any status, stalls in the middle of a change set)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence, Union

import grpc

from kpng_py.api import WATCH_METHOD, localv1


@dataclass(frozen=True)
class Abort:
    """End the stream with this status."""

    code: grpc.StatusCode
    details: str


@dataclass(frozen=True)
class Stall:
    """Send nothing more on this stream until the client gives up on it."""


# One answer to a WatchReq: raw messages (an OpItem is serialized), then maybe an Abort or a Stall.
Step = Union[bytes, localv1.OpItem, Abort, Stall]


class RawBrain:
    """Answers the n-th WatchReq (over all streams) with `replies[n]`; once
    they are used up, with `then` for every request (if given), or else with
    nothing (a quiet brain)."""

    def __init__(self, replies: Sequence[Sequence[Step]] = (),
                 then: Sequence[Step] | None = None) -> None:
        self._replies = list(replies)
        self._then = then
        self._lock = threading.Lock()
        self.streams = 0
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8))
        # No serializer: _watch answers with the bytes to send.
        handler: grpc.RpcMethodHandler[localv1.WatchReq, bytes] = (
            grpc.stream_stream_rpc_method_handler(
                self._watch, request_deserializer=localv1.WatchReq.FromString))
        service, name = WATCH_METHOD.lstrip("/").split("/")
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {name: handler}),))

    def start(self, socket: Path) -> str:
        """Listen on a unix socket; returns the client's target."""
        self._server.add_insecure_port(f"unix:{socket}")
        self._server.start()
        return f"unix://{socket}"

    def stop(self) -> None:
        self._server.stop(0).wait()

    def _next_reply(self) -> Sequence[Step] | None:
        with self._lock:
            if self._replies:
                return self._replies.pop(0)
            return self._then

    def _watch(self, requests: Iterator[localv1.WatchReq],
               context: grpc.ServicerContext) -> Iterator[bytes]:
        with self._lock:
            self.streams += 1
        done = threading.Event()
        context.add_callback(done.set)
        for _ in requests:
            reply = self._next_reply()
            if reply is None:
                done.wait()
                return
            for step in reply:
                if isinstance(step, Abort):
                    context.abort(step.code, step.details)
                if isinstance(step, Stall):
                    done.wait()
                    return
                yield step if isinstance(step, bytes) else step.SerializeToString()
