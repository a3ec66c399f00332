"""Node ports, ExternalIPs and load-balancer IPs at the socket, in the kernel
(docs/spec/node-port-behaviours.md, N1-N6, N14): a client in the
test cgroup dials the node's own addresses at node ports. The client netns
is the node: its addresses (10.244.0.1, fd00:244::1, loopback) are the local
addresses, followed by the backend's real LocalAddressFollower entered into
that netns.

Untranslated, a node address is a local address with nothing listening
(TCP: ECONNREFUSED; connected UDP: the send works, the reply is ICMP port
unreachable, ECONNREFUSED at recv), and an ExternalIP or LB IP has no route
(ENETUNREACH). A service without endpoints is refused by the program itself,
at connect() or sendto()."""

from __future__ import annotations

import errno
import logging
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import cleanup
from backends.ebpf.tools.dump import read_dump
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.node.nodeport_addresses import NodePortAddresses
from kpng_py.runtime.logs import record_fields
from kpng_py.state.skips import Skips
from lab.socket_lab import Agent, Lab, unique_bpffs_dir
from tests.support.ebpf import datapath_config, served_by, vips
from tests.support.ebpf_datapath import added, follower_in, removed, service_port, updated
from tests.support.process import wait_until

pytestmark = pytest.mark.kernel

NODE_V4, NODE_V6 = "10.244.0.1", "fd00:244::1"
# (socket family, the node address dialled, family of the endpoints it reaches)
NODE_DIALS = [pytest.param(4, NODE_V4, 4, id="ipv4"),
              pytest.param(6, NODE_V6, 6, id="ipv6"),
              pytest.param(6, f"::ffff:{NODE_V4}", 4, id="v4-mapped"),
              pytest.param(4, "127.0.0.1", 4, id="loopback-ipv4"),  # N3: translated
              pytest.param(6, "::1", 6, id="loopback-ipv6")]
EXTERNAL_IP, LB_IP = "203.0.113.7", "198.51.100.7"  # on no interface of the node


@contextmanager
def node_backend(lab: Lab, addresses: NodePortAddresses = NodePortAddresses()
                 ) -> Iterator[EbpfBackend]:
    """A backend of the lab's node with these --nodeport-addresses, starting
    from an empty full sync (the programs of the module's first one are
    adopted: nothing is compiled again)."""
    metrics = Metrics()
    ebpf = EbpfBackend(datapath_config(lab), metrics, Skips(metrics), addresses,
                       follower=follower_in(lab))
    ebpf.setup()
    try:
        ebpf.apply(ServicePortChanges(full=True))
        yield ebpf
    finally:
        ebpf.close()


@pytest.fixture
def backend(the_lab: Lab) -> Iterator[EbpfBackend]:
    with node_backend(the_lab) as ebpf:
        yield ebpf


def node_addresses(lab: Lab) -> set[str]:
    return set(read_dump(lab.bpffs_dir)["nodeAddresses"])


def tcp_served(agent: Agent, host: str, port: int, family: int) -> str:
    reply = agent.call("tcp", host=host, port=port, family=family)
    assert reply["ok"], reply
    assert reply["peer"] == [host, port]  # getpeername
    return reply["served_by"]


def connected_udp_errno(agent: Agent, host: str, port: int, family: int) -> int:
    """errno of a connected UDP exchange that the programs leave alone: the
    connect works, the reply is port unreachable."""
    sock = agent.call("udp_open", family=family)["sock"]
    assert agent.call("udp_connect", sock=sock, host=host, port=port)["ok"]
    reply = agent.call("udp_send", sock=sock)
    agent.call("udp_close", sock=sock)
    assert not reply["ok"], reply
    return reply["errno"]


