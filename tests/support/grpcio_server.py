"""A raw grpcio client that reads a Watch stream's messages as the bytes
received: with `lab.localv1_servers.GrpcioBrain` (grpcio's serving, as
kpng-py's brain served before it moved to grpclib), the compatibility
reference that tests compare our server's bytes with."""

from __future__ import annotations

import queue
from typing import TypeVar

import grpc

from kpng_py.api import WATCH_METHOD, localv1
from tests.support.process import WAIT_SECONDS

T = TypeVar("T")


class RawWatch:
    """A grpcio Watch stream whose messages are read as the bytes received;
    ask() sends a WatchReq, changeset() reads up to the next Sync."""

    def __init__(self, channel: grpc.Channel, method: str = WATCH_METHOD) -> None:
        self._requests: queue.Queue[localv1.WatchReq | None] = queue.Queue()
        # No deserializer: the responses are the bytes received.
        call: grpc.StreamStreamMultiCallable[localv1.WatchReq, bytes] = channel.stream_stream(
            method, request_serializer=localv1.WatchReq.SerializeToString)
        self._responses = call(iter(self._requests.get, None), timeout=WAIT_SECONDS * 4)

    def ask(self, node_name: str) -> None:
        self._requests.put(localv1.WatchReq(NodeName=node_name))

    def changeset(self) -> list[bytes]:
        messages = []
        for message in self._responses:
            messages.append(message)
            if localv1.OpItem.FromString(message).WhichOneof("Op") == "Sync":
                return messages
        raise AssertionError(f"the stream ended after {len(messages)} messages")

    def next(self) -> bytes:
        return next(self._responses)

    def close(self) -> None:
        self._requests.put(None)
        self._responses.cancel()

