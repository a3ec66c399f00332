"""healthCheckNodePort servers, as kube-proxy's pkg/proxy/healthcheck serves
them: for each service of type LoadBalancer with externalTrafficPolicy Local
and a health-check node port, an HTTP server on that port at every allowed
node address (`--nodeport-addresses`), any path. It answers 200 when the node
has at least one local endpoint external traffic may use and the proxy is
healthy (`/healthz`'s verdict), else 503, with

    {"service": {"namespace": "...", "name": "..."}, "localEndpoints": N,
     "serviceProxyHealthy": true}

and the headers `Content-Type: application/json` and
`X-Content-Type-Options: nosniff`. A service's server closes when the service
goes or loses its health-check port; its sockets follow the node's addresses.

localv1 carries no endpoint readiness: the brain sends the endpoints a proxy
may use. `localEndpoints` counts the distinct addresses of the service's local
endpoints in the External scope (what traffic from outside would reach).

Any backend uses it with one object: `HealthCheckNodePorts(metrics, flag)`,
then `start(local_addresses, proxy_health)`, `apply(changes)` after each
change set is programmed, `addresses_changed(local_addresses)` from a
`LocalAddressFollower`, `close()`. All servers share one thread and event loop
of their own; every method may be called from any thread. A port that cannot
be bound (another process holds it) is logged once, counted in
`kpng_py_dataplane_errors_total{kind="healthcheck-bind"}` and tried again with
every later change set or address change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Coroutine, Iterable, Protocol

from kpng_py.healthcheck.httpserver import BoundedHTTPServer, Response
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import IPAddress, ServicePort, ServicePortChanges, ServicePortName
from kpng_py.node.nodeport_addresses import LocalAddressSet, NodePortAddresses
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

_BACKLOG = 64


class ProxyHealth(Protocol):
    """What `/healthz` says (kpng_py.healthcheck.proxier_health.SyncHealth is one)."""

    def status(self) -> tuple[bool, dict]: ...


@dataclass(frozen=True, order=True)
class ServiceName:
    namespace: str
    name: str


@dataclass(frozen=True)
class HealthCheckService:
    """What one service's server answers with."""

    port: int
    local_endpoints: int


def needs_health_check(port: ServicePort) -> bool:
    """kube-proxy's NeedsHealthCheck: type LoadBalancer, eTP=Local, with a port."""
    return (port.type == "LoadBalancer" and port.external_traffic_local
            and port.health_check_node_port > 0)


def health_check_services(ports: Iterable[ServicePort]) -> dict[ServiceName, HealthCheckService]:
    """The services that get a server, from all the service ports of the node
    (a service's ports share its health-check port; their local endpoints
    are counted once per address, in the family that has most: a
    dual-stack pod is one endpoint, as kube-proxy's primary-family count
    says)."""
    found: dict[ServiceName, tuple[int, set[IPAddress]]] = {}
    for port in ports:
        if not needs_health_check(port):
            continue
        key = ServiceName(port.name.namespace, port.name.name)
        _, local = found.setdefault(key, (port.health_check_node_port, set()))
        local.update(ep.ip for ep in port.endpoints if ep.local and ep.external)
    return {key: HealthCheckService(hc_port, max(
                sum(1 for ip in local if ip.version == version) for version in (4, 6)))
            for key, (hc_port, local) in found.items()}


def health_response(service: ServiceName, local_endpoints: int, proxy_healthy: bool) -> Response:
    ok = local_endpoints > 0 and proxy_healthy
    body = {"service": {"namespace": service.namespace, "name": service.name},
            "localEndpoints": local_endpoints, "serviceProxyHealthy": proxy_healthy}
    return Response(200 if ok else 503, "application/json", json.dumps(body).encode(),
                    (("X-Content-Type-Options", "nosniff"),))


