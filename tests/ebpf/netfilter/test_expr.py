"""The nftables expressions the netfilter table is made of, in libnftables'
JSON schema (`man libnftables-json`): each builder gives the form nft itself
lists for the rule it stands for (pure: no kernel, no libnftables; the
kernel tests show nft accepts them)."""

from __future__ import annotations

import ipaddress

import pytest

from backends.ebpf.netfilter import expr as nx
from kpng_py.model import IPFamily, Protocol

ip = ipaddress.ip_address


@pytest.mark.parametrize(("built", "listed"), [
    (nx.addr(IPFamily.V4, "saddr"), {"payload": {"protocol": "ip", "field": "saddr"}}),
    (nx.addr(IPFamily.V6, "daddr"), {"payload": {"protocol": "ip6", "field": "daddr"}}),
    (nx.dport(), {"payload": {"protocol": "th", "field": "dport"}}),
    (nx.prefix(ipaddress.ip_network("10.0.0.0/8")), {"prefix": {"addr": "10.0.0.0", "len": 8}}),
    (nx.prefix(ipaddress.ip_network("2001:db8::/32")),
     {"prefix": {"addr": "2001:db8::", "len": 32}}),
    (nx.verdict("drop"), {"drop": None}),
    (nx.verdict("goto", "reject-chain"), nx.goto("reject-chain")),
    (nx.verdict("jump", "services"), {"jump": {"target": "services"}}),
    (nx.fib_local(), {"match": {"op": "==", "left": {"fib": {"result": "type",
                                                              "flags": ["daddr"]}},
                                "right": "local"}}),
    (nx.ct_new(), {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}),
    (nx.mark_unset(0x4000), {"match": {"op": "==", "left": {"&": [{"meta": {"key": "mark"}},
                                                                  0x4000]}, "right": 0}}),
    (nx.mark_or(0x4000), {"mangle": {"key": {"meta": {"key": "mark"}},
                                     "value": {"|": [{"meta": {"key": "mark"}}, 0x4000]}}}),
    (nx.set_update(IPFamily.V6, "aff6-x"),
     {"set": {"op": "update", "elem": {"payload": {"protocol": "ip6", "field": "saddr"}},
              "set": "@aff6-x"}}),
    (nx.numgen_random(3), {"numgen": {"mode": "random", "mod": 3, "offset": 0}}),
], ids=["ip-saddr", "ip6-daddr", "th-dport", "prefix4", "prefix6", "drop", "goto", "jump",
        "fib-local", "ct-new", "mark-unset", "mark-or", "set-update", "numgen"])
def test_each_builder_gives_the_form_nft_lists(built: nx.Json, listed: nx.Json) -> None:
    assert built == listed


@pytest.mark.parametrize("address", ["10.244.0.2", "fd00::2"])
def test_dnat_takes_the_family_of_its_address(address: str) -> None:
    family = IPFamily(ip(address).version)
    assert nx.dnat(ip(address), 8080) == {"dnat": {
        "family": nx.addr(family, "daddr")["payload"]["protocol"], "addr": address,
        "port": 8080}}


@pytest.mark.parametrize("family", list(IPFamily))
def test_a_frontend_key_is_the_destination_of_its_family_protocol_and_port(
        family: IPFamily) -> None:
    assert nx.frontend_key(family) == nx.concat(
        nx.addr(family, "daddr"), nx.meta("l4proto"), nx.dport())
    assert nx.frontend_key(family)["concat"][1:] == nx.port_key()["concat"]


@pytest.mark.parametrize("family", list(IPFamily))
def test_every_family_has_its_address_type_nfproto_and_loopback(family: IPFamily) -> None:
    loopback = ip("127.0.0.1") if family is IPFamily.V4 else ip("::1")
    assert loopback in nx.LOOPBACK[family]
    assert nx.ADDR_TYPE[family] == f"ipv{family.value}_addr"
    assert nx.NFPROTO[family] == f"ipv{family.value}"


def test_a_tcp_reset_is_for_tcp_only_and_other_rejects_are_port_unreachable() -> None:
    guard, reject = nx.reject_tcp_reset()
    assert guard == nx.match(nx.meta("l4proto"), nx.l4proto(Protocol.TCP))
    assert reject == {"reject": {"type": "tcp reset"}}
    assert nx.reject_port_unreachable() == [
        {"reject": {"type": "icmpx", "expr": "port-unreachable"}}]
    assert (nx.l4proto(Protocol.TCP), nx.l4proto(Protocol.UDP)) == ("tcp", "udp")
