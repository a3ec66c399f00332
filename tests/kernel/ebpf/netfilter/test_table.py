"""The netfilter table in the real kernel: a client outside the node reaches
pods through node ports, ExternalIPs and LB IPs (docs/spec/node-port-behaviours.md,
N1-N18, the ones that concern packets from outside). Real servers in a pod
namespace, real sockets in an "outside" namespace (lab/nodeport_lab.py);
the table is programmed in the node namespace and removed after each test.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import pytest

from backends.ebpf.netfilter.plan import NodePortMatch
from backends.ebpf.netfilter.table import NetfilterError, NetfilterTable
from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import (
    Endpoint,
    Endpoints,
    IPAddress,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
)
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from lab.netns_worker import NetnsWorker
from lab.nodeport_lab import (
    CLIENTS,
    NODE_OUTSIDE,
    NODE_OUTSIDE_2,
    NODE_POD_SIDE,
    PODS,
    Answer,
    Connection,
    NodePortLab,
    ip,
    nodeport_lab,
    tcp_probe,
    udp_probe,
    virtual_ip,
)
from tests.streams import build
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

NODE_PORT = 30080
FAMILIES = (4, 6)
# Long enough for an answer in a loaded lab; what a dropped packet waits.
DROP_WAIT = 1.0


class Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


@pytest.fixture(scope="module")
def the_lab() -> Iterator[NodePortLab]:
    require_root()
    with nodeport_lab() as made:
        yield made


class OnNode:
    """A NetfilterTable in the lab's node namespace: every call runs there."""

    def __init__(self, lab: NodePortLab, addresses: NodePortMatch) -> None:
        self.lab = lab
        self.failures = Count()
        self.metrics = Metrics()
        self.table: NetfilterTable = lab.on_node.call(
            NetfilterTable, addresses, Skips(self.metrics), self.failures)

    def apply(self, **changes) -> None:
        self.lab.on_node.call(self.table.apply, ServicePortChanges(**changes))

    def full(self, *ports: ServicePort) -> None:
        self.apply(added=ports, full=True)

    def skipped(self) -> dict[str, float]:
        """kpng_py_skipped_total by reason."""
        return {s.labels["reason"]: s.value for family in self.metrics.registry.collect()
                if family.name == "kpng_py_skipped" for s in family.samples
                if s.name == "kpng_py_skipped_total"}

    def call(self, method: str, *args: object):
        return self.lab.on_node.call(getattr(self.table, method), *args)


@pytest.fixture
def node(the_lab: NodePortLab) -> Iterator[OnNode]:
    on_node = OnNode(the_lab, NodePortMatch.every_local())
    yield on_node
    on_node.call("cleanup")
    assert on_node.call("describe") == [], "the table is still there after cleanup"


def service(name: str = "web", protocol: Protocol = Protocol.TCP, port: int = 80,
            endpoints: tuple[Endpoint, ...] = (), **fields) -> ServicePort:
    return ServicePort(ServicePortName("default", name, "p", protocol), "LoadBalancer",
                       (ip("10.96.0.10"), ip("fd96::10")), port, node_port=NODE_PORT,
                       node_port_families=(IPFamily.V4, IPFamily.V6),
                       endpoints=Endpoints.of(endpoints), **fields)


def tcp_and_udp(**fields) -> tuple[ServicePort, ServicePort]:
    """One service port per protocol, alike otherwise."""
    return (service("t", Protocol.TCP, **fields), service("u", Protocol.UDP, **fields))


def pods(family: int, target_port: int = 8080, count: int = 2, local: bool = True
         ) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(a, target_port, local=local) for a in PODS[family][:count])


def both_families(count: int = 2, target_port: int = 8080) -> tuple[Endpoint, ...]:
    return pods(4, target_port, count) + pods(6, target_port, count)


def outside(lab: NodePortLab, probe, *args, **kwargs) -> Answer:
    return lab.outside.call(lambda: probe(*args, **kwargs))


