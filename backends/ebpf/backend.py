"""`to-ebpf`: the Backend that programs the socket load balancer."""

from __future__ import annotations

import logging
import time

from backends.ebpf import maps
from backends.ebpf.loader import Datapath, DatapathConfig
from backends.ebpf.programmer import Capacity, ServiceProgrammer
from backends.ebpf.stale_udp import StaleUdpTerminator
from backends.ebpf.usage import CachedCount
from kpng_py.logs import fields
from kpng_py.metrics import Metrics
from kpng_py.model import ChangeSet
from kpng_py.skips import Skips

log = logging.getLogger(__name__)


class EbpfBackend:
    """setup: adopt the pinned maps and load fresh programs. The first apply
    (a full change set) reconciles the maps, then swaps the programs in; later
    applies only write map entries. close leaves the datapath in place."""

    def __init__(self, config: DatapathConfig, metrics: Metrics, skips: Skips) -> None:
        self._config = config
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
        self._terminator = StaleUdpTerminator(config.cgroup,
                                              self._datapath.maps[maps.REVERSE_NAT.pin])
        for spec in maps.MAP_SPECS:
            self._metrics.map_capacity.labels(spec.pin).set(
                self._datapath.maps[spec.pin].info().max_entries)
        for spec in (maps.SERVICES, maps.BACKENDS):  # the maps this process writes
            self._metrics.map_writes.labels(spec.pin)
        for spec in (maps.REVERSE_NAT, maps.AFFINITY):  # written by the datapath
            self._metrics.map_entries.labels(spec.pin).set_function(
                CachedCount(self._datapath.maps[spec.pin].count))
        log.info("eBPF datapath loaded", extra=fields(
            bpffs_dir=config.bpffs_dir, cgroup=config.cgroup,
            seconds=round(time.monotonic() - started, 3)))

    def apply(self, changes: ChangeSet) -> None:
        assert self._datapath and self._programmer and self._terminator, "setup() first"
        try:
            writes = self._programmer.apply(changes)
        finally:  # after a failed write too: then the counts are what the maps hold
            self._publish_entries()
        for pin, entries in writes.entries_written().items():
            self._metrics.map_writes.labels(pin).inc(entries)
        if not self._attached:
            self._datapath.attach()
            self._attached = True
        if writes.removed_udp:
            self._terminate_stale_udp(writes.removed_udp)

    def _publish_entries(self) -> None:
        programmer = self._programmer
        self._metrics.map_entries.labels(maps.SERVICES.pin).set(programmer.service_entries)
        self._metrics.map_entries.labels(maps.BACKENDS.pin).set(programmer.backend_entries)

    def _terminate_stale_udp(self, removed_udp: set) -> None:
        try:
            destroyed = self._terminator.terminate(removed_udp)
        except OSError as err:  # the maps are right; only the clean-up failed
            self._metrics.dataplane_errors.labels("udp-socket-termination").inc()
            log.warning("could not terminate UDP sockets of removed backends",
                        extra=fields(error=err))
            return
        if destroyed:
            log.info("terminated connected UDP sockets of removed backends",
                     extra=fields(sockets=destroyed, backends=len(removed_udp)))

    def close(self) -> None:
        if self._datapath is not None:
            self._datapath.close()
            self._datapath = None
