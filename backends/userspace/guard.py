"""The last line behind decode: service addresses (ClusterIPs, ExternalIPs,
load-balancer IPs) the backend must never serve.

Decode refuses them already (`kpng_py.state.decode.address_problem`); the backend
asks the same function again because what it would do with one is worse than
a skipped service: `0.0.0.0` or `::` would listen on every address of the
node, a loopback or link-local ClusterIP would capture the node's own
traffic, and a scope id or multicast address makes the kernel refuse the
address. Such a ClusterIP is dropped from its service port before anything
else sees it: never added to the interface, never listened on. (Node ports
listen on the node's own addresses, not on service addresses.)
"""

from __future__ import annotations

from dataclasses import replace

from kpng_py.model import IPAddress, ServicePort, ServicePortChanges, ServicePortName
from kpng_py.state.decode import AddressProblem, address_problem
from kpng_py.state.skips import Skips


class ClusterIPGuard:
    """Drops refused ClusterIPs from change sets; one skip per service port
    and address while the port keeps it (not again on resyncs)."""

    def __init__(self, skips: Skips) -> None:
        self._skips = skips
        self._reported: dict[ServicePortName, frozenset[IPAddress]] = {}

    def filter(self, changes: ServicePortChanges) -> ServicePortChanges:
        if changes.full and self._reported:
            names = {port.name for port in changes.added}
            self._reported = {n: ips for n, ips in self._reported.items() if n in names}
        for port in changes.removed:
            self._reported.pop(port.name, None)
        return replace(
            changes,
            added=tuple(self._servable(port, report=True) for port in changes.added),
            updated=tuple((self._servable(old, report=False), self._servable(new, report=True))
                          for old, new in changes.updated),
            removed=tuple(self._servable(port, report=False) for port in changes.removed))

    def _servable(self, port: ServicePort, report: bool) -> ServicePort:
        problems = {ip: problem
                    for ip in (*port.cluster_ips, *port.external_ips, *port.load_balancer_ips)
                    if (problem := address_problem(ip)) is not None}
        if report:
            self._report(port.name, problems)
        if not problems:
            return port

        def kept(ips: tuple[IPAddress, ...]) -> tuple[IPAddress, ...]:
            return tuple(ip for ip in ips if ip not in problems)

        return replace(port, cluster_ips=kept(port.cluster_ips),
                       external_ips=kept(port.external_ips),
                       load_balancer_ips=kept(port.load_balancer_ips))

    def _report(self, name: ServicePortName, problems: dict[IPAddress, AddressProblem]) -> None:
        before = self._reported.get(name, frozenset())
        for ip, problem in problems.items():
            if ip not in before:
                self._skips.skip(problem.reason, str(name),
                                 f"service address {problem.detail}; the userspace backend "
                                 "neither adds it to its interface nor listens on it")
        if problems:
            self._reported[name] = frozenset(problems)
        else:
            self._reported.pop(name, None)
