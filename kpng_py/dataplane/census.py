"""Counts of what the dataplane holds, for the metrics kube-proxy exports
about it (`kpng_py_service_ports`, `kubeproxy_sync_proxy_rules_no_local_endpoints_total`),
kept up to date from each applied change set: the work is proportional to
what changed, and the same for every backend."""

from __future__ import annotations

from kpng_py.model import ServicePort, ServicePortChanges, ServicePortName

INTERNAL, EXTERNAL = "internal", "external"


def reachable_from_outside(port: ServicePort) -> bool:
    """Whether the port has a frontend other than its ClusterIPs (kube-proxy's
    ExternallyAccessible): its external traffic policy applies."""
    return bool(port.external_ips or port.load_balancer_ips or port.node_port_families)


def _no_local_endpoints(port: ServicePort) -> set[str]:
    """The traffic policies that are Local for `port` without a local endpoint."""
    policies: set[str] = set()
    if port.internal_traffic_local and not any(
            ep.local and ep.internal for ep in port.endpoints):
        policies.add(INTERNAL)
    if port.external_traffic_local and reachable_from_outside(port) and not any(
            ep.local and ep.external for ep in port.endpoints):
        policies.add(EXTERNAL)
    return policies


class DataplaneCensus:
    def __init__(self) -> None:
        self.service_ports = 0
        self._no_local: dict[str, set[ServicePortName]] = {INTERNAL: set(), EXTERNAL: set()}

    def applied(self, changes: ServicePortChanges) -> None:
        """`changes` is in the dataplane now."""
        if changes.full:
            self.service_ports = 0
            for names in self._no_local.values():
                names.clear()
        self.service_ports += len(changes.added) - len(changes.removed)
        for port in changes.removed:
            for names in self._no_local.values():
                names.discard(port.name)
        for port in (*changes.added, *(new for _, new in changes.updated)):
            policies = _no_local_endpoints(port)
            for policy, names in self._no_local.items():
                if policy in policies:
                    names.add(port.name)
                else:
                    names.discard(port.name)

    def no_local_endpoints(self, policy: str) -> int:
        return len(self._no_local[policy])
