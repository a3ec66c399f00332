"""The labs' server: it tells each client which server answered and whom it
saw asking, so a check sees the endpoint it reached and whether the node
masqueraded the client. Standard library only (it runs inside pods, also as
a script path).

    peer_server.py [--name NAME] PROTO:ADDRESS:PORT ...

PROTO is tcp or udp; ADDRESS `[::]` makes one dual-stack socket (an IPv4
client is named as the IPv4 address it is). Every answer starts with one
line, `SERVED PEER_IP PEER_PORT`, where SERVED is NAME (a pod's name) or
else the socket's own `ADDRESS:PORT` (`[fd00::2]:53`). TCP: that line, then
an echo of what the client sends until its EOF (a long connection outlives a
proxy restart, N18). UDP: each datagram gets the line followed by the
datagram itself (a large datagram comes back whole). Prints "ready" once
every socket listens.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import socket
from typing import Callable

# One answer per datagram, so it must fit in one.
_MAX_DATAGRAM = 65507


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def answer_line(served: str, peer: tuple) -> bytes:
    """The first line of every answer, `peer` as the socket saw it."""
    address = ipaddress.ip_address(peer[0].split("%")[0])
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return f"{served} {address} {peer[1]}\n".encode()


def parse_spec(spec: str) -> tuple[str, str, int]:
    """`tcp:10.244.1.2:8080` or `udp:[fd00::2]:53` -> (proto, host, port)."""
    proto, rest = spec.split(":", 1)
    host, port = rest.rsplit(":", 1)
    if proto not in ("tcp", "udp"):
        raise ValueError(f"{spec!r}: the protocol is tcp or udp")
    return proto, host.strip("[]"), int(port)


def _bound(kind: int, host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if host == "::" else 1)
    sock.bind((host, port))
    return sock


def _tcp_handler(served: str) -> Callable:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(answer_line(served, writer.get_extra_info("peername")))
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:  # the client reset: nothing to answer
            pass
        finally:
            writer.close()
    return serve


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, served: str) -> None:
        self._served = served
        self._transport: asyncio.DatagramTransport | None = None

    # A datagram endpoint's transport is a DatagramTransport: typeshed's own
    # DatagramProtocol narrows the argument the same way, with the same ignore.
    def connection_made(  # type: ignore[override]
            self, transport: asyncio.DatagramTransport) -> None:
        self._transport = transport

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        if self._transport is not None:
            reply = answer_line(self._served, addr) + data
            self._transport.sendto(reply[:_MAX_DATAGRAM], addr)


async def serve(specs: list[str], name: str | None) -> None:
    loop = asyncio.get_running_loop()
    for spec in specs:
        proto, host, port = parse_spec(spec)
        served = name or host_port(host, port)
        if proto == "tcp":
            sock = _bound(socket.SOCK_STREAM, host, port)
            await asyncio.start_server(_tcp_handler(served), sock=sock, backlog=1024)
        else:
            await loop.create_datagram_endpoint(functools.partial(_Udp, served),
                                                sock=_bound(socket.SOCK_DGRAM, host, port))
    print("ready", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="peer_server.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", help="what every answer names as the server (default: "
                                       "the socket's ADDRESS:PORT)")
    parser.add_argument("specs", nargs="+", metavar="PROTO:ADDRESS:PORT")
    args = parser.parse_args()
    asyncio.run(serve(args.specs, args.name))


if __name__ == "__main__":
    main()
