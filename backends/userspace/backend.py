"""The userspace backend: change sets in, addresses and listeners out.

Service addresses (ClusterIPs, ExternalIPs, LB IPs) are changed with netlink
from the caller's thread; listeners live on an asyncio loop (uvloop when
installed) in a thread of their own, and `apply` waits until the loop has
applied the change. Order per change set: new addresses first, then
listeners, then addresses no longer used, so a client never finds an address
it may use missing. Node ports listen on each allowed node address
(`--nodeport-addresses`), followed live (`LocalAddressFollower`, whose
callbacks run on the loop too); healthCheckNodePorts are served by
kpng_py.healthcheck.service_health.

Bad input and bad neighbours cost only what they touch: a ClusterIP that
`kpng_py.state.decode.address_problem` refuses is dropped (guard.py); one the
kernel refuses, or a ClusterIP:port another process holds, leaves only that
frontend unserved, logged and counted once, and is tried again with every
later change set. Only a failure of the interface itself fails the change
set (addresses.py).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, TypeVar

from backends.userspace.addresses import ClusterIPAddresses
from backends.userspace.context import (
    MAX_HOUSEKEEPING_INTERVAL,
    Housekeeping,
    NodeAddresses,
    ProxyConfig,
    ProxyContext,
    ProxyStats,
    Tally,
)
from backends.userspace.guard import ClusterIPGuard
from backends.userspace.listener import Listener
from backends.userspace.picker import FrontendPickers, PortAffinity
from backends.userspace.tcp import TcpListener
from backends.userspace.udp import UdpListener
from kpng_py.healthcheck.service_health import HealthCheckNodePorts, ProxyHealth
from kpng_py.metrics.metrics import Metrics
from kpng_py.metrics.service_counters import ServiceCountersCollector, ServiceCounts
from kpng_py.model import (
    Endpoint,
    Frontend,
    FrontendKind,
    IPAddress,
    IPNetwork,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
    family_of,
    format_host_port,
)
from kpng_py.node.nodeport_addresses import LocalAddressFollower, LocalAddressSet
from kpng_py.runtime.aio import new_event_loop
from kpng_py.runtime.logs import fields
from kpng_py.state.skips import Skips

log = logging.getLogger(__name__)

_LISTENERS: dict[Protocol, type[Listener]] = {
    Protocol.TCP: TcpListener,
    Protocol.UDP: UdpListener,
}
T = TypeVar("T")

# The reason kpng_py_service_ports_not_programmed gives a port missing a listener.
CANNOT_LISTEN = "cannot-listen"


def raise_open_files_limit() -> None:
    """Each proxied TCP connection holds six descriptors (two sockets, two
    pipes); allow as many as the hard limit does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("raised the open files limit", extra=fields(before=soft, after=hard))


@dataclass(frozen=True)
class _Wanted:
    """One listener a service port needs: its frontend, the address it binds
    (the frontend's own, or one node address for a node port) and the
    endpoints of each side (`external` None: a ClusterIP, all clients alike)
    and who may connect."""

    frontend: Frontend
    address: IPAddress
    cluster: tuple[Endpoint, ...]
    external: tuple[Endpoint, ...] | None
    # Of an LB IP whose port has loadBalancerSourceRanges; None: not filtered.
    source_ranges: tuple[IPNetwork, ...] | None

    @property
    def key(self) -> tuple[Frontend, IPAddress, bool]:
        return (self.frontend, self.address, self.external is None)


