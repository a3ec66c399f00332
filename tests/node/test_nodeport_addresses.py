"""`--nodeport-addresses` (kpng_py/node/nodeport_addresses.py): what it
allows of the node's addresses, and its errors. Following the addresses
through netlink needs a namespace: tests/kernel/node/test_nodeport_addresses.py."""

from __future__ import annotations

import argparse
import ipaddress

import pytest

from kpng_py.node.nodeport_addresses import (
    LocalAddressSet,
    NodePortAddresses,
    add_nodeport_addresses_flag,
)

ip = ipaddress.ip_address
LOCAL = LocalAddressSet(
    frozenset({ip("127.0.0.1"), ip("::1"), ip("10.0.0.5"), ip("192.168.9.1"), ip("fd00::5")}),
    primary=frozenset({ip("10.0.0.5"), ip("fd00::5")}))


@pytest.mark.parametrize("flag, allowed", [
    ("", {"127.0.0.1", "::1", "10.0.0.5", "192.168.9.1", "fd00::5"}),
    ("primary", {"10.0.0.5", "fd00::5"}),
    ("10.0.0.0/8", {"10.0.0.5"}),
    ("10.0.0.0/8, fd00::/64", {"10.0.0.5", "fd00::5"}),
    ("127.0.0.0/8,192.168.9.1/32", {"127.0.0.1", "192.168.9.1"}),
    ("203.0.113.0/24", set()),
])
def test_the_flag_allows_what_kube_proxy_allows(flag: str, allowed: set[str]) -> None:
    assert {str(a) for a in NodePortAddresses.parse(flag).allowed(LOCAL)} == allowed


@pytest.mark.parametrize("flag, error", [
    ("10.0.0.0/33", "'10.0.0.0/33' is not a CIDR"),
    ("primary,10.0.0.0/8", "'primary' cannot be combined with CIDRs"),
    ("eth0", "'eth0' is not a CIDR (such as 10.0.0.0/8 or fd00::/64) nor 'primary'"),
])
def test_a_bad_flag_is_refused_at_start_naming_the_value(
        flag: str, error: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kpng-py")
    add_nodeport_addresses_flag(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([f"--nodeport-addresses={flag}"])
    assert f"--nodeport-addresses: {error}" in capsys.readouterr().err
