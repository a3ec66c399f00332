"""localv1 servers that are not kpng-py's own, for the watch client's tests
and the transport bench (docs/bench.md "Transport"):

* `GrpcioBrain`: grpcio's asyncio server answering Watch streams from a
  ChangeSetSource, the compatibility reference (KPNG's brain is another gRPC
  implementation, grpc-go's);
* `H2Brain`: h2 alone, answering a stream's first WatchReq with prepared
  bytes (gRPC-framed messages, or anything else), written in DATA frames of at
  most `frame_size` bytes as fast as flow control allows, then quiet, or
  ended at once with `end_status` and reset (as grpc servers end a stream
  whose client has not ended its side, all in one write): what no gRPC
  library sends (a lying length prefix, messages split anywhere or packed
  many to a frame), and a server that is never the limit.

Both listen on loopback or a unix socket only, on a loop of their own thread.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from pathlib import Path
from typing import AsyncIterator

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from kpng_py.api import WATCH_METHOD, localv1
from kpng_py.serve.server import ChangeSetSource
from kpng_py.transport import TLSFiles


def grpcio_server_credentials(tls: TLSFiles) -> grpc.ServerCredentials:
    """grpcio's form of `tls` for a server; with a CA, clients must present a
    certificate signed by it (KPNG's tlsflags, and our own server)."""
    if tls.key is None or tls.cert is None:
        raise ValueError("a TLS server needs --tls-key and --tls-crt")
    return grpc.ssl_server_credentials(
        [(tls.key.read_bytes(), tls.cert.read_bytes())],
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        require_client_auth=tls.ca is not None)


def grpcio_channel_credentials(tls: TLSFiles) -> grpc.ChannelCredentials:
    """grpcio's form of `tls` for a client (a certificate when it has one)."""
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        private_key=tls.key.read_bytes() if tls.key else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert else None)


class GrpcioBrain:
    """Serves Watch streams from a ChangeSetSource with grpcio's asyncio
    server, on a loop of its own thread: one reply per WatchReq (the
    client's credit), a reply's close_reason failing the stream with
    UNAVAILABLE."""

    def __init__(self, source: ChangeSetSource, address: str,
                 tls: TLSFiles | None = None) -> None:
        """`address`: grpcio's, `unix:/path` or `127.0.0.1:0`."""
        self._source, self._address, self._tls = source, address, tls or TLSFiles()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpcio-brain",
                                        daemon=True)
        self._server: grpc.aio.Server | None = None

    def start(self) -> int:
        """Serve; returns the port bound (0 on a unix socket)."""
        self._thread.start()
        return self._on_loop(self._start())

    def stop(self, grace: float = 0.0) -> None:
        if self._server is not None:
            self._on_loop(self._server.stop(grace))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _on_loop(self, work):
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=30)

    async def _start(self) -> int:
        # Keepalive pings as often as every second are fine, also while no
        # data flows (a client waiting for its next change set, or applying).
        self._server = grpc.aio.server(options=(
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0)))
        handler = grpc.stream_stream_rpc_method_handler(
            self._watch, request_deserializer=localv1.WatchReq.FromString,
            response_serializer=localv1.OpItem.SerializeToString)
        service_name, method = WATCH_METHOD.lstrip("/").split("/")
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service_name, {method: handler}),))
        if self._tls.enabled:
            bound = self._server.add_secure_port(self._address,
                                                 grpcio_server_credentials(self._tls))
        else:
            bound = self._server.add_insecure_port(self._address)
        await self._server.start()
        return bound

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


def framed(*ops: localv1.OpItem) -> bytes:
    """The ops as gRPC messages: a 5-byte prefix (not compressed, length) each."""
    return b"".join(struct.pack(">?I", False, op.ByteSize()) + op.SerializeToString()
                    for op in ops)


class H2Brain:
    def __init__(self, payload: bytes, frame_size: int = 1 << 14,
                 end_status: tuple[int, str] | None = None) -> None:
        self._payload, self._frame_size, self._end_status = payload, frame_size, end_status
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="h2-brain",
                                        daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.streams = 0

    def start(self, socket: Path) -> str:
        """Listen on a unix socket; returns the client's target."""
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(self._connection, path=str(socket)),
            self._loop).result(timeout=30)
        return f"unix://{socket}"

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in self._writers:
                writer.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        stream_id, sent = None, 0
        try:
            while data := await reader.read(1 << 16):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived) and stream_id is None:
                        stream_id = event.stream_id
                        self.streams += 1
                        conn.send_headers(stream_id, [(":status", "200"),
                                                      ("content-type", "application/grpc")])
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length,
                                                       event.stream_id)
                while stream_id is not None and sent < len(self._payload):
                    room = min(conn.local_flow_control_window(stream_id),
                               conn.max_outbound_frame_size, self._frame_size,
                               len(self._payload) - sent)
                    if room <= 0:
                        break
                    conn.send_data(stream_id, self._payload[sent:sent + room])
                    sent += room
                    if sent == len(self._payload):
                        self._end(conn, stream_id)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass  # the client went away, or reset the connection
        finally:
            self._writers.discard(writer)
            writer.close()

    def _end(self, conn: h2.connection.H2Connection, stream_id: int) -> None:
        """The status after the whole payload, and the reset right behind it."""
        if self._end_status is None:
            return
        code, message = self._end_status
        conn.send_headers(stream_id, [("grpc-status", str(code)), ("grpc-message", message)],
                          end_stream=True)
        conn.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