class ServicePortListeners:
    """The listeners of one service port: for each frontend
    (`ServicePort.frontends()`, as every backend serves) with endpoints of
    its own family, one on its address (on the interface), or for a node
    port one on each allowed node address of its family. No endpoints, no
    listener: the kernel refuses clients."""

    def __init__(self, ctx: ProxyContext, name: ServicePortName, skips: Skips) -> None:
        self._ctx = ctx
        self._skips = skips
        self.name = name
        self.port: ServicePort | None = None
        # Of all its listeners, for as long as the port is programmed.
        self.tally = Tally(per_endpoint=ctx.config.endpoint_counters)
        self.affinity = PortAffinity(ctx.housekeeping.watch)
        self._listeners: dict[tuple[Frontend, IPAddress, bool], Listener] = {}
        # Why a listener could not be opened: logged and counted once, not
        # again by each retry that fails the same way.
        self._listen_errors: dict[tuple[Frontend, IPAddress, bool], str] = {}
        self._ranges_given: tuple[str, ...] = ()
        self._ranges: tuple[IPNetwork, ...] | None = None

    def _wanted(self, port: ServicePort) -> list[_Wanted]:
        wanted: list[_Wanted] = []
        ranges = self._source_ranges(port)
        for frontend in port.frontends():
            family = family_of(frontend.ip)
            cluster = port.cluster_endpoints(family)
            external = (None if port.frontend_kind(frontend) is FrontendKind.CLUSTER_IP
                        else port.external_endpoints(family))
            if not (cluster or external):
                continue
            addresses = (self._ctx.node_addresses.node_port_addresses(family)
                         if frontend.is_node_port else [frontend.ip])
            lb_ip = not frontend.is_node_port and frontend.ip in port.load_balancer_ips
            filtered = ranges if lb_ip else None
            wanted.extend(_Wanted(frontend, address, cluster, external, filtered)
                          for address in addresses)
        return wanted

    def _source_ranges(self, port: ServicePort) -> tuple[IPNetwork, ...] | None:
        """The port's source ranges, parsed (and bad entries reported) once
        per value they take."""
        if port.load_balancer_source_ranges != self._ranges_given:
            self._ranges_given = port.load_balancer_source_ranges
            self._ranges = port.source_ranges(
                lambda text: self._skips.bad_source_range(str(self.name), text))
        return self._ranges

    def update(self, port: ServicePort, on_interface: Callable[[IPAddress], bool]) -> bool:
        """Listen as `port` says, on the node addresses known now; False while
        a listener it needs is missing (its address is not on the interface,
        or it cannot listen), for the backend to try again with the next
        change set."""
        gone = set() if self.port is None else set(self.port.endpoints).difference(port.endpoints)
        self.port = port
        self.affinity.update(port.affinity_timeout_seconds, gone)
        self.tally.keep_only(port.endpoints)
        wanted = {w.key: w for w in self._wanted(port)}
        for key in self._listeners.keys() - wanted.keys():
            self._listeners.pop(key).close()
        for key in self._listen_errors.keys() - wanted.keys():
            del self._listen_errors[key]
        complete = True
        for key, want in wanted.items():
            listener = self._listeners.get(key)
            if listener is not None:
                listener.update(want.cluster, want.external, want.source_ranges)
            elif not ((want.frontend.is_node_port or on_interface(want.address))
                      and self._open(want)):
                complete = False
        return complete

    def _open(self, want: _Wanted) -> bool:
        frontend = want.frontend
        address = format_host_port(want.address, frontend.port)
        label = f"{self.name}/{frontend.protocol.value} {address}"
        pickers = FrontendPickers(label, want.cluster, want.external, self.affinity,
                                  self._ctx.node_addresses.is_internal)
        listener = _LISTENERS[frontend.protocol](self._ctx, label, want.address, frontend.port,
                                                 pickers, self.tally, want.source_ranges)
        try:
            listener.start()
        except OSError as err:
            # E.g. another process holding this address:port: keep the rest
            # working; each later change set tries again.
            error = err.strerror or str(err)
            if self._listen_errors.get(want.key) != error:
                self._listen_errors[want.key] = error
                self._ctx.stats.error("listen")
                log.error("cannot listen; this service port is not served on this address "
                          "until a later change set can", extra=fields(
                              service_port=str(self.name), listener=label, error=error))
            return False
        if self._listen_errors.pop(want.key, None) is not None:
            log.info("listening after an earlier failure", extra=fields(
                service_port=str(self.name), listener=label))
        self._listeners[want.key] = listener
        return True

    def close(self) -> None:
        for listener in self._listeners.values():
            listener.close()
        self._listeners.clear()
        self.affinity.update(0, set())  # no new flow can use it: nothing to expire


