"""kube-proxy's iptables mode: the iptables-restore input of its syncs.

A full sync writes every chain: KUBE-SERVICES dispatches on destination
ClusterIP and port to the service port's KUBE-SVC-* chain, which picks an
endpoint with `-m statistic --mode random --probability 1/(n-i)` and jumps to
the endpoint's KUBE-SEP-* chain, which DNATs. A partial sync (kube-proxy's
MinimizeIPTablesRestore, on by default since 1.27) rewrites the top-level
chains, KUBE-SERVICES included in full, and only the KUBE-SVC/KUBE-SEP chains
of the services that changed. Both are loaded with
`iptables-restore --noflush`, so chains not named in the input are kept.

The jumps from the built-in chains into kube-proxy's (PREROUTING ->
KUBE-SERVICES ...) are not part of a restore: kube-proxy ensures them with
`iptables -I` once (`jump_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from kpng_py.model import IPFamily, ServicePort
from lab.kube_proxy import KubeServicePort, kube_service_ports, sha256_base32

MASQUERADE_MARK = "0x4000"  # --masquerade-bit 14, kube-proxy's default
# Above this many endpoints in total, kube-proxy drops per-endpoint comments
# and stops looking for stale chains on every sync.
LARGE_CLUSTER_ENDPOINTS = 1000


def restore_command(variant: str, family: IPFamily = IPFamily.V4) -> tuple[str, ...]:
    """kube-proxy's restore call, with iptables' `legacy` or `nft` backend."""
    return (f"{TOOL[family]}-{variant}-restore", "-w", "5", "-W", "100000", "--noflush",
            "--counters")


# The tool of each family's proxier.
TOOL = {IPFamily.V4: "iptables", IPFamily.V6: "ip6tables"}

KUBE_SERVICES = "KUBE-SERVICES"
KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_NODEPORTS = "KUBE-NODEPORTS"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBE_FIREWALL = "KUBE-FIREWALL"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_MARK_MASQ = "KUBE-MARK-MASQ"

_NEW = "-m conntrack --ctstate NEW"
_EXTERNAL_PORTALS = "kubernetes externally-visible service portals"
# (table, chain, from built-in chain, comment, extra match): kube-proxy's
# iptablesJumpChains and kubelet's KUBE-FIREWALL jumps.
_JUMPS = (
    ("filter", KUBE_EXTERNAL_SERVICES, "INPUT", _EXTERNAL_PORTALS, _NEW),
    ("filter", KUBE_EXTERNAL_SERVICES, "FORWARD", _EXTERNAL_PORTALS, _NEW),
    ("filter", KUBE_NODEPORTS, "INPUT", "kubernetes health check service ports", ""),
    ("filter", KUBE_SERVICES, "FORWARD", "kubernetes service portals", _NEW),
    ("filter", KUBE_SERVICES, "OUTPUT", "kubernetes service portals", _NEW),
    ("filter", KUBE_FORWARD, "FORWARD", "kubernetes forwarding rules", ""),
    ("filter", KUBE_PROXY_FIREWALL, "INPUT", "kubernetes load balancer firewall", _NEW),
    ("filter", KUBE_PROXY_FIREWALL, "OUTPUT", "kubernetes load balancer firewall", _NEW),
    ("filter", KUBE_PROXY_FIREWALL, "FORWARD", "kubernetes load balancer firewall", _NEW),
    ("filter", KUBE_FIREWALL, "INPUT", "", ""),
    ("filter", KUBE_FIREWALL, "OUTPUT", "", ""),
    ("nat", KUBE_SERVICES, "OUTPUT", "kubernetes service portals", ""),
    ("nat", KUBE_SERVICES, "PREROUTING", "kubernetes service portals", ""),
    ("nat", KUBE_POSTROUTING, "POSTROUTING", "kubernetes postrouting rules", ""),
)


def service_chain(port: KubeServicePort) -> str:
    """KUBE-SVC-<hash of `ns/name:port` + protocol>."""
    return "KUBE-SVC-" + sha256_base32(port.name + port.protocol)[:16]


def endpoint_chain(port: KubeServicePort, endpoint: str) -> str:
    """KUBE-SEP-<hash of `ns/name:port` + protocol + `ip:port`>."""
    return "KUBE-SEP-" + sha256_base32(port.name + port.protocol + endpoint)[:16]


def _chain_line(chain: str) -> str:
    return f":{chain} - [0:0]"


def _quoted(text: str) -> str:
    return f'"{text}"'


@dataclass(frozen=True)
class IptablesProxier:
    """What kube-proxy writes for a node whose pods are in `cluster_cidr`
    (--cluster-cidr: traffic from elsewhere to a ClusterIP is masqueraded)."""

    cluster_cidr: str
    family: IPFamily = IPFamily.V4

    def full_sync(self, ports: Iterable[ServicePort]) -> str:
        return self._sync(kube_service_ports(ports, self.family), changed=None)

    def partial_sync(self, ports: Iterable[ServicePort],
                     updated: Sequence[tuple[ServicePort, ServicePort]]) -> str:
        """A partial sync after the service ports in `updated` (old, new)
        changed; `ports` is the whole new state."""
        return self._sync(kube_service_ports(ports, self.family),
                          changed={str(new.name) for _, new in updated})

    def jump_rules(self) -> str:
        """The jumps from the built-in chains, as kube-proxy ensures them."""
        lines = []
        for table in ("filter", "nat"):
            lines.append(f"*{table}")
            jumps = [j for j in _JUMPS if j[0] == table]
            lines += [_chain_line(chain) for chain in dict.fromkeys(j[1] for j in jumps)]
            for _, chain, source, comment, match in jumps:
                words = [f"-I {source}", match,
                         f"-m comment --comment {_quoted(comment)}" if comment else "",
                         f"-j {chain}"]
                lines.append(" ".join(w for w in words if w))
            lines.append("COMMIT")
        return "\n".join(lines) + "\n"

    def _sync(self, ports: list[KubeServicePort], changed: set[str] | None) -> str:
        large = sum(len(p.endpoints) for p in ports) > LARGE_CLUSTER_ENDPOINTS
        filter_chains = [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS,
                         KUBE_PROXY_FIREWALL, KUBE_FIREWALL]
        # kubelet's route_localnet guard exists for IPv4 only.
        filter_rules = [
            f"-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" "
            "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT "
            "-j DROP"] if self.family is IPFamily.V4 else []
        nat_chains = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ]
        nat_rules = [
            f"-A {KUBE_POSTROUTING} -m mark ! --mark {MASQUERADE_MARK}/{MASQUERADE_MARK} -j RETURN",
            f"-A {KUBE_POSTROUTING} -j MARK --xor-mark {MASQUERADE_MARK}",
            f"-A {KUBE_POSTROUTING} -m comment --comment "
            "\"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
            f"-A {KUBE_MARK_MASQ} -j MARK --or-mark {MASQUERADE_MARK}",
        ]
        for port in ports:
            match = (f"-m {port.protocol} -p {port.protocol} -d {port.cluster_ip} "
                     f"--dport {port.port}")
            if not port.endpoints:
                filter_rules.append(
                    f"-A {KUBE_SERVICES} -m comment --comment "
                    f"{_quoted(port.name + ' has no endpoints')} {match} -j REJECT")
                continue
            svc = service_chain(port)
            cluster_ip_comment = f"-m comment --comment {_quoted(port.name + ' cluster IP')}"
            nat_rules.append(f"-A {KUBE_SERVICES} {cluster_ip_comment} {match} -j {svc}")
            if changed is not None and port.name not in changed:
                continue  # unchanged: its chains stay as they are in the kernel
            nat_chains.append(svc)
            nat_rules.append(f"-A {svc} {cluster_ip_comment} {match} "
                             f"! -s {self.cluster_cidr} -j {KUBE_MARK_MASQ}")
            nat_rules += self._balance(port, svc, large)
            for endpoint in port.endpoints:
                sep = endpoint_chain(port, endpoint)
                nat_chains.append(sep)
                comment = "" if large else f" -m comment --comment {port.name}"
                ip = endpoint.rsplit(":", 1)[0].strip("[]")
                nat_rules.append(f"-A {sep}{comment} -s {ip} -j {KUBE_MARK_MASQ}")
                nat_rules.append(f"-A {sep}{comment} -m {port.protocol} -p {port.protocol} "
                                 f"-j DNAT --to-destination {endpoint}")
        nat_rules.append(
            f"-A {KUBE_SERVICES} -m comment --comment \"kubernetes service nodeports; NOTE: this "
            f"must be the last rule in this chain\" -m addrtype --dst-type LOCAL "
            f"-j {KUBE_NODEPORTS}")
        filter_rules += [
            f"-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP",
            f"-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" "
            f"-m mark --mark {MASQUERADE_MARK}/{MASQUERADE_MARK} -j ACCEPT",
            f"-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" "
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        ]
        return "\n".join([
            "*filter", *map(_chain_line, filter_chains), *filter_rules, "COMMIT",
            "*nat", *map(_chain_line, nat_chains), *nat_rules, "COMMIT", ""])

    @staticmethod
    def _balance(port: KubeServicePort, svc: str, large: bool) -> list[str]:
        """Endpoint i of n is taken with probability 1/(n-i); the last always."""
        rules = []
        count = len(port.endpoints)
        for i, endpoint in enumerate(port.endpoints):
            comment = ("" if large
                       else f" -m comment --comment {_quoted(f'{port.name} -> {endpoint}')}")
            statistic = (f" -m statistic --mode random --probability {1.0 / (count - i):.10f}"
                         if i < count - 1 else "")
            rules.append(f"-A {svc}{comment}{statistic} -j {endpoint_chain(port, endpoint)}")
        return rules
