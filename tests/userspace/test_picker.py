"""Endpoint choice: Maglev order plus sessionAffinity ClientIP (no root needed)."""

from __future__ import annotations

import ipaddress

from backends.userspace.picker import EndpointPicker
from kpng_py.model import Endpoint

EP = tuple(Endpoint(ipaddress.ip_address(f"10.244.1.{i}"), 8080) for i in range(1, 5))
CLIENT = ipaddress.ip_address("10.244.0.2")


def _first(picker: EndpointPicker, port: int, now: float) -> Endpoint:
    return picker.candidates(CLIENT, port, now, 1)[0]


def test_without_affinity_client_ports_spread_over_endpoints():
    picker = EndpointPicker("test", EP, affinity_timeout=0)
    assert {_first(picker, port, 0) for port in range(40000, 40100)} == set(EP)
    assert picker.affinity is None


def test_candidates_are_distinct_bounded_and_deterministic():
    picker = EndpointPicker("test", EP, affinity_timeout=0)
    order = picker.candidates(CLIENT, 40000, 0, 3)
    assert len(order) == len(set(order)) == 3
    assert EndpointPicker("other", EP, 0).candidates(CLIENT, 40000, 5, 3) == order
    assert len(picker.candidates(CLIENT, 40000, 0, 10)) == len(EP)


def test_no_endpoints_no_candidates():
    assert EndpointPicker("test", (), 0).candidates(CLIENT, 40000, 0, 3) == []


def test_affinity_keeps_a_client_on_its_endpoint_until_idle_for_the_timeout():
    picker = EndpointPicker("test", EP, affinity_timeout=10)
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
    assert picker.expire(later) == 0


def test_affinity_to_a_removed_endpoint_is_dropped():
    picker = EndpointPicker("test", EP, affinity_timeout=100)
    chosen = _first(picker, 40000, now=0)
    picker.served(CLIENT, chosen, now=0)
    remaining = tuple(ep for ep in EP if ep != chosen)
    assert picker.update(remaining, 100) == {chosen}
    assert len(picker.affinity) == 0
    assert _first(picker, 40000, now=1) in remaining


def test_a_failed_affine_endpoint_is_followed_by_maglev_order():
    picker = EndpointPicker("test", EP, affinity_timeout=100)
    affine = EP[3]
    picker.served(CLIENT, affine, now=0)
    order = picker.candidates(CLIENT, 40000, 1, 3)
    assert order[0] == affine and len(set(order)) == 3


def test_turning_affinity_off_and_changing_its_timeout():
    picker = EndpointPicker("test", EP, affinity_timeout=100)
    picker.served(CLIENT, EP[0], now=0)
    picker.update(EP, 0)
    assert picker.affinity is None and picker.expire(1) == 0
    picker.update(EP, 30)
    assert picker.affinity is not None and picker.affinity.timeout == 30
