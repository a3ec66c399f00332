"""Terminate connected UDP sockets whose endpoint was removed
(docs/spec/service-behaviours.md, S9: the socket-level counterpart of
kube-proxy's UDP conntrack flush).

A connected UDP socket went through connect4/6 once and keeps sending to the
endpoint chosen then, even after that endpoint left the service. We find such
sockets and destroy them with sock_diag SOCK_DESTROY (what `ss -K` does): the
application gets ECONNABORTED and reconnects, which picks a live endpoint.

Which sockets: the network namespaces of the processes in the attached cgroup
(and its descendants), deduplicated; in each, connected UDP sockets whose peer
is a removed endpoint and whose reverse-NAT entry says they reached it through
the service that lost it. Sockets an application pointed at a pod IP itself,
or that reached the same endpoint through another service, are left alone.

Why raw netlink: pyroute2's DiagSocket can dump but has no destroy request,
ignores netlink errors for this family and cannot open a socket in another
namespace without forking; the two messages we need are fixed-size structs.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol

from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.contents import HostPort, reached_through
from backends.ebpf.maps.layout import RevNatKey, RevNatValue, unpacked_address
from kpng_py.node.netns import in_netns
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_ESTABLISHED = 1  # connected UDP sockets report this state

_NLMSGHDR = struct.Struct("=IHHII")
# struct inet_diag_req_v2 without its inet_diag_sockid (kept as raw bytes).
_REQ_HEAD = struct.Struct("=BBBxI")
# struct inet_diag_sockid: ports and addresses in network order, then the
# interface and the socket cookie as two host-order words.
_SOCKID = struct.Struct(">HH16s16s")
_SOCKID_SIZE = 48
_COOKIE = struct.Struct("=II")  # its last 8 bytes
# struct inet_diag_msg: family, state, timer, retrans, then the sockid.
_MSG_HEAD = struct.Struct("=BBBB")

_NETLINK_TIMEOUT = 5.0


@dataclass(frozen=True)
class ConnectedSocket:
    family: int
    cookie: int
    peer: HostPort
    sockid: bytes  # as the kernel reported it, to address the destroy request


def namespaces_of_cgroup(cgroup: Path) -> dict[tuple[int, int], Path]:
    """One /proc/PID/ns/net path per network namespace used by a process of
    the cgroup or its descendants."""
    found: dict[tuple[int, int], Path] = {}
    for directory, _, _ in os.walk(cgroup):
        try:
            pids = Path(directory, "cgroup.procs").read_text().split()
        except OSError:  # removed meanwhile, or a threaded cgroup
            continue
        for pid in pids:
            path = Path("/proc", pid, "ns", "net")
            try:
                st = path.stat()
            except OSError:  # the process exited
                continue
            found.setdefault((st.st_dev, st.st_ino), path)
    return found


def open_diag_socket(netns: Path) -> socket.socket:
    """A sock_diag netlink socket in another network namespace."""
    def open_socket() -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        sock.settimeout(_NETLINK_TIMEOUT)
        return sock

    return in_netns(netns, open_socket)


def _request(sock: socket.socket, msg_type: int, flags: int, family: int, states: int,
             sockid: bytes) -> None:
    body = _REQ_HEAD.pack(family, socket.IPPROTO_UDP, 0, states) + sockid
    sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags, 0, 0) + body)


def _replies(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each message until DONE or an error/ack."""
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, msg_type, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
            yield msg_type, data[offset + _NLMSGHDR.size:offset + length]
            if msg_type in (NLMSG_DONE, NLMSG_ERROR):
                return
            offset += (length + 3) & ~3


