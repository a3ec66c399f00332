"""The socket load balancer in the kernel, with real sockets: a client process
in the test cgroup (client netns, no route out) dials ClusterIPs; real
servers in the pods netns say who served it. An untranslated VIP fails with
ENETUNREACH there, so a silent escape cannot pass for success."""

from __future__ import annotations

import errno
import threading
import time
from itertools import cycle

import pytest

from backends.ebpf.backend import EbpfBackend
from kpng_py.api import localv1
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePort
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from lab.socket_lab import BACKEND_COUNT, Agent, backend_ip, target
from tests.support.ebpf import served_by, vips
from tests.support.ebpf_datapath import added, brain_ops, removed, service_port, updated
from tests.support.state import apply_synced

pytestmark = pytest.mark.kernel

ALL = list(range(1, BACKEND_COUNT + 1))
# (socket family, how the client writes the VIP, family of the endpoints it must reach)
DIALS = [pytest.param(4, "10.96.{}", 4, id="ipv4"),
         pytest.param(6, "fd00:96::{}", 6, id="ipv6"),
         pytest.param(6, "::ffff:10.96.{}", 4, id="v4-mapped")]


def dialed(template: str, net: str) -> str:
    return template.format(net if "10.96" in template else net.replace(".", ":"))


@pytest.mark.parametrize("family, template, endpoint_family", DIALS)
def test_tcp_reaches_an_endpoint_and_getpeername_shows_the_vip(
        backend: EbpfBackend, agent: Agent, family: int, template: str,
        endpoint_family: int) -> None:
    svc = service_port(f"tcp-{template}", vips(f"1.{family}{endpoint_family}"), 80,
                       endpoints=[1, 2])
    backend.apply(added(svc))
    host = dialed(template, f"1.{family}{endpoint_family}")
    reply = agent.call("tcp", host=host, port=80, family=family)
    assert reply["ok"], reply
    assert reply["peer"] == [host, 80]
    assert reply["served_by"] in served_by([1, 2], endpoint_family)


@pytest.mark.parametrize("family, template, endpoint_family", DIALS)
def test_unconnected_udp_replies_come_from_the_vip(
        backend: EbpfBackend, agent: Agent, family: int, template: str,
        endpoint_family: int) -> None:
    net = f"2.{family}{endpoint_family}"
    backend.apply(added(service_port(f"udp-{net}", vips(net), 53, endpoints=[1, 2], protocol="UDP",
                                     target_port=5353)))
    host = dialed(template, net)
    sock = agent.call("udp_open", family=family)["sock"]
    reply = agent.call("udp_sendto", sock=sock, host=host, port=53, payload="q" * 2000)
    assert reply["ok"], reply
    assert reply["from"] == [host, 53]  # recvmsg hook
    assert reply["served_by"] in served_by([1, 2], endpoint_family, 5353)
    assert reply["size"] == 2000


@pytest.mark.parametrize("family, template, endpoint_family", DIALS)
def test_connected_udp_shows_the_vip(backend: EbpfBackend, agent: Agent, family: int,
                                     template: str, endpoint_family: int) -> None:
    net = f"3.{family}{endpoint_family}"
    backend.apply(added(service_port(f"cudp-{net}", vips(net), 53, endpoints=[1], protocol="UDP",
                                     target_port=5353)))
    host = dialed(template, net)
    sock = agent.call("udp_open", family=family)["sock"]
    assert agent.call("udp_connect", sock=sock, host=host, port=53)["peer"] == [host, 53]
    reply = agent.call("udp_send", sock=sock)
    assert reply["from"] == [host, 53]
    assert reply["served_by"] in served_by([1], endpoint_family, 5353)


def test_new_connections_spread_and_a_udp_socket_sticks(backend: EbpfBackend,
                                                        agent: Agent) -> None:
    backend.apply(added(service_port("spread", vips("4.1"), 80, endpoints=ALL),
                        service_port("spread", vips("4.1"), 80, endpoints=ALL, protocol="UDP",
                                     target_port=5353)))
    tcp = {agent.call("tcp", host="10.96.4.1", port=80, family=4)["served_by"]
           for _ in range(100)}
    assert tcp == served_by(ALL, 4)
    udp_endpoints = set()
    for _ in range(24):
        sock = agent.call("udp_open", family=4)["sock"]
        seen = {agent.call("udp_sendto", sock=sock, host="10.96.4.1", port=80)["served_by"]
                for _ in range(3)}
        assert len(seen) == 1, "one unconnected socket talks to one endpoint"
        udp_endpoints |= seen
        agent.call("udp_close", sock=sock)
    assert len(udp_endpoints) >= 3


