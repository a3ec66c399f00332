"""The state model's packed endpoints: what goes in comes out, in order, and
compares as the endpoints themselves."""

from __future__ import annotations

import ipaddress
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kpng_py.model import (
    ENDPOINT_EXTERNAL,
    ENDPOINT_INTERNAL,
    ENDPOINT_LOCAL,
    Endpoint,
    Endpoints,
    Protocol,
    ServicePort,
    ServicePortName,
    packed_address,
    sorted_endpoints,
    unpacked_address,
)

addresses = st.one_of(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    # Not IPv4-mapped: the state model refuses that form for IPv6.
    st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address).filter(
        lambda ip: ip.ipv4_mapped is None))
endpoints = st.builds(Endpoint, addresses, st.integers(0, 65535), st.booleans(),
                      st.booleans(), st.booleans())


@given(st.lists(endpoints, max_size=20))
def test_endpoints_read_back_as_they_were_packed(given_endpoints: list[Endpoint]) -> None:
    packed = Endpoints.of(given_endpoints)
    assert list(packed) == given_endpoints
    assert len(packed) == len(given_endpoints)
    assert [packed[i] for i in range(-len(packed), len(packed))] == given_endpoints * 2
    assert packed == tuple(given_endpoints) and packed == Endpoints(packed.packed)
    assert packed[1:3] == tuple(given_endpoints[1:3]) and packed[::2] == given_endpoints[::2]
    assert pickle.loads(pickle.dumps(packed)) == packed
    assert hash(packed) == hash(Endpoints(bytes(packed.packed)))


@given(addresses)
def test_an_address_unpacks_as_it_was(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    assert unpacked_address(packed_address(ip)) == ip


@given(st.lists(endpoints, max_size=20, unique_by=Endpoint.sort_key))
def test_packed_endpoints_sort_as_their_sort_keys(given_endpoints: list[Endpoint]) -> None:
    """The state model sorts endpoints, each (address, port) once, by their
    packed bytes: the same order."""
    by_bytes = sorted(Endpoints.of([ep]).packed for ep in given_endpoints)
    assert Endpoints(b"".join(by_bytes)) == sorted_endpoints(given_endpoints)


@given(st.lists(endpoints, max_size=20), st.sampled_from([4, 6]),
       st.sampled_from([ENDPOINT_INTERNAL, ENDPOINT_EXTERNAL, ENDPOINT_LOCAL]))
def test_targets_are_the_address_and_port_of_the_endpoints_with_a_flag(
        given_endpoints: list[Endpoint], version: int, flag: int) -> None:
    def has(ep: Endpoint) -> bool:
        return {ENDPOINT_INTERNAL: ep.internal, ENDPOINT_EXTERNAL: ep.external,
                ENDPOINT_LOCAL: ep.local}[flag]

    assert Endpoints.of(given_endpoints).targets(version, flag) == tuple(
        packed_address(ep.ip)[1:] + ep.port.to_bytes(2, "big")
        for ep in given_endpoints if ep.ip.version == version and has(ep))


def test_a_service_port_keeps_the_endpoints_it_is_given_packed() -> None:
    ep = Endpoint(ipaddress.ip_address("10.244.0.2"), 8080, local=True, internal=False)
    # A tuple where the field is Endpoints: the port packs what it is given.
    port = ServicePort(ServicePortName("ns", "web", "", Protocol.TCP), "ClusterIP",
                       (ipaddress.ip_address("10.96.0.10"),), 80,
                       endpoints=(ep,))  # type: ignore[arg-type]
    assert isinstance(port.endpoints, Endpoints) and port.endpoints == (ep,)
    assert port.cluster_endpoints() == () and port == ServicePort(
        port.name, "ClusterIP", port.cluster_ips, 80, endpoints=Endpoints.of([ep]))


def test_packed_endpoints_are_whole_and_a_value() -> None:
    with pytest.raises(ValueError, match="not whole endpoints"):
        Endpoints(b"\x04")
    with pytest.raises(AttributeError, match="are a value"):
        Endpoints().packed = b""
    with pytest.raises(IndexError, match="endpoint 0 of 0"):
        Endpoints()[0]
