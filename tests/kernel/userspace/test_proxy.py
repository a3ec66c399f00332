"""The userspace proxy with real sockets: a client, the node running the
backend and a server, each in its own network namespace (lab/proxy_node.py)."""

from __future__ import annotations

import ipaddress
import time

import pytest

from backends.userspace.picker import EndpointPicker, PortAffinity
from kpng_py.model import IPFamily, Protocol, ServicePort, ServicePortChanges
from lab.proxy_node import CLOSED_PORT, ENDPOINT_PORT, SERVER_V4, SERVER_V6, service_port

pytestmark = pytest.mark.kernel

VIP4, VIP6 = "10.96.0.10", "fd00:10:96::10"
TCP, UDP = Protocol.TCP, Protocol.UDP


def _web(*endpoints, **kwargs) -> ServicePort:
    return service_port("web", TCP, (VIP4, VIP6), 80, endpoints, **kwargs)


def _dns(*endpoints, **kwargs) -> ServicePort:
    return service_port("dns", UDP, (VIP4, VIP6), 53, endpoints, **kwargs)


def _endpoints(results: list[dict]) -> set[str]:
    return {r["endpoint"] for r in results}


def _node_addresses(netns_cluster) -> str:
    return netns_cluster.node.ip("-br", "addr", "show", "dev", "kpng-py0").stdout


@pytest.mark.parametrize("vip, servers", [(VIP4, SERVER_V4), (VIP6, SERVER_V6)])
def test_tcp_reaches_every_endpoint_and_the_client_sees_the_cluster_ip(
        start_node, client, vip, servers):
    start_node().apply(ServicePortChanges(added=(_web(*SERVER_V4, *SERVER_V6),), full=True))
    results = client("tcp_echo", host=vip, port=80, count=30)
    assert _endpoints(results) == set(servers)
    assert all(r["peer"] == [vip, 80] for r in results)
    # Each connection half-closed after "ping"; the echo still came back.
    assert all(r["echo"] == "ping" for r in results)


@pytest.mark.parametrize("vip, servers", [(VIP4, SERVER_V4), (VIP6, SERVER_V6)])
@pytest.mark.parametrize("connected", [False, True])
def test_udp_replies_come_from_the_cluster_ip(start_node, client, vip, servers, connected):
    start_node().apply(ServicePortChanges(added=(_dns(*SERVER_V4, *SERVER_V6),), full=True))
    results = client("udp_echo", host=vip, port=53, count=20, size=2000, connected=connected)
    assert _endpoints(results) == set(servers)
    assert all(r["source"] == [vip, 53] and r["size"] == 2000 for r in results)


def test_no_endpoints_means_refused_for_tcp_and_udp(start_node, client):
    node = start_node()
    # A family without endpoints is refused too: here IPv6 has none.
    node.apply(ServicePortChanges(added=(_web(), _dns(SERVER_V4[0])), full=True))
    assert client("tcp_echo", host=VIP4, port=80, count=1) == {"error": "ECONNREFUSED"}
    assert client("udp_echo", host=VIP6, port=53, count=1, size=10, connected=True) == {
        "error": "ECONNREFUSED"}
    assert _endpoints(client("udp_echo", host=VIP4, port=53, count=1, size=10, connected=True)) == {
        SERVER_V4[0]}
    # Endpoints arrive: served; they all go: refused again.
    node.apply(ServicePortChanges(updated=((_web(), _web(SERVER_V4[1])),)))
    assert _endpoints(client("tcp_echo", host=VIP4, port=80, count=3)) == {SERVER_V4[1]}
    node.apply(ServicePortChanges(updated=((_web(SERVER_V4[1]), _web()),)))
    assert client("tcp_echo", host=VIP4, port=80, count=1) == {"error": "ECONNREFUSED"}


def test_removing_an_endpoint_keeps_established_connections(start_node, client):
    node = start_node()
    before = _web(*SERVER_V4)
    node.apply(ServicePortChanges(added=(before,), full=True))
    kept = client("open", sock="kept", host=VIP4, port=80)["endpoint"]
    after = _web(*(ip for ip in SERVER_V4 if ip != kept))
    node.apply(ServicePortChanges(updated=((before, after),)))
    assert client("echo", sock="kept", data="still here") == {"data": "still here"}
    assert kept not in _endpoints(client("tcp_echo", host=VIP4, port=80, count=20))


def test_a_udp_session_moves_off_a_removed_endpoint(start_node, client):
    node = start_node()
    before = _dns(*SERVER_V4)
    node.apply(ServicePortChanges(added=(before,), full=True))
    client("udp_open", sock="stream", host=VIP4, port=53)
    first = client("udp_send", sock="stream", payload="one")["endpoint"]
    after = _dns(*(ip for ip in SERVER_V4 if ip != first))
    node.apply(ServicePortChanges(updated=((before, after),)))
    reply = client("udp_send", sock="stream", payload="two")
    assert reply["data"] == "two" and reply["endpoint"] in {ip for ip in SERVER_V4 if ip != first}