@pytest.mark.parametrize("family, host, endpoint_family", NODE_DIALS)
def test_n1_n2_the_node_port_answers_on_node_addresses(
        backend: EbpfBackend, agent: Agent, family: int, host: str, endpoint_family: int) -> None:
    """TCP, connected and unconnected UDP; getpeername and recvfrom show
    nodeIP:nodePort, the address dialled."""
    tcp = service_port("np", vips("20.1"), 80, endpoints=[1, 2], node_port=30080)
    udp = service_port("np", vips("20.1"), 53, endpoints=[1, 2], protocol="UDP",
                       target_port=5353, node_port=30053)
    backend.apply(added(tcp, udp))
    assert tcp_served(agent, host, 30080, family) in served_by([1, 2], endpoint_family)
    sock = agent.call("udp_open", family=family)["sock"]
    reply = agent.call("udp_sendto", sock=sock, host=host, port=30053)
    assert reply["from"] == [host, 30053]  # recvmsg
    assert reply["served_by"] in served_by([1, 2], endpoint_family, 5353)
    connected = agent.call("udp_open", family=family)["sock"]
    assert agent.call("udp_connect", sock=connected, host=host, port=30053)["peer"] == [
        host, 30053]
    reply = agent.call("udp_send", sock=connected)
    assert reply["from"] == [host, 30053]
    assert reply["served_by"] in served_by([1, 2], endpoint_family, 5353)
    for opened in (sock, connected):
        agent.call("udp_close", sock=opened)


def test_n1_the_wildcard_itself_is_not_a_node_address(backend: EbpfBackend,
                                                      agent: Agent) -> None:
    """connect() to 0.0.0.0 or :: reaches the host's loopback: no node port."""
    backend.apply(added(service_port("wild", vips("20.2"), 80, endpoints=[1], node_port=30081)))
    assert tcp_served(agent, NODE_V4, 30081, 4) in served_by([1], 4)
    for host, family in (("0.0.0.0", 4), ("::", 6)):
        assert agent.call("tcp", host=host, port=30081, family=family)["errno"] == (
            errno.ECONNREFUSED)


def test_n1_addresses_outside_nodeport_addresses_are_not_translated(
        the_lab: Lab, agent: Agent) -> None:
    with node_backend(the_lab, NodePortAddresses.parse("fd00:244::/64")) as ebpf:
        assert node_addresses(the_lab) == {NODE_V6}
        ebpf.apply(added(service_port("cidr", vips("20.3"), 80, endpoints=[1], node_port=30082),
                         service_port("cidr", vips("20.3"), 53, endpoints=[1], protocol="UDP",
                                      target_port=5353, node_port=30082)))
        assert tcp_served(agent, NODE_V6, 30082, 6) in served_by([1], 6)
        for host, family in ((NODE_V4, 4), ("127.0.0.1", 4), ("::1", 6)):
            assert agent.call("tcp", host=host, port=30082, family=family)["errno"] == (
                errno.ECONNREFUSED), host
            assert connected_udp_errno(agent, host, 30082, family) == errno.ECONNREFUSED, host
        # The ClusterIP is no node address and answers as ever.
        assert tcp_served(agent, "10.96.20.3", 80, 4) in served_by([1], 4)


@contextmanager
def address_on_lo(lab: Lab, cidr: str) -> Iterator[None]:
    lab.node.ip("addr", "add", cidr, "dev", "lo", *(["nodad"] if ":" in cidr else []))
    try:
        yield
    finally:
        lab.node.ip("addr", "del", cidr, "dev", "lo")


