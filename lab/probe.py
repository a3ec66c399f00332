"""The lab's client for what curl, dig and socat cannot show: errno and
timing of a rejected connect, recvfrom/getpeername addresses, which pod
answered and the client address it saw, one UDP socket kept across an
endpoint replacement, a long-lived connection across a backend restart, a
health check's headers. Runs inside a pod or namespace (standard library
only) and prints JSON.

    probe.py connect HOST PORT [--udp]         one connect (+ one exchange for UDP)
    probe.py udp-echo HOST PORT --size N [--connected]
    probe.py ask HOST PORT [--udp] [--connected] [--source IP] [--count N] [--until-failure]
        N new sockets (fewer with --until-failure: none after the first that
        failed), each asks lab/peer_server.py once: which pod answered, the
        client address that pod saw, getpeername() (TCP, connected UDP) and
        the source recvfrom() names (UDP); or the errno and how long it took
    probe.py http-get HOST PORT [--path P] [--source IP]
        one GET (a health check): status, headers (lower-case names), body
    probe.py dns-follow HOST PORT [--connected]  until stdin closes: who answers
    probe.py http-loop HOST PORT ECHO_HOST ECHO_PORT  until stdin closes

HOST may be an IPv4-mapped IPv6 address (`::ffff:10.96.0.10`): the socket is
then AF_INET6, as a dual-stack application's would be. --source binds the
socket to that local address first (the external client has two).
"""

from __future__ import annotations

import argparse
import errno
import http.client
import ipaddress
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any

_TXT = 16
_IN = 1
# What a UDP socket answers once the kernel aborted it (sock_destroy: the
# error, then "not connected"); ICMP errors (refused, unreachable) are
# reported by a socket that stays usable.
_SOCKET_UNUSABLE = (errno.ECONNABORTED, errno.EDESTADDRREQ, errno.ENOTCONN, errno.EBADF)


