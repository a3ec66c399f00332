"""Bad input and bad neighbours: one bad ClusterIP, a refused address, a
taken port or a vanished interface leaves every other service served
(client, node and server namespaces of lab/proxy_node.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kpng_py.model import Protocol, ServicePort, ServicePortChanges
from lab.proxy_node import SERVER_V4, SERVER_V6, SetupRefused, addresses, service_port

pytestmark = pytest.mark.kernel

TCP, UDP = Protocol.TCP, Protocol.UDP
INTERFACE = "kpng-py0"
# What a hostile brain may send as ClusterIPs; decode refuses them all, and
# so does the backend when they get past it.
HOSTILE = (("scoped", ("fd00:10:96::66%c0",)), ("wildcard", ("0.0.0.0", "::")),
           ("loopback", ("127.0.0.5", "::1")), ("metadata", ("169.254.169.254", "fe80::1")),
           ("multicast", ("224.0.0.5", "ff02::5")))
# The node's own address on the client's link.
NODE_ADDRESS = "10.244.0.1"


def _web(name: str, vip4: str, vip6: str, port: int = 80) -> ServicePort:
    return service_port(name, TCP, (vip4, vip6), port, (*SERVER_V4, *SERVER_V6))


def _served_by(client, host: str, port: int, servers: tuple[str, ...]) -> bool:
    results = client("tcp_echo", host=host, port=port, count=30)
    return isinstance(results, list) and {r["endpoint"] for r in results} == set(servers)


def _errors(node, kind: str) -> float:
    return node.counts().get(f"kpng_py_dataplane_errors_total:{kind}", 0)


def _error_lines(node, **match: str) -> list[dict]:
    return [r for r in node.log() if r["level"] == "error"
            and all(r.get(k) == v for k, v in match.items())]


def test_a_hostile_change_set_leaves_lo_alone_and_serves_the_good_services(
        start_node, client, netns_cluster):
    node_ns = netns_cluster.node
    lo, uplink = addresses(node_ns, "lo"), addresses(node_ns, "c0")
    with pytest.raises(SetupRefused, match="loopback"):
        start_node("--interface", "lo")
    node = start_node()
    good = (_web("web", "10.96.1.10", "fd00:10:96::110"),
            service_port("dns", UDP, ("10.96.1.53",), 53, SERVER_V4))
    hostile = tuple(service_port(name, TCP, ips, 8081, SERVER_V4) for name, ips in HOSTILE)
    node.apply(ServicePortChanges(added=good + hostile, full=True))
    # A later change set (incremental, then a resync) applies as well.
    late = _web("late", "10.96.1.20", "fd00:10:96::120")
    node.apply(ServicePortChanges(added=(late,)))
    node.apply(ServicePortChanges(added=good + hostile + (late,), full=True))
    for vip, servers in (("10.96.1.10", SERVER_V4), ("fd00:10:96::110", SERVER_V6),
                         ("10.96.1.20", SERVER_V4), ("fd00:10:96::120", SERVER_V6)):
        assert _served_by(client, vip, 80, servers), vip
    assert client("udp_echo", host="10.96.1.53", port=53, count=3, size=10, connected=True)[0][
        "size"] == 10
    # No listener on a wildcard: the node's own address is not a service.
    assert client("tcp_echo", host=NODE_ADDRESS, port=8081, count=1) == {"error": "ECONNREFUSED"}
    assert addresses(node_ns, "lo") == lo and addresses(node_ns, "c0") == uplink
    held = {a for a in addresses(node_ns, INTERFACE) if not a.startswith("fe80::")}
    assert held == {"10.96.1.10/32", "fd00:10:96::110/128", "10.96.1.53/32",
                    "10.96.1.20/32", "fd00:10:96::120/128"}
    # One count and one line per bad address, not one per change set.
    counts = node.counts()
    refused = sum(len(ips) for _, ips in HOSTILE)
    assert (counts.get("kpng_py_skipped_total:special-ip", 0)
            + counts.get("kpng_py_skipped_total:bad-ip", 0)) == refused
    assert len([r for r in node.log() if r.get("reason") in ("special-ip", "bad-ip")]) == refused


def _set_ipv6(ns, device: str, enabled: bool) -> None:
    ns.run("sysctl", "-qw", f"net.ipv6.conf.{device}.disable_ipv6={int(not enabled)}")


def test_a_cluster_ip_the_kernel_refuses_is_left_out_and_retried(
        start_node, client, netns_cluster):
    """With IPv6 off on the interface the kernel refuses every IPv6 ClusterIP:
    the IPv4 side of the same services is served, later change sets apply,
    and once IPv6 is back the next change set adds and serves it."""
    node = start_node()
    web = _web("web", "10.96.2.10", "fd00:10:96::210")
    dns = service_port("dns", UDP, ("10.96.2.10", "fd00:10:96::210"), 53,
                       (*SERVER_V4, *SERVER_V6))
    _set_ipv6(netns_cluster.node, INTERFACE, False)
    try:
        node.apply(ServicePortChanges(added=(web, dns), full=True))
        assert _served_by(client, "10.96.2.10", 80, SERVER_V4)
        assert "error" in client("tcp_echo", host="fd00:10:96::210", port=80, count=1)
        node.apply(ServicePortChanges(added=(_web("other", "10.96.2.20", "fd00:10:96::220"),)))
        assert _served_by(client, "10.96.2.20", 80, SERVER_V4)
        # Tried again with each change set; logged and counted once per address.
        assert _errors(node, "address") == 2
        assert len(_error_lines(node, cluster_ip="fd00:10:96::210")) == 1
    finally:
        _set_ipv6(netns_cluster.node, INTERFACE, True)
    node.apply(ServicePortChanges(added=(_web("third", "10.96.2.30", "fd00:10:96::230"),)))
    for vip in ("fd00:10:96::210", "fd00:10:96::220", "fd00:10:96::230"):
        assert _served_by(client, vip, 80, SERVER_V6), vip
    assert client("udp_echo", host="fd00:10:96::210", port=53, count=3, size=10,
                  connected=True)[0]["size"] == 10
    assert _errors(node, "address") == 2


_BLOCKER = """
import socket, sys
sock = socket.socket()
sock.setsockopt(socket.IPPROTO_IP, 15, 1)  # IP_FREEBIND
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.listen()
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_port_taken_by_another_process_is_listened_on_once_it_is_free(
        start_node, client, netns_cluster):
    vip = "10.96.3.10"
    blocker = subprocess.Popen(netns_cluster.node.exec_args(
        sys.executable, "-c", _BLOCKER, vip, "80"), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    assert blocker.stdin is not None and blocker.stdout is not None
    try:
        assert blocker.stdout.readline().strip() == "ready"
        node = start_node()
        taken = _web("taken", vip, "fd00:10:96::310")
        node.apply(ServicePortChanges(added=(taken,), full=True))
        assert _served_by(client, "fd00:10:96::310", 80, SERVER_V6)
        node.apply(ServicePortChanges(added=(_web("other", "10.96.3.20", "fd00:10:96::320"),)))
        assert _errors(node, "listen") == 1
        assert len(_error_lines(node, service_port="default/taken:p")) == 1
    finally:
        blocker.stdin.close()
        blocker.wait(timeout=10)
    # The next change set, about another service, retries it.
    node.apply(ServicePortChanges(added=(_web("third", "10.96.3.30", "fd00:10:96::330"),)))
    assert _served_by(client, vip, 80, SERVER_V4)
    assert _errors(node, "listen") == 1


def test_an_interface_deleted_under_the_backend_is_set_up_again(
        start_node, client, netns_cluster):
    node = start_node()
    web = _web("web", "10.96.4.10", "fd00:10:96::410")
    node.apply(ServicePortChanges(added=(web,), full=True))
    netns_cluster.node.ip("link", "del", INTERFACE)
    late = _web("late", "10.96.4.20", "fd00:10:96::420")
    # The interface itself failed: the change set fails (the applier retries
    # with the whole state, as below).
    assert node.send(ServicePortChanges(added=(late,))).startswith("error:")
    node.apply(ServicePortChanges(added=(web, late), full=True))
    for vip, servers in (("10.96.4.10", SERVER_V4), ("fd00:10:96::420", SERVER_V6)):
        assert _served_by(client, vip, 80, servers), vip