def test_udp_sessions_end_after_the_idle_timeout(start_node, client):
    node = start_node("--udp-idle-timeout", "0.5")
    node.apply(ServicePortChanges(added=(_dns(*SERVER_V4),), full=True))
    client("udp_open", sock="stream", host=VIP4, port=53)
    first = client("udp_send", sock="stream", payload="one")
    # While the client keeps talking, its session (the node's upstream socket) stays.
    for _ in range(3):
        time.sleep(0.2)
        again = client("udp_send", sock="stream", payload="again")
        assert (again["endpoint"], again["upstream_port"]) == (first["endpoint"],
                                                               first["upstream_port"])
    # Idle past the timeout: the next datagram opens a new session, to the
    # endpoint Maglev gives the same client address and port.
    time.sleep(1.5)
    later = client("udp_send", sock="stream", payload="later")
    assert later["endpoint"] == first["endpoint"]
    assert later["upstream_port"] != first["upstream_port"]


def _source_ports_by_maglev_choice(endpoints: tuple[str, ...]) -> dict[str, list[int]]:
    """Client source ports grouped by the endpoint Maglev gives them (without affinity)."""
    picker = EndpointPicker("test", _web(*endpoints).cluster_endpoints(IPFamily.V4),
                            PortAffinity(lambda item: None))
    client_ip = ipaddress.ip_address("10.244.0.2")
    ports: dict[str, list[int]] = {}
    for port in range(41000, 41200):
        ports.setdefault(str(picker.candidates(client_ip, port, 0, 1)[0].ip), []).append(port)
    return ports


def test_session_affinity_holds_until_the_timeout(start_node, client):
    node = start_node()
    node.apply(ServicePortChanges(added=(_web(*SERVER_V4, affinity_timeout_seconds=1),), full=True))
    ports = _source_ports_by_maglev_choice(SERVER_V4)
    one, other = SERVER_V4[0], SERVER_V4[1]
    assert client("tcp_echo", host=VIP4, port=80, count=1, source_port=ports[one][0])[0][
        "endpoint"] == one
    # Within the timeout, a port Maglev sends elsewhere still lands on the affine endpoint.
    assert client("tcp_echo", host=VIP4, port=80, count=1, source_port=ports[other][0])[0][
        "endpoint"] == one
    time.sleep(1.3)
    # Idle past the timeout: Maglev decides again.
    assert client("tcp_echo", host=VIP4, port=80, count=1, source_port=ports[other][1])[0][
        "endpoint"] == other


def test_a_refusing_endpoint_is_skipped_for_the_next_in_maglev_order(start_node, client):
    node = start_node("--tcp-connect-attempts", "3")
    refusing = [(ip, CLOSED_PORT) for ip in SERVER_V4[:2]]
    node.apply(ServicePortChanges(added=(_web(*refusing, SERVER_V4[2]),), full=True))
    assert _endpoints(client("tcp_echo", host=VIP4, port=80, count=15)) == {SERVER_V4[2]}
    # Nothing accepts: the client is reset rather than left hanging.
    node.apply(ServicePortChanges(added=(_web(*refusing),), full=True))
    assert client("tcp_echo", host=VIP4, port=80, count=1) == {"error": "ECONNRESET"}


def test_tcp_and_udp_on_one_port_are_independent(start_node, client):
    node = start_node()
    tcp = service_port("both", TCP, (VIP4,), 53, SERVER_V4)
    udp = service_port("both", UDP, (VIP4,), 53, SERVER_V4)
    node.apply(ServicePortChanges(added=(tcp, udp), full=True))
    assert client("udp_echo", host=VIP4, port=53, count=1, size=10, connected=True)[0]["size"] == 10
    node.apply(ServicePortChanges(removed=(udp,)))
    assert client("udp_echo", host=VIP4, port=53, count=1, size=10, connected=True) == {
        "error": "ECONNREFUSED"}
    assert client("tcp_echo", host=VIP4, port=53, count=1)[0]["echo"] == "ping"


def test_ports_and_services_come_and_go_with_their_addresses(start_node, client, netns_cluster):
    node = start_node()
    http = service_port("web", TCP, (VIP4,), 80, SERVER_V4)
    https = service_port("web", TCP, (VIP4,), 443, SERVER_V4, port_name="https")
    node.apply(ServicePortChanges(added=(http, https), full=True))
    # Removing one port leaves the other and the ClusterIP.
    node.apply(ServicePortChanges(removed=(https,)))
    assert client("tcp_echo", host=VIP4, port=443, count=1) == {"error": "ECONNREFUSED"}
    assert client("tcp_echo", host=VIP4, port=80, count=1)[0]["echo"] == "ping"
    assert VIP4 in _node_addresses(netns_cluster)
    # Removing the service removes its listener and its ClusterIP.
    node.apply(ServicePortChanges(removed=(http,)))
    assert VIP4 not in _node_addresses(netns_cluster)
    assert "error" in client("tcp_echo", host=VIP4, port=80, count=1)
    # Re-created: served again.
    node.apply(ServicePortChanges(added=(http,)))
    assert client("tcp_echo", host=VIP4, port=80, count=1)[0]["echo"] == "ping"


