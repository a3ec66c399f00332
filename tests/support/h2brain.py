"""A localv1 server on h2 alone: it answers a stream's first WatchReq with
prepared bytes (gRPC-framed messages, or anything else), written in DATA
frames of at most `frame_size` bytes as fast as flow control allows, then
stays quiet. What no gRPC library sends (a lying length prefix, messages split
anywhere or packed many to a frame), and a server that is never the limit
(bench/transport.py)."""

from __future__ import annotations

import asyncio
import struct
import threading
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from kpng_py.api import localv1


def framed(*ops: localv1.OpItem) -> bytes:
    """The ops as gRPC messages: a 5-byte prefix (not compressed, length) each."""
    return b"".join(struct.pack(">?I", False, op.ByteSize()) + op.SerializeToString()
                    for op in ops)


class H2Brain:
    def __init__(self, payload: bytes, frame_size: int = 1 << 14) -> None:
        self._payload, self._frame_size = payload, frame_size
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
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass  # the client went away, or reset the connection
        finally:
            self._writers.discard(writer)
            writer.close()
