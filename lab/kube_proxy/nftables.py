"""kube-proxy's nftables mode: the `nft -f` transactions of its syncs.

Everything lives in `table ip kube-proxy`. The `services` chain looks the
packet's `ip daddr . meta l4proto . th dport` up in the verdict map
`service-ips`, whose element for a ClusterIP port is `goto` the service
port's chain; that chain picks an endpoint with `numgen random mod N vmap`
and goes to the endpoint's chain, which DNATs. A full sync (the first)
creates and flushes the table's chains, sets and maps and writes everything;
a partial sync is a transaction that re-creates and flushes only the chains
of the service ports that changed, adds or deletes their map elements, and
flushes the endpoint chains that went stale (kube-proxy deletes those in a
later transaction). The text is what kube-proxy's knftables library hands to
`nft -f -`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from kpng_py.model import ServicePort
from lab.kube_proxy import KubeServicePort, kube_service_ports, sha256_base32

TABLE = "ip kube-proxy"
LOAD_COMMAND = ("nft", "-f", "-")
MASQUERADE_MARK = "0x00004000"  # kube-proxy formats its mark with %#08x

# (name, type, hook, priority): DNAT is -100, SNAT 100; the filter chains run
# just before DNAT so that they see ClusterIPs.
_BASE_CHAINS = (
    ("filter-prerouting", "filter", "prerouting", -110),
    ("filter-input", "filter", "input", -110),
    ("filter-forward", "filter", "forward", -110),
    ("filter-output", "filter", "output", -110),
    ("filter-output-post-dnat", "filter", "output", -90),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
)
# (chain, jumped to from, match)
_JUMPS = (
    ("nodeport-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-forward", "ct state new "),
    ("service-endpoints-check", "filter-output", "ct state new "),
    ("firewall-check", "filter-prerouting", "ct state new "),
    ("firewall-check", "filter-output", "ct state new "),
    ("services", "nat-output", ""),
    ("services", "nat-prerouting", ""),
    ("masquerading", "nat-postrouting", ""),
    ("cluster-ips-check", "filter-forward", "ct state new "),
    ("cluster-ips-check", "filter-output-post-dnat", "ct state new "),
)
_SERVICE_KEY = "ipv4_addr . inet_proto . inet_service : verdict"
# (kind, name, type, comment), flushed by every full sync
_CONTAINERS = (
    ("set", "cluster-ips", "ipv4_addr", "Active ClusterIPs"),
    ("map", "no-endpoint-services", _SERVICE_KEY,
     "vmap to drop or reject packets to services with no endpoints"),
    ("map", "no-endpoint-nodeports", "inet_proto . inet_service : verdict",
     "vmap to drop or reject packets to service nodeports with no endpoints"),
    ("map", "firewall-ips", _SERVICE_KEY,
     "destinations that are subject to LoadBalancerSourceRanges"),
    ("map", "service-ips", _SERVICE_KEY, "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
    ("map", "service-nodeports", "inet_proto . inet_service : verdict", "NodePort traffic"),
)


def _hashed(name: str) -> str:
    """kube-proxy's chain-name base: 8 characters of the name's hash, `-`, the name."""
    return sha256_base32(name)[:8] + "-" + name


def service_chain(port: KubeServicePort) -> str:
    return "service-" + _hashed(f"{port.namespace}/{port.service}/{port.protocol}/{port.port_name}")


def endpoint_chain(port: KubeServicePort, endpoint: str) -> str:
    ip, ep_port = endpoint.rsplit(":", 1)
    ip = ip.strip("[]").replace(":", ".")
    return "endpoint-" + _hashed(
        f"{port.namespace}/{port.service}/{port.protocol}/{port.port_name}__{ip}/{ep_port}")


@dataclass(frozen=True)
class NftablesProxier:
    """What kube-proxy writes for a node whose pods are in `cluster_cidr`,
    with ClusterIPs from `service_cidr`."""

    cluster_cidr: str
    service_cidr: str

    def full_sync(self, ports: Iterable[ServicePort]) -> str:
        tx = self._setup()
        for port in kube_service_ports(ports):
            tx += self._create_chains(port)
            tx += self._service_elements(port, "add")
            tx += self._chain_rules(port)
        return "\n".join(tx) + "\n"

    def partial_sync(self, updated: Sequence[tuple[ServicePort, ServicePort]]) -> str:
        """A partial sync after the service ports in `updated` (old, new) changed."""
        tx: list[str] = []
        for old_port, new_port in updated:
            old, new = KubeServicePort.of(old_port), KubeServicePort.of(new_port)
            if old is None or new is None:
                raise ValueError(f"{new_port.name}: the nftables ruleset is IPv4 only")
            tx += self._create_chains(new)
            if self._service_elements(old, "add") != self._service_elements(new, "add"):
                tx += self._service_elements(old, "delete") + self._service_elements(new, "add")
            tx += self._chain_rules(new)
            live = {endpoint_chain(new, ep) for ep in new.endpoints}
            tx += [f"flush chain {TABLE} {endpoint_chain(old, ep)}"
                   for ep in old.endpoints if endpoint_chain(old, ep) not in live]
        return "\n".join(tx) + "\n"

    def _setup(self) -> list[str]:
        """kube-proxy's setupNFTables on its first sync."""
        tx = [f'add table {TABLE} {{ comment "rules for kube-proxy" ; }}']
        for name, *_ in _BASE_CHAINS:  # re-create base chains whatever they were
            tx += [f"add chain {TABLE} {name}", f"delete chain {TABLE} {name}"]
        for name, kind, hook, priority in _BASE_CHAINS:
            tx += [f"add chain {TABLE} {name} {{ type {kind} hook {hook} priority {priority} ; }}",
                   f"flush chain {TABLE} {name}"]
        created: list[str] = []
        for chain, source, match in _JUMPS:
            tx += self._ensure_chain(chain, created)
            tx.append(f"add rule {TABLE} {source} {match}jump {chain}")
        for chain in ("services", "cluster-ips-check", "masquerading", "mark-for-masquerade",
                      "firewall-check"):
            tx += self._ensure_chain(chain, created)
        tx += [
            f"add rule {TABLE} mark-for-masquerade mark set mark or {MASQUERADE_MARK}",
            f"add rule {TABLE} masquerading mark and {MASQUERADE_MARK} == 0 return",
            f"add rule {TABLE} masquerading mark set mark xor {MASQUERADE_MARK}",
            f"add rule {TABLE} masquerading masquerade fully-random",
            f'add set {TABLE} cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}',
            f"add rule {TABLE} cluster-ips-check ip daddr @cluster-ips reject "
            'comment "Reject traffic to invalid ports of ClusterIPs"',
            f"add rule {TABLE} cluster-ips-check ip daddr {{ {self.service_cidr} }} drop "
            'comment "Drop traffic to unallocated ClusterIPs"',
        ]
        for kind, name, key_type, comment in _CONTAINERS[1:]:
            tx.append(f'add {kind} {TABLE} {name} {{ type {key_type} ; comment "{comment}" ; }}')
        tx += [
            f'add chain {TABLE} reject-chain {{ comment "helper for @no-endpoint-services / '
            f'@no-endpoint-nodeports" ; }}',
            f"flush chain {TABLE} reject-chain",
            f"add rule {TABLE} reject-chain reject",
            f"add rule {TABLE} service-endpoints-check "
            "ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
            f"add rule {TABLE} nodeport-endpoints-check "
            "ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports",
            f"add rule {TABLE} firewall-check "
            "ip daddr . meta l4proto . th dport vmap @firewall-ips",
            f"add rule {TABLE} services ip daddr . meta l4proto . th dport vmap @service-ips",
            f"add rule {TABLE} services fib daddr type local ip daddr != 127.0.0.0/8 "
            "meta l4proto . th dport vmap @service-nodeports",
        ]
        tx += [f"flush {kind} {TABLE} {name}" for kind, name, *_ in _CONTAINERS]
        return tx

    @staticmethod
    def _ensure_chain(chain: str, created: list[str]) -> list[str]:
        if chain in created:
            return []
        created.append(chain)
        return [f"add chain {TABLE} {chain}", f"flush chain {TABLE} {chain}"]

    @staticmethod
    def _service_elements(port: KubeServicePort, verb: str) -> list[str]:
        key = f"{port.cluster_ip} . {port.protocol} . {port.port}"
        lines = [f"{verb} element {TABLE} cluster-ips {{ {port.cluster_ip} }}"]
        if port.endpoints:
            value = "" if verb == "delete" else f" : goto {service_chain(port)}"
            lines.append(f"{verb} element {TABLE} service-ips {{ {key}{value} }}")
        else:
            value = "" if verb == "delete" else " : goto reject-chain"
            lines.append(f"{verb} element {TABLE} no-endpoint-services {{ {key}{value} "
                         f'comment "{port.name}" }}')
        return lines

    @staticmethod
    def _create_chains(port: KubeServicePort) -> list[str]:
        """The service port's endpoint chains and chain, created and flushed."""
        if not port.endpoints:
            return []
        chains = [endpoint_chain(port, ep) for ep in port.endpoints] + [service_chain(port)]
        return [line for chain in chains
                for line in (f"add chain {TABLE} {chain}", f"flush chain {TABLE} {chain}")]

    def _chain_rules(self, port: KubeServicePort) -> list[str]:
        if not port.endpoints:
            return []
        svc = service_chain(port)
        endpoints = [(ep, endpoint_chain(port, ep)) for ep in port.endpoints]
        tx = [f"add rule {TABLE} {svc} ip daddr {port.cluster_ip} {port.protocol} dport "
              f"{port.port} ip saddr != {self.cluster_cidr} jump mark-for-masquerade"]
        choices = ", ".join(f"{i} : goto {chain}" for i, (_, chain) in enumerate(endpoints))
        tx.append(f"add rule {TABLE} {svc} numgen random mod {len(endpoints)} "
                  f"vmap {{ {choices} }}")
        for endpoint, chain in endpoints:
            ip = endpoint.rsplit(":", 1)[0]
            tx += [f"add rule {TABLE} {chain} ip saddr {ip} jump mark-for-masquerade",
                   f"add rule {TABLE} {chain} meta l4proto {port.protocol} dnat to {endpoint}"]
        return tx
