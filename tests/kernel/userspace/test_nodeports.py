"""Node ports, ExternalIPs, LB IPs and healthCheckNodePorts of the userspace
backend with real sockets (lab/proxy_node.py): the client namespace is
"outside the node" (10.244.0.2 on the node's c0 link, 10.244.0.1), the node
namespace runs the backend, the server namespace holds the endpoints.
Behaviour numbers are those of docs/spec/node-port-behaviours.md."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from dataclasses import replace
from typing import Callable

import pytest

from kpng_py.model import (
    Endpoint,
    Endpoints,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortChanges,
)
from lab.netns import NetNS
from lab.proxy_node import ENDPOINT_PORT, REPO, SERVER_V4, SERVER_V6, agent_answer, service_port

pytestmark = pytest.mark.kernel

VIP4, VIP6 = "10.96.0.10", "fd00:10:96::10"
NODE4, NODE6 = "10.244.0.1", "fd00:10:244::1"
# A node address the client reaches only through a route the tests add.
OTHER_NODE4 = "10.244.1.1"
EXTERNAL_IP, LB_IP = "192.0.2.10", "198.51.100.10"
NODE_PORT, HC_PORT = 30080, 30100
TCP, UDP = Protocol.TCP, Protocol.UDP
BOTH = (IPFamily.V4, IPFamily.V6)
# How long the tests wait for the backend to follow an address change.
FOLLOW_LIMIT = 10.0


@pytest.fixture(scope="module", autouse=True)
def client_routes(netns_cluster):
    """The client reaches the other node address, the ExternalIP and the LB IP
    through the node (all inside the test's namespaces)."""
    for ip in (OTHER_NODE4, EXTERNAL_IP, LB_IP):
        netns_cluster.client.ip("route", "add", f"{ip}/32", "via", NODE4)


def _port(name: str, protocol: Protocol, endpoints=(), *, node_port: int = NODE_PORT,
          families=BOTH, **fields) -> ServicePort:
    """A NodePort service port as decode would build it (both families)."""
    base = service_port(name, protocol, (VIP4, VIP6), 80, endpoints)
    fields.setdefault("type", "NodePort")
    return replace(base, node_port=node_port, node_port_families=families, **fields)


def _ips(*texts: str):
    return tuple(ipaddress.ip_address(t) for t in texts)


def _endpoint(ip: str, local: bool = False, external: bool = True) -> Endpoint:
    return Endpoint(ipaddress.ip_address(ip), ENDPOINT_PORT, local=local, external=external)


def _endpoints(results) -> set[str]:
    assert isinstance(results, list), results
    return {r["endpoint"] for r in results}


def _listening(ns: NetNS, port: int, protocol: Protocol) -> set[str]:
    """Local addresses with a socket on `port` (TCP: listening), per /proc/net."""
    found = set()
    for table, v6 in ((protocol.value.lower(), False), (protocol.value.lower() + "6", True)):
        text = ns.run("cat", f"/proc/net/{table}").stdout
        for line in text.splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if int(port_hex, 16) != port or (protocol is TCP and fields[3] != "0A"):
                continue
            raw = bytes.fromhex(address)
            # /proc/net prints each 32-bit word in host (little-endian) order.
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(str(ipaddress.ip_address(packed)))
    return found


def _ss_listening(ns: NetNS, port: int) -> str:
    return ns.run("ss", "-Hltun", f"sport = :{port}").stdout.strip()


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + FOLLOW_LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {FOLLOW_LIMIT}s: {what}")
        time.sleep(0.05)


def _on_node(netns_cluster, op: str, **args):
    """One lab.agent command run in the node's namespace (a host process)."""
    done = subprocess.run(netns_cluster.python(netns_cluster.node, "lab.agent"),
                          input=json.dumps({"op": op, **args}) + "\n", text=True,
                          capture_output=True, cwd=REPO, check=True)
    return agent_answer(json.loads(done.stdout))


@pytest.mark.parametrize("node_ip, servers", [(NODE4, SERVER_V4), (NODE6, SERVER_V6)])
def test_n1_node_port_answers_on_allowed_node_addresses_tcp_and_udp(
        start_node, client, node_ip, servers):
    node = start_node("--nodeport-addresses", "10.244.0.0/24,fd00:10:244::/64")
    all_endpoints = (*SERVER_V4, *SERVER_V6)
    node.apply(ServicePortChanges(added=(_port("web", TCP, all_endpoints),
                                         _port("dns", UDP, all_endpoints)), full=True))
    # Endpoints are picked at random: 30 tries miss one of 3 with a
    # probability of 3 x (2/3)^30, about 1e-5 (with 10 tries about 5 %: seen failing).
    results = client("tcp_echo", host=node_ip, port=NODE_PORT, count=30)
    assert _endpoints(results) == set(servers)
    assert all(r["peer"] == [node_ip, NODE_PORT] and r["echo"] == "ping" for r in results)
    for connected in (False, True):
        results = client("udp_echo", host=node_ip, port=NODE_PORT, count=30, size=100,
                         connected=connected)
        assert _endpoints(results) == set(servers)
        assert all(r["source"] == [node_ip, NODE_PORT] for r in results)
    # 10.244.1.1 is the node's too, but outside --nodeport-addresses.
    assert client("tcp_echo", host=OTHER_NODE4, port=NODE_PORT, count=1) == {
        "error": "ECONNREFUSED"}
    assert client("udp_echo", host=OTHER_NODE4, port=NODE_PORT, count=1, size=1,
                  connected=True) == {"error": "ECONNREFUSED"}


def test_n1_a_node_address_added_later_answers_and_one_removed_stops(
        start_node, client, netns_cluster):
    node = start_node()  # every local address
    node.apply(ServicePortChanges(added=(_port("web", TCP, (*SERVER_V4, *SERVER_V6)),),
                                  full=True))
    assert _endpoints(
        client("tcp_echo", host=OTHER_NODE4, port=NODE_PORT, count=3)) <= set(SERVER_V4)
    netns_cluster.node.ip("addr", "add", "10.244.0.100/24", "dev", "c0")
    try:
        _wait_until(lambda: "10.244.0.100" in _listening(netns_cluster.node, NODE_PORT, TCP),
                    "a listener on the new address")
        results = client("tcp_echo", host="10.244.0.100", port=NODE_PORT, count=3)
        assert all(r["peer"] == ["10.244.0.100", NODE_PORT] for r in results)
    finally:
        netns_cluster.node.ip("addr", "del", "10.244.0.100/24", "dev", "c0")
    _wait_until(lambda: "10.244.0.100" not in _listening(netns_cluster.node, NODE_PORT, TCP),
                "the listener on the removed address closed")
    # The backend's own interface is not the node's: no node port on a ClusterIP.
    listening = _listening(netns_cluster.node, NODE_PORT, TCP)
    assert {NODE4, OTHER_NODE4, "127.0.0.1", NODE6, "::1"} <= listening
    assert VIP4 not in listening and VIP6 not in listening


def test_n3_loopback_node_port_serves_a_host_process(start_node, netns_cluster):
    node = start_node()
    node.apply(ServicePortChanges(added=(_port("web", TCP, (*SERVER_V4, *SERVER_V6)),),
                                  full=True))
    for host, servers in (("127.0.0.1", SERVER_V4), ("::1", SERVER_V6)):
        results = _on_node(netns_cluster, "tcp_echo", host=host, port=NODE_PORT, count=2)
        assert _endpoints(results) <= set(servers)
        assert all(r["peer"] == [host, NODE_PORT] for r in results)


def test_n4_tcp_and_udp_on_one_node_port_are_independent(start_node, client):
    node = start_node()
    web = _port("web", TCP, (SERVER_V4[0],))
    dns = _port("dns", UDP, (SERVER_V4[1],))
    node.apply(ServicePortChanges(added=(web, dns), full=True))
    assert _endpoints(client("tcp_echo", host=NODE4, port=NODE_PORT, count=5)) == {SERVER_V4[0]}
    assert _endpoints(client("udp_echo", host=NODE4, port=NODE_PORT, count=5, size=10,
                             connected=True)) == {SERVER_V4[1]}
    node.apply(ServicePortChanges(removed=(web,)))
    assert client("tcp_echo", host=NODE4, port=NODE_PORT, count=1) == {"error": "ECONNREFUSED"}
    assert _endpoints(client("udp_echo", host=NODE4, port=NODE_PORT, count=5, size=10,
                             connected=True)) == {SERVER_V4[1]}


def test_n5_deleting_or_retyping_releases_the_node_port(start_node, client, netns_cluster):
    node = start_node()
    web = _port("web", TCP, SERVER_V4)
    node.apply(ServicePortChanges(added=(web,), full=True))
    assert NODE4 in _listening(netns_cluster.node, NODE_PORT, TCP)
    # Back to type ClusterIP: the node port goes, the ClusterIP stays.
    cluster_ip_only = replace(web, type="ClusterIP", node_port=0, node_port_families=())
    node.apply(ServicePortChanges(updated=((web, cluster_ip_only),)))
    assert client("tcp_echo", host=NODE4, port=NODE_PORT, count=1) == {"error": "ECONNREFUSED"}
    assert _listening(netns_cluster.node, NODE_PORT, TCP) == set()
    assert _endpoints(client("tcp_echo", host=VIP4, port=80, count=2)) <= set(SERVER_V4)
    node.apply(ServicePortChanges(updated=((cluster_ip_only, web),)))
    assert _endpoints(client("tcp_echo", host=NODE4, port=NODE_PORT, count=2)) <= set(SERVER_V4)
    node.apply(ServicePortChanges(removed=(web,)))
    assert client("tcp_echo", host=NODE4, port=NODE_PORT, count=1) == {"error": "ECONNREFUSED"}
    assert _listening(netns_cluster.node, NODE_PORT, TCP) == set()
    assert _ss_listening(netns_cluster.node, NODE_PORT) == ""


def test_n6_no_endpoints_refuses_node_port_external_ip_and_lb_ip(start_node, client):
    node = start_node()
    empty_tcp = _port("web", TCP, (), external_ips=_ips(EXTERNAL_IP),
                      load_balancer_ips=_ips(LB_IP), type="LoadBalancer")
    empty_udp = _port("dns", UDP, (), external_ips=_ips(EXTERNAL_IP),
                      load_balancer_ips=_ips(LB_IP), type="LoadBalancer")
    node.apply(ServicePortChanges(added=(empty_tcp, empty_udp), full=True))
    for host, port in ((NODE4, NODE_PORT), (EXTERNAL_IP, 80), (LB_IP, 80)):
        assert client("tcp_echo", host=host, port=port, count=1) == {"error": "ECONNREFUSED"}
        assert client("udp_echo", host=host, port=port, count=1, size=1, connected=True) == {
            "error": "ECONNREFUSED"}


@pytest.mark.parametrize("frontend_ip", [EXTERNAL_IP, LB_IP])
def test_n14_external_and_lb_ips_answer_from_outside_and_from_the_host(
        start_node, client, netns_cluster, frontend_ip):
    node = start_node()
    web = _port("web", TCP, SERVER_V4, external_ips=_ips(EXTERNAL_IP),
                load_balancer_ips=_ips(LB_IP), type="LoadBalancer")
    dns = _port("dns", UDP, SERVER_V4, external_ips=_ips(EXTERNAL_IP),
                load_balancer_ips=_ips(LB_IP), type="LoadBalancer")
    node.apply(ServicePortChanges(added=(web, dns), full=True))
    results = client("tcp_echo", host=frontend_ip, port=80, count=10)
    assert _endpoints(results) <= set(SERVER_V4)
    assert all(r["peer"] == [frontend_ip, 80] for r in results)
    results = client("udp_echo", host=frontend_ip, port=80, count=5, size=10, connected=False)
    assert all(r["source"] == [frontend_ip, 80] for r in results)
    assert _endpoints(_on_node(netns_cluster, "tcp_echo", host=frontend_ip, port=80,
                               count=2)) <= set(SERVER_V4)
    node.apply(ServicePortChanges(removed=(web, dns)))
    assert client("tcp_echo", host=frontend_ip, port=80, count=1)["error"] in {
        "ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "TimeoutError"}


def _local_only(protocol: Protocol, local: str | None) -> ServicePort:
    """eTP=Local: every endpoint in the cluster scope, only `local` (this
    node's) in the External scope, as the brain sends them."""
    endpoints = Endpoints.of(_endpoint(ip, local=ip == local, external=ip == local)
                             for ip in (*SERVER_V4, *SERVER_V6))
    return replace(_port("web", protocol),
                   endpoints=endpoints, external_traffic_local=True, type="LoadBalancer",
                   external_ips=_ips(EXTERNAL_IP), health_check_node_port=HC_PORT)


def test_n7_etp_local_from_outside_uses_only_local_endpoints(start_node, client):
    node = start_node()
    node.apply(ServicePortChanges(added=(_local_only(TCP, SERVER_V4[2]),
                                         _local_only(UDP, SERVER_V4[2])), full=True))
    for host, port in ((NODE4, NODE_PORT), (EXTERNAL_IP, 80)):
        assert _endpoints(client("tcp_echo", host=host, port=port, count=10)) == {SERVER_V4[2]}
        assert _endpoints(client("udp_echo", host=host, port=port, count=5, size=10,
                                 connected=True)) == {SERVER_V4[2]}


def test_n8_n9_etp_local_without_a_local_endpoint_drops_outside_serves_the_node(
        start_node, client, netns_cluster):
    node = start_node()
    web, dns = _local_only(TCP, None), _local_only(UDP, None)
    node.apply(ServicePortChanges(added=(web, dns), full=True))
    for host, port in ((NODE4, NODE_PORT), (NODE6, NODE_PORT), (EXTERNAL_IP, 80)):
        # N8: no SYN-ACK and no reset: the client's connect times out (an
        # answer in the lab takes milliseconds: a second is long enough).
        assert client("tcp_echo", host=host, port=port, count=1, timeout=1) == {
            "error": "TimeoutError"}
        assert client("udp_echo", host=host, port=port, count=1, size=1, connected=True,
                      timeout=1) == {"error": "TimeoutError"}
        # N9: a host process uses the cluster endpoints.
        served = _endpoints(_on_node(netns_cluster, "tcp_echo", host=host, port=port, count=6))
        assert served <= set(SERVER_V6 if ":" in host else SERVER_V4)
    # A local endpoint appears: served from outside at once, from it only.
    node.apply(ServicePortChanges(updated=((web, _local_only(TCP, SERVER_V4[0])),)))
    assert _endpoints(client("tcp_echo", host=NODE4, port=NODE_PORT, count=5)) == {SERVER_V4[0]}


def _http(netns_cluster, host: str, path: str = "/any/path") -> dict:
    """GET from the client namespace with curl: status, headers, body."""
    url = f"http://{host}:{HC_PORT}{path}" if ":" not in host else f"http://[{host}]:{HC_PORT}{path}"
    done = subprocess.run(netns_cluster.client.exec_args("curl", "-sS", "-m", "3", "-D", "-", url),
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.returncode}
    # text mode has turned the CRLFs into newlines
    head, _, body = done.stdout.partition("\n\n")
    lines = head.split("\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return {"status": int(lines[0].split()[1]), "headers": headers, "body": json.loads(body)}


def test_n11_health_check_node_port(start_node, netns_cluster):
    node = start_node()
    served = _local_only(TCP, SERVER_V4[1])
    node.apply(ServicePortChanges(added=(served,), full=True))
    for host in (NODE4, NODE6):
        answer = _http(netns_cluster, host)
        assert answer["status"] == 200
        assert answer["headers"]["Content-Type"] == "application/json"
        assert answer["headers"]["X-Content-Type-Options"] == "nosniff"
        assert answer["body"] == {"service": {"namespace": "default", "name": "web"},
                                  "localEndpoints": 1, "serviceProxyHealthy": True}
    none_local = _local_only(TCP, None)
    node.apply(ServicePortChanges(updated=((served, none_local),)))
    answer = _http(netns_cluster, NODE4, "/")
    assert answer["status"] == 503 and answer["body"]["localEndpoints"] == 0
    node.apply(ServicePortChanges(removed=(none_local,)))
    assert _http(netns_cluster, NODE4) == {"error": 7}  # curl: could not connect
    assert _listening(netns_cluster.node, HC_PORT, TCP) == set()
