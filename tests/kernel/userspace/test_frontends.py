"""The userspace backend serves the frontends `to-print` shows, for the same
change sets: the eBPF backend and `to-print` take a service port's frontends
from `ServicePort.frontends()`, and so must the userspace backend, also for a
port listing two ClusterIPs of one family (decode keeps one per family, a
change set may still carry more).

The backend runs in a network namespace of the test's own; what it serves is
read from that namespace (`ss`, `ip addr`), what `to-print` shows from its
JSON lines.
"""

from __future__ import annotations

import io
import ipaddress
import json
from typing import Iterator

import pytest

from backends.userspace.context import DEFAULT_INTERFACE
from kpng_py.dataplane.print_backend import PrintBackend
from kpng_py.model import Protocol, ServicePortChanges
from lab.netns import NetNS, netns
from lab.proxy_node import addresses, node_starter, service_port
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

Served = set[tuple[str, int, str]]  # (ClusterIP, port, protocol)

WEB = service_port("web", Protocol.TCP, ("10.96.0.20", "10.96.0.21", "fd00:10:96::20"), 80,
                   ("10.244.0.5", "fd00:10:244::5"))
WEB_MOVED = service_port("web", Protocol.TCP, ("10.96.0.21", "10.96.0.22", "fd00:10:96::20"),
                         8080, ("10.244.0.5", "fd00:10:244::5"))
DNS = service_port("dns", Protocol.UDP, ("10.96.0.53", "10.96.0.54"), 53, ("10.244.0.6",))
# No IPv6 endpoint: its IPv6 frontend is on the interface, with no listener.
HALF = service_port("half", Protocol.TCP, ("10.96.0.30", "fd00:10:96::30"), 443,
                    ("10.244.0.7",))

STEPS = (
    ServicePortChanges(added=(WEB, DNS, HALF), full=True),
    ServicePortChanges(updated=((WEB, WEB_MOVED),), removed=(DNS,)),
    ServicePortChanges(added=(DNS, HALF), full=True),
)


@pytest.fixture
def ns() -> Iterator[NetNS]:
    require_root()
    with netns() as the_ns:
        yield the_ns


def _printed(line: str) -> tuple[set[str], Served]:
    """From one `to-print` line: the ClusterIPs, and the frontends that have
    endpoints of their family (those a dataplane forwards)."""
    ports = json.loads(line)["servicePorts"]
    cluster_ips = {ip for p in ports for ip in p["clusterIPs"]}
    forwarded = {(ip, p["port"], p["protocol"]) for p in ports for ip in p["clusterIPs"]
                 if any(ep.startswith("[") == (":" in ip) for ep in p["endpoints"])}
    return cluster_ips, forwarded


def _listening(ns: NetNS) -> Served:
    """The TCP listeners and unconnected UDP sockets in `ns`."""
    served: Served = set()
    for protocol, flag in (("TCP", "-t"), ("UDP", "-u")):
        for line in ns.run("ss", "-H", "-l", "-n", flag).stdout.splitlines():
            host, port = line.split()[3].rsplit(":", 1)
            served.add((host.strip("[]"), int(port), protocol))
    return served


def _on_interface(ns: NetNS) -> set[str]:
    ips = {entry.split("/")[0] for entry in addresses(ns, DEFAULT_INTERFACE)}
    return {ip for ip in ips if not ipaddress.ip_address(ip).is_link_local}


def test_the_userspace_backend_serves_the_frontends_to_print_shows(ns):
    printed = io.StringIO()
    to_print = PrintBackend(printed)
    with node_starter(ns) as start:
        node = start()
        for step, changes in enumerate(STEPS):
            to_print.apply(changes)
            node.apply(changes)
            cluster_ips, forwarded = _printed(printed.getvalue().splitlines()[-1])
            assert _on_interface(ns) == cluster_ips, f"step {step}"
            assert _listening(ns) == forwarded, f"step {step}"
    # The steps did hold a second ClusterIP of one family, served both ways.
    assert ("10.96.0.54", 53, "UDP") in forwarded and ("10.96.0.30", 443, "TCP") in forwarded
