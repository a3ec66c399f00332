"""`to-print`: a debug backend that shows exactly what a dataplane would program.

After each applied Sync it writes one JSON line to stdout:
``{"sync": N, "servicePorts": [...]}``, service ports sorted by name then
protocol, every list sorted. A service port shows only the frontends it owns,
and is missing while it owns none: the state model decides that for every
backend alike. Beside its frontends, each shows the endpoints a client on the
node uses (`endpoints`, ``[]``: refused) and, with a frontend from outside
the node, those a client from outside uses (`externalEndpoints`), what it gets
in a family without one (`externalNoEndpoints`: drop or reject), who may reach
the LB IPs (`loadBalancerSourceRanges`), the health-check node port and which
endpoints are local: what the eBPF maps, the netfilter table, the userspace
listeners and the health-check servers hold, from the `ServicePort` methods
they use. docs/architecture.md ("What `to-print` prints") lists every field
and when it appears.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Mapping, Protocol

from kpng_py.dataplane.registry import BackendSpec
from kpng_py.healthcheck.service_health import needs_health_check
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import (
    Endpoint,
    IPFamily,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
)


def service_port_json(port: ServicePort) -> dict:
    """The port as printed (docs/architecture.md says what each field is):
    the fields of local endpoints, node ports, ExternalIPs and LB IPs only
    when it has them."""
    printed: dict[str, object] = {
        "name": str(port.name),
        "protocol": port.protocol.value,
        "type": port.type,
        "clusterIPs": sorted(str(ip) for ip in port.cluster_ips),
        "port": port.port,
        "endpoints": _addresses(port.cluster_endpoints()),
        "affinityTimeoutSeconds": port.affinity_timeout_seconds,
        "internalTrafficLocal": port.internal_traffic_local,
    }
    extras = {
        "localEndpoints": _addresses(ep for ep in port.endpoints if ep.local),
        "externalIPs": sorted(str(ip) for ip in port.external_ips),
        "loadBalancerIPs": sorted(str(ip) for ip in port.load_balancer_ips),
        "nodePort": port.node_port if port.node_port_families else 0,
        "nodePortFamilies": [_family_name(family) for family in port.node_port_families],
        "externalTrafficLocal": port.external_traffic_local,
        "healthCheckNodePort": port.health_check_node_port if needs_health_check(port) else 0,
    }
    printed.update((key, value) for key, value in extras.items() if value)
    printed.update(_from_outside(port))
    return printed


def _from_outside(port: ServicePort) -> dict:
    """The fields of traffic from outside the node; none for a port that
    has no frontend from outside."""
    families = port.outside_families()
    if not families:
        return {}
    printed: dict = {"externalEndpoints": _addresses(port.external_endpoints())}
    unserved = {_family_name(family): "drop" if port.drops_outside(family) else "reject"
                for family in families if not port.external_endpoints(family)}
    if unserved:
        printed["externalNoEndpoints"] = unserved
    # A bad range is the backends' to report (a `bad-ip` skip each); what
    # they program is the ranges that parse.
    ranges = port.source_ranges(lambda text: None) if port.load_balancer_ips else None
    if ranges is not None:
        printed["loadBalancerSourceRanges"] = sorted(str(network) for network in ranges)
    return printed


def _addresses(endpoints: Iterable[Endpoint]) -> list[str]:
    return sorted(str(ep) for ep in endpoints)


def _family_name(family: IPFamily) -> str:
    return f"IPv{family.value}"


class TextOut(Protocol):
    """Where `to-print` writes its lines (standard output, or a test's
    reader): text, flushed after each line."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class PrintBackend:
    def __init__(self, out: TextOut) -> None:
        self._out = out
        self._ports: dict[ServicePortName, ServicePort] = {}
        self._syncs = 0

    def setup(self) -> None:
        pass

    def apply(self, changes: ServicePortChanges) -> None:
        if changes.full:
            self._ports.clear()
        for port in changes.current():
            self._ports[port.name] = port
        for port in changes.removed:
            self._ports.pop(port.name, None)
        self._syncs += 1
        ports = sorted(self._ports.values(), key=lambda p: p.name.sort_key())
        line = {"sync": self._syncs, "servicePorts": [service_port_json(p) for p in ports]}
        self._out.write(json.dumps(line, separators=(", ", ": ")) + "\n")
        self._out.flush()

    def close(self) -> None:
        self._out.flush()

    def apply_stages(self) -> Mapping[str, float]:
        return {}  # nothing worth timing apart

    def not_programmed(self) -> Mapping[str, int]:
        return {}  # it prints every port it is given


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no flags of its own


def create(args: argparse.Namespace, metrics: Metrics) -> PrintBackend:
    del args, metrics
    return PrintBackend(sys.stdout)


BACKEND = BackendSpec(
    name="print",
    help="print the programmed state as one JSON line per sync (debugging, tests)",
    add_arguments=add_arguments, create=create, tool=None)
