"""Sockets of the proxy: listeners bound to a frontend address, upstream
sockets, and the filter that drops clients from outside (N8)."""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from typing import Iterable

from kpng_py.model import IPAddress, IPNetwork

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


# Classic BPF (linux/filter.h): a socket filter that drops what does not come
# from allowed sources. On a listening TCP socket it sees the SYN, so a
# dropped client gets no SYN-ACK and no reset: its connect times out (N8, N13).
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
_SKF_NET_OFF = -0x100000  # offsets from the IP header (the socket sees TCP/UDP)
_LD_W_ABS = 0x20          # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15             # BPF_JMP | BPF_JEQ | BPF_K
_AND_K = 0x54             # BPF_ALU | BPF_AND | BPF_K
_JA = 0x05                # BPF_JMP | BPF_JA
_RET_K = 0x06             # BPF_RET | BPF_K
_ACCEPT = 0xFFFFFFFF
_MAX_INSNS = 4096         # BPF_MAXINSNS
_ALL_ONES = 0xFFFFFFFF
# Where the source address starts in each family's header.
_SOURCE_OFFSET = {4: 12, 6: 8}
# Loopback: a process of the node's own network namespace.
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))

_Insn = tuple[int, int, int, int]


def _words(value: bytes) -> list[int]:
    return [int.from_bytes(value[i:i + 4], "big") for i in range(0, len(value), 4)]


def _network_block(base: int, network: IPNetwork) -> list[tuple[int, int, int]]:
    """(offset, mask, value) of each 32-bit word of the source address that
    `network` constrains (none for a /0: every source)."""
    return [(base + 4 * i, mask, value) for i, (mask, value) in enumerate(
        zip(_words(network.netmask.packed), _words(network.network_address.packed))) if mask]


def _source_filter(version: int, networks: list[IPNetwork]) -> list[_Insn]:
    """Accept sources in `networks` (of one family), drop everything else.
    Each network is a block of (load word, [and mask,] compare) steps ending
    in a jump to the final accept: a mismatch skips to the next block. (`ja`
    takes a 32-bit offset, where a conditional jump takes 8 bits: the
    program's size is the only limit.)"""
    base = _SKF_NET_OFF + _SOURCE_OFFSET[version]
    blocks = [_network_block(base, network) for network in networks]

    def step_size(mask: int) -> int:
        return 2 if mask == _ALL_ONES else 3

    size = sum(sum(step_size(mask) for _, mask, _ in block) + 1 for block in blocks) + 2
    if size > _MAX_INSNS:
        raise ValueError(f"{len(networks)} allowed source networks are too many for one "
                         "socket filter")
    accept = size - 1
    program: list[_Insn] = []
    for block in blocks:
        for i, (offset, mask, value) in enumerate(block):
            program.append((_LD_W_ABS, 0, 0, offset & _ALL_ONES))
            if mask != _ALL_ONES:
                program.append((_AND_K, 0, 0, mask))
            rest = sum(step_size(m) for _, m, _ in block[i + 1:]) + 1  # left in this block
            program.append((_JEQ_K, 0, rest, value))
        program.append((_JA, 0, 0, accept - len(program) - 1))
    return program + [(_RET_K, 0, 0, 0), (_RET_K, 0, 0, _ACCEPT)]


def attach_source_filter(sock: socket.socket, version: int,
                         networks: Iterable[IPNetwork]) -> None:
    """Drop packets to `sock` unless their source is in one of `networks`
    (those of other families are ignored; none left: drop all)."""
    program = _source_filter(version, sorted({n for n in networks if n.version == version}))
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(code)
    fprog = struct.pack("HP", len(program), ctypes.addressof(buffer))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def detach_filter(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
    except OSError:  # ENOENT: none attached
        pass
