"""`to-print`: a debug backend that shows exactly what a dataplane would program.

After each applied Sync it writes one JSON line to stdout:
``{"sync": N, "servicePorts": [...]}``, service ports sorted by name then
protocol, each with its ClusterIPs and the endpoints ClusterIP traffic may use
(as strings, sorted). A service port with no usable endpoints has
``"endpoints": []`` (a dataplane rejects connections to it). A service port
shows only the ClusterIPs whose frontends it owns, and is missing while it owns
none: the state model decides that for every backend alike, so what is printed
is what the eBPF maps and the userspace listeners hold.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Mapping

from kpng_py.metrics import Metrics
from kpng_py.model import ServicePortChanges, ServicePort, ServicePortName
from kpng_py.registry import BackendSpec


def service_port_json(port: ServicePort) -> dict:
    """The port as printed; the fields of node ports, ExternalIPs and LB IPs
    only when it has them."""
    printed = {
        "name": str(port.name),
        "protocol": port.protocol.value,
        "clusterIPs": sorted(str(ip) for ip in port.cluster_ips),
        "port": port.port,
        "endpoints": sorted(str(ep) for ep in port.cluster_endpoints()),
        "affinityTimeoutSeconds": port.affinity_timeout_seconds,
        "internalTrafficLocal": port.internal_traffic_local,
    }
    extras = {
        "externalIPs": sorted(str(ip) for ip in port.external_ips),
        "loadBalancerIPs": sorted(str(ip) for ip in port.load_balancer_ips),
        "nodePort": port.node_port if port.node_port_families else 0,
        "nodePortFamilies": [f"IPv{family.value}" for family in port.node_port_families],
        "externalTrafficLocal": port.external_traffic_local,
    }
    printed.update((key, value) for key, value in extras.items() if value)
    return printed


class PrintBackend:
    def __init__(self, out: IO[str]) -> None:
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


# No dataplane: a lab run has nothing to test through it.
BACKEND = BackendSpec(
    name="print",
    help="print the programmed state as one JSON line per sync (debugging, tests)",
    add_arguments=add_arguments, create=create, lab=None, tool=None)
