"""Which existing interface the backend may manage for ClusterIPs
(backends/userspace/addresses.py `check_ownership`), decided on the link's
facts without the kernel; tests/kernel/userspace/test_addresses.py does it
on real links."""

from __future__ import annotations

import ipaddress

import pytest

from backends.userspace.addresses import AddressSetupError, InterfaceAddress, Link, check_ownership
from backends.userspace.context import DEFAULT_INTERFACE, MARKER


def _held(*addresses: str) -> tuple[InterfaceAddress, ...]:
    return tuple(InterfaceAddress(ipaddress.ip_address(text.partition("/")[0]),
                                  int(text.partition("/")[2])) for text in addresses)


def _link(name: str = DEFAULT_INTERFACE, kind: str | None = "dummy", alias: str | None = None,
          loopback: bool = False, ports: int = 0, held: tuple[str, ...] = ()) -> Link:
    return Link(name, 7, kind, alias, loopback, ports, _held(*held))


@pytest.mark.parametrize("address, like", [
    ("10.96.0.1/32", True), ("fd00::1/128", True),
    ("10.96.0.0/24", False), ("fe80::1/128", False),  # a subnet; link-local
])
def test_only_host_addresses_that_are_not_link_local_are_cluster_ip_like(
        address: str, like: bool) -> None:
    assert _held(address)[0].is_cluster_ip_like is like


@pytest.mark.parametrize("link", [
    _link(alias=MARKER), _link(name="other", kind="bridge", alias=MARKER, held=("10.0.0.1/24",)),
])
def test_a_marked_dummy_or_bridge_without_ports_is_managed_as_it_is(link: Link) -> None:
    assert check_ownership(link) is False


def test_an_unmarked_default_interface_holding_only_cluster_ips_is_adopted() -> None:
    """The upgrade case: an earlier version created it without the marker."""
    assert check_ownership(_link(held=("10.96.0.1/32", "fe80::1/64"))) is True


@pytest.mark.parametrize("link, why", [
    (_link(name="lo", kind=None, alias=MARKER, loopback=True), "it is the loopback interface"),
    (_link(name="eth0", kind=None, alias=MARKER), "it is a physical link"),
    (_link(name="veth0", kind="veth"), "it is a veth link"),
    (_link(kind="bridge", alias=MARKER, ports=2), "it is a bridge with 2 port(s)"),
    (_link(name="mine"), f"it is not marked as kpng-py's (alias {MARKER!r});"),
    (_link(held=("10.96.0.1/32", "10.1.0.1/24")),
     f"it is not marked as kpng-py's (alias {MARKER!r}) and holds 10.1.0.1/24;"),
])
def test_anything_else_is_refused_with_the_reason_and_the_fix(link: Link, why: str) -> None:
    with pytest.raises(AddressSetupError) as caught:
        check_ownership(link)
    message = str(caught.value)
    assert message.startswith(f"refusing to manage the interface {link.name!r} for "
                              f"ClusterIPs: {why}"), message
    assert "pick another name with --interface" in message
    # Marking is offered only where marking would make the link acceptable.
    assert ("ip link set dev" in message) is ("not marked" in why)
