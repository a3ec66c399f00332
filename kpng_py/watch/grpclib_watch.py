"""The localv1 Watch call on grpclib (asyncio on HTTP/2 with h2): one
connection per stream, KPNG's TLS, keepalive, and each message read as raw
bytes with the size limit checked on its length prefix.

grpclib 0.4.8 (pinned) has no receive size limit and decodes messages in its
codec, where an undecodable one would fail the call. So a message is read
here, from the call's HTTP/2 stream: its 5-byte prefix (compressed flag,
length), refused at once if longer than the limit (before its bytes are taken
in, so a hostile length cannot make the client buffer gigabytes), then its
bytes. Messages are split out of whatever the stream has buffered, all of it
taken at once, not read two reads a message (a full state of 110 000 small
messages cost about 7 us of CPU each in grpclib's reads). That reads
attributes of grpclib its documentation does not show: the client `Stream`'s
`_stream` (the HTTP/2 stream) and `_wrapper` (which wakes a reader with
StreamTerminatedError when the stream is reset or the connection lost, a
failed keepalive ping included), and how many bytes the HTTP/2 stream's
buffer holds (`_acked_size`; without it, reads take only what a message
needs). Everything else is grpclib's public API.
"""

from __future__ import annotations

import ssl
import struct
from types import TracebackType

import h2.exceptions
from grpclib.client import Channel, Stream
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.metadata import decode_grpc_message
from grpclib.protocol import Stream as HTTP2Stream

from kpng_py.api import WATCH_METHOD, localv1
from kpng_py.transport import AddressError, DialTarget, TLSFiles

_PREFIX = struct.Struct(">?I")  # a gRPC message's compressed flag and length


class CallFailed(Exception):
    """The call ended with a gRPC status other than OK: answered by the brain
    (`local` False), or decided here (a lost connection, a message over the
    size limit: `oversized`)."""

    def __init__(self, status: str, details: str, local: bool = True,
                 oversized: bool = False) -> None:
        super().__init__(f"{status}: {details}")
        self.status, self.details = status, details
        self.local, self.oversized = local, oversized


class _WatchReqCodec(CodecBase):
    """Encodes WatchReq; replies never pass through a codec (see `WatchCall`)."""

    __content_subtype__ = "proto"

    def encode(self, message: localv1.WatchReq, message_type: object) -> bytes:
        return message.SerializeToString()

    def decode(self, data: bytes, message_type: object) -> bytes:
        return data


def open_channel(target: str, tls: TLSFiles, keepalive_time: float,
                 keepalive_timeout: float) -> Channel:
    """A channel to `target` (nothing is dialled before the first request).
    Keepalive as grpcio's was set: a ping every `keepalive_time` also on a
    stream idle for hours (no limit on pings without data), the connection
    closed when one is not answered within `keepalive_timeout`."""
    where = DialTarget.parse(target)
    context: ssl.SSLContext | None = tls.client_context() if tls.enabled else None
    config = Configuration(
        _keepalive_time=keepalive_time,
        _keepalive_timeout=keepalive_timeout,
        _http2_max_pings_without_data=0,
        # grpclib skips a ping sent sooner than this after the last one; its
        # timer may fire a millisecond early, so half the period keeps every ping.
        _http2_min_sent_ping_interval_without_data=keepalive_time / 2,
        ssl_target_name_override=where.tls_server_name if context else None,
    )
    if where.unix_path is not None:
        return Channel(path=where.unix_path, ssl=context, config=config, codec=_WatchReqCodec())
    return Channel(where.host, where.port, ssl=context, config=config, codec=_WatchReqCodec())