def _addresses(port: ServicePort) -> set[IPAddress]:
    """The addresses the interface holds for `port`: those of its frontends
    (node ports are on the node's own addresses)."""
    return {frontend.ip for frontend in port.frontends() if not frontend.is_node_port}


class _LoopThread:
    """An event loop running in its own thread, and a way to run code on it."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name="kpng-py-userspace", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call(self, func: Callable[[], T]) -> T:
        """Run `func` on the loop and wait for its result (or exception)."""
        async def run() -> T:
            return func()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.call(_cancel_tasks)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()


def _cancel_tasks() -> None:
    current = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is not current:
            task.cancel()


class UserspaceBackend:
    """`to-userspace`: see the package docstring and docs/userspace.md."""

    def __init__(self, config: ProxyConfig, metrics: Metrics) -> None:
        self.config = config
        self._stats = ProxyStats(metrics)
        self._addresses = ClusterIPAddresses(config.interface, self._stats)
        self._skips = Skips(metrics)
        self._guard = ClusterIPGuard(self._skips)
        self._loop_thread = _LoopThread()
        interval = min(MAX_HOUSEKEEPING_INTERVAL, config.udp_idle_timeout / 4)
        self._ctx = ProxyContext(self._loop_thread.loop, config, self._stats,
                                 Housekeeping(self._loop_thread.loop, interval),
                                 NodeAddresses(config.nodeport_addresses, config.cluster_cidrs))
        # The node's own addresses (not those of the backend's interface),
        # followed live; and the healthCheckNodePort servers on them.
        self._follower = LocalAddressFollower(self._node_addresses_changed,
                                              ignore_interfaces=(config.interface,))
        self._health_checks = HealthCheckNodePorts(metrics, config.nodeport_addresses)
        self._health: ProxyHealth | None = None
        self._registry = metrics.registry
        self._collector = ServiceCountersCollector(
            self._counts_per_service_port,
            self._counts_per_endpoint if config.endpoint_counters else None)
        # What is programmed: the service ports, and how many use each ClusterIP.
        self._ports: dict[ServicePortName, ServicePortListeners] = {}
        self._address_users: Counter[IPAddress] = Counter()
        # Service ports missing a listener (see ServicePortListeners.update),
        # with the version to listen for when trying again.
        self._incomplete: dict[ServicePortName, ServicePort] = {}

    def use_health(self, health: ProxyHealth) -> None:
        """What /healthz says, for the healthCheckNodePort answers (before setup)."""
        self._health = health

    def setup(self) -> None:
        raise_open_files_limit()
        self._addresses.setup()
        self._loop_thread.start()
        self._registry.register(self._collector)  # unregistered before the loop stops
        self._loop_thread.call(self._ctx.housekeeping.start)
        local = self._follower.start()
        self._loop_thread.call(lambda: self._ctx.node_addresses.set(local))
        self._health_checks.start(local, self._health)
        log.info("node ports listen on the allowed node addresses", extra=fields(
            nodeport_addresses=str(self.config.nodeport_addresses),
            addresses=sorted(map(str, self.config.nodeport_addresses.allowed(local)))))

    def _node_addresses_changed(self, local: LocalAddressSet) -> None:
        """From the follower's thread: node ports move to the new addresses
        (on the loop, between two change sets' listener work), and so do the
        health-check servers."""
        self._loop_thread.call(lambda: self._move_node_ports(local))
        self._health_checks.addresses_changed(local)

    def _move_node_ports(self, local: LocalAddressSet) -> None:
        self._ctx.node_addresses.set(local)
        holds = self._addresses.holds
        for listeners in self._ports.values():
            if listeners.port is not None:
                self._track(listeners.port, listeners.update(listeners.port, holds))

    def apply(self, changes: ServicePortChanges) -> None:
        changes = self._guard.filter(changes)
        self._addresses.repair()
        if changes.full:
            self._addresses.refresh()
            self._address_users = Counter(ip for p in changes.added for ip in _addresses(p))
            wanted = set(self._address_users)
            self._addresses.add(wanted)
            self._loop_thread.call(lambda: self._apply_listeners(changes))
            self._addresses.retain_only(wanted)
        else:
            appeared, vanished = self._count_address_users(changes)
            # ClusterIPs the kernel refused before are tried again each time.
            self._addresses.add((appeared | self._addresses.failed) - vanished)
            self._loop_thread.call(lambda: self._apply_listeners(changes))
            self._addresses.remove(vanished)
        self._health_checks.apply(changes)
        self._stats.cluster_ips.set(len(self._addresses.present))

    def _count_address_users(
            self, changes: ServicePortChanges) -> tuple[set[IPAddress], set[IPAddress]]:
        """Update the per-ClusterIP user counts for an incremental change set;
        the ClusterIPs that gained their first user and lost their last. Only
        the changed service ports are looked at."""
        olds = changes.removed + tuple(old for old, _ in changes.updated)
        news = changes.current()
        users = self._address_users
        touched = {ip for port in olds + news for ip in _addresses(port)}
        before = {ip for ip in touched if users[ip] > 0}
        for port in olds:
            users.subtract(_addresses(port))
        for port in news:
            users.update(_addresses(port))
        after = {ip for ip in touched if users[ip] > 0}
        for ip in touched - after:
            users.pop(ip, None)
        return after - before, before - after

    def _apply_listeners(self, changes: ServicePortChanges) -> None:
        """On the loop: removals first, so a ClusterIP:port that moves from one
        service port to another is free to bind; then the changed ports; then
        the ports still missing a listener from earlier change sets."""
        gone: Iterable[ServicePortName] = (
            set(self._ports) - {p.name for p in changes.added} if changes.full
            else (p.name for p in changes.removed))
        for name in list(gone):
            self._incomplete.pop(name, None)
            listeners = self._ports.pop(name, None)
            if listeners is not None:
                listeners.close()
        self._ctx.node_addresses.service_addresses = frozenset(self._addresses.present)
        holds = self._addresses.holds
        current = changes.current()
        for port in current:
            listeners = self._ports.get(port.name)
            if listeners is None:
                listeners = self._ports[port.name] = ServicePortListeners(self._ctx, port.name,
                                                                          self._skips)
            self._track(port, listeners.update(port, holds))
        changed = {p.name for p in current}
        for port in [p for name, p in self._incomplete.items() if name not in changed]:
            self._track(port, self._ports[port.name].update(port, holds))

    def _track(self, port: ServicePort, complete: bool) -> None:
        if complete:
            self._incomplete.pop(port.name, None)
        else:
            self._incomplete[port.name] = port

    def _counts_per_service_port(self) -> dict[ServicePortName, ServiceCounts]:
        """What the collector exports at a scrape (read on the loop)."""
        return self._loop_thread.call(
            lambda: {name: listeners.tally.counts() for name, listeners in self._ports.items()})

    def _counts_per_endpoint(self) -> dict[tuple[ServicePortName, str], int]:
        """With --endpoint-counters, at a scrape: per (service port, endpoint)."""
        return self._loop_thread.call(lambda: {
            (name, endpoint): count for name, listeners in self._ports.items()
            for endpoint, count in (listeners.tally.endpoints or {}).items()})

    def apply_stages(self) -> Mapping[str, float]:
        return {}  # no stages timed apart

    def not_programmed(self) -> Mapping[str, int]:
        """The service ports missing a listener (tried again with each change set)."""
        return {CANNOT_LISTEN: len(self._incomplete)} if self._incomplete else {}

    def close(self) -> None:
        """Close listeners and connections; the ClusterIPs stay (see addresses)."""
        def close_all() -> None:
            for listeners in self._ports.values():
                listeners.close()
            for connection in list(self._ctx.connections):
                connection.close()
            self._ctx.housekeeping.stop()

        self._follower.stop()
        self._health_checks.close()
        if self._loop_thread.loop.is_running():
            self._registry.unregister(self._collector)
            self._loop_thread.call(close_all)
        self._loop_thread.stop()
        self._addresses.close()
