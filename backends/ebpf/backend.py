"""`to-ebpf`: the Backend that programs the socket load balancer."""

from __future__ import annotations

import logging
import time
from typing import Mapping

from backends.ebpf import maps
from backends.ebpf.loader import Datapath, DatapathConfig
from backends.ebpf.netfilter import NetfilterTable
from backends.ebpf.programmer import Capacity, ServiceProgrammer
from backends.ebpf.stale_udp import StaleUdpTerminator
from backends.ebpf.usage import CachedCount
from kpng_py.logs import fields
from kpng_py.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.skips import Skips

log = logging.getLogger(__name__)


class BackendNotReadyError(RuntimeError):
    """apply() on a backend without a datapath: a caller's mistake, not the node's."""


class EbpfBackend:
    """setup: adopt the pinned maps and load fresh programs. The first apply
    (a full change set) reconciles the maps, then swaps the programs in; later
    applies only write map entries. close leaves the datapath in place.

    With a `netfilter` table (packets from outside the node: node ports,
    ExternalIPs, LB IPs), setup adopts it and every apply programs it after
    the maps; close leaves it in place too."""

    def __init__(self, config: DatapathConfig, metrics: Metrics, skips: Skips,
                 netfilter: NetfilterTable | None = None) -> None:
        self._config = config
        self._netfilter = netfilter
        self._metrics = metrics
        self._skips = skips
        self._datapath: Datapath | None = None
        self._programmer: ServiceProgrammer | None = None
        self._terminator: StaleUdpTerminator | None = None
        self._attached = False

    def setup(self) -> None:
        started = time.monotonic()
        self._datapath = Datapath.load(self._config)
        services = self._datapath.maps[maps.SERVICES.pin]
        backends = self._datapath.maps[maps.BACKENDS.pin]
        self._programmer = ServiceProgrammer(
            services, backends,
            Capacity(services.info().max_entries, backends.info().max_entries), self._skips)
        config = self._datapath.config  # with its paths resolved: use no other
        self._terminator = StaleUdpTerminator(
            config.cgroup, self._datapath.maps[maps.REVERSE_NAT.pin],
            self._metrics.dataplane_errors.labels("udp-socket-termination"))
        for spec in maps.MAP_SPECS:
            self._metrics.map_capacity.labels(spec.pin).set(
                self._datapath.maps[spec.pin].info().max_entries)
        for spec in (maps.SERVICES, maps.BACKENDS):  # the maps this process writes
            self._metrics.map_writes.labels(spec.pin)
        for spec in (maps.REVERSE_NAT, maps.AFFINITY):  # written by the datapath
            self._metrics.map_entries.labels(spec.pin).set_function(
                CachedCount(self._datapath.maps[spec.pin].count))
        if self._netfilter is not None:
            self._netfilter.adopt()
        log.info("eBPF datapath loaded", extra=fields(
            bpffs_dir=config.bpffs_dir, cgroup=config.cgroup,
            seconds=round(time.monotonic() - started, 3)))

    def apply(self, changes: ServicePortChanges) -> None:
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
        if writes.removed_udp:
            self._terminate_stale_udp(terminator, writes.removed_udp)
        if self._netfilter is not None:
            self._netfilter.apply(changes)

    def apply_stages(self) -> Mapping[str, float]:
        return self._programmer.last_stages if self._programmer is not None else {}

    def _loaded(self) -> tuple[Datapath, ServiceProgrammer, StaleUdpTerminator]:
        """What setup() made; a real check, not an assert (python -O strips those)."""
        if self._datapath is None or self._programmer is None or self._terminator is None:
            raise BackendNotReadyError(
                f"the eBPF backend of cgroup {self._config.cgroup} has no datapath (setup() was "
                "not called, failed, or close() was called): call setup() before apply()")
        return self._datapath, self._programmer, self._terminator

    def _publish_entries(self, programmer: ServiceProgrammer) -> None:
        self._metrics.map_entries.labels(maps.SERVICES.pin).set(programmer.service_entries)
        self._metrics.map_entries.labels(maps.BACKENDS.pin).set(programmer.backend_entries)

    def _terminate_stale_udp(self, terminator: StaleUdpTerminator, removed_udp: set) -> None:
        destroyed = terminator.terminate(removed_udp)  # counts and warns its own failures
        if destroyed:
            log.info("terminated connected UDP sockets of removed backends",
                     extra=fields(sockets=destroyed, backends=len(removed_udp)))

    def close(self) -> None:
        if self._datapath is not None:
            self._datapath.close()
            self._datapath = None