class WatchCall:
    """One Watch stream on `channel`, as an async context manager: `send`
    WatchReqs, read the reply messages' bytes with `next_messages`. Failures
    are raised as CallFailed."""

    def __init__(self, channel: Channel, target: str, max_msg_size: int) -> None:
        self._call: Stream[localv1.WatchReq, bytes] = channel.request(
            WATCH_METHOD, Cardinality.STREAM_STREAM, localv1.WatchReq, bytes)
        self._target, self._max_msg_size = target, max_msg_size
        self._failures = _CallFailures(target, self._call)
        self._answered = False
        self._pending = b""  # read from the HTTP/2 stream, not a whole message yet
        self._draining = False  # the brain's status is in: read what came before it

    async def __aenter__(self) -> WatchCall:
        await self._call.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        """Resets the stream if it is still open. Only ever left by an
        exception (grpclib would wait for the brain's end otherwise)."""
        with self._failures:
            await self._call.__aexit__(exc_type, exc, tb)

    async def send(self, request: localv1.WatchReq) -> None:
        """Sends a WatchReq. A stream the brain has already ended (its status
        in, the stream reset) takes none: what it sent before its status is
        still to be read, even when the reset came before its headers were
        looked at (all of it in one read)."""
        with self._failures:
            if self._draining:
                return
            try:
                await self._call.send_message(request)
                if not self._answered:  # the brain's headers, or its status alone
                    await self._call.recv_initial_metadata()
                    self._answered = True
            except (StreamTerminatedError, h2.exceptions.StreamClosedError):
                if not self._ended_by_brain():
                    raise

    async def next_messages(self) -> list[bytes] | None:
        """The bytes of the next messages: every one complete in what has
        arrived, at least one (waited for); None once the brain ended the
        stream with status OK."""
        with self._failures:
            if self._draining:
                return await self._read()
            try:
                with self._call._wrapper:
                    return await self._read()
            except StreamTerminatedError:
                if not self._ended_by_brain():
                    raise
                return await self._read()

    def _ended_by_brain(self) -> bool:
        """Whether the stream was reset after the brain's status (grpc servers
        do): then what came before the status is still to be read, and no
        more can come, so reads drain the buffer from now on."""
        if _status_fields(self._call._stream) is None:
            return False
        self._draining = True
        return True

    async def _read(self) -> list[bytes] | None:
        """Messages from the HTTP/2 stream's buffer; if cut off while
        waiting, the next call goes on where this one stopped."""
        stream = self._call._stream
        while True:
            messages, missing = self._split()
            if messages:
                return messages
            try:
                # At least what the next message lacks, and all that is buffered.
                data = await stream.recv_data(max(missing, getattr(stream.buffer,
                                                                   "_acked_size", 0)))
            except AssertionError as err:  # grpclib's Buffer: the data ended short
                raise CallFailed("INTERNAL", "the brain ended the stream in the middle "
                                 "of a message") from err
            if not data:
                if self._pending:
                    raise CallFailed("INTERNAL", "the brain ended the stream in the middle "
                                     "of a message")
                _end_status(_status_fields(stream))
                return None
            self._pending += data

    def _split(self) -> tuple[list[bytes], int]:
        """The whole messages at the start of what is pending (taken out), and
        how many more bytes the next one needs at least. A prefix is checked
        as soon as it is in; a bad one fails the call once the messages
        before it are returned (a Sync among them is applied)."""
        pending, offset = self._pending, 0
        messages: list[bytes] = []
        missing = 0
        while True:
            if len(pending) - offset < _PREFIX.size:
                missing = _PREFIX.size - (len(pending) - offset)
                break
            compressed, size = _PREFIX.unpack_from(pending, offset)
            if (compressed or size > self._max_msg_size) and messages:
                break
            if compressed:
                raise CallFailed("INTERNAL", "the brain sent a compressed message "
                                 "though none was negotiated")
            if size > self._max_msg_size:
                raise CallFailed(
                    "RESOURCE_EXHAUSTED", f"a message of {size} bytes is over "
                    f"--max-msg-size ({self._max_msg_size} bytes)", oversized=True)
            end = offset + _PREFIX.size + size
            if end > len(pending):
                missing = end - len(pending)
                break
            messages.append(pending[offset + _PREFIX.size:end])
            offset = end
        if offset:
            self._pending = pending[offset:]
        return messages, missing


def _status_fields(stream: HTTP2Stream | None) -> list[tuple[str, str]] | None:
    """The header fields carrying the brain's status once it has sent it: its
    trailers, or its headers when they were all it sent (trailers-only)."""
    if stream is None:
        return None
    if stream.trailers is not None:
        return stream.trailers
    if stream.headers is not None and any(name == "grpc-status" for name, _ in stream.headers):
        return stream.headers
    return None


def _end_status(status_fields: list[tuple[str, str]] | None) -> None:
    """None for a stream ended with OK; else the brain's status, raised."""
    fields = dict(status_fields or ())
    code = fields.get("grpc-status")
    try:
        status = Status(int(code)) if code is not None else None
    except ValueError:
        status = None
    if status is None:
        raise CallFailed("INTERNAL", f"the brain ended the stream without a valid "
                         f"grpc-status (got {code!r})", local=False)
    if status is not Status.OK:
        raise CallFailed(status.name, decode_grpc_message(fields.get("grpc-message", "")),
                         local=False)
    return None


class _CallFailures:
    """Turns what grpclib, h2 and the socket raise into CallFailed. A stream
    reset after the brain's status (as grpc servers do when the client has
    not ended its side) fails with that status."""

    def __init__(self, target: str, call: Stream[localv1.WatchReq, bytes]) -> None:
        self._target, self._call = target, call

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None or isinstance(exc, CallFailed):
            return
        if isinstance(exc, GRPCError):
            raise CallFailed(exc.status.name, exc.message or "", local=False) from exc
        status = _status_fields(getattr(self._call, "_stream", None))  # once sent
        if status is not None and isinstance(
                exc, (StreamTerminatedError, h2.exceptions.StreamClosedError)):
            _end_status(status)
            raise CallFailed("UNAVAILABLE", f"the brain closed the stream and reset it ({exc})",
                             local=False) from exc
        if isinstance(exc, StreamTerminatedError):
            raise CallFailed("UNAVAILABLE", f"the stream to {self._target} ended: {exc} "
                             "(the brain went away, or did not answer a keepalive ping)") from exc
        if isinstance(exc, AddressError):
            raise CallFailed("UNAVAILABLE", str(exc)) from exc
        if isinstance(exc, OSError):  # refused, no socket file, TLS handshake (ssl.SSLError)
            raise CallFailed("UNAVAILABLE", f"cannot reach {self._target}: {exc}") from exc
        if isinstance(exc, (ProtocolError, h2.exceptions.H2Error)):
            raise CallFailed("INTERNAL", f"HTTP/2 or gRPC protocol error with "
                             f"{self._target}: {exc!r}") from exc
