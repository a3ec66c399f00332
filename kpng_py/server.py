"""The serving end of localv1 Watch streams, shared by the built-in brain and
`replay`.

A `ChangeSetSource` decides what to send; this module runs the gRPC server,
answers each WatchReq with one change set and never sends anything before the
next WatchReq (the client's credit).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Protocol

import grpc

from kpng_py.api import LEGACY_WATCH_METHOD, WATCH_METHOD, localv1
from kpng_py.logs import fields
from kpng_py.transport import AddressError, ListenAddress, TLSFiles

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """One answer to a WatchReq: ops (ending in Sync) and whether to fail the
    stream after them."""

    ops: tuple[localv1.OpItem, ...]
    close_reason: str | None = None


class StreamSession(Protocol):
    def next_reply(self, node_name: str, cancelled: threading.Event) -> Reply | None:
        """Block until there is something to send for this WatchReq; None when
        `cancelled` is set first."""

    def close(self) -> None:
        """The stream ended."""


class ChangeSetSource(Protocol):
    def open_stream(self) -> StreamSession:
        """A new Watch stream started."""


class LocalApiServer:
    def __init__(self, source: ChangeSetSource, listen: ListenAddress,
                 tls: TLSFiles | None = None, max_streams: int = 128) -> None:
        self._source = source
        self._listen = listen
        self.port = 0  # the TCP port bound, once started (useful with port 0)
        self._tls = tls or TLSFiles()
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=max_streams, thread_name_prefix="watch"),
            options=[("grpc.so_reuseport", 0)],
        )
        handler = grpc.stream_stream_rpc_method_handler(
            self._watch,
            request_deserializer=localv1.WatchReq.FromString,
            response_serializer=localv1.OpItem.SerializeToString,
        )
        for method in (WATCH_METHOD, LEGACY_WATCH_METHOD):
            service, name = method.lstrip("/").split("/")
            self._server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {name: handler}),))

    def start(self) -> None:
        if self._listen.unix_path is not None:
            _prepare_unix_socket(self._listen.unix_path)
        address = self._listen.grpc_address()
        old_umask = os.umask(0o177)  # the socket is created owner-only (0600)
        try:
            if self._tls.enabled:
                port = self._server.add_secure_port(address, self._tls.server_credentials())
            else:
                port = self._server.add_insecure_port(address)
            if port == 0:
                raise AddressError(f"cannot listen on {self._listen}")
            self.port = port
            self._server.start()
        finally:
            os.umask(old_umask)
        if self._listen.unix_path is not None:
            os.chmod(self._listen.unix_path, 0o600)
        log.info("serving localv1", extra=fields(listen=str(self._listen), tls=self._tls.enabled))

    def stop(self, grace: float = 1.0) -> None:
        """Close every stream and stop listening."""
        self._server.stop(grace).wait()
        if self._listen.unix_path is not None:
            self._listen.unix_path.unlink(missing_ok=True)

    def wait(self) -> None:
        self._server.wait_for_termination()

    def _watch(self, requests: Iterator[localv1.WatchReq],
               context: grpc.ServicerContext) -> Iterator[localv1.OpItem]:
        cancelled = threading.Event()
        context.add_callback(cancelled.set)
        session = self._source.open_stream()
        peer = context.peer()
        try:
            for request in requests:
                reply = session.next_reply(request.NodeName, cancelled)
                if reply is None:
                    return
                yield from reply.ops
                if reply.close_reason is not None:
                    log.info("closing a watch stream", extra=fields(
                        peer=peer, reason=reply.close_reason))
                    context.abort(grpc.StatusCode.UNAVAILABLE, reply.close_reason)
        finally:
            session.close()


def _prepare_unix_socket(path) -> None:
    """Replace a stale socket file; refuse to steal a live one or a non-socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        raise AddressError(f"{path} exists and is not a socket; remove it or pick another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        log.info("replacing a stale socket", extra=fields(path=str(path)))
        path.unlink()
    else:
        raise AddressError(f"{path} is in use by a running server; stop it or pick another path")
    finally:
        probe.close()
