"""The serving end of localv1 Watch streams, shared by the built-in brain and
`replay`.

A `ChangeSetSource` decides what to send; this module runs the gRPC server,
answers each WatchReq with one change set and never sends anything before the
next WatchReq (the client's credit).

The server is grpcio's asyncio server on an event loop of its own thread: a
stream waiting for the client's next WatchReq, or for something new to send,
is a suspended task, not a blocked thread, so idle streams cannot starve the
others however many there are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import secrets
import socket
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, NoReturn, Protocol

import grpc

from kpng_py.aio import ThreadsafeEvent, new_event_loop, running_task
from kpng_py.api import LEGACY_WATCH_METHOD, WATCH_METHOD, localv1
from kpng_py.logs import fields
from kpng_py.transport import AddressError, ListenAddress, TLSFiles

log = logging.getLogger(__name__)

_STOPPING = "the brain is stopping"

_SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    # Clients may check an idle stream with keepalive pings as often as every
    # second (`kpng-py local --keepalive-time 1`), also while no data flows
    # and between streams, without being sent away for "too many pings"
    # (strikes 0: never).
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
)


@dataclass(frozen=True)
class Reply:
    """One answer to a WatchReq: ops (ending in Sync) and whether to fail the
    stream after them."""

    ops: tuple[localv1.OpItem, ...]
    close_reason: str | None = None


class StreamSession(Protocol):
    async def next_reply(self, node_name: str) -> Reply:
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


@dataclass(frozen=True)
class _SocketFile:
    """The unix socket file a server created: its path and which file it is."""

    path: Path
    device: int
    inode: int


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
        self._socket: _SocketFile | None = None

    def start(self) -> None:
        address = self._listen.grpc_address()
        unix_path = self._listen.unix_path
        staging = None
        if unix_path is not None:
            _check_unix_path(unix_path)
            staging = _staging_path(unix_path)
            address = f"unix:{staging}"
        started: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(address, started),
                                        name="localv1-server", daemon=True)
        old_umask = os.umask(0o177)  # the socket is created owner-only (0600)
        try:
            self._thread.start()
            self.port = started.result()
        except BaseException:
            self._thread.join()
            self._thread = None
            raise
        finally:
            os.umask(old_umask)
        if unix_path is not None and staging is not None:
            try:
                self._socket = _publish_socket(staging, unix_path)
            except OSError as err:
                self.stop(grace=0)
                raise AddressError(f"cannot listen on {self._listen}: {err.strerror}") from err
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
            _remove_if_same(self._socket)
            self._socket = None

    def _run(self, address: str, started: concurrent.futures.Future[int]) -> None:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(self._serve(address, started))

    async def _serve(self, address: str,
                     started: concurrent.futures.Future[int]) -> None:
        try:
            server = self._create_server()
            port = self._add_port(server, address)
            await server.start()
        except BaseException as err:
            started.set_exception(err)
            return
        started.set_result(port)
        await self._stop_requested.wait()
        self._streams.stop()
        await server.stop(self._grace)

    def _create_server(self) -> grpc.aio.Server:
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        handler = grpc.stream_stream_rpc_method_handler(
            self._streams.watch,
            request_deserializer=localv1.WatchReq.FromString,
            response_serializer=localv1.OpItem.SerializeToString,
        )
        for method in (WATCH_METHOD, LEGACY_WATCH_METHOD):
            service, name = method.lstrip("/").split("/")
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {name: handler}),))
        return server

    def _add_port(self, server: grpc.aio.Server, address: str) -> int:
        try:
            if self._tls.enabled:
                port = server.add_secure_port(address, self._tls.server_credentials())
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as err:  # grpcio raises it when the bind fails
            raise AddressError(f"cannot listen on {self._listen}: {err}") from err
        if port == 0:
            raise AddressError(f"cannot listen on {self._listen}")
        return port



class _WatchStreams:
    """The Watch handler and the streams it serves. At stop, a stream that is
    waiting (for the client's next WatchReq, or for something to send) ends
    at once with UNAVAILABLE; one sending a reply first finishes it (within
    the server's grace period)."""

    def __init__(self, source: ChangeSetSource) -> None:
        self._source = source
        self._waiting: set[asyncio.Task] = set()
        self._stopping = False

    def stop(self) -> None:
        self._stopping = True
        if self._waiting:
            log.info("closing the watch streams", extra=fields(streams=len(self._waiting)))
        for task in self._waiting:
            task.cancel()

    async def watch(self, requests: AsyncIterator[localv1.WatchReq],
                    context: grpc.aio.ServicerContext) -> AsyncIterator[localv1.OpItem]:
        task = running_task()
        session = self._source.open_stream()
        try:
            self._waiting.add(task)
            async for request in requests:
                reply = await session.next_reply(request.NodeName)
                self._waiting.discard(task)
                for op in reply.ops:
                    yield op
                if reply.close_reason is not None:
                    log.info("closing a watch stream", extra=fields(
                        peer=context.peer(), reason=reply.close_reason))
                    await context.abort(grpc.StatusCode.UNAVAILABLE, reply.close_reason)
                if self._stopping:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, _STOPPING)
                self._waiting.add(task)
        except asyncio.CancelledError:
            # By stop() while waiting, by grpcio when the grace period ends
            # (mid-reply, or between the last op of a reply and the next
            # wait), or because the client went away. Not let through: grpcio
            # would log it as an error of the servicer.
            if self._stopping:
                await context.abort(grpc.StatusCode.UNAVAILABLE, _STOPPING)
        finally:
            self._waiting.discard(task)
            session.close()


def _check_unix_path(path: Path) -> None:
    """Refuse to steal a live socket or to replace a non-socket; a stale
    socket file is replaced when the new one is published."""
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
    else:
        raise AddressError(f"{path} is in use by a running server; stop it or pick another path")
    finally:
        probe.close()


def _staging_path(path: Path) -> Path:
    """Where the socket is bound before it is renamed to `path`: grpcio
    unlinks the path it bound when the server stops, and that must never be
    the public path, which a successor may own by then. Short, as socket
    paths are limited to 107 bytes."""
    return path.with_name(f".kpng-{os.getpid()}-{secrets.token_hex(3)}.sock")


def _publish_socket(staging: Path, path: Path) -> _SocketFile:
    """Move the bound socket to its public path, in one step (a stale file
    there is replaced atomically), and remember which file it is."""
    os.chmod(staging, 0o600)
    created = os.lstat(staging)
    os.rename(staging, path)
    return _SocketFile(path, created.st_dev, created.st_ino)


def _remove_if_same(socket_file: _SocketFile) -> None:
    try:
        current = os.lstat(socket_file.path)
    except FileNotFoundError:
        return
    if (current.st_dev, current.st_ino) != (socket_file.device, socket_file.inode):
        log.info("leaving the socket to the server that replaced it",
                 extra=fields(path=str(socket_file.path)))
        return
    socket_file.path.unlink(missing_ok=True)
