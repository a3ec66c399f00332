"""The serving end of localv1 Watch streams, shared by the built-in brain and
`replay`.

A `ChangeSetSource` decides what to send; this module runs the gRPC server,
answers each WatchReq with one change set and never sends anything before the
next WatchReq (the client's credit).

The server is grpclib's (asyncio on h2) on an event loop of its own thread: a
stream waiting for the client's next WatchReq, or for something new to send,
is a suspended task, not a blocked thread, so idle streams cannot starve the
others however many there are. A reply is serialized once, as the gRPC
messages of its ops in a few large buffers (`wire_parts`), each written in
HTTP/2 frames as large as flow control allows, not a frame and a write per op:
a source that hands several streams the same Reply (the brain does, per node
and state version) pays for one serialization, and the brain's first answer
of a big state is on its way while its later parts are serialized.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import struct
import threading
import weakref
import zlib
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, NoReturn, Protocol, Sequence

import grpclib.server
from google.protobuf.message import DecodeError
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol

from kpng_py.api import LEGACY_WATCH_METHOD, WATCH_METHOD, localv1
from kpng_py.runtime.aio import ThreadsafeEvent, new_event_loop, running_task
from kpng_py.runtime.logs import fields
from kpng_py.serve.listeners import SocketFile, bind_tcp, bind_unix, publish_socket, remove_if_same
from kpng_py.transport import AddressError, ListenAddress, TLSFiles

log = logging.getLogger(__name__)

_STOPPING = "the brain is stopping"
# How long stop() waits for the handlers once their connections are closed.
_CLOSE_SECONDS = 5.0
# The prefix of every gRPC message on the stream: compressed or not, its length.
MESSAGE_PREFIX = struct.Struct(">BI")
# grpcio's default limit for a message received (a WatchReq is a node name).
_MAX_REQUEST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Reply:
    """One answer to a WatchReq: ops (ending in Sync) and whether to fail the
    stream after them."""

    ops: tuple[localv1.OpItem, ...]
    close_reason: str | None = None

    @cached_property
    def wire(self) -> bytes:
        """The ops as the gRPC messages of a stream, serialized once however
        many streams are sent this Reply."""
        parts: list[bytes] = []
        for op in self.ops:
            message = op.SerializeToString()
            parts += (MESSAGE_PREFIX.pack(0, len(message)), message)
        return b"".join(parts)

    def wire_parts(self) -> Iterator[bytes]:
        if self.wire:
            yield self.wire


class Answer(Protocol):
    """What a session answers a WatchReq with (a Reply, or the brain's
    ChangeSetReply, which writes its wire without building the ops)."""

    @property
    def ops(self) -> Sequence[localv1.OpItem]: ...

    def wire_parts(self) -> Iterator[bytes]:
        """The ops as the gRPC messages of the stream, in the parts they are
        written in, none empty (none: no op)."""

    @property
    def close_reason(self) -> str | None: ...


class StreamSession(Protocol):
    async def next_reply(self, node_name: str) -> Answer:
        """Wait until there is something to send for this WatchReq. The wait
        ends by cancelling the task when the stream ends."""

    def close(self) -> None:
        """The stream ended."""


class ChangeSetSource(Protocol):
    def open_stream(self) -> StreamSession:
        """A new Watch stream started."""


async def wait_until_cancelled() -> NoReturn:
    """A session with nothing more to say keeps its stream open and quiet
    until the stream's task is cancelled."""
    while True:
        await asyncio.get_running_loop().create_future()  # nothing resolves it


