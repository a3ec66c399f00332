"""A client inside the client namespace, driven by JSON lines on stdin; one
JSON line answers each command. Errors come back as {"error": "ECONNREFUSED"}.

Commands ({"op": ...}):
  tcp    host port count [source_port] -> [{"endpoint", "peer", "echo"}] for `count`
                              connections, each sending "ping", half-closing and
                              reading the echo
  open   id host port      -> {"endpoint", "peer"}; keeps the connection as `id`
  echo   id data           -> {"data"}: sends and reads the echo on connection `id`
  udp    host port count size connected -> [{"endpoint", "source", "size"}], one
                              fresh socket per datagram
  udp-open id host port   -> {}: one connected UDP socket kept as `id`
  udp-send id data         -> {"endpoint", "upstream_port", "data"}: one datagram and
                              its answer on `id`
"""

from __future__ import annotations

import errno
import json
import socket
import sys

TIMEOUT = 3.0


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _recv_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("closed before the greeting")
        data += chunk
    return data


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def _parse_answer(reply: bytes) -> tuple[str, int, bytes]:
    """lab/peer_server.py's answer: the endpoint's address, the client port
    it saw (which tells proxy sessions apart), and what followed the line
    (UDP: the datagram)."""
    line, _, body = reply.partition(b"\n")
    served, _peer_ip, peer_port = line.decode().split()
    return served.rsplit(":", 1)[0].strip("[]"), int(peer_port), body


class Agent:
    def __init__(self) -> None:
        self._kept: dict[str, socket.socket] = {}

    def _connect(self, host: str, port: int, source_port: int = 0) -> tuple[socket.socket, dict]:
        source = ("::" if ":" in host else "0.0.0.0", source_port) if source_port else None
        sock = socket.create_connection((host, port), timeout=TIMEOUT, source_address=source)
        endpoint, _, _ = _parse_answer(_recv_line(sock))
        return sock, {"endpoint": endpoint, "peer": list(sock.getpeername()[:2])}

    def tcp(self, host: str, port: int, count: int, source_port: int = 0) -> list[dict]:
        results = []
        for _ in range(count):
            sock, result = self._connect(host, port, source_port)
            with sock:
                sock.sendall(b"ping")
                sock.shutdown(socket.SHUT_WR)  # half-close: the echo must still come back
                rest = b""
                while chunk := sock.recv(4096):
                    rest += chunk
                result["echo"] = rest.decode()
            results.append(result)
        return results

    def open(self, id: str, host: str, port: int) -> dict:
        sock, result = self._connect(host, port)
        self._kept[id] = sock
        return result

    def echo(self, id: str, data: str) -> dict:
        sock = self._kept[id]
        sock.sendall(data.encode())
        return {"data": _recv_exactly(sock, len(data.encode())).decode()}

    def udp(self, host: str, port: int, count: int, size: int, connected: bool) -> list[dict]:
        results = []
        for _ in range(count):
            with socket.socket(_family(host), socket.SOCK_DGRAM) as sock:
                sock.settimeout(TIMEOUT)
                payload = b"x" * size
                if connected:
                    sock.connect((host, port))
                    sock.send(payload)
                    data = sock.recv(65535)
                    source = sock.getpeername()
                else:
                    sock.sendto(payload, (host, port))
                    data, source = sock.recvfrom(65535)
                endpoint, _, body = _parse_answer(data)
                results.append({"endpoint": endpoint, "source": list(source[:2]),
                                "size": len(body)})
        return results

    def udp_open(self, id: str, host: str, port: int) -> dict:
        sock = socket.socket(_family(host), socket.SOCK_DGRAM)
        sock.settimeout(TIMEOUT)
        sock.connect((host, port))
        self._kept[id] = sock
        return {}

    def udp_send(self, id: str, data: str) -> dict:
        sock = self._kept[id]
        sock.send(data.encode())
        endpoint, upstream_port, body = _parse_answer(sock.recv(65535))
        return {"endpoint": endpoint, "upstream_port": upstream_port, "data": body.decode()}


def main() -> None:
    agent = Agent()
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op").replace("-", "_")
        try:
            result = getattr(agent, op)(**command)
        except OSError as err:
            name = errno.errorcode.get(err.errno, "") if err.errno else type(err).__name__
            result = {"error": name or type(err).__name__}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