def _family(host: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET


def _errno_name(err: OSError) -> str:
    if isinstance(err, socket.timeout) or err.errno is None:
        return "timeout"
    return errno.errorcode.get(err.errno, str(err.errno))


def _addr(addr: Any) -> list[Any]:
    return [addr[0], addr[1]]


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# -- one-shot probes -------------------------------------------------------
def connect(host: str, port: int, udp: bool, timeout: float) -> None:
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    started = time.monotonic()
    with socket.socket(_family(host), kind) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
            peer = _addr(sock.getpeername())
            if udp:  # a refusal of UDP shows on the exchange, not the connect
                sock.send(b"probe")
                sock.recv(65535)
        except OSError as err:
            emit(ok=False, errno=_errno_name(err), seconds=time.monotonic() - started)
            return
    emit(ok=True, peer=peer, seconds=time.monotonic() - started)


def udp_echo(host: str, port: int, size: int, connected: bool, timeout: float) -> None:
    payload = os.urandom(size)
    with socket.socket(_family(host), socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            if connected:
                sock.connect((host, port))
                sock.send(payload)
            else:
                sock.sendto(payload, (host, port))
            reply, source = sock.recvfrom(65535)
            peer = _addr(sock.getpeername()) if connected else None
        except OSError as err:
            emit(ok=False, errno=_errno_name(err))
            return
    emit(ok=True, equal=reply == payload, size=len(reply), source=_addr(source), peer=peer)


# -- peer_server's answers, health checks ----------------------------------
def _bound_socket(host: str, kind: int, source: str | None, source_port: int,
                  timeout: float) -> socket.socket:
    sock = socket.socket(_family(host), kind)
    sock.settimeout(timeout)
    if source or source_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((source or "", source_port))
    return sock


def _peer_answer(answer: bytes) -> dict[str, Any]:
    pod, ip, port = answer.split(b"\n", 1)[0].decode().split()
    return {"pod": pod, "seen_as": [ip, int(port)]}


def ask_once(host: str, port: int, udp: bool, connected: bool, source: str | None,
             timeout: float, source_port: int = 0) -> dict[str, Any]:
    """One exchange with lab/peer_server.py from a new socket (also called in
    process, e.g. by lab/nodeport_lab.py's workers)."""
    started = time.monotonic()
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    try:
        with _bound_socket(host, kind, source, source_port, timeout) as sock:
            if udp and not connected:
                sock.sendto(b"?\n", (host, port))
                reply, origin = sock.recvfrom(65535)
                return {"ok": True, **_peer_answer(reply), "source": _addr(origin),
                        "seconds": time.monotonic() - started}
            sock.connect((host, port))
            peer = _addr(sock.getpeername())
            if udp:
                sock.send(b"?\n")
            reply = sock.recv(65535)
            return {"ok": True, **_peer_answer(reply), "peer": peer,
                    "seconds": time.monotonic() - started}
    except OSError as err:
        return {"ok": False, "errno": _errno_name(err), "seconds": time.monotonic() - started}
    except ValueError:  # not peer_server's line (another server answered)
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


# -- DNS (just enough for one TXT question) --------------------------------
def dns_query(name: str, query_id: int) -> bytes:
    header = struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.strip(".").split("."))
    return header + labels + b"\0" + struct.pack("!HH", _TXT, _IN)


def _skip_name(msg: bytes, offset: int) -> int:
    while True:
        length = msg[offset]
        if length & 0xC0 == 0xC0:  # compression pointer ends the name
            return offset + 2
        if length == 0:
            return offset + 1
        offset += 1 + length


def dns_txt_answer(msg: bytes, query_id: int) -> str | None:
    """The first TXT string of a reply to `query_id`, or None."""
    got_id, _flags, qdcount, ancount = struct.unpack("!HHHH", msg[:8])
    if got_id != query_id or ancount == 0:
        return None
    offset = 12
    for _ in range(qdcount):
        offset = _skip_name(msg, offset) + 4
    offset = _skip_name(msg, offset)
    rtype, _cls, _ttl, rdlength = struct.unpack("!HHIH", msg[offset:offset + 10])
    if rtype != _TXT or rdlength == 0:
        return None
    text_len = msg[offset + 10]
    return msg[offset + 11:offset + 11 + text_len].decode()


def _until_stdin_closes() -> threading.Event:
    done = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    return done


def dns_follow(host: str, port: int, name: str, connected: bool, interval: float) -> None:
    """One UDP socket asking `name` every `interval` s; a line per answer or
    error. The socket is replaced only when the kernel makes it unusable
    (e.g. a proxy destroyed it), as a resolver library would do."""
    done = _until_stdin_closes()
    sock: socket.socket | None = None
    query_id = 0
    while not done.is_set():
        query_id = (query_id + 1) & 0xFFFF
        started = time.monotonic()
        try:
            if sock is None:
                sock = _dns_socket(host, port, connected)
                emit(event="socket", connected=connected)
            query = dns_query(name, query_id)
            if connected:
                sock.send(query)
            else:
                sock.sendto(query, (host, port))
            answer = _await_answer(sock, query_id, interval)
            emit(t=started, pod=answer)
        except OSError as err:
            emit(t=started, error=_errno_name(err))
            if sock is not None and err.errno in _SOCKET_UNUSABLE:
                sock.close()
                sock = None
                emit(event="socket-dropped", reason=_errno_name(err))
        done.wait(max(0.0, interval - (time.monotonic() - started)))
    if sock is not None:
        sock.close()


def _dns_socket(host: str, port: int, connected: bool) -> socket.socket:
    sock = socket.socket(_family(host), socket.SOCK_DGRAM)
    if connected:
        sock.connect((host, port))
    return sock


def _await_answer(sock: socket.socket, query_id: int, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        answer = dns_txt_answer(sock.recv(65535), query_id)
        if answer is not None:
            return answer
    raise socket.timeout()


# -- restart loop ----------------------------------------------------------
def http_loop(host: str, port: int, echo_host: str, echo_port: int, interval: float) -> None:
    """New HTTP connections every `interval` s, plus one established TCP
    connection that exchanges a line every `interval` s."""
    done = _until_stdin_closes()
    try:
        established: socket.socket | None = socket.create_connection((echo_host, echo_port), 2)
    except OSError as err:
        established = None
        emit(t=time.monotonic(), kind="established", ok=False, errno=_errno_name(err))
    count = 0
    while not done.is_set():
        started = time.monotonic()
        emit(t=started, kind="new", **_http_get(host, port))
        count += 1
        if established is not None:
            emit(t=started, kind="established", **_exchange(established, f"ping {count}\n"))
        done.wait(max(0.0, interval - (time.monotonic() - started)))
    if established is not None:
        established.close()


def _exchange(sock: socket.socket, line: str) -> dict[str, Any]:
    try:
        sock.sendall(line.encode())
        echoed = _recv_exactly(sock, len(line))
    except OSError as err:
        return {"ok": False, "errno": _errno_name(err)}
    if echoed == line.encode():
        return {"ok": True}
    short = len(echoed) < len(line)
    return {"ok": False, "errno": "closed by the peer" if short else "echo differed"}


def _http_get(host: str, port: int) -> dict[str, Any]:
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            body = b"".join(iter(lambda: sock.recv(4096), b""))
    except OSError as err:
        return {"ok": False, "errno": _errno_name(err)}
    text = body.decode(errors="replace").split("\r\n\r\n", 1)[-1].strip()
    return {"ok": True, "pod": text.split()[0] if text else None}


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("connect")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--udp", action="store_true")
    p.add_argument("--timeout", type=float, default=2.0)
    p = sub.add_parser("udp-echo")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--size", type=int, default=2000)
    p.add_argument("--connected", action="store_true")
    p.add_argument("--timeout", type=float, default=2.0)
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
    p = sub.add_parser("dns-follow")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--name", default="whoami.e2e")
    p.add_argument("--connected", action="store_true")
    p.add_argument("--interval", type=float, default=0.1)
    p = sub.add_parser("http-loop")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("echo_host")
    p.add_argument("echo_port", type=int)
    p.add_argument("--interval", type=float, default=0.05)
    args = parser.parse_args(argv)
    if args.command == "connect":
        connect(args.host, args.port, args.udp, args.timeout)
    elif args.command == "udp-echo":
        udp_echo(args.host, args.port, args.size, args.connected, args.timeout)
    elif args.command == "ask":
        answers = []
        for _ in range(args.count):
            answers.append(ask_once(args.host, args.port, args.udp, args.connected, args.source,
                                    args.timeout))
            if args.until_failure and not answers[-1]["ok"]:
                break
        emit(answers=answers)
    elif args.command == "http-get":
        emit(**http_get(args.host, args.port, args.path, args.source, args.timeout))
    elif args.command == "dns-follow":
        dns_follow(args.host, args.port, args.name, args.connected, args.interval)
    else:
        http_loop(args.host, args.port, args.echo_host, args.echo_port, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
