"""A server that tells each client who it reached and who it saw: the
endpoint of the netfilter tests (tests/ebpf/test_netfilter.py), where
"who it saw" shows whether the node masqueraded.

TCP: sends "ADDRESS:PORT PEER_IP:PEER_PORT\\n", then echoes until the
client's EOF (a long connection survives a proxy restart, N18). UDP: answers
each datagram with the same line. Prints "ready" once every socket listens.

    python -m lab.peer_echo tcp:10.244.1.2:8080 udp:[fd00:244:1::2]:5353 ...
"""

from __future__ import annotations

import asyncio
import sys

from lab.address_servers import _identity, _parse


def _line(served: bytes, peer: tuple) -> bytes:
    return served + b" " + _identity(peer[0], peer[1]) + b"\n"


def _tcp_handler(served: bytes):
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_line(served, writer.get_extra_info("peername")))
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
    return serve


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, served: bytes) -> None:
        self._served = served
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        if self._transport is not None:
            self._transport.sendto(_line(self._served, addr), addr)


async def main(specs: list[str]) -> None:
    loop = asyncio.get_running_loop()
    for spec in specs:
        proto, host, port = _parse(spec)
        served = _identity(host, port)
        if proto == "tcp":
            await asyncio.start_server(_tcp_handler(served), host, port, reuse_address=True)
        else:
            await loop.create_datagram_endpoint(lambda s=served: _Udp(s), local_addr=(host, port))
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