class LocalApiServer:
    """start() serves on a thread of its own until stop()."""

    def __init__(self, source: ChangeSetSource, listen: ListenAddress,
                 tls: TLSFiles | None = None) -> None:
        self._listen = listen
        self.port = 0  # the TCP port bound, once started (useful with port 0)
        self._tls = tls or TLSFiles()
        self._thread: threading.Thread | None = None
        self._streams = _WatchStreams(source)
        self._stop_requested = ThreadsafeEvent()
        self._grace = 0.0
        self._socket: SocketFile | None = None

    def start(self) -> None:
        context = self._tls.server_context() if self._tls.enabled else None
        unix_path = self._listen.unix_path
        if unix_path is not None:
            sock, staging = bind_unix(unix_path)
            sockets = [sock]
        else:
            sockets, staging = bind_tcp(self._listen), None
            self.port = sockets[0].getsockname()[1]
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(sockets, context, started),
                                        name="localv1-server", daemon=True)
        self._thread.start()
        try:
            started.result()
            if unix_path is not None and staging is not None:
                self._socket = publish_socket(staging, unix_path)
        except BaseException as err:
            self.stop(grace=0)
            if staging is not None:
                staging.unlink(missing_ok=True)
            if isinstance(err, OSError):
                raise AddressError(f"cannot listen on {self._listen}: {err.strerror}") from err
            raise
        log.info("serving localv1", extra=fields(listen=str(self._listen), tls=self._tls.enabled))

    def stop(self, grace: float = 1.0) -> None:
        """Close every stream (after up to `grace` seconds) and stop listening.
        The socket file is removed only if it still is the one this server
        created: a successor that replaced it keeps it."""
        if self._thread is None:
            return
        self._grace = grace
        self._stop_requested.set()
        self._thread.join()
        self._thread = None
        if self._socket is not None:
            remove_if_same(self._socket)
            self._socket = None

    def _run(self, sockets: list[socket.socket], context: ssl.SSLContext | None,
             started: concurrent.futures.Future[None]) -> None:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(self._serve(sockets, context, started))

    async def _serve(self, sockets: list[socket.socket], context: ssl.SSLContext | None,
                     started: concurrent.futures.Future[None]) -> None:
        servers = [_Server([self._streams]) for _ in sockets]
        try:
            for server, sock in zip(servers, sockets):
                await server.start(sock=sock, ssl=context)
        except BaseException as err:
            for sock in sockets:
                sock.close()
            started.set_exception(err)
            return
        started.set_result(None)
        await self._stop_requested.wait()
        await self._shut_down(servers)

    async def _shut_down(self, servers: list[_Server]) -> None:
        """Stop listening and cancel every stream's handler: a waiting stream
        ends at once, one sending a reply finishes it within the grace period;
        then close the connections (what is still being sent is cut)."""
        self._streams.stop()
        for server in servers:
            server.close()
        closed = asyncio.gather(*(server.wait_closed() for server in servers))
        await asyncio.wait([closed], timeout=self._grace)
        for server in servers:
            server.close_connections()
        await asyncio.wait([closed], timeout=_CLOSE_SECONDS)
        if not closed.done():
            log.warning("watch streams still open after their connections were closed",
                        extra=fields(streams=len(self._streams.served)))


class _Server(grpclib.server.Server):
    """grpclib's server, which also closes the connections it accepted:
    grpclib's close() stops listening and cancels the handlers, and leaves
    the connections open."""

    def __init__(self, handlers: list[_WatchStreams]) -> None:
        super().__init__(handlers)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        return protocol

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            processor = getattr(protocol, "processor", None)  # None before connection_made
            if processor is not None:
                processor.close(_STOPPING)


class _WatchStreams:
    """The Watch handler and the streams it serves. At stop, a stream that is
    waiting (for the client's next WatchReq, or for something to send) ends
    at once with UNAVAILABLE; one sending a reply first finishes it (within
    the server's grace period)."""

    def __init__(self, source: ChangeSetSource) -> None:
        self._source = source
        self.served: set[asyncio.Task] = set()  # the streams' handler tasks
        self._stopping = False

    def __mapping__(self) -> dict[str, Handler]:
        handler = Handler(self.watch, Cardinality.STREAM_STREAM, localv1.WatchReq,
                          localv1.OpItem)
        return {WATCH_METHOD: handler, LEGACY_WATCH_METHOD: handler}

    def stop(self) -> None:
        self._stopping = True
        if self.served:
            log.info("closing the watch streams", extra=fields(streams=len(self.served)))

    async def watch(self, stream: grpclib.server.Stream) -> None:
        task = running_task()
        session = self._source.open_stream()
        self.served.add(task)
        try:
            await self._answer(stream, session)
        finally:
            self.served.discard(task)
            session.close()

    async def _answer(self, stream: grpclib.server.Stream, session: StreamSession) -> None:
        headers_sent = False
        while True:
            try:
                request = await _next_request(stream)
                if request is None:
                    return  # the client ended its side of the stream
                reply = await session.next_reply(request.NodeName)
            except asyncio.CancelledError:
                # By stop() (the stream was waiting), by the client going
                # away, or by its deadline: grpclib tells these apart.
                self._raise_if_stopping(stream)
                raise
            for part in reply.wire_parts():
                await self._write(stream, part, headers=not headers_sent)
                headers_sent = True
            if reply.close_reason is not None:
                log.info("closing a watch stream", extra=fields(
                    peer=_peer(stream), reason=reply.close_reason))
                raise GRPCError(Status.UNAVAILABLE, reply.close_reason)
            if self._stopping:
                raise GRPCError(Status.UNAVAILABLE, _STOPPING)

    async def _write(self, stream: grpclib.server.Stream, wire: bytes, headers: bool) -> None:
        """Write one part of a reply. Cancelled by stop(), it still finishes (the server
        closes the connection when the grace period ends); cancelled for any
        other reason, or a second time, it stops."""
        writing = asyncio.ensure_future(_write_reply(stream, wire, headers))
        try:
            await asyncio.shield(writing)
        except asyncio.CancelledError:
            if not self._stopping:
                writing.cancel()
                raise
            running_task().uncancel()
            await writing  # cancelled with this task when the connection is closed

    def _raise_if_stopping(self, stream: grpclib.server.Stream) -> None:
        """Tell a waiting client that the brain stops, unless the client reset
        the stream as the stop began: grpclib cancelled it then, and a status
        raised into that cancellation is logged as a failure to handle it."""
        if self._stopping and not _cancelled_by_grpclib(stream):
            running_task().uncancel()
            raise GRPCError(Status.UNAVAILABLE, _STOPPING)


