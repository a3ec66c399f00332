"""The datapath's per-frontend counters (the `counters` map, lb_maps.h) as
totals per frontend id, and per service port for kpng_py.metrics.service_counters.

The programs count in a per-CPU hash keyed by frontend id: `translated` (a
socket sent to an endpoint: a TCP connect, a UDP socket's first datagram to an
endpoint) and `rejected` (a connect or send refused, the service having no
endpoints). The control plane deletes them as id_maps says. The
entries are pinned, so the counts survive a restart of the backend as the
frontend ids do.
"""

from __future__ import annotations

from typing import Mapping

from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.contents import HostPort
from kpng_py.metrics.service_counters import ServiceCounts
from kpng_py.model import ServicePortName


def read_counts(counters: MapAccess) -> dict[int, ServiceCounts]:
    """Every entry of the map, by frontend id (its values: one per CPU)."""
    found: dict[int, ServiceCounts] = {}
    for frontend_id, per_cpu in counters.items():
        found[int(frontend_id)] = ServiceCounts(
            sum(cpu.translated for cpu in per_cpu), sum(cpu.rejected for cpu in per_cpu))
    return found


def read_endpoint_counts(endpoint_counters: MapAccess) -> dict[int, int]:
    """Every entry of endpoint_counters, by endpoint id, the CPUs added up."""
    return {int(endpoint_id): sum(cpu.translated for cpu in per_cpu)
            for endpoint_id, per_cpu in endpoint_counters.items()}


def per_endpoint(counts: Mapping[int, int], targets: Mapping[int, tuple[int, HostPort]],
                 owners: Mapping[int, ServicePortName | None]
                 ) -> dict[tuple[ServicePortName, str], int]:
    """The counts of each (service port, endpoint), over the endpoints of all
    the port's frontends (each frontend has its own endpoint ids)."""
    totals: dict[tuple[ServicePortName, str], int] = {}
    for endpoint_id, count in counts.items():
        frontend_id, target = targets.get(endpoint_id, (0, None))
        name = owners.get(frontend_id)
        if name is not None and target is not None:
            key = (name, str(target))
            totals[key] = totals.get(key, 0) + count
    return totals


def per_service_port(counts: Mapping[int, ServiceCounts],
                     owners: Mapping[int, ServicePortName | None]
                     ) -> dict[ServicePortName, ServiceCounts]:
    """The counts of a service port's frontends (ClusterIPs, node ports,
    ExternalIPs, LB IPs) added up; ids no service port owns are left out."""
    totals: dict[ServicePortName, ServiceCounts] = {}
    for frontend_id, frontend in counts.items():
        name = owners.get(frontend_id)
        if name is not None:
            totals[name] = totals.get(name, ServiceCounts()) + frontend
    return totals