def served_ip(answer: Answer) -> IPAddress:
    assert not answer.error, f"expected an answer, got {answer.error}"
    return ip(answer.served.rsplit(":", 1)[0].strip("[]"))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("probe", [tcp_probe, udp_probe], ids=["tcp", "udp"])
def test_n1_a_node_port_on_the_node_address_reaches_a_pod(node: OnNode, family: int,
                                                          probe) -> None:
    protocol = Protocol.TCP if probe is tcp_probe else Protocol.UDP
    node.full(service(protocol=protocol, endpoints=both_families(1)))
    answer = outside(node.lab, probe, NODE_OUTSIDE[family], NODE_PORT)
    assert served_ip(answer) == PODS[family][0]


@pytest.mark.parametrize("family", FAMILIES)
def test_n1_only_the_allowed_node_addresses_answer_and_they_follow_changes(
        the_lab: NodePortLab, family: int) -> None:
    node = OnNode(the_lab, NodePortMatch.only([NODE_OUTSIDE[4], NODE_OUTSIDE[6]]))
    try:
        node.full(service(endpoints=both_families(1)))
        assert served_ip(outside(the_lab, tcp_probe, NODE_OUTSIDE[family], NODE_PORT))
        refused = outside(the_lab, tcp_probe, NODE_OUTSIDE_2[family], NODE_PORT)
        assert refused.error == "ECONNREFUSED"
        node.call("set_node_addresses", [NODE_OUTSIDE_2[4], NODE_OUTSIDE_2[6]])
        assert served_ip(outside(the_lab, tcp_probe, NODE_OUTSIDE_2[family], NODE_PORT))
        assert outside(the_lab, tcp_probe, NODE_OUTSIDE[family], NODE_PORT).error == "ECONNREFUSED"
    finally:
        node.call("cleanup")


def test_n4_tcp_and_udp_on_one_node_port_are_separate_services(node: OnNode) -> None:
    node.full(service("t", Protocol.TCP, endpoints=pods(4, 8080, 1)),
              service("u", Protocol.UDP, endpoints=(Endpoint(PODS[4][1], 5353),)))
    assert outside(node.lab, tcp_probe, NODE_OUTSIDE[4], NODE_PORT).served == f"{PODS[4][0]}:8080"
    assert outside(node.lab, udp_probe, NODE_OUTSIDE[4], NODE_PORT).served == f"{PODS[4][1]}:5353"


def test_n5_a_removed_service_stops_at_once(node: OnNode) -> None:
    web = service(endpoints=both_families(1), external_ips=(virtual_ip(7),))
    node.full(web)
    assert served_ip(outside(node.lab, tcp_probe, virtual_ip(7), 80))
    node.apply(removed=(web,))
    assert outside(node.lab, tcp_probe, NODE_OUTSIDE[4], NODE_PORT).error == "ECONNREFUSED"
    # Not translated any more: the node's route for the VIP range is `prohibit`.
    assert outside(node.lab, tcp_probe, virtual_ip(7), 80).error in ("EHOSTUNREACH", "EACCES")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("probe", [tcp_probe, udp_probe], ids=["tcp", "udp"])
def test_n6_without_endpoints_node_port_external_ip_and_lb_ip_refuse(
        node: OnNode, family: int, probe) -> None:
    protocol = Protocol.TCP if probe is tcp_probe else Protocol.UDP
    node.full(service(protocol=protocol, external_ips=(virtual_ip(7, family),),
                      load_balancer_ips=(virtual_ip(8, family),)))
    for target, port in ((NODE_OUTSIDE[family], NODE_PORT), (virtual_ip(7, family), 80),
                         (virtual_ip(8, family), 80)):
        assert outside(node.lab, probe, target, port).error == "ECONNREFUSED", target


@pytest.mark.parametrize("family", FAMILIES)
def test_n7_etp_local_keeps_the_client_address(node: OnNode, family: int) -> None:
    node.full(service(endpoints=both_families(1), external_traffic_local=True))
    client = CLIENTS[family][0]
    answer = outside(node.lab, tcp_probe, NODE_OUTSIDE[family], NODE_PORT, src=client)
    assert answer.peer_ip == client