def _cancelled_by_grpclib(stream: grpclib.server.Stream) -> bool:
    """The client reset the stream or its deadline passed (stop() cancels
    the task itself, not through the stream's wrapper)."""
    wrapper = stream._stream.wrapper  # noqa: SLF001 - grpclib 0.4.8, pinned
    return wrapper is not None and bool(wrapper.cancelled)


async def _next_request(stream: grpclib.server.Stream) -> localv1.WatchReq | None:
    """The next WatchReq, None at the end of the client's side. Read here, not
    with grpclib's recv_message, which reads a message of any length the
    client claims: one above grpcio's limit fails the stream, as it did."""
    h2_stream = stream._stream  # noqa: SLF001 - grpclib 0.4.8, pinned
    try:
        prefix = await h2_stream.recv_data(MESSAGE_PREFIX.size)
        if not prefix:
            return None
        compressed, length = MESSAGE_PREFIX.unpack(prefix)
        if length > _MAX_REQUEST_BYTES:
            raise _bad_request(stream, Status.RESOURCE_EXHAUSTED, f"a request of {length} bytes, "
                               f"more than {_MAX_REQUEST_BYTES}")
        message = await h2_stream.recv_data(length)
        if compressed:
            message = _decompressed(stream, message)
        return localv1.WatchReq.FromString(message)
    except AssertionError as err:  # grpclib's Buffer: the stream ended inside a message
        raise _bad_request(stream, Status.INVALID_ARGUMENT, "the stream ends inside a "
                           "message") from err
    except DecodeError as err:
        raise _bad_request(stream, Status.INVALID_ARGUMENT,
                           f"the request is not a localv1 WatchReq ({err})") from err


def _decompressed(stream: grpclib.server.Stream, message: bytes) -> bytes:
    """A message compressed with gzip or deflate, the encodings grpcio offers
    (told apart by their headers: grpclib does not pass on grpc-encoding)."""
    inflater = zlib.decompressobj(32 + zlib.MAX_WBITS)
    try:
        message = inflater.decompress(message, _MAX_REQUEST_BYTES + 1)
    except zlib.error as err:
        raise _bad_request(stream, Status.INVALID_ARGUMENT,
                           f"a compressed request that does not inflate ({err})") from err
    if len(message) > _MAX_REQUEST_BYTES or not inflater.eof:
        raise _bad_request(stream, Status.RESOURCE_EXHAUSTED, "a compressed request of more "
                           f"than {_MAX_REQUEST_BYTES} bytes")
    return message


def _bad_request(stream: grpclib.server.Stream, status: Status, problem: str) -> GRPCError:
    log.info("closing a watch stream: a bad request",
             extra=fields(peer=_peer(stream), problem=problem))
    return GRPCError(status, problem)


async def _write_reply(stream: grpclib.server.Stream, wire: bytes, headers: bool) -> None:
    """The reply's messages, as they are, on grpclib's HTTP/2 stream (its
    Stream.send_message would encode and frame one message per call)."""
    if headers:
        await stream.send_initial_metadata()
    await stream._stream.send_data(wire)  # noqa: SLF001 - grpclib 0.4.8, pinned


def _peer(stream: grpclib.server.Stream) -> str:
    address = stream.peer.addr()
    return str(address) if address else "unix socket"
