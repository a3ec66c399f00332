"""A test client: runs socket operations read as JSON lines from stdin and
answers each with one JSON line on stdout.

Run it inside the client network namespace (`ip netns exec NS python
cgroup_agent.py`; socket_lab.Agent does). The parent moves it into the test
cgroup, then sends an empty line; the agent answers with its cgroup and only
then creates sockets, so the kpng-py programs attached to the cgroup see
every socket it makes. A long-lived agent keeps sockets across calls (sticky
UDP, stale connected UDP).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections import Counter

TIMEOUT = 2.0


def _family(family: int) -> int:
    return socket.AF_INET if family == 4 else socket.AF_INET6


def _address(addr: tuple) -> list:
    return [addr[0], addr[1]]


def _served_by(answer: bytes) -> str:
    """Who answered: the first word of lab/peer_server.py's line."""
    return answer.split(maxsplit=1)[0].decode()


def _payload_size(answer: bytes) -> int:
    """How much of the datagram came back after the server's line."""
    return len(answer.partition(b"\n")[2])


class Agent:
    def __init__(self) -> None:
        self.sockets: dict[int, socket.socket] = {}

    def tcp(self, host: str, port: int, family: int) -> dict:
        with socket.socket(_family(family), socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect((host, port))
            peer = _address(sock.getpeername())
            return {"peer": peer, "served_by": _served_by(sock.makefile("rb").readline())}

    def udp_open(self, family: int) -> dict:
        sock = socket.socket(_family(family), socket.SOCK_DGRAM)
        sock.settimeout(TIMEOUT)
        self.sockets[sock.fileno()] = sock
        return {"sock": sock.fileno()}

    def udp_sendto(self, sock: int, host: str, port: int, payload: str = "x") -> dict:
        s = self.sockets[sock]
        s.sendto(payload.encode(), (host, port))
        data, source = s.recvfrom(65535)
        return {"from": _address(source), "served_by": _served_by(data),
                "size": _payload_size(data)}

    def udp_connect(self, sock: int, host: str, port: int) -> dict:
        s = self.sockets[sock]
        s.connect((host, port))
        return {"peer": _address(s.getpeername())}

    def udp_send(self, sock: int, payload: str = "x") -> dict:
        s = self.sockets[sock]
        s.send(payload.encode())
        data, source = s.recvfrom(65535)
        return {"from": _address(source), "served_by": _served_by(data)}

    def udp_close(self, sock: int) -> dict:
        self.sockets.pop(sock).close()
        return {}

    def udp_query(self, host: str, port: int, family: int) -> dict:
        """One request and its reply from a fresh unconnected socket (a DNS lookup)."""
        with socket.socket(_family(family), socket.SOCK_DGRAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.sendto(b"q", (host, port))
            data, source = sock.recvfrom(65535)
            return {"peer": _address(source), "served_by": _served_by(data)}

    def loop_start(self, targets: list[dict], pause: float = 0.0) -> dict:
        """Until loop_stop, in a thread: rounds of one exchange with each target
        ({"proto": "tcp" or "udp", "host", "port", "family"}) in turn, a TCP
        connect or a UDP query, with `pause` seconds between rounds."""
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._run_loop, args=(targets, pause))
        self._loop.start()
        return {}

    def loop_stop(self) -> dict:
        """How many connects and queries worked, failed (by protocol and errno)
        or showed something else than the VIP as their peer."""
        self._stop.set()
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
                    result = exchange(host, port, target["family"])
                except OSError as err:
                    errors[f"{proto} {err.errno or type(err).__name__}"] += 1
                    continue
                served[result["served_by"]] += 1
                wrong_peer += result["peer"] != [host, port]
            self._stop.wait(pause)
        self._stats = {"connects": done["tcp"], "queries": done["udp"], "served": dict(served),
                       "errors": dict(errors), "wrong_peer": wrong_peer}


def main() -> None:
    sys.stdin.readline()  # the parent has moved us into the cgroup
    with open("/proc/self/cgroup") as cgroups:
        print(json.dumps({"cgroup": cgroups.read().strip()}), flush=True)
    agent = Agent()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            reply = {"ok": True, **getattr(agent, op)(**request)}
        except OSError as err:
            reply = {"ok": False, "errno": err.errno, "error": str(err)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