def test_udp_sockets_spread_when_other_sockets_come_between(backend: EbpfBackend,
                                                          agent: Agent) -> None:
    """A client that makes a TCP connection before each DNS query: socket
    cookies count up, so its UDP sockets only ever get every other cookie."""
    backend.apply(added(service_port("alternate", vips("4.2"), 80, endpoints=ALL, protocol="UDP",
                                     target_port=5353)))
    udp = set()
    for _ in range(24):
        agent.call("tcp", host=str(backend_ip(1)), port=8080, family=4)
        udp.add(agent.call("udp_query", host="10.96.4.2", port=80, family=4)["served_by"])
    assert len(udp) >= 3, udp


def test_named_target_ports_resolve_per_endpoint(backend: EbpfBackend, agent: Agent) -> None:
    """Through the state model, as the brain sends it: targetPort "web" is
    8080 on one endpoint and 9090 on the other."""
    service = localv1.Service(
        Namespace="default", Name="named", Type="ClusterIP",
        IPs=localv1.ServiceIPs(ClusterIPs=localv1.IPSet(V4=["10.96.5.1"])),
        Ports=[localv1.PortMapping(Name="http", Protocol=localv1.TCP, Port=80,
                                   TargetPortName="web")])
    endpoints = [localv1.Endpoint(IPs=localv1.IPSet(V4=[str(backend_ip(i))]), Local=True,
                                  PortOverrides=[localv1.PortName(Name="web", Port=port)])
                 for i, port in ((1, 8080), (2, 9090))]
    backend.apply(apply_synced(NodeState(Skips(Metrics())), brain_ops(service, endpoints)))
    seen = {agent.call("tcp", host="10.96.5.1", port=80, family=4)["served_by"]
            for _ in range(40)}
    assert seen == {"10.244.0.2:8080", "10.244.0.3:9090"}


def test_tcp_and_udp_on_one_port_are_independent(backend: EbpfBackend, agent: Agent) -> None:
    tcp = service_port("both", vips("6.1"), 53, endpoints=[1])
    udp = service_port("both", vips("6.1"), 53, endpoints=[2], protocol="UDP", target_port=5353)
    backend.apply(added(tcp, udp))
    sock = agent.call("udp_open", family=4)["sock"]
    assert agent.call("tcp", host="10.96.6.1", port=53, family=4)["served_by"] == (
        "10.244.0.2:8080")
    assert agent.call("udp_sendto", sock=sock, host="10.96.6.1", port=53)["served_by"] == (
        "10.244.0.3:5353")
    backend.apply(removed(udp))
    assert agent.call("udp_sendto", sock=sock, host="10.96.6.1", port=53)["errno"] == (
        errno.ENETUNREACH)
    assert agent.call("tcp", host="10.96.6.1", port=53, family=4)["served_by"] == (
        "10.244.0.2:8080")


def test_ports_and_services_come_and_go(backend: EbpfBackend, agent: Agent) -> None:
    http = service_port("multi", vips("7.1"), 80, endpoints=[1], port_name="http")
    admin = service_port("multi", vips("7.1"), 9090, endpoints=[1], port_name="admin",
                         target_port=9090)
    backend.apply(added(http))
    assert agent.call("tcp", host="10.96.7.1", port=9090, family=4)["errno"] == errno.ENETUNREACH
    backend.apply(added(admin))
    assert agent.call("tcp", host="10.96.7.1", port=9090, family=4)["served_by"] == (
        "10.244.0.2:9090")
    backend.apply(removed(admin))
    assert agent.call("tcp", host="10.96.7.1", port=9090, family=4)["errno"] == errno.ENETUNREACH
    assert agent.call("tcp", host="10.96.7.1", port=80, family=4)["ok"]
    backend.apply(removed(http))
    assert agent.call("tcp", host="10.96.7.1", port=80, family=4)["errno"] == errno.ENETUNREACH
    backend.apply(added(http))  # re-created
    assert agent.call("tcp", host="10.96.7.1", port=80, family=4)["ok"]


@pytest.mark.parametrize("family, template, endpoint_family", DIALS)
def test_no_endpoints_is_refused_at_once(backend: EbpfBackend, agent: Agent, family: int,
                                         template: str, endpoint_family: int) -> None:
    net = f"8.{family}{endpoint_family}"
    tcp = service_port(f"empty-{net}", vips(net), 80)
    udp = service_port(f"empty-{net}", vips(net), 53, protocol="UDP", target_port=5353)
    backend.apply(added(tcp, udp))
    host = dialed(template, net)
    assert agent.call("tcp", host=host, port=80, family=family)["errno"] == errno.ECONNREFUSED
    sock = agent.call("udp_open", family=family)["sock"]
    assert agent.call("udp_sendto", sock=sock, host=host, port=53)["errno"] == (
        errno.ECONNREFUSED)
    assert agent.call("udp_connect", sock=sock, host=host, port=53)["errno"] == (
        errno.ECONNREFUSED)
    backend.apply(updated(tcp, service_port(f"empty-{net}", vips(net), 80, endpoints=[3])))
    assert agent.call("tcp", host=host, port=80, family=family)["served_by"] in served_by(
        [3], endpoint_family)


