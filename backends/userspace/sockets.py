"""Sockets of the proxy: listeners bound to a ClusterIP, upstream sockets."""

from __future__ import annotations

import socket
import struct

from kpng_py.model import IPAddress

# Not exported by Python's socket module (linux/in.h, linux/in6.h).
IP_FREEBIND = 15
IPV6_FREEBIND = 78

LISTEN_BACKLOG = 4096


def socket_family(address: IPAddress) -> socket.AddressFamily:
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


def sockaddr(address: IPAddress, port: int) -> tuple[str, int]:
    return (str(address), port)


def listening_socket(address: IPAddress, port: int, kind: socket.SocketKind) -> socket.socket:
    """A non-blocking socket bound to address:port.

    Freebind lets the bind succeed before the address is on the interface, so
    listeners and addresses can be set up in either order. IPv6 listeners are
    v6-only: a ClusterIP is one family's address.
    """
    sock = socket.socket(socket_family(address), kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if address.version == 6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        sock.bind(sockaddr(address, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0) so the peer sees the failure at once."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
