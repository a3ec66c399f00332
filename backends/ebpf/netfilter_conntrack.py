"""Delete the conntrack entries of UDP flows from outside whose endpoint left
the service (nodeport-semantics N17, what kube-proxy does after each sync).

A UDP "connection" DNATed by the netfilter table stays bound to its endpoint
for as long as the client keeps sending (conntrack refreshes the entry with
every datagram). When the endpoint goes, the client would keep sending into
the void: deleting the entry makes its next datagram a new flow, which the
table sends to a live endpoint.

Which entries: UDP, translated (reply source != original destination), the
reply coming from the endpoint that went, and the original destination a
frontend of the service port from outside (its node port on any address, or
one of its ExternalIPs / LB IPs with the service port).
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

from backends.ebpf.netfilter_plan import FAMILIES, external_endpoints
from kpng_py.logs import fields
from kpng_py.model import IPAddress, IPFamily, Protocol as L4, ServicePort

log = logging.getLogger(__name__)

_AF = {IPFamily.V4: socket.AF_INET, IPFamily.V6: socket.AF_INET6}


@dataclass(frozen=True)
class StaleFlows:
    """Flows to delete: those answered by `endpoint` that reached it through
    `node_port` (0: none) or one of `frontends` (address, port)."""

    family: IPFamily
    endpoint: tuple[IPAddress, int]
    node_port: int
    frontends: frozenset[tuple[IPAddress, int]]

    def matches(self, orig: NFCTAttrTuple, reply: NFCTAttrTuple) -> bool:
        source = (ipaddress.ip_address(reply.saddr), reply.sport)
        destination = (ipaddress.ip_address(orig.daddr), orig.dport)
        if source != self.endpoint or destination == source:
            return False  # another endpoint, or a flow that was never translated
        return (bool(self.node_port) and orig.dport == self.node_port) or (
            destination in self.frontends)


def stale_udp_flows(old: ServicePort | None, new: ServicePort | None) -> list[StaleFlows]:
    """The flows of `old` (a UDP service port) whose endpoint `new` no longer
    has (all of them when the port went)."""
    if old is None or old.protocol is not L4.UDP:
        return []
    flows = []
    for family in FAMILIES:
        kept = set() if new is None else {(ep.ip, ep.port)
                                          for ep in external_endpoints(new, family)}
        ips = [ip for ip in old.external_ips + old.load_balancer_ips if ip.version == family.value]
        frontends = frozenset((ip, old.port) for ip in ips)
        for ep in external_endpoints(old, family):
            if (ep.ip, ep.port) not in kept:
                flows.append(StaleFlows(family, (ep.ip, ep.port), old.node_port, frontends))
    return flows


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
        for family, flows in by_family.items():
            try:
                deleted += self._delete_in(family, flows)
            except (OSError, NetlinkError) as err:
                self._failures.inc()
                log.warning("cannot delete stale UDP conntrack entries; counted in "
                            "kpng_py_dataplane_errors{kind=\"udp-conntrack\"}", extra=fields(
                                family=f"ipv{family.value}", endpoints=len(flows), error=err))
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