@pytest.mark.parametrize("family", FAMILIES)
def test_n8_etp_local_without_a_local_endpoint_drops(node: OnNode, family: int) -> None:
    # Endpoints elsewhere (not local, so not in the External scope for eTP=Local).
    elsewhere = tuple(Endpoint(ip("10.244.2.2" if f == 4 else "fd00:244:2::2"), 8080,
                               local=False, external=False) for f in FAMILIES)
    node.full(service(endpoints=elsewhere, external_traffic_local=True,
                      load_balancer_ips=(virtual_ip(8, family),)))
    for target, port in ((NODE_OUTSIDE[family], NODE_PORT), (virtual_ip(8, family), 80)):
        answer = outside(node.lab, tcp_probe, target, port, timeout=DROP_WAIT)
        assert answer.error == "timeout", target


@pytest.mark.parametrize("family", FAMILIES)
def test_n10_etp_cluster_is_masqueraded_to_the_node(node: OnNode, family: int) -> None:
    node.full(*tcp_and_udp(endpoints=both_families(1)))
    for probe in (tcp_probe, udp_probe):
        answer = outside(node.lab, probe, NODE_OUTSIDE[family], NODE_PORT)
        assert answer.peer_ip == NODE_POD_SIDE[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_n13_source_ranges_filter_the_lb_ip_only(node: OnNode, family: int) -> None:
    allowed, other = CLIENTS[family]
    prefix = 32 if family == 4 else 128
    node.full(service(endpoints=both_families(1), load_balancer_ips=(virtual_ip(8, family),),
                      external_ips=(virtual_ip(7, family),),
                      load_balancer_source_ranges=(f"{allowed}/{prefix}",)))
    lb = virtual_ip(8, family)
    assert served_ip(outside(node.lab, tcp_probe, lb, 80, src=allowed))
    assert outside(node.lab, tcp_probe, lb, 80, src=other, timeout=DROP_WAIT).error == "timeout"
    assert served_ip(outside(node.lab, tcp_probe, NODE_OUTSIDE[family], NODE_PORT, src=other))
    assert served_ip(outside(node.lab, tcp_probe, virtual_ip(7, family), 80, src=other))


@pytest.mark.parametrize("family", FAMILIES)
def test_n14_external_ips_not_on_the_node_reach_a_pod(node: OnNode, family: int) -> None:
    node.full(*tcp_and_udp(endpoints=both_families(1), external_ips=(virtual_ip(7, family),)))
    for probe in (tcp_probe, udp_probe):
        assert served_ip(outside(node.lab, probe, virtual_ip(7, family), 80)) == PODS[family][0]


def test_n16_a_pod_reaching_itself_through_the_node_port_is_masqueraded(node: OnNode) -> None:
    # eTP=Local: only the hairpin rule masquerades.
    node.full(service(endpoints=pods(4, count=1), external_traffic_local=True))
    in_pod = NetnsWorker(node.lab.pod_netns)
    try:
        answer = in_pod.call(tcp_probe, NODE_POD_SIDE[4], NODE_PORT, PODS[4][0])
    finally:
        in_pod.close()
    assert served_ip(answer) == PODS[4][0]
    assert answer.peer_ip == NODE_POD_SIDE[4]


def spread(node: OnNode, family: int, tries: int = 24) -> set[IPAddress]:
    return {served_ip(outside(node.lab, tcp_probe, NODE_OUTSIDE[family], NODE_PORT))
            for _ in range(tries)}


@pytest.mark.parametrize("family", FAMILIES)
def test_n15_client_ip_affinity_holds_and_can_be_switched_off(node: OnNode, family: int
                                                               ) -> None:
    without = service(endpoints=both_families(2))
    node.full(without)
    # 24 random picks of two endpoints are all alike with odds 2^-23.
    assert spread(node, family) == set(PODS[family])
    sticky = dataclasses.replace(without, affinity_timeout_seconds=60)
    node.apply(updated=((without, sticky),))
    assert len(spread(node, family)) == 1
    node.apply(updated=((sticky, without),))
    assert spread(node, family) == set(PODS[family])


@pytest.mark.parametrize("family", FAMILIES)
def test_n17_a_udp_client_with_a_fixed_port_reaches_a_new_endpoint(node: OnNode, family: int
                                                                    ) -> None:
    first, second = PODS[family]
    old = service(protocol=Protocol.UDP, endpoints=pods(family, count=1))
    node.full(old)
    client = CLIENTS[family][0]
    assert served_ip(outside(node.lab, udp_probe, NODE_OUTSIDE[family], NODE_PORT,
                             src=client, sport=40000)) == first
    new = dataclasses.replace(old, endpoints=Endpoints.of([Endpoint(second, 8080, local=True)]))
    node.apply(updated=((old, new),))
    # The first pod still serves: only the deleted conntrack entry sends the
    # client's next datagram to the second.
    assert served_ip(outside(node.lab, udp_probe, NODE_OUTSIDE[family], NODE_PORT,
                             src=client, sport=40000)) == second
    assert node.table.stale_udp_deleted >= 1
    assert node.failures.value == 0


def test_n18_a_restarted_table_keeps_connections_and_accepts_new_ones(node: OnNode) -> None:
    web = service(endpoints=both_families(1))
    node.full(web)
    connection = node.lab.outside.call(Connection, NODE_OUTSIDE[4], NODE_PORT)
    try:
        restarted = OnNode(node.lab, NodePortMatch.every_local())
        assert restarted.call("adopt") is True
        assert served_ip(outside(node.lab, tcp_probe, NODE_OUTSIDE[4], NODE_PORT))
        restarted.full(web)
        assert node.lab.outside.call(connection.echo, "still there") == "still there"
        assert served_ip(outside(node.lab, tcp_probe, NODE_OUTSIDE[4], NODE_PORT))
    finally:
        node.lab.outside.call(connection.close)


def test_describe_lists_the_table_and_an_update_keeps_unchanged_objects(node: OnNode) -> None:
    web = service(endpoints=both_families(1), external_ips=(virtual_ip(7),))
    node.full(web)
    handles_before = _chain_names(node)
    grown = dataclasses.replace(web, endpoints=Endpoints.of(both_families(2)))
    node.apply(updated=((web, grown),))
    after = _chain_names(node)
    assert handles_before < after
    assert {name for name in after - handles_before} == {
        f"ep4-default/web/p/tcp/{PODS[4][1]}/8080",
        f"ep6-default/web/p/tcp/{str(PODS[6][1]).replace(':', '.')}/8080"}


def _chain_names(node: OnNode) -> set[str]:
    return {obj["chain"]["name"] for obj in node.call("describe") if "chain" in obj}


def test_cleanup_removes_the_table_and_a_namespace_without_one_is_left_alone(
        the_lab: NodePortLab) -> None:
    node = OnNode(the_lab, NodePortMatch.every_local())
    assert node.call("adopt") is False
    node.full(service(endpoints=both_families(1)))
    assert node.call("cleanup") is True
    assert node.call("describe") == []
    assert node.call("cleanup") is False
    assert outside(the_lab, tcp_probe, NODE_OUTSIDE[4], NODE_PORT).error == "ECONNREFUSED"


def test_a_first_change_set_that_is_not_full_is_refused_with_the_fix(
        the_lab: NodePortLab) -> None:
    node = OnNode(the_lab, NodePortMatch.every_local())
    with pytest.raises(NetfilterError, match="must be a full one"):
        node.apply(added=(service(endpoints=both_families(1)),))
    assert node.call("describe") == []


def test_describe_lines_name_each_frontend_and_where_it_goes(node: OnNode) -> None:
    elsewhere = Endpoint(ip("10.244.2.2"), 80, local=False, external=False)
    node.full(service(endpoints=pods(4, count=1), external_ips=(virtual_ip(7),)),
              dataclasses.replace(service("away", external_traffic_local=True,
                                          endpoints=(elsewhere,)), node_port=NODE_PORT + 1))
    # Both are dual-stack without IPv6 endpoints: IPv6 is refused.
    assert sorted(node.call("describe_lines")) == [
        "no-endpoint-nodeports4: tcp . 30081 -> drop",
        "no-endpoint-nodeports6: tcp . 30080 -> goto reject-chain",
        "no-endpoint-nodeports6: tcp . 30081 -> goto reject-chain",
        f"service-ips4: {virtual_ip(7)} . tcp . 80 -> goto svc4-default/web/p/tcp",
        "service-nodeports4: tcp . 30080 -> goto svc4-default/web/p/tcp",
    ]


def test_a_service_name_nft_would_not_parse_is_programmed_under_a_hashed_name(
        node: OnNode) -> None:
    hostile = dataclasses.replace(service(endpoints=both_families(1)), name=ServicePortName(
        "default", 'x" } ; flush ruleset ; {' + "y" * 300, "p", Protocol.TCP))
    node.full(hostile)
    assert served_ip(outside(node.lab, tcp_probe, NODE_OUTSIDE[4], NODE_PORT)) == PODS[4][0]


def test_the_longest_readable_names_fit_nft(node: OnNode) -> None:
    longest = dataclasses.replace(
        service(endpoints=(Endpoint(ip("fd00:244:1:0:ffff:ffff:ffff:ffff"), 65535),),
                affinity_timeout_seconds=86400),
        name=ServicePortName("n" * 63, "s" * 63, "p" * 15, Protocol.TCP))
    node.full(longest)
    assert any(obj["set"]["name"].startswith("aff6-86400s-" + "n" * 63)
               for obj in node.call("describe") if "set" in obj)


def test_an_external_ip_two_services_claim_goes_to_the_second_when_the_first_goes(
        node: OnNode) -> None:
    """Through the state model, which gives the frontend to the first
    claimant and hands it over in the Sync that lets it go: the table never
    holds the key twice (nftables would refuse the whole transaction)."""
    state = NodeState(Skips(node.metrics))

    def claimant(name: str, pod: IPAddress) -> list[L.OpItem]:
        svc = build.service(name, v4=["10.96.0.30" if name == "first" else "10.96.0.31"],
                            ports=[build.port("p", 80, target=8080)])
        svc.IPs.ExternalIPs.V4.append(str(virtual_ip(7)))
        return [build.set_service(svc), build.set_endpoint(
            "default", name, "a", build.endpoint([str(pod)], local=True))]

    node.call("apply", state.apply([build.reset(), *claimant("first", PODS[4][0]),
                                    *claimant("second", PODS[4][1]), build.sync()]))
    assert served_ip(outside(node.lab, tcp_probe, virtual_ip(7), 80)) == PODS[4][0]
    assert node.skipped() == {"frontend-conflict": 1.0}
    node.call("apply", state.apply([build.delete(L.ServicesSet, "default/first"), build.sync()]))
    assert served_ip(outside(node.lab, tcp_probe, virtual_ip(7), 80)) == PODS[4][1]


@pytest.mark.parametrize("family", FAMILIES)
def test_n17_a_udp_client_refused_before_the_service_existed_reaches_it_after(
        node: OnNode, family: int) -> None:
    node.full()
    client = CLIENTS[family][0]
    # Delivered to the node, refused, and confirmed in conntrack untranslated.
    assert outside(node.lab, udp_probe, NODE_OUTSIDE[family], NODE_PORT, src=client,
                   sport=40001).error == "ECONNREFUSED"
    node.apply(added=(service(protocol=Protocol.UDP, endpoints=pods(family, count=1)),))
    assert served_ip(outside(node.lab, udp_probe, NODE_OUTSIDE[family], NODE_PORT,
                             src=client, sport=40001)) == PODS[family][0]