def test_internal_traffic_policy_local_uses_local_endpoints_only(backend: EbpfBackend,
                                                                 agent: Agent) -> None:
    local = service_port("itp", vips("9.1"), 80, endpoints=ALL, local_only=[2])
    backend.apply(added(local))
    seen = {agent.call("tcp", host="10.96.9.1", port=80, family=4)["served_by"]
            for _ in range(20)}
    assert seen == {"10.244.0.3:8080"}
    none_here = service_port("itp", vips("9.1"), 80, endpoints=ALL, local_only=[])
    backend.apply(updated(local, none_here))
    assert agent.call("tcp", host="10.96.9.1", port=80, family=4)["errno"] == errno.ECONNREFUSED


def _sticky(agent: Agent, host: str, family: int, times: int) -> str:
    seen = {agent.call("tcp", host=host, port=80, family=family)["served_by"]
            for _ in range(times)}
    assert len(seen) == 1, f"{host} spread over {seen} despite session affinity"
    return seen.pop()


def test_session_affinity_holds_until_the_client_is_idle_for_the_timeout(
        backend: EbpfBackend, agent: Agent) -> None:
    hosts = [f"10.96.10.{i}" for i in range(1, 9)]
    backend.apply(added(*(service_port(f"aff-{i}", [host], 80, endpoints=ALL, affinity=1,
                                       families=(4,)) for i, host in enumerate(hosts))))
    first = {host: _sticky(agent, host, 4, 8) for host in hosts}
    for _ in range(3):  # each use restarts the idle clock: 1.8 s in all
        time.sleep(0.6)
        assert {host: _sticky(agent, host, 4, 1) for host in hosts} == first
    time.sleep(1.3)
    after = {host: _sticky(agent, host, 4, 8) for host in hosts}
    # Each service picks anew (1 in 4 to pick the same): some must differ.
    assert after != first


def test_session_affinity_to_a_removed_endpoint_is_dropped(backend: EbpfBackend,
                                                           agent: Agent) -> None:
    svc = service_port("aff-gone", ["10.96.11.1"], 80, endpoints=ALL, affinity=600,
                       families=(4,))
    backend.apply(added(svc))
    first = _sticky(agent, "10.96.11.1", 4, 4)
    first_index = next(i for i in ALL if served_by([i], 4) == {first})
    without = service_port("aff-gone", ["10.96.11.1"], 80, affinity=600, families=(4,),
                           endpoints=[i for i in ALL if i != first_index])
    backend.apply(updated(svc, without))
    second = _sticky(agent, "10.96.11.1", 4, 6)
    assert second != first
    backend.apply(updated(without, svc))
    assert _sticky(agent, "10.96.11.1", 4, 4) == second


def test_session_affinity_is_shared_by_the_frontends_of_a_service_port(
        backend: EbpfBackend, agent: Agent) -> None:
    """kube-proxy keeps one affinity per service port: a client sent to an
    endpoint through the ClusterIP stays with it through the ExternalIP and
    the LB IP (N15), in each family; a port of another service does not
    share it."""
    external = {4: "203.0.113.13", 6: "2001:db8::13"}
    lb = {4: "203.0.113.14", 6: "2001:db8::14"}
    sticky = service_port("aff-shared", vips("13.1"), 80, endpoints=ALL, affinity=600,
                          external_ips=list(external.values()), lb_ips=list(lb.values()))
    backend.apply(added(sticky))
    for family, cluster_ip in zip((4, 6), vips("13.1")):
        first = _sticky(agent, cluster_ip, family, 6)
        assert _sticky(agent, external[family], family, 6) == first
        assert _sticky(agent, lb[family], family, 6) == first
    # A service of its own keeps an affinity of its own: over services
    # created one after the other, each client's first pick spreads.
    others = [service_port(f"aff-other-{i}", [f"10.96.13.{10 + i}"], 80, endpoints=ALL,
                           affinity=600, families=(4,)) for i in range(8)]
    backend.apply(added(*others))
    picks = {_sticky(agent, f"10.96.13.{10 + i}", 4, 2) for i in range(8)}
    assert len(picks) > 1, f"8 services with affinity all sent the client to {picks}"


