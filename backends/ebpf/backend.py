"""`to-ebpf`: the Backend that programs the socket load balancer."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, TypeVar

from backends.ebpf.datapath.loader import Datapath, DatapathConfig, mount_holding
from backends.ebpf.maps import counters, id_maps
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.node_addresses import AddressFollower, FollowerFactory, NodeAddressMap
from backends.ebpf.maps.usage import CachedCount
from backends.ebpf.programmer.service_programmer import Capacity, MapWrites, ServiceProgrammer
from backends.ebpf.stale_udp import StaleUdpTerminator
from kpng_py.dataplane.contract import BackendSetupError, DataplaneHealth
from kpng_py.healthcheck.service_health import HealthCheckNodePorts
from kpng_py.metrics.metrics import Metrics
from kpng_py.metrics.service_counters import ServiceCountersCollector, ServiceCounts
from kpng_py.model import IPAddress, ServicePortChanges, ServicePortName
from kpng_py.node.nodeport_addresses import LocalAddressFollower, LocalAddressSet, NodePortAddresses
from kpng_py.runtime.logs import fields
from kpng_py.runtime.retrytimer import RetryTimer
from kpng_py.state.skips import Skips

if TYPE_CHECKING:  # the table's module loads libnftables: only when one is made
    from backends.ebpf.netfilter.table import NetfilterTable

log = logging.getLogger(__name__)

# How often the datapath is checked for parts another process took away: a
# check is a few dozen bpf() calls and one netlink listing of the tables.
DATAPATH_CHECK_SECONDS = 1.0
# The parts kpng_py_datapath_missing names (Datapath.missing's, and the table).
DATAPATH_PARTS = ("maps", "programs", "links")
NETFILTER_PART = "netfilter-table"

K = TypeVar("K")
V = TypeVar("V")


def _log_netfilter_scope(netfilter: NetfilterTable, cgroup: Path) -> None:
    """--cgroup scopes the socket load balancer, not the table: say so, as
    a warning when the cgroup is not the whole node's."""
    mount = mount_holding(cgroup)
    whole_node = mount is not None and mount.point == cgroup
    (log.info if whole_node else log.warning)(
        "the netfilter table serves node ports, ExternalIPs and LB IPs to packets from outside "
        "for this whole network namespace, whatever --cgroup is (pass "
        "--no-nodeport-netfilter to leave them to another proxy)",
        extra=fields(table=netfilter.name, cgroup=cgroup, netns_inode=_netns_inode()))


def _netns_inode() -> int:
    """The network namespace this process runs in (what `ip netns identify` compares)."""
    return os.stat("/proc/self/ns/net").st_ino


class BackendNotReadyError(RuntimeError):
    """apply() on a backend without a datapath: a caller's mistake, not the node's."""


