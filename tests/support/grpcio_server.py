"""grpcio's serving of a ChangeSetSource, as kpng-py's brain served it before
it moved to grpclib: the compatibility reference that tests compare our
server's bytes with, and a raw grpcio client that reads the messages as bytes.

The reference answers each WatchReq with the reply's ops through grpcio's own
serializer (`OpItem.SerializeToString`) and fails the stream with
UNAVAILABLE and the reply's close reason; it has no stop semantics of its own
(stop() ends everything at once)."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Coroutine, Iterator, TypeVar

import grpc

from kpng_py.api import WATCH_METHOD, localv1
from kpng_py.server import ChangeSetSource
from kpng_py.transport import TLSFiles
from tests.support.process import WAIT_SECONDS

T = TypeVar("T")


class GrpcioServer:
    """A grpcio asyncio server of `source` on `address` (`unix:/path`,
    `127.0.0.1:0`), on an event loop of its own thread."""

    def __init__(self, source: ChangeSetSource, address: str,
                 tls: TLSFiles | None = None) -> None:
        self._source = source
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self.port = self._call(self._start(address, tls))

    def stop(self) -> None:
        if self._server is not None:
            self._call(self._server.stop(0))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_SECONDS)
        self._loop.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(WAIT_SECONDS)

    async def _start(self, address: str, tls: TLSFiles | None) -> int:
        self._server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(
            self._watch, request_deserializer=localv1.WatchReq.FromString,
            response_serializer=localv1.OpItem.SerializeToString)
        service, name = WATCH_METHOD.lstrip("/").split("/")
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {name: handler}),))
        if tls is None:
            port = self._server.add_insecure_port(address)
        else:
            port = self._server.add_secure_port(address, grpc.ssl_server_credentials(
                [(tls.key.read_bytes(), tls.cert.read_bytes())],
                root_certificates=tls.ca.read_bytes(), require_client_auth=True))
        await self._server.start()
        return port

    async def _watch(self, requests: AsyncIterator[localv1.WatchReq],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[localv1.OpItem]:
        session = self._source.open_stream()
        try:
            async for request in requests:
                reply = await session.next_reply(request.NodeName)
                for op in reply.ops:
                    yield op
                if reply.close_reason is not None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, reply.close_reason)
        finally:
            session.close()


class RawWatch:
    """A grpcio Watch stream whose messages are read as the bytes received;
    ask() sends a WatchReq, changeset() reads up to the next Sync."""

    def __init__(self, channel: grpc.Channel, method: str = WATCH_METHOD) -> None:
        self._requests: queue.Queue[localv1.WatchReq | None] = queue.Queue()
        call = channel.stream_stream(method, request_serializer=localv1.WatchReq.SerializeToString,
                                     response_deserializer=None)
        self._responses: Iterator[bytes] = call(iter(self._requests.get, None),
                                                timeout=WAIT_SECONDS * 4)

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