def connected_udp_sockets(sock: socket.socket) -> Iterator[ConnectedSocket]:
    for family in (socket.AF_INET, socket.AF_INET6):
        _request(sock, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, family,
                 1 << TCP_ESTABLISHED, bytes(_SOCKID_SIZE))
        for msg_type, payload in _replies(sock):
            if msg_type == NLMSG_ERROR:
                _raise_error(payload, "dump UDP sockets")
            if msg_type != SOCK_DIAG_BY_FAMILY:
                continue
            sockid = payload[_MSG_HEAD.size:_MSG_HEAD.size + _SOCKID_SIZE]
            _, dport, _, dst = _SOCKID.unpack_from(sockid)
            ip = ipaddress.IPv4Address(dst[:4]) if family == socket.AF_INET else (
                unpacked_address(dst))
            cookie_low, cookie_high = _COOKIE.unpack_from(sockid, _SOCKID_SIZE - _COOKIE.size)
            yield ConnectedSocket(family, cookie_low | cookie_high << 32, HostPort(ip, dport),
                                  sockid)


def destroy(sock: socket.socket, target: ConnectedSocket) -> bool:
    """SOCK_DESTROY one socket; False when it is already gone."""
    _request(sock, SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, target.family, 0, target.sockid)
    for msg_type, payload in _replies(sock):
        if msg_type == NLMSG_ERROR:
            try:
                _raise_error(payload, "SOCK_DESTROY")
            except FileNotFoundError:
                return False  # closed meanwhile
            return True
    return False


def _raise_error(payload: bytes, what: str) -> None:
    """An NLMSG_ERROR carries -errno (0 for an acknowledgement)."""
    code = -struct.unpack_from("=i", payload)[0]
    if code:
        raise OSError(code, f"{what}: {os.strerror(code)}")


class Failures(Protocol):
    """Where failed clean-ups are counted (a prometheus Counter child is one)."""

    def inc(self) -> None: ...


class StaleUdpTerminator:
    """Destroys connected UDP sockets of the cgroup whose endpoint is gone.

    A namespace that cannot be checked (its pod is going away, or a security
    module refuses) is usually refused again with every following change set:
    each failure is counted in `failures`, and warned about once per namespace
    until a check of it succeeds again."""

    def __init__(self, cgroup: Path, reverse_nat: MapAccess[RevNatKey, RevNatValue],
                 failures: Failures,
                 open_socket: Callable[[Path], socket.socket] = open_diag_socket) -> None:
        self._cgroup = cgroup
        self._reverse_nat = reverse_nat
        self._failures = failures
        self._open_socket = open_socket
        self._failing: set[tuple[int, int]] = set()  # namespaces warned about

    def terminate(self, removed: Iterable[tuple[int, HostPort]]) -> int:
        """Destroy the sockets that reached a removed (frontend id, endpoint)
        pair; returns how many."""
        by_endpoint: dict[HostPort, set[int]] = {}
        for frontend_id, endpoint in removed:
            by_endpoint.setdefault(endpoint, set()).add(frontend_id)
        if not by_endpoint:
            return 0
        destroyed = 0
        namespaces = namespaces_of_cgroup(self._cgroup)
        self._failing &= namespaces.keys()  # forget namespaces that are gone
        for key, netns in namespaces.items():
            try:
                with self._open_socket(netns) as sock:
                    destroyed += self._terminate_in(sock, by_endpoint)
            except OSError as err:  # the namespace went away, or no permission
                self._failed(key, netns, err)
            else:
                self._failing.discard(key)
        return destroyed

    def _failed(self, key: tuple[int, int], netns: Path, err: OSError) -> None:
        self._failures.inc()
        if key in self._failing:
            return
        self._failing.add(key)
        log.warning("cannot check a network namespace for stale UDP sockets; counted in "
                    "kpng_py_dataplane_errors{kind=\"udp-socket-termination\"}, not warned "
                    "again until it can be checked", extra=fields(netns=netns, error=err))

    def _terminate_in(self, sock: socket.socket, by_endpoint: dict[HostPort, set[int]]) -> int:
        stale = [s for s in connected_udp_sockets(sock)
                 if s.peer in by_endpoint and self._reached_through(s, by_endpoint[s.peer])]
        return sum(destroy(sock, s) for s in stale)

    def _reached_through(self, target: ConnectedSocket, frontend_ids: set[int]) -> bool:
        return reached_through(self._reverse_nat, target.cookie, target.peer) in frontend_ids
