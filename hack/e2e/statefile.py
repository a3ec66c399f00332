"""The cluster state the checks change, written as a KPNG state file
(docs/spec/state-file.md) for the built-in brain.

Values are frozen; a check changes the cluster by building a new state
(`with_service`, `without_service`, `ServiceSpec.with_endpoints`...) the way a
Kubernetes e2e test creates, updates and deletes objects.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from lab.cluster import ADDRESSING, Family, IPAddress, Pod, ip_family
from lab.servers import ContainerPort

LOCAL_NODE = "node-a"   # the node the backend serves (--node-name)
REMOTE_NODE = "node-b"  # a node with no processes: its endpoints are not Local
ZONE = "zone-a"         # the zone of both
OTHER_ZONE_NODE = "node-c"  # a node with no processes in another zone
OTHER_ZONE = "zone-b"
PROTOCOL_NUMBERS = {"TCP": 1, "UDP": 2}


@dataclass(frozen=True)
class PortSpec:
    """A service port whose targetPort is a named container port, or a number
    (`target_number`; then endpoints carry no port override for it)."""

    name: str
    protocol: str
    port: int
    target: ContainerPort | None = None
    target_number: int = 0
    node_port: int = 0  # type NodePort / LoadBalancer: the port on every node

    def backend_port(self, pod: Pod) -> int:
        return self.target.number(pod) if self.target else self.target_number

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "protocol": PROTOCOL_NUMBERS[self.protocol],
                               "port": self.port}
        if self.target:
            out["targetportname"] = self.target.value
        else:
            out["targetport"] = self.target_number
        if self.node_port:
            out["nodeport"] = self.node_port
        return out


@dataclass(frozen=True)
class EndpointRef:
    """A pod backing a service, on the local node unless `node` says
    otherwise. A pod that is not terminating serves when it is ready; a
    terminating one (its grace period) may still serve (`serving`). Hints:
    the zones and nodes its EndpointSlice names for it (trafficDistribution)."""

    pod: Pod
    node: str = LOCAL_NODE
    ready: bool = True
    terminating: bool = False
    serving: bool = False  # read only when terminating
    hint_zones: tuple[str, ...] = ()
    hint_nodes: tuple[str, ...] = ()

    @property
    def is_serving(self) -> bool:
        return self.serving if self.terminating else self.ready

    def conditions(self) -> dict[str, bool]:
        """As the state file says them: serving and terminating only where
        the endpoint terminates (the file's defaults otherwise)."""
        if not self.terminating:
            return {"ready": self.ready}
        return {"ready": self.ready, "serving": self.serving, "terminating": True}


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    ip_index: int  # the ClusterIP is the service CIDR's address number 10 + ip_index
    ports: tuple[PortSpec, ...]
    endpoints: tuple[EndpointRef, ...] = ()
    type: str = "ClusterIP"
    headless: bool = False
    affinity_timeout: int | None = None
    internal_traffic_local: bool = False
    # None: every family of the cluster; else a single-stack service.
    only_family: Family | None = None
    external_ips: tuple[IPAddress, ...] = ()
    lb_ips: tuple[IPAddress, ...] = ()  # status.loadBalancer.ingress
    external_traffic_local: bool = False  # externalTrafficPolicy: Local
    health_check_node_port: int = 0
    source_ranges: tuple[str, ...] = ()  # loadBalancerSourceRanges (filter the LB IPs)
    labels: tuple[tuple[str, str], ...] = ()
    # trafficDistribution (PreferSameNode, PreferSameZone): the API's only;
    # what a proxy reads is the endpoints' hints, which the file says too.
    traffic_distribution: str = ""

    def cluster_ip(self, family: Family) -> IPAddress:
        return ADDRESSING[family].service_ip(self.ip_index)

    def port(self, name: str) -> PortSpec:
        return next(p for p in self.ports if p.name == name)

    def with_endpoints(self, *endpoints: EndpointRef | Pod) -> ServiceSpec:
        refs = tuple(e if isinstance(e, EndpointRef) else EndpointRef(e) for e in endpoints)
        return dataclasses.replace(self, endpoints=refs)

    def with_ports(self, *ports: PortSpec) -> ServiceSpec:
        return dataclasses.replace(self, ports=ports)

    def families(self, cluster_families: tuple[Family, ...]) -> tuple[Family, ...]:
        if self.only_family is None:
            return cluster_families
        return (self.only_family,) if self.only_family in cluster_families else ()

    def to_yaml(self, cluster_families: tuple[Family, ...],
                zone_of: Callable[[str], str]) -> dict[str, Any]:
        families = self.families(cluster_families)
        service: dict[str, Any] = {"namespace": "default", "name": self.name, "type": self.type}
        if self.labels:
            service["labels"] = dict(self.labels)
        if self.headless:
            service["ips"] = {"headless": True}
        else:
            service["ips"] = {"clusterips": _ip_set(self.cluster_ip(f) for f in families)}
        service["ports"] = [p.to_yaml() for p in self.ports]
        if self.affinity_timeout is not None:
            service["sessionaffinity"] = {"clientip": {"timeoutseconds": self.affinity_timeout}}
        if self.internal_traffic_local:
            service["internaltraffictolocal"] = True
        external = self._external_yaml(families)
        service["ips"].update(external.pop("ips", {}))
        service.update(external)
        return {"service": service,
                "endpoints": [self._endpoint_yaml(e, families, zone_of) for e in self.endpoints]}

    def _external_yaml(self, families: tuple[Family, ...]) -> dict[str, Any]:
        """ExternalIPs, LB IPs, their filter, eTP and the health check port."""
        out: dict[str, Any] = {}
        external = [ip for ip in self.external_ips if ip_family(ip) in families]
        lb = [ip for ip in self.lb_ips if ip_family(ip) in families]
        ips = {"externalips": _ip_set(external), "loadbalancerips": _ip_set(lb)}
        if any(ips.values()):
            out["ips"] = {key: value for key, value in ips.items() if value}
        if self.source_ranges and lb:
            out["ipfilters"] = [{"targetips": _ip_set(lb),
                                 "sourceranges": list(self.source_ranges)}]
        if self.external_traffic_local:
            out["externaltraffictolocal"] = True
        if self.health_check_node_port:
            out["healthchecknodeport"] = self.health_check_node_port
        return out

    def _endpoint_yaml(self, ref: EndpointRef, families: tuple[Family, ...],
                       zone_of: Callable[[str], str]) -> dict[str, Any]:
        endpoint: dict[str, Any] = {"ips": _ip_set(ref.pod.ip(f) for f in families)}
        overrides = [{"name": p.name, "port": p.backend_port(ref.pod)}
                     for p in self.ports if p.target]
        if overrides:
            endpoint["portoverrides"] = overrides
        out = {"podname": ref.pod.name, "endpoint": endpoint,
               "topology": {"node": ref.node, "zone": zone_of(ref.node)},
               "conditions": ref.conditions()}
        hints = {"zones": list(ref.hint_zones), "nodes": list(ref.hint_nodes)}
        if any(hints.values()):
            out["hints"] = {key: names for key, names in hints.items() if names}
        return out


def _ip_set(ips) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ip in ips:
        out.setdefault("v4" if ip_family(ip) is Family.IPV4 else "v6", []).append(str(ip))
    return out


# The service topology's nodes (name, zone): only the first runs a backend.
SERVICE_TOPOLOGY_NODES = ((LOCAL_NODE, ZONE), (REMOTE_NODE, ZONE), (OTHER_ZONE_NODE, OTHER_ZONE))


@dataclass(frozen=True)
class ClusterState:
    families: tuple[Family, ...]
    services: tuple[ServiceSpec, ...] = field(default=())
    nodes: tuple[tuple[str, str], ...] = SERVICE_TOPOLOGY_NODES  # (name, zone)

    def zone_of(self, node: str) -> str:
        return dict(self.nodes)[node]

    def with_service(self, service: ServiceSpec) -> ClusterState:
        """Create or update (by name)."""
        kept = tuple(s for s in self.services if s.name != service.name)
        return dataclasses.replace(self, services=kept + (service,))

    def without_service(self, name: str) -> ClusterState:
        return dataclasses.replace(self, services=tuple(s for s in self.services
                                                        if s.name != name))

    def to_yaml(self) -> str:
        nodes = [{"name": name, "topology": {"node": name, "zone": zone}}
                 for name, zone in self.nodes]
        body = {"nodes": nodes,
                "services": [s.to_yaml(self.families, self.zone_of)
                             for s in sorted(self.services, key=lambda s: s.name)]}
        return yaml.safe_dump(body, sort_keys=False)


def write_atomically(path: Path, text: str) -> None:
    """The brain never sees a half-written file: write a sibling, rename it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
