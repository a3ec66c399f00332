"""Endpoint choice: Maglev order plus sessionAffinity ClientIP, shared by
the listeners of a service port (no root needed)."""

from __future__ import annotations

import ipaddress

from backends.userspace.context import Expiring
from backends.userspace.picker import EndpointPicker, FrontendPickers, PortAffinity
from kpng_py.model import Endpoint

EP = tuple(Endpoint(ipaddress.ip_address(f"10.244.1.{i}"), 8080) for i in range(1, 5))
CLIENT = ipaddress.ip_address("10.244.0.2")


def _affinity(timeout: int, watched: list[Expiring] | None = None) -> PortAffinity:
    affinity = PortAffinity((watched if watched is not None else []).append)
    affinity.update(timeout, set())
    return affinity


def _picker(endpoints: tuple[Endpoint, ...] = EP, timeout: int = 0) -> EndpointPicker:
    return EndpointPicker("test", endpoints, _affinity(timeout))


def _first(picker: EndpointPicker, port: int, now: float) -> Endpoint:
    return picker.candidates(CLIENT, port, now, 1)[0]


def test_without_affinity_client_ports_spread_over_endpoints():
    picker = _picker()
    assert {_first(picker, port, 0) for port in range(40000, 40100)} == set(EP)
    assert picker.affinity.table is None


def test_candidates_are_distinct_bounded_and_deterministic():
    picker = _picker()
    order = picker.candidates(CLIENT, 40000, 0, 3)
    assert len(order) == len(set(order)) == 3
    assert _picker().candidates(CLIENT, 40000, 5, 3) == order
    assert len(picker.candidates(CLIENT, 40000, 0, 10)) == len(EP)


def test_no_endpoints_no_candidates():
    assert _picker(()).candidates(CLIENT, 40000, 0, 3) == []


def test_affinity_keeps_a_client_on_its_endpoint_until_idle_for_the_timeout():
    picker = _picker(timeout=10)
    chosen = _first(picker, 40000, now=0)
    picker.served(CLIENT, chosen, now=0)
    # Every new flow from that IP, whatever its port, goes there, and refreshes it.
    for second, port in enumerate(range(40001, 40020)):
        assert _first(picker, port, now=second) == chosen
        picker.served(CLIENT, chosen, now=second)
    last_flow = 18
    assert _first(picker, 50000, now=last_flow + 9.9) == chosen
    # After the timeout without a new flow, Maglev decides again.
    later = last_flow + 10
    assert {_first(picker, port, later) for port in range(40000, 40100)} == set(EP)
    assert not picker.affinity.expire(later)


def test_affinity_to_a_removed_endpoint_is_dropped():
    picker = _picker(timeout=100)
    chosen = _first(picker, 40000, now=0)
    picker.served(CLIENT, chosen, now=0)
    remaining = tuple(ep for ep in EP if ep != chosen)
    assert picker.update(remaining) == {chosen}
    picker.affinity.update(100, {chosen})
    assert picker.affinity.table is not None and len(picker.affinity.table) == 0
    assert _first(picker, 40000, now=1) in remaining


def test_a_failed_affine_endpoint_is_followed_by_maglev_order():
    picker = _picker(timeout=100)
    affine = EP[3]
    picker.served(CLIENT, affine, now=0)
    order = picker.candidates(CLIENT, 40000, 1, 3)
    assert order[0] == affine and len(set(order)) == 3


def test_turning_affinity_off_and_changing_its_timeout():
    picker = _picker(timeout=100)
    picker.served(CLIENT, EP[0], now=0)
    picker.affinity.update(0, set())
    assert picker.affinity.table is None and not picker.affinity.expire(1)
    assert _first(picker, 40000, now=1) == _picker().candidates(CLIENT, 40000, 1, 1)[0]
    picker.affinity.update(30, set())
    assert picker.affinity.table is not None and picker.affinity.table.timeout == 30


def test_one_affinity_is_shared_by_every_listener_of_the_port():
    """kube-proxy keeps one affinity per service port: a client sent to an
    endpoint through one frontend (the ClusterIP) stays with it through the
    others (its node port, LB IP), until the timeout (N15)."""
    watched: list[Expiring] = []
    affinity = _affinity(100, watched)
    cluster_ip = FrontendPickers("ClusterIP", EP, None, affinity, lambda ip: False)
    node_port = FrontendPickers("NodePort", EP, EP, affinity, lambda ip: False)
    # The port whose Maglev choice for this client differs from EP[2] ...
    port = next(p for p in range(40000, 41000)
                if _picker().candidates(CLIENT, p, 0, 1)[0] != EP[2])
    cluster_ip.for_client(CLIENT).served(CLIENT, EP[2], now=0)
    assert watched == [affinity]
    # ... goes to EP[2] through the node port, from outside as from inside.
    assert node_port.for_client(CLIENT).candidates(CLIENT, port, 1, 1) == [EP[2]]
    assert node_port.inside.candidates(CLIENT, port, 1, 1) == [EP[2]]
    assert affinity.expire(50) and not affinity.expire(100)


def test_an_affinity_to_a_remote_endpoint_does_not_apply_from_outside():
    """eTP=Local: clients from outside use this node's endpoints only; an
    affinity a node client made to another node's endpoint is not theirs to
    use (kube-proxy's local chain checks only local endpoints)."""
    affinity = _affinity(100)
    local = EP[:2]
    pickers = FrontendPickers("NodePort", EP, local, affinity, lambda ip: False)
    affinity.remember(CLIENT, EP[3], now=0)
    assert pickers.outside is not None
    assert pickers.outside.candidates(CLIENT, 40000, 1, 1)[0] in local
    assert pickers.inside.candidates(CLIENT, 40000, 1, 1) == [EP[3]]
