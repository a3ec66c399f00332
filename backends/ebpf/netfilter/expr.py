"""The few nftables JSON expressions (libnftables' JSON schema, `man
libnftables-json`) the netfilter table is made of, one builder each.

They return plain JSON values (lists and dicts), ready for `Nftables.json_cmd`.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Union

from kpng_py.model import IPAddress, IPFamily, Protocol

Json = Any
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

# The payload protocol of an address of each family, and the nfproto value.
_IP = {IPFamily.V4: "ip", IPFamily.V6: "ip6"}
NFPROTO = {IPFamily.V4: "ipv4", IPFamily.V6: "ipv6"}
ADDR_TYPE = {IPFamily.V4: "ipv4_addr", IPFamily.V6: "ipv6_addr"}
# Loopback: never a node-port address for packets from outside (CVE-2020-8558).
LOOPBACK = {IPFamily.V4: ipaddress.ip_network("127.0.0.0/8"),
            IPFamily.V6: ipaddress.ip_network("::1/128")}


def l4proto(protocol: Protocol) -> str:
    return protocol.value.lower()


def meta(key: str) -> Json:
    return {"meta": {"key": key}}


def addr(family: IPFamily, field: str) -> Json:
    """`ip saddr`, `ip6 daddr`, ..."""
    return {"payload": {"protocol": _IP[family], "field": field}}


def dport() -> Json:
    return {"payload": {"protocol": "th", "field": "dport"}}


def match(left: Json, right: Json, op: str = "==") -> Json:
    return {"match": {"op": op, "left": left, "right": right}}


def prefix(network: Network) -> Json:
    return {"prefix": {"addr": str(network.network_address), "len": network.prefixlen}}


def anonymous_set(values: list[Json]) -> Json:
    return {"set": values}


def concat(*parts: Json) -> Json:
    return {"concat": list(parts)}


def vmap(key: Json, data: Json) -> Json:
    return {"vmap": {"key": key, "data": data}}


def goto(chain: str) -> Json:
    return {"goto": {"target": chain}}


def jump(chain: str) -> Json:
    return {"jump": {"target": chain}}


def verdict(kind: str, chain: str = "") -> Json:
    """`drop`, `accept`, `return`, or `goto`/`jump` to `chain`."""
    return {kind: {"target": chain}} if chain else {kind: None}


def frontend_key(family: IPFamily) -> Json:
    """`ip daddr . meta l4proto . th dport`: what service maps are keyed by."""
    return concat(addr(family, "daddr"), meta("l4proto"), dport())


def port_key() -> Json:
    """`meta l4proto . th dport`: what node-port maps are keyed by."""
    return concat(meta("l4proto"), dport())


def fib_local() -> Json:
    """`fib daddr type local`: the destination is one of the node's addresses."""
    return match({"fib": {"result": "type", "flags": ["daddr"]}}, "local")


def ct_new() -> Json:
    return match({"ct": {"key": "state"}}, "new", op="in")


def mark_or(bits: int) -> Json:
    """`meta mark set meta mark | bits`."""
    return {"mangle": {"key": meta("mark"), "value": {"|": [meta("mark"), bits]}}}


def mark_xor(bits: int) -> Json:
    return {"mangle": {"key": meta("mark"), "value": {"^": [meta("mark"), bits]}}}


def mark_unset(bits: int) -> Json:
    """`meta mark & bits == 0`."""
    return match({"&": [meta("mark"), bits]}, 0)


def masquerade() -> Json:
    return {"masquerade": {"flags": ["fully-random"]}}


def dnat(ip: IPAddress, port: int) -> Json:
    return {"dnat": {"family": _IP[IPFamily(ip.version)], "addr": str(ip), "port": port}}


def set_update(family: IPFamily, name: str) -> Json:
    """`update @name { ip saddr }`: (re)start the client's timeout in `name`."""
    return {"set": {"op": "update", "elem": addr(family, "saddr"), "set": f"@{name}"}}


def reject_tcp_reset() -> list[Json]:
    return [match(meta("l4proto"), "tcp"), {"reject": {"type": "tcp reset"}}]


def reject_port_unreachable() -> list[Json]:
    return [{"reject": {"type": "icmpx", "expr": "port-unreachable"}}]


def numgen_random(modulus: int) -> Json:
    return {"numgen": {"mode": "random", "mod": modulus, "offset": 0}}