def test_an_unconnected_udp_socket_moves_off_a_deleted_endpoint(backend: EbpfBackend,
                                                                agent: Agent) -> None:
    svc = service_port("udp-move", ["10.96.12.1"], 53, endpoints=[1, 2], protocol="UDP",
                       target_port=5353, families=(4,))
    backend.apply(added(svc))
    sock = agent.call("udp_open", family=4)["sock"]
    first = agent.call("udp_sendto", sock=sock, host="10.96.12.1", port=53)["served_by"]
    remaining = [i for i in (1, 2) if served_by([i], 4, 5353) != {first}]
    backend.apply(updated(svc, service_port("udp-move", ["10.96.12.1"], 53, endpoints=remaining,
                                            protocol="UDP", target_port=5353, families=(4,))))
    reply = agent.call("udp_sendto", sock=sock, host="10.96.12.1", port=53)
    assert reply["served_by"] in served_by(remaining, 4, 5353)
    assert reply["from"] == ["10.96.12.1", 53]


@pytest.mark.parametrize("family, template, endpoint_family", DIALS)
def test_connected_udp_sockets_of_a_deleted_endpoint_are_terminated(
        backend: EbpfBackend, agent: Agent, family: int, template: str,
        endpoint_family: int) -> None:
    """S9: the stale socket fails once and reconnects to a live endpoint; a
    socket that reached the same endpoint through another service (S14) and
    one that dialed the pod IP itself are left alone."""
    net, other_net = f"13.{family}{endpoint_family}", f"13.1{family}{endpoint_family}"

    def udp(name: str, where: str, endpoints: list[int]) -> ServicePort:
        return service_port(name, vips(where), 53, endpoints=endpoints, protocol="UDP",
                            target_port=5353)

    leaving, sharing = udp(f"s9-{net}", net, [1]), udp(f"s9-other-{net}", other_net, [1])
    backend.apply(added(leaving, sharing))
    host, other_host = dialed(template, net), dialed(template, other_net)
    pod = str(backend_ip(1, endpoint_family))
    pod_host = pod if family == endpoint_family else f"::ffff:{pod}"
    stale, other, direct = (agent.call("udp_open", family=family)["sock"] for _ in range(3))
    agent.call("udp_connect", sock=stale, host=host, port=53)
    agent.call("udp_connect", sock=other, host=other_host, port=53)
    agent.call("udp_connect", sock=direct, host=pod_host, port=5353)
    first = served_by([1], endpoint_family, 5353)
    for sock in (stale, other, direct):
        assert agent.call("udp_send", sock=sock)["served_by"] in first

    backend.apply(updated(leaving, udp(f"s9-{net}", net, [2])))
    # The destroyed socket is disconnected: send() says EDESTADDRREQ; a
    # receiver would have been woken with ECONNABORTED, which the next
    # exchange after reconnecting still reports once.
    failures = []
    for _ in range(3):
        reply = agent.call("udp_send", sock=stale)
        if reply["ok"]:
            break
        failures.append(reply["errno"])
        agent.call("udp_connect", sock=stale, host=host, port=53)
    assert failures[0] == errno.EDESTADDRREQ
    assert set(failures[1:]) <= {errno.ECONNABORTED}
    assert reply["served_by"] in served_by([2], endpoint_family, 5353)
    assert agent.call("udp_send", sock=other)["served_by"] in first
    assert agent.call("udp_send", sock=direct)["served_by"] in first


def test_endpoint_churn_under_a_connect_loop_fails_no_connect(backend: EbpfBackend,
                                                              agent: Agent) -> None:
    subsets = cycle([[1, 2], [2, 3], [3, 4, 1], [4], ALL, [1, 3], [2, 4], [1]])
    current = service_port("churn", vips("14.1"), 80, endpoints=ALL)
    backend.apply(added(current))
    stop = threading.Event()
    updates = 0

    def churn() -> None:
        nonlocal current, updates
        while not stop.is_set():
            new = service_port("churn", vips("14.1"), 80, endpoints=next(subsets))
            backend.apply(updated(current, new))
            current, updates = new, updates + 1
            time.sleep(0.002)

    churner = threading.Thread(target=churn)
    agent.call("loop_start", targets=[target("tcp", "10.96.14.1", 80)])
    churner.start()
    try:
        time.sleep(3)
    finally:
        stop.set()
        churner.join()
        result = agent.call("loop_stop")
    print(f"churn: {result['connects']} connects, {updates} updates, "
          f"served {sorted(result['served'].items())}")
    assert result["errors"] == {} and result["wrong_peer"] == 0, result
    assert set(result["served"]) == served_by(ALL, 4)
    assert updates > 100 and result["connects"] > 300
