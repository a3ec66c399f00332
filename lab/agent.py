"""The labs' client agent: socket operations read as JSON lines on stdin, each
answered with one JSON line on stdout. It keeps sockets across commands
(sticky UDP, a stale connected socket, a connection through a proxy
restart). Standard library only; it runs inside a namespace, as a script or
`-m lab.agent`. Every server it talks to is lab/peer_server.py.

    agent.py [--in-cgroup] [--timeout SECONDS]

A socket's family is its host's, unless `family` (4 or 6) says: an IPv4
address dialled from an AF_INET6 socket is `::ffff:a.b.c.d`. With
--in-cgroup it first waits for an empty line (the parent moves it into a
test cgroup meanwhile: `ip netns exec` hides the cgroup tree from it) and
answers {"cgroup": ...}; only then does it make sockets, so the programs
attached to that cgroup see every one (lab/socket_lab.py).

Answers: {"ok": true, ...} or {"ok": false, "errno": N, "error": "ECONNREFUSED"}.
Any op may say "timeout" (seconds) for the sockets it makes: a check that
expects a drop need not wait --timeout's 3 s.

    tcp host port [family]        peer, served_by: one connection
    tcp_echo host port count [source_port]
                                  results: [{endpoint, peer, echo}], count
                                  connections each sending "ping", half-closing
                                  and reading the echo
    udp_query host port [family]  peer, served_by: one datagram, a fresh socket
    udp_echo host port count size connected
                                  results: [{endpoint, source, size}], a fresh
                                  socket per datagram
    udp_open [sock] [family] [host port]   sock: kept (connected with host)
    udp_sendto sock host port [payload]    from, served_by, size
    udp_connect sock host port             peer
    udp_send sock [payload]       from, served_by, endpoint, upstream_port, data
    udp_close sock
    open sock host port           endpoint, peer: a TCP connection kept
    echo sock data                data: sent on it and read back
    loop_start targets [pause]    rounds of tcp / udp_query to each target in a
                                  thread ({"proto", "host", "port"}), until
    loop_stop                     connects, queries, served, errors, wrong_peer

`endpoint` is the address part of the server's name, `upstream_port` the
client port it saw (which tells a proxy's sessions apart), `size` what came
back after its line.
"""

from __future__ import annotations

import argparse
import errno
import json
import socket
import sys
import threading
from collections import Counter
from typing import Any


def _family(host: str | None, family: int | None = None) -> socket.AddressFamily:
    if family is not None:
        return socket.AF_INET6 if family == 6 else socket.AF_INET
    return socket.AF_INET6 if host and ":" in host else socket.AF_INET


def _address(addr: tuple) -> list:
    return [addr[0], addr[1]]


def _answer(data: bytes) -> tuple[str, int, bytes]:
    """peer_server's answer: who served, the client port it saw, and what
    followed its line."""
    line, _, rest = data.partition(b"\n")
    served, _peer_ip, peer_port = line.decode().split()
    return served, int(peer_port), rest


def _endpoint(served: str) -> str:
    """The address of a server named "ADDRESS:PORT"."""
    return served.rsplit(":", 1)[0].strip("[]")


def _recv_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("closed before the server's line")
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


