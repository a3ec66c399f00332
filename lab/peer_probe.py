"""Clients of the NodePort topology for what curl cannot show (standard
library only, run inside a namespace, JSON out; see probe.py for the others):

    peer_probe.py ask HOST PORT [--udp] [--connected] [--source IP] [--count N] [--until-failure]
        N new sockets (fewer with --until-failure: none after the first that
        failed), each asks lab/whoami_server.py once: which pod answered,
        the client address that pod saw, getpeername() (TCP, connected UDP)
        and the source recvfrom() names (UDP); or the errno and how long it took
    peer_probe.py http-get HOST PORT [--path P] [--source IP]
        one GET (a health check): status, headers (lower-case names), body

HOST may be an IPv4-mapped IPv6 address; --source binds the socket to that
local address first (the external client has two).
"""

from __future__ import annotations

import argparse
import http.client
import socket
import sys
import time
from typing import Any

from probe import _addr, _errno_name, _family, emit  # same directory: lab/


def _socket(host: str, kind: int, source: str | None, timeout: float) -> socket.socket:
    sock = socket.socket(_family(host), kind)
    sock.settimeout(timeout)
    if source:
        sock.bind((source, 0))
    return sock


def _parse(line: bytes) -> dict[str, Any]:
    pod, ip, port = line.decode().split()
    return {"pod": pod, "seen_as": [ip, int(port)]}


def ask_once(host: str, port: int, udp: bool, connected: bool, source: str | None,
             timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    try:
        with _socket(host, kind, source, timeout) as sock:
            if udp and not connected:
                sock.sendto(b"?\n", (host, port))
                reply, origin = sock.recvfrom(65535)
                return {"ok": True, **_parse(reply), "source": _addr(origin),
                        "seconds": time.monotonic() - started}
            sock.connect((host, port))
            peer = _addr(sock.getpeername())
            if udp:
                sock.send(b"?\n")
            reply = sock.recv(65535)
            return {"ok": True, **_parse(reply), "peer": peer,
                    "seconds": time.monotonic() - started}
    except OSError as err:
        return {"ok": False, "errno": _errno_name(err), "seconds": time.monotonic() - started}
    except ValueError:  # not the whoami server's line (another server answered)
        return {"ok": False, "errno": "unexpected answer", "seconds": time.monotonic() - started}


def http_get(host: str, port: int, path: str, source: str | None,
             timeout: float) -> dict[str, Any]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
    except OSError as err:
        return {"ok": False, "errno": _errno_name(err)}
    finally:
        conn.close()
    return {"ok": True, "status": response.status, "body": body,
            "headers": {k.lower(): v for k, v in response.getheaders()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="peer_probe.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("ask", "http-get"):
        p = sub.add_parser(name)
        p.add_argument("host")
        p.add_argument("port", type=int)
        p.add_argument("--source")
        p.add_argument("--timeout", type=float, default=2.0)
        if name == "ask":
            p.add_argument("--udp", action="store_true")
            p.add_argument("--connected", action="store_true")
            p.add_argument("--count", type=int, default=1)
            p.add_argument("--until-failure", action="store_true")
        else:
            p.add_argument("--path", default="/healthz")
    args = parser.parse_args(argv)
    if args.command == "ask":
        answers = []
        for _ in range(args.count):
            answers.append(ask_once(args.host, args.port, args.udp, args.connected, args.source,
                                    args.timeout))
            if args.until_failure and not answers[-1]["ok"]:
                break
        emit(answers=answers)
    else:
        emit(**http_get(args.host, args.port, args.path, args.source, args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
