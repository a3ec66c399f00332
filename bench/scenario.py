"""The synthetic cluster state every contender programs.

N ClusterIP service ports (TCP, port 80) of E endpoints each, as kpng-py's
model (`ServicePort`), so our backends and the kube-proxy rulesets get the
very same state. Addresses follow the e2e cluster's plan: ClusterIPs from
10.96.0.0/16, endpoints from the cluster pod CIDR 10.244.0.0/16. Filler
endpoints are made-up pods outside the node's pod subnet (10.244.0.0/24):
nothing ever dials them.

In the datapath bench the last service ports are *probes*: services whose
endpoints are real servers (nginx, dnsmasq, iperf3) in a pod. They come last
so that the probe's rule is the last one kube-proxy's iptables walks past.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, replace

from kpng_py.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
    sorted_endpoints,
)

SERVICE_CIDR = ipaddress.IPv4Network("10.96.0.0/16")
CLUSTER_POD_CIDR = ipaddress.IPv4Network("10.244.0.0/16")
# As in the e2e cluster: the first ClusterIP is the CIDR's address number 10.
FIRST_SERVICE_HOST = 10
NAMESPACE = "bench"
SERVICE_PORT = 80
FILLER_TARGET_PORT = 8080
# Made-up pods 10.244.1.0 onwards (endpoints of different services may share
# a pod, as in a real cluster); 10.244.0.0/24 is the node's real pod subnet.
_FILLER_POD_BASE = int(ipaddress.IPv4Address("10.244.1.0"))
_FILLER_PODS = 250 * 256
# Where a filler endpoint moves to in a one-endpoint change (a pod
# rescheduled to a new address).
_MOVED_POD = ipaddress.IPv4Address("10.244.255.254")
MAX_SERVICES = SERVICE_CIDR.num_addresses - FIRST_SERVICE_HOST - 1


@dataclass(frozen=True)
class Probe:
    """A service port backed by real servers: `endpoints` are (ip, port)."""

    name: str
    protocol: Protocol
    port: int
    endpoints: tuple[tuple[str, int], ...]

    def to_json(self) -> dict:
        return {**asdict(self), "protocol": self.protocol.value}

    @classmethod
    def from_json(cls, data: dict) -> Probe:
        return cls(data["name"], Protocol(data["protocol"]), data["port"],
                   tuple((ip, port) for ip, port in data["endpoints"]))


@dataclass(frozen=True)
class Scenario:
    """N service ports of E endpoints; the last len(probes) are the probes."""

    services: int
    endpoints: int
    probes: tuple[Probe, ...] = ()

    def __post_init__(self) -> None:
        if not max(1, len(self.probes)) <= self.services <= MAX_SERVICES:
            raise ValueError(f"{self.services} services: need {max(1, len(self.probes))} to "
                             f"{MAX_SERVICES} (the service CIDR {SERVICE_CIDR})")
        if not 1 <= self.endpoints <= _FILLER_PODS:
            raise ValueError(f"{self.endpoints} endpoints per service: need 1 to {_FILLER_PODS}")

    # -- serialisation (the scenario is handed to worker processes) ------------

    def to_json(self) -> str:
        return json.dumps({"services": self.services, "endpoints": self.endpoints,
                           "probes": [p.to_json() for p in self.probes]})

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        data = json.loads(text)
        return cls(data["services"], data["endpoints"],
                   tuple(Probe.from_json(p) for p in data["probes"]))

    # -- the state ---------------------------------------------------------------

    @property
    def fillers(self) -> int:
        return self.services - len(self.probes)

    def cluster_ip(self, index: int) -> ipaddress.IPv4Address:
        return SERVICE_CIDR[FIRST_SERVICE_HOST + index]

    def probe_ip(self, name: str) -> ipaddress.IPv4Address:
        index = next(i for i, p in enumerate(self.probes) if p.name == name)
        return self.cluster_ip(self.fillers + index)

    def service_ports(self) -> list[ServicePort]:
        """Every service port, fillers first, probes last."""
        ports = [self._filler(i) for i in range(self.fillers)]
        ports += [self._probe(i, probe) for i, probe in enumerate(self.probes)]
        return ports

    def full_changeset(self) -> ServicePortChanges:
        return ServicePortChanges(added=tuple(self.service_ports()), full=True)

    def _filler(self, index: int) -> ServicePort:
        first = index * self.endpoints
        pods = (ipaddress.IPv4Address(_FILLER_POD_BASE + (first + j) % _FILLER_PODS)
                for j in range(self.endpoints))
        return ServicePort(
            name=ServicePortName(NAMESPACE, f"svc-{index}", "http", Protocol.TCP),
            type="ClusterIP", cluster_ips=(self.cluster_ip(index),), port=SERVICE_PORT,
            target_port=FILLER_TARGET_PORT,
            endpoints=sorted_endpoints(Endpoint(ip, FILLER_TARGET_PORT) for ip in pods))

    def _probe(self, index: int, probe: Probe) -> ServicePort:
        return ServicePort(
            name=ServicePortName(NAMESPACE, f"probe-{probe.name}", probe.name, probe.protocol),
            type="ClusterIP", cluster_ips=(self.cluster_ip(self.fillers + index),),
            port=probe.port, target_port=probe.endpoints[0][1],
            endpoints=sorted_endpoints(Endpoint(ipaddress.IPv4Address(ip), port)
                              for ip, port in probe.endpoints))

    # -- the one-endpoint change ---------------------------------------------

    def changed_index(self) -> int:
        """The filler service whose endpoint moves (one in the middle)."""
        if self.fillers == 0:
            raise ValueError("a one-endpoint change needs at least one filler service")
        return self.fillers // 2

    def endpoint_moves(self) -> tuple[ServicePort, ServicePort]:
        """The changed service port before and after its first endpoint moved
        to a new pod address; change k goes one way when k is even and back
        when it is odd, so any number of changes keeps E endpoints."""
        before = self._filler(self.changed_index())
        moved = Endpoint(_MOVED_POD, FILLER_TARGET_PORT)
        after = replace(before, endpoints=sorted_endpoints((moved, *before.endpoints[1:])))
        return before, after

    def endpoint_change(self, step: int) -> ServicePortChanges:
        before, after = self.endpoint_moves()
        old, new = (before, after) if step % 2 == 0 else (after, before)
        return ServicePortChanges(updated=((old, new),), endpoint_changes=2)