def test_n1_addresses_added_later_answer_and_removed_ones_stop(the_lab: Lab,
                                                               agent: Agent) -> None:
    """The follower's netlink events reach the map, within the CIDRs only."""
    with node_backend(the_lab, NodePortAddresses.parse("10.244.0.0/16,fd00:7::/64")) as ebpf:
        ebpf.apply(added(service_port("later", vips("20.4"), 80, endpoints=[2],
                                      node_port=30083)))
        with address_on_lo(the_lab, "192.0.2.7/32"):  # outside: added first
            with address_on_lo(the_lab, "10.244.7.1/32"), address_on_lo(the_lab,
                                                                         "fd00:7::1/128"):
                wait_until(lambda: {"10.244.7.1", "fd00:7::1"} <= node_addresses(the_lab),
                           "the new addresses in node_addresses")
                assert node_addresses(the_lab) == {NODE_V4, "10.244.7.1", "fd00:7::1"}
                assert tcp_served(agent, "10.244.7.1", 30083, 4) in served_by([2], 4)
                assert tcp_served(agent, "fd00:7::1", 30083, 6) in served_by([2], 6)
                assert agent.call("tcp", host="192.0.2.7", port=30083, family=4)["errno"] == (
                    errno.ECONNREFUSED)
            wait_until(lambda: node_addresses(the_lab) == {NODE_V4},
                       "the removed addresses gone from node_addresses")
        assert agent.call("tcp", host="10.244.7.1", port=30083, family=4)["errno"] == (
            errno.ENETUNREACH)
        assert tcp_served(agent, NODE_V4, 30083, 4) in served_by([2], 4)


def test_n4_tcp_and_udp_on_one_node_port_are_independent(backend: EbpfBackend,
                                                          agent: Agent) -> None:
    tcp = service_port("n4-tcp", vips("20.5"), 80, endpoints=[1], node_port=30084)
    udp = service_port("n4-udp", vips("20.6"), 53, endpoints=[2], protocol="UDP",
                       target_port=5353, node_port=30084)
    backend.apply(added(tcp, udp))
    assert tcp_served(agent, NODE_V4, 30084, 4) == "10.244.0.2:8080"
    assert agent.call("udp_query", host=NODE_V4, port=30084, family=4)["served_by"] == (
        "10.244.0.3:5353")
    backend.apply(removed(udp))
    assert connected_udp_errno(agent, NODE_V4, 30084, 4) == errno.ECONNREFUSED
    assert tcp_served(agent, NODE_V4, 30084, 4) == "10.244.0.2:8080"


def test_n5_a_deleted_node_port_or_one_back_to_cluster_ip_stops_at_once(
        backend: EbpfBackend, agent: Agent) -> None:
    node_port = service_port("n5", vips("20.7"), 80, endpoints=[1], node_port=30085)
    cluster_ip = service_port("n5", vips("20.7"), 80, endpoints=[1])
    backend.apply(added(node_port))
    assert tcp_served(agent, NODE_V6, 30085, 6) in served_by([1], 6)
    backend.apply(updated(node_port, cluster_ip))
    for host, family in ((NODE_V4, 4), (NODE_V6, 6)):
        assert agent.call("tcp", host=host, port=30085, family=family)["errno"] == (
            errno.ECONNREFUSED)
    assert tcp_served(agent, "10.96.20.7", 80, 4) in served_by([1], 4)
    backend.apply(updated(cluster_ip, node_port))
    assert tcp_served(agent, NODE_V4, 30085, 4) in served_by([1], 4)
    backend.apply(removed(node_port))
    assert agent.call("tcp", host=NODE_V4, port=30085, family=4)["errno"] == errno.ECONNREFUSED
    assert agent.call("tcp", host="10.96.20.7", port=80, family=4)["errno"] == (
        errno.ENETUNREACH)


@pytest.mark.parametrize("host, port, family", [
    pytest.param(NODE_V4, 30086, 4, id="node-port"),
    pytest.param(NODE_V6, 30086, 6, id="node-port-ipv6"),
    pytest.param(EXTERNAL_IP, 80, 4, id="external-ip"),
    pytest.param(LB_IP, 80, 4, id="lb-ip")])
def test_n6_no_endpoints_refuses_node_port_external_ip_and_lb_ip(
        backend: EbpfBackend, agent: Agent, host: str, port: int, family: int) -> None:
    backend.apply(added(*(service_port("n6", vips("20.8"), 80, protocol=protocol,
                                       node_port=30086, external_ips=[EXTERNAL_IP],
                                       lb_ips=[LB_IP]) for protocol in ("TCP", "UDP"))))
    assert agent.call("tcp", host=host, port=port, family=family)["errno"] == errno.ECONNREFUSED
    sock = agent.call("udp_open", family=family)["sock"]
    assert agent.call("udp_sendto", sock=sock, host=host, port=port)["errno"] == (
        errno.ECONNREFUSED)  # at once, by the program: untranslated, it would time out
    agent.call("udp_close", sock=sock)