class EbpfBackend:
    """setup: adopt the pinned maps and load fresh programs, and start
    following the node's addresses (node_addresses: those `nodeport_addresses`
    allows, rewritten from the follower's thread on every change). The first
    apply (a full change set) reconciles the maps, then swaps the programs in;
    later applies only write map entries. close stops the follower and leaves
    the datapath in place.

    With a `netfilter` table (packets from outside the node: node ports,
    ExternalIPs, LB IPs), setup adopts it, every apply programs it after the
    maps, and one that answers on a list of node addresses gets each new
    list from the follower; close leaves it in place too."""

    def __init__(self, config: DatapathConfig, metrics: Metrics, skips: Skips,
                 nodeport_addresses: NodePortAddresses = NodePortAddresses(),
                 follower: FollowerFactory = LocalAddressFollower,
                 netfilter: NetfilterTable | None = None,
                 check_seconds: float = DATAPATH_CHECK_SECONDS) -> None:
        self._config = config
        self._netfilter = netfilter
        self._metrics = metrics
        self._skips = skips
        self._nodeport_addresses = nodeport_addresses
        self._make_follower = follower
        self._datapath: Datapath | None = None
        self._programmer: ServiceProgrammer | None = None
        self._terminator: StaleUdpTerminator | None = None
        self._node_addresses: NodeAddressMap | None = None
        self._follower: AddressFollower | None = None
        # The healthCheckNodePort servers (docs/spec/node-port-behaviours.md, N11),
        # on the allowed node addresses.
        self._health_checks = HealthCheckNodePorts(metrics, nodeport_addresses)
        self._health: DataplaneHealth | None = None
        # apply(), the follower's callbacks and the datapath check, one at a time.
        self._lock = threading.Lock()
        self._attached = False
        self._check_seconds = check_seconds
        self._check = RetryTimer(self._check_datapath, name="datapath-check")
        self._collector = ServiceCountersCollector(
            self._counts_per_service_port,
            self._counts_per_endpoint if config.endpoint_counters else None)

    def use_health(self, health: DataplaneHealth) -> None:
        """What /healthz says, for the healthCheckNodePort answers, and told
        when the datapath is found incomplete (before setup)."""
        self._health = health

    def setup(self) -> None:
        started = time.monotonic()
        self._datapath = Datapath.load(self._config)
        self._metrics.registry.register(self._collector)  # unregistered with the datapath
        services = self._datapath.maps[maps.SERVICES.pin]
        endpoints = self._datapath.maps[maps.ENDPOINTS.pin]
        config = self._datapath.config  # with its paths resolved: use no other
        self._terminator = StaleUdpTerminator(
            config.cgroup, self._datapath.maps[maps.REVERSE_NAT.pin],
            self._metrics.dataplane_errors.labels("udp-socket-termination"))
        for spec in maps.MAP_SPECS:
            self._metrics.map_capacity.labels(spec.pin).set(
                self._datapath.maps[spec.pin].info().max_entries)
        for spec in (maps.SERVICES, maps.ENDPOINTS, maps.NODE_ADDRESSES,
                     maps.SERVICE_NAMES):  # written here
            self._metrics.map_writes.labels(spec.pin)
        for part in (*DATAPATH_PARTS, *((NETFILTER_PART,) if self._netfilter else ())):
            self._metrics.datapath_missing.labels(part).set(0)
            self._metrics.datapath_restored.labels(part)
        # Made by the datapath, or not counted by the programmer: walked.
        for spec in (maps.REVERSE_NAT, maps.AFFINITY, maps.COUNTERS, maps.ENDPOINT_COUNTERS,
                     maps.SERVICE_NAMES):
            self._metrics.map_entries.labels(spec.pin).set_function(
                CachedCount(self._datapath.maps[spec.pin].count))
        if self._netfilter is not None:
            self._netfilter.adopt()
            _log_netfilter_scope(self._netfilter, config.cgroup)
        self._node_addresses = NodeAddressMap(self._datapath.maps[maps.NODE_ADDRESSES.pin])
        self._follow_node_addresses()
        self._programmer = ServiceProgrammer(
            services, endpoints,
            Capacity(services.info().max_entries, endpoints.info().max_entries), self._skips)
        log.info("eBPF datapath loaded", extra=fields(
            bpffs_dir=config.bpffs_dir, cgroup=config.cgroup,
            nodeport_addresses=str(self._nodeport_addresses),
            seconds=round(time.monotonic() - started, 3)))

    def _follow_node_addresses(self) -> None:
        """The first scan is written before any callback (they wait for the
        lock), so the map never goes back to an older set."""
        follower = self._make_follower(self._on_local_addresses)
        with self._lock:
            try:
                local = follower.start()
            except OSError as err:
                raise BackendSetupError(f"cannot follow the node's addresses for node ports "
                                        f"(netlink): {err}") from err
            self._follower = follower
            self._write_node_addresses(local)
            self._health_checks.start(local, self._health)

    def _on_local_addresses(self, local: LocalAddressSet) -> None:
        """The follower's callback, on its thread."""
        with self._lock:
            self._write_node_addresses(local)
            self._health_checks.addresses_changed(local)

    def _write_node_addresses(self, local: LocalAddressSet) -> None:
        """node_addresses := the allowed local addresses. A failure is logged
        and counted, never raised: the follower's thread must go on, and the
        next change writes the whole difference again."""
        if self._node_addresses is None:  # closed meanwhile
            return
        allowed = self._nodeport_addresses.allowed(local)
        if self._netfilter is not None and self._netfilter.follows_addresses:
            self._write_netfilter_addresses(self._netfilter, allowed)
        try:
            written = self._node_addresses.set_to(allowed)
        except OSError as err:
            self._metrics.dataplane_errors.labels("node-addresses").inc()
            log.error("cannot write the node-port addresses; node ports answer on those "
                      "the map holds", extra=fields(error=err,
                                                    map_size_flag=maps.NODE_ADDRESSES.size_flag))
        else:
            self._metrics.map_writes.labels(maps.NODE_ADDRESSES.pin).inc(written)
        self._metrics.map_entries.labels(maps.NODE_ADDRESSES.pin).set(len(self._node_addresses))

    def _write_netfilter_addresses(self, netfilter: NetfilterTable,
                                   allowed: frozenset[IPAddress]) -> None:
        from backends.ebpf.netfilter.table import NetfilterError

        try:
            netfilter.set_node_addresses(allowed)
        except NetfilterError as err:
            self._metrics.dataplane_errors.labels("netfilter-addresses").inc()
            log.error("cannot write the node-port addresses of the netfilter table; packets "
                      "from outside reach node ports on those it holds", extra=fields(error=err))

    def apply(self, changes: ServicePortChanges) -> None:
        with self._lock:
            self._apply(changes)

    def _apply(self, changes: ServicePortChanges) -> None:
        datapath, programmer, terminator = self._loaded()
        try:
            writes = programmer.apply(changes)
        finally:  # after a failed write too: then the counts are what the maps hold
            self._publish_entries(programmer)
        for pin, entries in writes.entries_written().items():
            self._metrics.map_writes.labels(pin).inc(entries)
        if not self._attached:
            datapath.attach()
            self._attached = True
            self._check.arm(self._check_seconds)
        if writes.removed_udp:
            self._terminate_stale_udp(terminator, writes.removed_udp)
        self._follow_frontend_ids(datapath, programmer, writes, changes.full)
        if self._netfilter is not None:
            self._netfilter.apply(changes)
        self._health_checks.apply(changes)

    def _check_datapath(self) -> None:
        """The check's timer: find what another process took away from the
        datapath (`kpng-py ebpf cleanup`, a hand-made change) and put it
        back; then check again after the interval."""
        try:
            with self._lock:
                if self._datapath is None:
                    return  # closed
                missing = self._datapath.missing()
                if self._netfilter is not None and self._netfilter.gone():
                    missing[NETFILTER_PART] = [self._netfilter.name]
                if missing:
                    self._restore(self._datapath, missing)
        finally:
            self._check.arm(self._check_seconds)  # a no-op once closed

    def _restore(self, datapath: Datapath, missing: Mapping[str, list[str]]) -> None:
        """Put back what is missing, saying so in the log, the metrics and
        /healthz and /livez (503 until it is back: traffic fails meanwhile)."""
        failures: tuple[type[Exception], ...] = (OSError, BackendSetupError)
        if self._netfilter is not None:
            from backends.ebpf.netfilter.table import NetfilterError

            failures += (NetfilterError,)
        summary = "; ".join(f"{part}: {', '.join(names)}" for part, names in missing.items())
        log.error("parts of the eBPF datapath are gone: another process removed them (`kpng-py "
                  "ebpf cleanup` while this one runs, or a hand-made change); putting them "
                  "back", extra=fields(missing=summary, bpffs_dir=datapath.config.bpffs_dir))
        for part in missing:
            self._metrics.datapath_missing.labels(part).set(1)
        if self._health is not None:
            self._health.dataplane_incomplete(summary)
        try:
            if missing.keys() - {NETFILTER_PART}:
                datapath.restore()
            if NETFILTER_PART in missing and self._netfilter is not None:
                self._netfilter.restore()
        except failures as err:
            self._metrics.dataplane_errors.labels("datapath-restore").inc()
            log.error("cannot put the eBPF datapath back; trying again in %g s",
                      self._check_seconds, extra=fields(error=err, missing=summary))
            return
        for part in missing:
            self._metrics.datapath_missing.labels(part).set(0)
            self._metrics.datapath_restored.labels(part).inc()
        if self._health is not None:
            self._health.dataplane_complete()
        log.info("the eBPF datapath is whole again", extra=fields(restored=summary))

    def _follow_frontend_ids(self, datapath: Datapath, programmer: ServiceProgrammer,
                             writes: MapWrites, full: bool) -> None:
        """Names and counters follow the frontends' ids
        (id_maps): a full change set writes every name and deletes
        what no frontend has, a partial one only what it changed. The
        datapath does not read them: a failure is logged and counted, and
        the next full change set repairs both."""
        names, counter_map, endpoint_counters = (datapath.maps[maps.SERVICE_NAMES.pin],
                                                 datapath.maps[maps.COUNTERS.pin],
                                                 datapath.maps[maps.ENDPOINT_COUNTERS.pin])
        try:
            for bpf_map in (names, counter_map):
                id_maps.forget(bpf_map, writes.released_frontend_ids)
            id_maps.forget(endpoint_counters, writes.released_endpoint_ids)
            if full:
                owners = programmer.service_port_of_ids()
                for bpf_map in (names, counter_map):
                    id_maps.keep_only(bpf_map, owners.keys())
                id_maps.keep_only(endpoint_counters, programmer.endpoint_ids())
                named = [(frontend_id, name) for frontend_id, name in owners.items() if name]
            else:
                named = writes.named_frontend_ids
            written = id_maps.write_names(names, named)
            self._metrics.map_writes.labels(maps.SERVICE_NAMES.pin).inc(
                written + len(writes.released_frontend_ids))
        except OSError as err:
            self._metrics.dataplane_errors.labels("service-ids").inc()
            log.error("cannot write the names or delete the counters of frontend ids; the next "
                      "full change set tries again", extra=fields(error=err))

    def _counts_per_service_port(self) -> dict[ServicePortName, ServiceCounts]:
        """What the collector exports at a scrape (from the HTTP server's thread)."""
        return self._scraped(lambda datapath, programmer: counters.per_service_port(
            counters.read_counts(datapath.maps[maps.COUNTERS.pin]),
            programmer.service_port_of_ids()))

    def _counts_per_endpoint(self) -> dict[tuple[ServicePortName, str], int]:
        """With --endpoint-counters, at a scrape: per (service port, endpoint)."""
        return self._scraped(lambda datapath, programmer: counters.per_endpoint(
            counters.read_endpoint_counts(datapath.maps[maps.ENDPOINT_COUNTERS.pin]),
            programmer.endpoint_targets(), programmer.service_port_of_ids()))

    def _scraped(self, read: Callable[[Datapath, ServiceProgrammer], dict[K, V]]) -> dict[K, V]:
        """`read` of the datapath and the programmer, between two applies
        (nothing before setup or after close)."""
        with self._lock:
            if self._datapath is None or self._programmer is None:
                return {}
            return read(self._datapath, self._programmer)

    def apply_stages(self) -> Mapping[str, float]:
        return self._programmer.last_stages if self._programmer is not None else {}

    def not_programmed(self) -> Mapping[str, int]:
        """The service ports waiting for room in the maps (capacity). Which
        port owns a frontend is the state's to decide, and counts there
        (frontend-conflict)."""
        with self._lock:
            if self._programmer is None:
                return {}
            return {reason.value: count
                    for reason, count in self._programmer.not_programmed().items()}

    def _loaded(self) -> tuple[Datapath, ServiceProgrammer, StaleUdpTerminator]:
        """What setup() made; a real check, not an assert (python -O strips those)."""
        if self._datapath is None or self._programmer is None or self._terminator is None:
            raise BackendNotReadyError(
                f"the eBPF backend of cgroup {self._config.cgroup} has no datapath (setup() was "
                "not called, failed, or close() was called): call setup() before apply()")
        return self._datapath, self._programmer, self._terminator

    def _publish_entries(self, programmer: ServiceProgrammer) -> None:
        self._metrics.map_entries.labels(maps.SERVICES.pin).set(programmer.service_entries)
        self._metrics.map_entries.labels(maps.ENDPOINTS.pin).set(programmer.endpoint_entries)

    def _terminate_stale_udp(self, terminator: StaleUdpTerminator, removed_udp: set) -> None:
        destroyed = terminator.terminate(removed_udp)  # counts and warns its own failures
        if destroyed:
            log.info("terminated connected UDP sockets of removed endpoints",
                     extra=fields(sockets=destroyed, endpoints=len(removed_udp)))

    def close(self) -> None:
        self._check.close()  # outside the lock: a check in progress holds it
        if self._follower is not None:
            self._follower.stop()  # outside the lock: its last callback may hold it
            self._follower = None
        with self._lock:
            self._health_checks.close()
            self._node_addresses = None
            if self._datapath is not None:
                self._metrics.registry.unregister(self._collector)
                if self._attached:
                    config = self._datapath.config
                    log.info("the eBPF programs stay attached and keep translating with the "
                             "last state programmed; `kpng-py ebpf cleanup --cgroup %s "
                             "--bpffs-dir %s` removes them", config.cgroup, config.bpffs_dir,
                             extra=fields(cgroup=config.cgroup, bpffs_dir=config.bpffs_dir))
                self._datapath.close()
                self._datapath = None
