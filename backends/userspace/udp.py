"""UDP: a session per client, replies sent from the ClusterIP:port listener.

A datagram from a new client address opens a session: a socket connected to
the endpoint Maglev (or the client's affinity) chose. The endpoint's replies
are sent back through the listener socket, which is bound to the ClusterIP,
so the client sees them come from ClusterIP:port. Sessions end after
`udp_idle_timeout` seconds without traffic either way, when their endpoint
goes away (the client's next datagram picks a live one, as kube-proxy's
conntrack flush does), when the endpoint answers with ICMP port unreachable,
and with their listener.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from backends.userspace.context import ProxyContext, Tally
from backends.userspace.listener import Listener
from backends.userspace.picker import FrontendPickers
from backends.userspace.sockets import sockaddr, socket_family
from kpng_py.model import Endpoint, IPAddress, IPNetwork
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

# Largest UDP payload (IPv4 limit; IPv6 jumbograms do not cross a proxy).
_MAX_DATAGRAM = 65535
# Datagrams handled per wake-up, so one busy socket cannot starve the others.
_BATCH = 64

ClientAddress = tuple[str, int]


class _Session:
    __slots__ = ("client", "endpoint", "sock", "last_used")

    def __init__(self, client: ClientAddress, endpoint: Endpoint, sock: socket.socket,
                 now: float) -> None:
        self.client = client
        self.endpoint = endpoint
        self.sock = sock
        self.last_used = now


class UdpListener(Listener):
    """One ClusterIP:port for UDP and its sessions."""

    KIND = socket.SOCK_DGRAM

    def __init__(self, ctx: ProxyContext, name: str, address: IPAddress, port: int,
                 pickers: FrontendPickers, tally: Tally,
                 source_ranges: tuple[IPNetwork, ...] | None) -> None:
        super().__init__(ctx, name, address, port, pickers, tally, source_ranges)
        self._sessions: dict[ClientAddress, _Session] = {}
        # One receive buffer for the listener and its sessions: the loop runs
        # one callback at a time and each sends what it read before returning.
        self._buffer = bytearray(_MAX_DATAGRAM)
        self._view = memoryview(self._buffer)

    def update(self, cluster: tuple[Endpoint, ...], external: tuple[Endpoint, ...] | None,
               source_ranges: tuple[IPNetwork, ...] | None) -> set[Endpoint]:
        """Sessions to endpoints that went end: the client's next datagram
        opens one to a live endpoint."""
        gone = super().update(cluster, external, source_ranges)
        if gone:
            for session in [s for s in self._sessions.values() if s.endpoint in gone]:
                self._end(session)
        return gone

    def close(self) -> None:
        for session in list(self._sessions.values()):
            self._end(session)
        super().close()

    def expire(self, now: float) -> bool:
        idle_before = now - self._ctx.config.udp_idle_timeout
        for session in [s for s in self._sessions.values() if s.last_used <= idle_before]:
            self._end(session)
        return bool(self._sessions)

    def _on_readable(self, sock: socket.socket) -> None:
        """Datagrams from clients."""
        for _ in range(_BATCH):
            try:
                size, client = sock.recvfrom_into(self._buffer)
            except BlockingIOError:
                return
            except OSError as err:
                self._ctx.stats.error("udp-receive")
                log.debug("udp receive failed",
                          extra=fields(listener=self.name, error=err.strerror))
                return
            client = client[:2]
            session = self._sessions.get(client) or self._open(client, sock)
            if session is None:
                continue
            session.last_used = self._loop.time()
            try:
                session.sock.send(self._view[:size])
            except BlockingIOError:
                self._ctx.stats.error("udp-drop")
            except OSError as err:  # e.g. ECONNREFUSED from an earlier ICMP error
                self._session_failed(session, err)

    def _open(self, client: ClientAddress, listening: socket.socket) -> _Session | None:
        """A session for a new client; its endpoint's replies are sent from
        `listening` (sessions end before it closes)."""
        client_ip = ipaddress.ip_address(client[0])
        now = self._loop.time()
        picker = self.picker_for(client_ip)
        if picker is None or not (candidates := picker.candidates(client_ip, client[1], now, 1)):
            self._tally.rejected += 1
            return None
        endpoint = candidates[0]
        sock = socket.socket(socket_family(endpoint.ip), socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.connect(sockaddr(endpoint.ip, endpoint.port))
        except OSError as err:
            sock.close()
            self._tally.rejected += 1
            self._ctx.stats.error("udp-connect")
            log.debug("udp session failed to open", extra=fields(
                listener=self.name, endpoint=str(endpoint), error=err.strerror))
            return None
        session = _Session(client, endpoint, sock, now)
        self._sessions[client] = session
        self._loop.add_reader(sock.fileno(), self._on_endpoint_datagrams, session, listening)
        picker.served(client_ip, endpoint, now)
        self._tally.sent_to(endpoint)
        self._ctx.stats.udp_sessions.inc()
        self._ctx.housekeeping.watch(self)
        return session

    def _on_endpoint_datagrams(self, session: _Session, listening: socket.socket) -> None:
        for _ in range(_BATCH):
            try:
                size = session.sock.recv_into(self._buffer)
            except BlockingIOError:
                return
            except OSError as err:
                self._session_failed(session, err)
                return
            session.last_used = self._loop.time()
            try:
                listening.sendto(self._view[:size], session.client)
            except OSError:  # the client's socket buffer is full, or it is unreachable
                self._ctx.stats.error("udp-drop")

    def _session_failed(self, session: _Session, err: OSError) -> None:
        """The endpoint refused (ICMP port unreachable) or the socket broke:
        end the session so the client's next datagram starts a fresh one."""
        log.debug("udp session ended by an error", extra=fields(
            listener=self.name, endpoint=str(session.endpoint), error=err.strerror))
        self._end(session)

    def _end(self, session: _Session) -> None:
        del self._sessions[session.client]
        self._loop.remove_reader(session.sock.fileno())
        session.sock.close()
        self._ctx.stats.udp_sessions.dec()
