"""Delete the conntrack entries of UDP flows from outside whose endpoint left
the service (docs/spec/node-port-behaviours.md, N17: what kube-proxy does after
each sync).

A UDP "connection" DNATed by the netfilter table stays bound to its endpoint
for as long as the client keeps sending (conntrack refreshes the entry with
every datagram). When the endpoint goes, the client would keep sending into
the void: deleting the entry makes its next datagram a new flow, which the
table sends to a live endpoint.

Which entries: UDP, translated (reply source != original destination), the
reply coming from the endpoint that went, and the original destination a
frontend of the service port from outside (its node port on any address, or
one of its ExternalIPs / LB IPs with the service port). And when a UDP
service port gets its first endpoint in a family: the entries of flows to
its frontends that were not translated (a datagram to a node port before
the service existed was delivered to the node, refused, and confirmed in
conntrack without NAT: the client's next datagrams would follow it).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from dataclasses import dataclass
from typing import Iterable, Protocol

from pyroute2 import Conntrack
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

from backends.ebpf.netfilter.plan import FAMILIES, node_port_of
from kpng_py.model import IPAddress, IPFamily, ServicePort
from kpng_py.model import Protocol as L4
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

_AF = {IPFamily.V4: socket.AF_INET, IPFamily.V6: socket.AF_INET6}


@dataclass(frozen=True)
class StaleFlows:
    """Flows to delete: those that reached a frontend of a service port (its
    `node_port` on any address, 0: none, or one of `frontends`) and were
    answered by `endpoint`; with `endpoint` None, those that were not
    translated at all (they came before the port had an endpoint here)."""

    family: IPFamily
    endpoint: tuple[IPAddress, int] | None
    node_port: int
    frontends: frozenset[tuple[IPAddress, int]]

    def matches(self, orig: NFCTAttrTuple, reply: NFCTAttrTuple) -> bool:
        source = (ipaddress.ip_address(reply.saddr), reply.sport)
        destination = (ipaddress.ip_address(orig.daddr), orig.dport)
        translated = destination != source
        if translated != (self.endpoint is not None) or (translated and source != self.endpoint):
            return False
        return (bool(self.node_port) and orig.dport == self.node_port) or (
            destination in self.frontends)


def stale_udp_flows(old: ServicePort | None, new: ServicePort | None) -> list[StaleFlows]:
    """For a UDP service port that was `old` and is `new` (None: absent):
    the flows of each endpoint that went, and, in a family where it gets
    its first endpoint, the flows that reached its frontends untranslated
    (as kube-proxy clears them: they would stay untranslated as long as the
    client keeps sending)."""
    if not any(port is not None and port.protocol is L4.UDP for port in (old, new)):
        return []
    flows = []
    for family in FAMILIES:
        had = _endpoints(old, family)
        has = _endpoints(new, family)
        flows += [StaleFlows(family, ep, node_port_of(old, family), _frontends(old, family))
                  for ep in sorted(had - has, key=str) if old is not None]
        if has and not had and new is not None:
            flows.append(StaleFlows(family, None, node_port_of(new, family),
                                    _frontends(new, family)))
    return flows


def _endpoints(port: ServicePort | None, family: IPFamily) -> set[tuple[IPAddress, int]]:
    if port is None or port.protocol is not L4.UDP:
        return set()
    return {(ep.ip, ep.port) for ep in port.external_endpoints(family)}


def _frontends(port: ServicePort, family: IPFamily) -> frozenset[tuple[IPAddress, int]]:
    return frozenset((ip, port.port) for ip in port.external_ips + port.load_balancer_ips
                     if ip.version == family.value)


class Failures(Protocol):
    def inc(self) -> None: ...


class ConntrackCleaner:
    """Deletes stale UDP conntrack entries in the process's network namespace.
    A failure is counted in `failures` and logged, never raised: the table is
    programmed either way, and the next change set tries again."""

    def __init__(self, failures: Failures) -> None:
        self._failures = failures

    def delete(self, stale: Iterable[StaleFlows]) -> int:
        """Delete the entries of `stale`; returns how many went."""
        by_family: dict[IPFamily, list[StaleFlows]] = {}
        for flows in stale:
            by_family.setdefault(flows.family, []).append(flows)
        deleted = 0
        for family, in_family in by_family.items():
            try:
                deleted += self._delete_in(family, in_family)
            except (OSError, NetlinkError) as err:
                self._failures.inc()
                log.warning("cannot delete stale UDP conntrack entries; counted in "
                            "kpng_py_dataplane_errors{kind=\"udp-conntrack\"}", extra=fields(
                                family=f"ipv{family.value}", endpoints=len(in_family),
                                error=err))
        return deleted

    def _delete_in(self, family: IPFamily, flows: list[StaleFlows]) -> int:
        af = _AF[family]
        deleted = 0
        with Conntrack(nfgen_family=af) as ct:
            entries = list(ct.dump_entries(tuple_orig=NFCTAttrTuple(
                family=af, proto=socket.IPPROTO_UDP)))
            for entry in entries:
                if any(f.matches(entry.tuple_orig, entry.tuple_reply) for f in flows):
                    try:
                        ct.entry("del", tuple_orig=entry.tuple_orig)
                    except NetlinkError as err:
                        if err.code != errno.ENOENT:  # ENOENT: it expired meanwhile
                            raise
                        continue
                    deleted += 1
        return deleted
