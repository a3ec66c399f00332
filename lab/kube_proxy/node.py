"""kube-proxy's iptables mode on a lab node: the rules it keeps for the
node's service ports, loaded into the node's network namespace as kube-proxy
loads them (its jumps from the built-in chains, then a full sync), and
removed as `kube-proxy --cleanup` removes them (the jumps, then every
KUBE-* chain). What the e2e's migration check runs beside kpng-py
(docs/deploy.md, "From kube-proxy to kpng-py")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from kpng_py.model import IPFamily, ServicePort
from lab.kube_proxy.iptables import TOOL, IptablesProxier, restore_command
from lab.procs import in_namespace, run

# kube-proxy's chains all start so (KUBE-SERVICES, KUBE-SVC-*, KUBE-SEP-*...).
_PREFIX = "KUBE-"


@dataclass
class KubeProxyRules:
    """kube-proxy in `netns`, one proxier per family of `cluster_cidrs`
    (--cluster-cidr: traffic from elsewhere to a ClusterIP is masqueraded),
    with iptables' `variant` backend (nft, as on current distributions)."""

    netns: str
    cluster_cidrs: Mapping[IPFamily, str]
    variant: str = "nft"
    _jumps_ensured: bool = field(default=False, init=False)

    def sync(self, ports: Sequence[ServicePort]) -> None:
        """A full sync of `ports` (the node's view), as kube-proxy's first one."""
        for family, cidr in self.cluster_cidrs.items():
            proxier = IptablesProxier(cidr, family)
            command = in_namespace(self.netns, restore_command(self.variant, family))
            if not self._jumps_ensured:
                run(command, stdin=proxier.jump_rules())
            run(command, stdin=proxier.full_sync(ports))
        self._jumps_ensured = True

    def cleanup(self) -> None:
        """`kube-proxy --cleanup`: nothing of kube-proxy's is left."""
        for family in self.cluster_cidrs:
            saved = run(in_namespace(self.netns, [f"{TOOL[family]}-{self.variant}-save"])).stdout
            removal = cleanup_input(saved)
            if removal:
                run(in_namespace(self.netns, restore_command(self.variant, family)),
                    stdin=removal)
        self._jumps_ensured = False


def cleanup_input(saved: str) -> str:
    """The iptables-restore input that removes kube-proxy's rules from what
    iptables-save printed: per table, its chains flushed (declared again),
    the jumps into them from the built-in chains deleted, its chains
    deleted; other rules and chains are left alone."""
    blocks = []
    table = ""
    chains: list[str] = []
    jumps: list[str] = []
    for line in saved.splitlines():
        if line.startswith("*"):
            table, chains, jumps = line[1:], [], []
        elif line.startswith(f":{_PREFIX}"):
            chains.append(line[1:].split()[0])
        elif line.startswith("-A ") and not line.split()[1].startswith(_PREFIX) and (
                f"-j {_PREFIX}" in line):
            jumps.append("-D " + line[3:])
        elif line == "COMMIT" and (chains or jumps):
            blocks += [f"*{table}", *(f":{chain} - [0:0]" for chain in chains), *jumps,
                       *(f"-X {chain}" for chain in chains), "COMMIT"]
    return "\n".join(blocks) + "\n" if blocks else ""
