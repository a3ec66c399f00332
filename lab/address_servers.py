"""The socket lab's servers (socket_lab.py): one process serving many
(address, port, protocol) sockets, each answering with its own address so a
client can tell who served it.

TCP: send "ADDRESS:PORT" and close. UDP: reply "ADDRESS:PORT|PAYLOAD" to the
sender. Usage: `address_servers.py tcp:10.244.0.2:8080 udp:[fd00:244::2]:53 ...`;
prints "ready" once every socket listens.
"""

from __future__ import annotations

import selectors
import socket
import sys


def _parse(spec: str) -> tuple[str, str, int]:
    proto, rest = spec.split(":", 1)
    host, port = rest.rsplit(":", 1)
    return proto, host.strip("[]"), int(port)


def _identity(host: str, port: int) -> bytes:
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode()


def main() -> None:
    selector = selectors.DefaultSelector()
    for spec in sys.argv[1:]:
        proto, host, port = _parse(spec)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        sock = socket.socket(family, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        if proto == "tcp":
            sock.listen(1024)
        selector.register(sock, selectors.EVENT_READ, (proto, _identity(host, port)))
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            proto, identity = key.data
            sock = key.fileobj
            if proto == "tcp":
                conn, _ = sock.accept()
                conn.sendall(identity)
                conn.close()
            else:
                data, peer = sock.recvfrom(65535)
                sock.sendto(identity + b"|" + data, peer)


if __name__ == "__main__":
    main()