def test_a_full_change_set_reconciles_with_what_a_previous_run_left(
        start_node, client, netns_cluster):
    first = start_node()
    first.apply(ServicePortChanges(added=(_web(*SERVER_V4), _dns(*SERVER_V4)), full=True))
    first.close()  # the ClusterIPs stay on the interface across a restart
    assert VIP4 in _node_addresses(netns_cluster)
    netns_cluster.node.ip("addr", "add", "10.96.99.99/32", "dev", "kpng-py0")
    second = start_node()
    web_only = service_port("web", TCP, ("10.96.0.20",), 80, SERVER_V4)
    second.apply(ServicePortChanges(added=(web_only,), full=True))
    addresses = _node_addresses(netns_cluster)
    assert "10.96.0.20/32" in addresses
    assert VIP4 not in addresses and VIP6 not in addresses and "10.96.99.99" not in addresses
    assert client("tcp_echo", host="10.96.0.20", port=80, count=1)[0]["echo"] == "ping"


def test_connections_sessions_and_refusals_are_counted_per_service_port(start_node, client):
    """The metrics the eBPF backend exports too: a TCP connection relayed, a
    UDP session opened (one per client socket, not per datagram), a client
    reset because no endpoint accepted."""
    node = start_node("--tcp-connect-attempts", "1")
    node.apply(ServicePortChanges(added=(_web(*SERVER_V4, *SERVER_V6), _dns(*SERVER_V4)),
                                  full=True))
    assert len(client("tcp_echo", host=VIP4, port=80, count=5)) == 5
    assert len(client("tcp_echo", host=VIP6, port=80, count=2)) == 2
    assert len(client("udp_echo", host=VIP4, port=53, count=3, size=10, connected=False)) == 3
    counts = node.counts()
    assert counts["kpng_py_service_connections_total:default/web:p,TCP"] == 7
    assert counts["kpng_py_service_rejections_total:default/web:p,TCP"] == 0
    assert counts["kpng_py_service_connections_total:default/dns:p,UDP"] == 3
    node.apply(ServicePortChanges(updated=((_web(*SERVER_V4, *SERVER_V6),
                                            _web((SERVER_V4[0], CLOSED_PORT))),)))
    assert client("tcp_echo", host=VIP4, port=80, count=1) == {"error": "ECONNRESET"}
    counts = node.counts()
    assert counts["kpng_py_service_connections_total:default/web:p,TCP"] == 7
    assert counts["kpng_py_service_rejections_total:default/web:p,TCP"] == 1
    # A removed service port is no longer exported.
    node.apply(ServicePortChanges(removed=(_dns(*SERVER_V4),)))
    assert "kpng_py_service_connections_total:default/dns:p,UDP" not in node.counts()


def test_endpoint_counters_count_each_endpoints_connections_and_forget_a_gone_one(
        start_node, client):
    """With --endpoint-counters, as the eBPF backend: per (service port,
    endpoint), matching what the clients saw; an endpoint the port no longer
    has is no longer exported."""
    node = start_node("--endpoint-counters")
    node.apply(ServicePortChanges(added=(_web(*SERVER_V4), _dns(*SERVER_V4)), full=True))
    results = client("tcp_echo", host=VIP4, port=80, count=9)
    client("udp_echo", host=VIP4, port=53, count=2, size=10, connected=False)
    served = {ip: sum(1 for r in results if r["endpoint"] == ip) for ip in SERVER_V4}

    def per_endpoint(service: str, protocol: str) -> dict[str, float]:
        prefix = f"kpng_py_service_endpoint_connections_total:default/{service}:p,{protocol},"
        return {key[len(prefix):]: value for key, value in node.counts().items()
                if key.startswith(prefix)}

    assert per_endpoint("web", "TCP") == {f"{ip}:{ENDPOINT_PORT}": n
                                          for ip, n in served.items() if n}
    assert sum(per_endpoint("dns", "UDP").values()) == 2
    node.apply(ServicePortChanges(updated=((_web(*SERVER_V4), _web(*SERVER_V4[1:])),)))
    assert f"{SERVER_V4[0]}:{ENDPOINT_PORT}" not in per_endpoint("web", "TCP")


def test_without_the_flag_there_are_no_endpoint_series(start_node, client):
    node = start_node()
    node.apply(ServicePortChanges(added=(_web(*SERVER_V4),), full=True))
    assert len(client("tcp_echo", host=VIP4, port=80, count=2)) == 2
    assert not any(key.startswith("kpng_py_service_endpoint_connections")
                   for key in node.counts())