class Agent:
    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._kept: dict[Any, socket.socket] = {}
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self._stats: dict[str, Any] = {}

    def run(self, request: dict) -> dict:
        """One request: its "op" with its arguments, and "timeout" (seconds)
        for the sockets it makes (--timeout's otherwise)."""
        request = dict(request)
        op, timeout = request.pop("op"), request.pop("timeout", None)
        default, self._timeout = self._timeout, timeout or self._timeout
        try:
            return getattr(self, op)(**request)
        finally:
            self._timeout = default

    # -- one exchange per new socket -------------------------------------------
    def tcp(self, host: str, port: int, family: int | None = None) -> dict:
        with self._socket(socket.SOCK_STREAM, host, family) as sock:
            sock.connect((host, port))
            peer = _address(sock.getpeername())
            served, _, _ = _answer(_recv_line(sock))
        return {"peer": peer, "served_by": served}

    def tcp_echo(self, host: str, port: int, count: int, source_port: int = 0) -> dict:
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
        return {"results": results}

    def udp_query(self, host: str, port: int, family: int | None = None) -> dict:
        with self._socket(socket.SOCK_DGRAM, host, family) as sock:
            sock.sendto(b"q", (host, port))
            data, source = sock.recvfrom(65535)
        return {"peer": _address(source), "served_by": _answer(data)[0]}

    def udp_echo(self, host: str, port: int, count: int, size: int, connected: bool) -> dict:
        results = []
        for _ in range(count):
            with self._socket(socket.SOCK_DGRAM, host) as sock:
                payload = b"x" * size
                if connected:
                    sock.connect((host, port))
                    sock.send(payload)
                    data, source = sock.recv(65535), sock.getpeername()
                else:
                    sock.sendto(payload, (host, port))
                    data, source = sock.recvfrom(65535)
                served, _, body = _answer(data)
                results.append({"endpoint": _endpoint(served), "source": _address(source),
                                "size": len(body)})
        return {"results": results}

    # -- kept sockets ------------------------------------------------------------
    def udp_open(self, sock: Any = None, family: int | None = None, host: str | None = None,
                 port: int = 0) -> dict:
        kept = self._socket(socket.SOCK_DGRAM, host, family)
        if host:
            kept.connect((host, port))
        key = kept.fileno() if sock is None else sock
        self._kept[key] = kept
        return {"sock": key}

    def udp_sendto(self, sock: Any, host: str, port: int, payload: str = "x") -> dict:
        kept = self._kept[sock]
        kept.sendto(payload.encode(), (host, port))
        data, source = kept.recvfrom(65535)
        served, _, body = _answer(data)
        return {"from": _address(source), "served_by": served, "size": len(body)}

    def udp_connect(self, sock: Any, host: str, port: int) -> dict:
        kept = self._kept[sock]
        kept.connect((host, port))
        return {"peer": _address(kept.getpeername())}

    def udp_send(self, sock: Any, payload: str = "x") -> dict:
        kept = self._kept[sock]
        kept.send(payload.encode())
        data, source = kept.recvfrom(65535)
        served, upstream_port, body = _answer(data)
        return {"from": _address(source), "served_by": served, "endpoint": _endpoint(served),
                "upstream_port": upstream_port, "data": body.decode()}

    def udp_close(self, sock: Any) -> dict:
        self._kept.pop(sock).close()
        return {}

    def open(self, sock: Any, host: str, port: int) -> dict:
        kept, result = self._connect(host, port)
        self._kept[sock] = kept
        return result

    def echo(self, sock: Any, data: str) -> dict:
        kept = self._kept[sock]
        kept.sendall(data.encode())
        return {"data": _recv_exactly(kept, len(data.encode())).decode()}

    def _connect(self, host: str, port: int, source_port: int = 0) -> tuple[socket.socket, dict]:
        source = ("::" if ":" in host else "0.0.0.0", source_port) if source_port else None
        sock = socket.create_connection((host, port), timeout=self._timeout,
                                        source_address=source)
        served, _, _ = _answer(_recv_line(sock))
        return sock, {"endpoint": _endpoint(served), "peer": _address(sock.getpeername())}

    def _socket(self, kind: int, host: str | None, family: int | None = None) -> socket.socket:
        sock = socket.socket(_family(host, family), kind)
        sock.settimeout(self._timeout)
        return sock

    # -- loops -------------------------------------------------------------------
    def loop_start(self, targets: list[dict], pause: float = 0.0) -> dict:
        """Until loop_stop, in a thread: rounds of one exchange with each target
        ({"proto": "tcp" or "udp", "host", "port"}) in turn, a TCP connect or
        a UDP query, with `pause` seconds between rounds."""
        self._stop.clear()
        self._loop = threading.Thread(target=self._run_loop, args=(targets, pause))
        self._loop.start()
        return {}

    def loop_stop(self) -> dict:
        """How many connects and queries worked, failed (by protocol and errno)
        or showed something else than the VIP as their peer."""
        self._stop.set()
        if self._loop is not None:
            self._loop.join()
        return self._stats

    def _run_loop(self, targets: list[dict], pause: float) -> None:
        served: Counter = Counter()
        errors: Counter = Counter()
        done: Counter = Counter()
        wrong_peer = 0
        while not self._stop.is_set():
            for target in targets:
                proto, host, port = target["proto"], target["host"], target["port"]
                done[proto] += 1
                exchange = self.tcp if proto == "tcp" else self.udp_query
                try:
                    result = exchange(host, port, target.get("family"))
                except OSError as err:
                    errors[f"{proto} {err.errno or type(err).__name__}"] += 1
                    continue
                served[result["served_by"]] += 1
                wrong_peer += result["peer"] != [host, port]
            self._stop.wait(pause)
        self._stats = {"connects": done["tcp"], "queries": done["udp"], "served": dict(served),
                       "errors": dict(errors), "wrong_peer": wrong_peer}


def _failure(err: OSError) -> dict:
    name = errno.errorcode.get(err.errno, "") if err.errno else ""
    return {"ok": False, "errno": err.errno, "error": name or type(err).__name__}


def main() -> None:
    parser = argparse.ArgumentParser(prog="agent.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-cgroup", action="store_true",
                        help="wait for an empty line, then say which cgroup this is in")
    parser.add_argument("--timeout", type=float, default=3.0,
                        help="seconds a socket operation may take (default 3)")
    args = parser.parse_args()
    if args.in_cgroup:
        sys.stdin.readline()  # the parent has moved us into the cgroup
        with open("/proc/self/cgroup") as cgroups:
            print(json.dumps({"cgroup": cgroups.read().strip()}), flush=True)
    agent = Agent(args.timeout)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"ok": True, **agent.run(request)}
        except OSError as err:
            reply = _failure(err)
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
