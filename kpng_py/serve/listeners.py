"""The sockets a localv1 server listens on: bound here, before the server
starts, so that their options and the unix socket's file are ours to decide.

A unix socket is bound owner-only at a temporary name in its directory and
renamed to its path once the server listens (a stale socket there is replaced
in one step); on exit its path is removed only if it still is that file. TCP
is bound as grpcio binds it: `[::]` is one dual-stack socket, a name every
address it resolves to (port 0: the port of the first one for the others),
SO_REUSEADDR and no SO_REUSEPORT.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from kpng_py.runtime.logs import fields
from kpng_py.transport import AddressError, ListenAddress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SocketFile:
    """The unix socket file a server created: its path and which file it is."""

    path: Path
    device: int
    inode: int


def bind_unix(path: Path) -> tuple[socket.socket, Path]:
    """A socket bound (mode 0600) at a staging name beside `path`, and that
    name; `path` is checked first (a live socket is not stolen)."""
    _check_unix_path(path)
    staging = _staging_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # created owner-only, never readable by others
    try:
        sock.bind(str(staging))
        os.chmod(staging, 0o600)
    except OSError as err:
        sock.close()
        raise AddressError(f"cannot listen on unix://{path}: {err.strerror}") from err
    finally:
        os.umask(old_umask)
    sock.setblocking(False)
    return sock, staging


def bind_tcp(listen: ListenAddress) -> list[socket.socket]:
    """The bound (not yet listening) sockets of a tcp:// address."""
    host, port = listen.tcp_host_port()
    if host in ("", "::"):
        return [_bind_wildcard(listen, port)]
    try:
        candidates = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                        flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise AddressError(f"cannot listen on {listen}: cannot resolve {host!r} "
                           f"({err.strerror})") from err
    addresses = list(dict.fromkeys((c[0], c[4]) for c in candidates))
    sockets: list[socket.socket] = []
    try:
        for family, address in addresses:
            if sockets:  # port 0: every address gets the port the first one got
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sockets.append(_bind(listen, family, address))
    except AddressError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bind_wildcard(listen: ListenAddress, port: int) -> socket.socket:
    """`[::]`: one socket for IPv6 and IPv4, or IPv4 only on a host without IPv6."""
    if not _ipv6_available():
        return _bind(listen, socket.AF_INET, ("0.0.0.0", port))
    return _bind(listen, socket.AF_INET6, ("::", port), dual_stack=True)


def _ipv6_available() -> bool:
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        return False
    return True


def _bind(listen: ListenAddress, family: int, address: tuple, dual_stack: bool = False,
          ) -> socket.socket:
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as err:
        raise AddressError(f"cannot listen on {listen}: {err.strerror}") from err
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise AddressError(f"cannot listen on {listen}: {err.strerror}; "
                           "pick another address or port") from err
    sock.setblocking(False)
    return sock


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
    """Where the socket is bound before it is renamed to `path`: never the
    public path, which a successor may own by the time this server stops.
    Short, as socket paths are limited to 107 bytes."""
    return path.with_name(f".kpng-{os.getpid()}-{secrets.token_hex(3)}.sock")


def publish_socket(staging: Path, path: Path) -> SocketFile:
    """Move the bound socket to its public path, in one step (a stale file
    there is replaced atomically), and remember which file it is."""
    created = os.lstat(staging)
    os.rename(staging, path)
    return SocketFile(path, created.st_dev, created.st_ino)


def remove_if_same(socket_file: SocketFile) -> None:
    try:
        current = os.lstat(socket_file.path)
    except FileNotFoundError:
        return
    if (current.st_dev, current.st_ino) != (socket_file.device, socket_file.inode):
        log.info("leaving the socket to the server that replaced it",
                 extra=fields(path=str(socket_file.path)))
        return
    socket_file.path.unlink(missing_ok=True)