@pytest.mark.parametrize("host", [EXTERNAL_IP, LB_IP])
def test_n14_external_ips_and_lb_ips_off_the_node_translate(
        backend: EbpfBackend, agent: Agent, host: str) -> None:
    backend.apply(added(*(service_port("n14", vips("20.9"), 80, endpoints=[3], protocol=protocol,
                                       target_port=8080 if protocol == "TCP" else 5353,
                                       external_ips=[EXTERNAL_IP], lb_ips=[LB_IP])
                          for protocol in ("TCP", "UDP"))))
    assert tcp_served(agent, host, 80, 4) == "10.244.0.4:8080"
    sock = agent.call("udp_open", family=4)["sock"]
    reply = agent.call("udp_sendto", sock=sock, host=host, port=80)
    agent.call("udp_close", sock=sock)
    assert (reply["from"], reply["served_by"]) == ([host, 80], "10.244.0.4:5353")


def test_the_dump_shows_each_kind_and_the_node_port_addresses(backend: EbpfBackend,
                                                              the_lab: Lab) -> None:
    backend.apply(added(service_port("kinds", ["10.96.20.10"], 80, endpoints=[1],
                                     families=(4,), node_port=30087,
                                     external_ips=[EXTERNAL_IP], lb_ips=[LB_IP])))
    dump = read_dump(the_lab.bpffs_dir)
    assert {(svc["vip"], svc["port"]): svc["kind"] for svc in dump["services"]} == {
        ("10.96.20.10", 80): "ClusterIP", (EXTERNAL_IP, 80): "ExternalIP",
        (LB_IP, 80): "LoadBalancerIP", ("0.0.0.0", 30087): "NodePort"}
    assert dump["nodeAddresses"] == [NODE_V4, "127.0.0.1", "::1", NODE_V6]


def test_node_ports_keep_answering_after_close_and_a_restart_adopts_the_addresses(
        the_lab: Lab, agent: Agent) -> None:
    with node_backend(the_lab) as ebpf:
        ebpf.apply(added(service_port("kept", vips("20.11"), 80, endpoints=[4],
                                      node_port=30088)))
    assert tcp_served(agent, NODE_V4, 30088, 4) in served_by([4], 4)  # no process
    with node_backend(the_lab, NodePortAddresses.parse("fd00::/16")):
        assert node_addresses(the_lab) == {NODE_V6}  # the difference, written at setup


def test_a_node_addresses_map_too_small_is_logged_and_counted_not_raised(
        the_lab: Lab, caplog: pytest.LogCaptureFixture) -> None:
    """Four local addresses, room for two: setup goes on, the error names the
    flag, the map holds what fitted."""
    metrics = Metrics()
    config = replace(datapath_config(the_lab, node_addresses=2), bpffs_dir=unique_bpffs_dir())
    ebpf = EbpfBackend(config, metrics, Skips(metrics), follower=follower_in(the_lab))
    try:
        with caplog.at_level(logging.ERROR):
            ebpf.setup()
        assert [record_fields(r).get("map_size_flag") for r in caplog.records
                if "node-port addresses" in r.getMessage()] == ["--map-size-node-addresses"]
        assert metrics.registry.get_sample_value(
            "kpng_py_dataplane_errors_total", {"kind": "node-addresses"}) == 1
        assert metrics.registry.get_sample_value(
            "kpng_py_map_entries", {"map": "node_addresses"}) == 2
        assert len(read_dump(config.bpffs_dir)["nodeAddresses"]) == 2
    finally:
        ebpf.close()
        cleanup(config.bpffs_dir)