def _bound_socket(address: IPAddress, port: int) -> socket.socket:
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if address.version == 6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((str(address), port))
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _ServiceServer:
    """One service's server: a bounded HTTP server (16 connections at most,
    as /healthz) and one listening socket per allowed node address."""

    def __init__(self, name: ServiceName, service: HealthCheckService, metrics: Metrics,
                 owner: HealthCheckNodePorts) -> None:
        self.name = name
        self.service = service
        self._owner = owner
        self._errors = metrics.dataplane_errors
        self._http = BoundedHTTPServer(f"healthcheck {name.namespace}/{name.name}", {}, metrics,
                                       any_path=self._answer)
        self._servers: dict[IPAddress, asyncio.Server] = {}
        self._bind_errors: dict[IPAddress, str] = {}

    def _answer(self) -> Response:
        return health_response(self.name, self.service.local_endpoints,
                               self._owner.proxy_healthy())

    async def listen_on(self, addresses: frozenset[IPAddress]) -> None:
        for address in self._servers.keys() - addresses:
            self._servers.pop(address).close()
        for address in self._bind_errors.keys() - addresses:
            del self._bind_errors[address]
        for address in addresses - self._servers.keys():
            try:
                sock = _bound_socket(address, self.service.port)
            except OSError as err:
                self._bind_failed(address, err.strerror or str(err))
                continue
            self._servers[address] = await self._http.serve_socket(sock)
            if self._bind_errors.pop(address, None) is not None:
                log.info("serving the health check after an earlier failure",
                         extra=fields(service=self._label, address=str(address)))

    def _bind_failed(self, address: IPAddress, error: str) -> None:
        if self._bind_errors.get(address) == error:
            return
        self._bind_errors[address] = error
        self._errors.labels("healthcheck-bind").inc()
        log.error("cannot serve the health-check node port on this address until a later "
                  "change set or address change can", extra=fields(
                      service=self._label, address=str(address), port=self.service.port,
                      error=error))

    @property
    def retrying(self) -> bool:
        """Some address could not be bound and is to be tried again."""
        return bool(self._bind_errors)

    @property
    def _label(self) -> str:
        return f"{self.name.namespace}/{self.name.name}"

    async def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        await self._http.close_connections()


class HealthCheckNodePorts:
    """Every healthCheckNodePort server of the node (see the module docstring)."""

    def __init__(self, metrics: Metrics, nodeport_addresses: NodePortAddresses) -> None:
        self._metrics = metrics
        self._flag = nodeport_addresses
        self._ports: dict[ServicePortName, ServicePort] = {}
        self._servers: dict[ServiceName, _ServiceServer] = {}
        self._addresses: frozenset[IPAddress] = frozenset()
        self._health: ProxyHealth | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, local: LocalAddressSet, health: ProxyHealth | None) -> None:
        """Start the servers' thread. `health` None (no one said what
        /healthz says): every answer says the proxy is not healthy."""
        self._health = health
        self._addresses = self._flag.allowed(local)
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="healthcheck-nodeports",
                                        daemon=True)
        self._thread.start()

    def proxy_healthy(self) -> bool:
        return self._health is not None and self._health.status()[0]

    @property
    def serving(self) -> dict[ServiceName, HealthCheckService]:
        """What is served now, per service."""
        return {name: server.service for name, server in self._servers.items()}

    def apply(self, changes: ServicePortChanges) -> None:
        """Follow one programmed change set (waits until the servers did).
        Only ports with a health check are kept, and the servers' thread is
        only called when one of them changed or a bind is to be retried, so
        a change set costs what it carries, not what the node holds."""
        touched = changes.full
        if changes.full:
            self._ports = {}
        for port in changes.removed:
            touched |= self._ports.pop(port.name, None) is not None
        for port in changes.current():
            if needs_health_check(port):
                self._ports[port.name] = port
                touched = True
            elif self._ports.pop(port.name, None) is not None:
                touched = True
        if touched or any(server.retrying for server in self._servers.values()):
            self._call(self._sync(health_check_services(self._ports.values())))

    def addresses_changed(self, local: LocalAddressSet) -> None:
        """The node's addresses changed (from a LocalAddressFollower's thread
        or any other)."""
        allowed = self._flag.allowed(local)
        self._call(self._move(allowed))

    async def _move(self, allowed: frozenset[IPAddress]) -> None:
        self._addresses = allowed
        await self._sync(self.serving)

    async def _sync(self, wanted: dict[ServiceName, HealthCheckService]) -> None:
        # Gone, or moved to another port: closed (a new count is only an answer).
        for name in [n for n, s in self._servers.items()
                     if n not in wanted or wanted[n].port != s.service.port]:
            await self._servers.pop(name).close()
        for name, service in wanted.items():
            server = self._servers.get(name)
            if server is None:
                server = self._servers[name] = _ServiceServer(name, service, self._metrics, self)
                log.info("serving a health-check node port", extra=fields(
                    service=f"{name.namespace}/{name.name}", port=service.port))
            server.service = service
            await server.listen_on(self._addresses)

    def _call(self, coroutine: Coroutine[None, None, None]) -> None:
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("HealthCheckNodePorts.start() was not called")
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        """Close every server and stop the thread."""
        if self._loop is None or self._thread is None:
            return
        self._call(self._sync({}))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = None
