"""An endpoint for proxy_node.py: TCP and UDP on PORT at each ADDRESS given.

TCP: greets with the address it was reached at ("10.244.1.1\\n"), then echoes
until the client's EOF, then closes. UDP: answers each datagram with
"ADDRESS PEER_PORT " + the datagram (the peer port tells proxy sessions apart). Prints "ready" once every socket is bound.

    python -m lab.echo_server PORT ADDRESS...
"""

from __future__ import annotations

import asyncio
import sys


async def _serve_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(f"{writer.get_extra_info('sockname')[0]}\n".encode())
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


class _UdpEcho(asyncio.DatagramProtocol):
    def __init__(self, address: str) -> None:
        self._address = address
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        assert self._transport is not None
        self._transport.sendto(f"{self._address} {addr[1]} ".encode() + data, addr)


async def main(port: int, addresses: list[str]) -> None:
    loop = asyncio.get_running_loop()
    for address in addresses:
        await asyncio.start_server(_serve_tcp, address, port)
        await loop.create_datagram_endpoint(lambda a=address: _UdpEcho(a), local_addr=(address, port))
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2:]))
