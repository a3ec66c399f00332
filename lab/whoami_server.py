"""A server that says who answered and who it saw asking: on TCP and UDP
PORT, both families, it answers every connection (TCP: then closes) and every
datagram with one line `<pod> <peer address> <peer port>`, the peer as the
pod sees it (a masqueraded client shows as the node's address). Prints
"ready" once both sockets are bound.

    python lab/whoami_server.py POD PORT
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys


def answer(pod: str, peer: tuple) -> bytes:
    """The line for a peer (an IPv4 client of the dual-stack socket appears
    as ::ffff:a.b.c.d; it is named as the IPv4 address it is)."""
    ip = ipaddress.ip_address(peer[0].split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"{pod} {ip} {peer[1]}\n".encode()


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, pod: str) -> None:
        self._pod = pod
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        assert self._transport is not None
        self._transport.sendto(answer(self._pod, addr), addr)


def _dual_stack(kind: int, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, kind)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", port))
    return sock


async def main(pod: str, port: int) -> None:
    async def serve_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(pod, writer.get_extra_info("peername")))
        await writer.drain()
        writer.close()

    loop = asyncio.get_running_loop()
    await asyncio.start_server(serve_tcp, sock=_dual_stack(socket.SOCK_STREAM, port))
    await loop.create_datagram_endpoint(lambda: _Udp(pod),
                                        sock=_dual_stack(socket.SOCK_DGRAM, port))
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
