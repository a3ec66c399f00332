"""What kube-proxy would program for the same state, in its two netfilter
modes: `iptables` (iptables-restore input) and `nftables` (an `nft -f`
transaction). The generators follow kube-proxy's proxiers (pkg/proxy/iptables
and pkg/proxy/nftables, Kubernetes 1.29+) rule for rule for ClusterIP service
ports, so loading their output costs what kube-proxy's own syncs cost.

Only what the benchmark's state and the e2e's migration check use is
generated: ClusterIP service ports with cluster traffic policy, no session
affinity, no NodePorts; iptables in either family (nftables: IPv4). The
benchmark loads them into a namespace of its own; `node.KubeProxyRules`
loads and removes them on a lab node as kube-proxy would.
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
    def of(cls, port: ServicePort, family: IPFamily = IPFamily.V4) -> KubeServicePort | None:
        """The view of a service port in one family (kube-proxy runs a proxier
        per family); None without a ClusterIP of that family."""
        vip = next((ip for ip in port.cluster_ips if family_of(ip) == family), None)
        if vip is None:
            return None
        return cls(
            name=str(port.name), namespace=port.name.namespace, service=port.name.name,
            port_name=port.name.port, protocol=port.protocol.value.lower(),
            cluster_ip=str(vip), port=port.port,
            endpoints=tuple(str(ep) for ep in port.cluster_endpoints(family)))


def kube_service_ports(ports: Iterable[ServicePort],
                       family: IPFamily = IPFamily.V4) -> list[KubeServicePort]:
    return [kp for kp in (KubeServicePort.of(port, family) for port in ports) if kp is not None]
