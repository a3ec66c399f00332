"""What kube-proxy would program for the same state, in its two netfilter
modes: `iptables` (iptables-restore input) and `nftables` (an `nft -f`
transaction). The generators follow kube-proxy's proxiers (pkg/proxy/iptables
and pkg/proxy/nftables, Kubernetes 1.29+) rule for rule for ClusterIP service
ports, so loading their output costs what kube-proxy's own syncs cost.

Only what the benchmark's state uses is generated: IPv4 ClusterIP services
with cluster traffic policy, no session affinity, no NodePorts.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Iterable

from kpng_py.model import IPFamily, ServicePort, family_of


def sha256_base32(text: str) -> str:
    """kube-proxy's chain-name hash: SHA-256, base32 (standard alphabet)."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()


@dataclass(frozen=True)
class KubeServicePort:
    """One service port as kube-proxy's proxiers see it (one IP family)."""

    name: str        # ServicePortName: `namespace/name:port`
    namespace: str
    service: str
    port_name: str
    protocol: str    # lower case, as in kube-proxy's chain names and rules
    cluster_ip: str
    port: int
    endpoints: tuple[str, ...]  # `ip:port`, in order

    @classmethod
    def of(cls, port: ServicePort) -> KubeServicePort | None:
        """The IPv4 view of a service port; None without an IPv4 ClusterIP."""
        vip = next((frontend.ip for frontend in port.frontends()
                    if family_of(frontend.ip) == IPFamily.V4), None)
        if vip is None:
            return None
        return cls(
            name=str(port.name), namespace=port.name.namespace, service=port.name.name,
            port_name=port.name.port, protocol=port.protocol.value.lower(),
            cluster_ip=str(vip), port=port.port,
            endpoints=tuple(str(ep) for ep in port.cluster_endpoints(IPFamily.V4)))


def kube_service_ports(ports: Iterable[ServicePort]) -> list[KubeServicePort]:
    return [kp for kp in map(KubeServicePort.of, ports) if kp is not None]
