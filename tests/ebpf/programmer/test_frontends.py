"""What the map programmer writes for each frontend of a service port: its
key, the endpoints of its family that cluster traffic may use, its affinity
timeout and the flag of its kind (no maps: the specs alone)."""

from __future__ import annotations

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import KeyedFrontend
from backends.ebpf.programmer.frontends import frontends_of, keyed_frontends
from lab.socket_lab import backend_ip
from tests.support.ebpf_datapath import service_port


def servers(family: int, *numbers: int) -> tuple[bytes, ...]:
    """The lab's servers of these numbers in `family`, port 8080, as the
    maps hold an endpoint: a packed lb_l4addr, its pad zero."""
    return tuple(bytes(maps.L4Addr.of(backend_ip(n, family), 8080)) for n in numbers)


def test_keyed_frontends_are_the_ports_frontends_in_order() -> None:
    port = service_port("web", ["10.96.0.10", "fd96::10"], 80, [1], node_port=30080,
                        external_ips=["192.0.2.7"])
    keyed = keyed_frontends(port)
    assert [k.frontend for k in keyed] == list(port.frontends())
    assert keyed == tuple(KeyedFrontend(f) for f in port.frontends())


def test_each_frontend_gets_the_endpoints_of_its_family_in_order() -> None:
    port = service_port("web", ["10.96.0.10", "fd96::10"], 80, [2, 1], node_port=30080)
    specs = frontends_of(port)
    assert list(specs) == list(keyed_frontends(port))
    for keyed, spec in specs.items():
        assert spec.targets == servers(keyed.ip_version, 2, 1), keyed.frontend


def test_endpoints_cluster_traffic_may_not_use_are_left_out() -> None:
    port = service_port("web", ["10.96.0.10"], 80, [1, 2, 3], families=(4,), local_only=[2])
    (spec,) = frontends_of(port).values()
    assert spec.targets == servers(4, 2)


def test_each_frontend_carries_the_flag_of_its_kind_and_the_affinity_timeout() -> None:
    port = service_port("web", ["10.96.0.10"], 80, [1], families=(4,), affinity=30,
                        node_port=30080, external_ips=["192.0.2.7"], lb_ips=["198.51.100.8"])
    flags = {str(keyed.frontend.ip) if not keyed.frontend.is_node_port else "node port":
             spec.kind_flag for keyed, spec in frontends_of(port).items()}
    assert flags == {"10.96.0.10": 0, "192.0.2.7": maps.SVC_F_EXTERNAL_IP,
                     "198.51.100.8": maps.SVC_F_LOAD_BALANCER_IP,
                     "node port": maps.SVC_F_NODE_PORT}
    assert {spec.affinity_timeout for spec in frontends_of(port).values()} == {30}


def test_given_keyed_frontends_only_those_get_a_spec() -> None:
    port = service_port("web", ["10.96.0.10", "fd96::10"], 80, [1])
    v6 = keyed_frontends(port)[1:]
    specs = frontends_of(port, v6)
    assert list(specs) == list(v6)
    assert specs[v6[0]].targets == servers(6, 1)
