"""The endpoints of a services item as generators write them, read a whole
endpoint at a time.

A 10 000-service file has 100 000 endpoints and a million lines; read line by
line into plain values, then field by field into protobuf messages, they
were most of the brain's start (80 us each). Generated files write them all
alike (`yaml.dump` of `{podname, endpoint: {ips: {v4}, portoverrides},
topology: {node}}`, its keys in this order or sorted), so one regular
expression matches one endpoint in C, and its bytes are written straight
from the few scalars it holds.

This reads only what it can vouch for: IPv4 addresses, port overrides with a
name and a port in 1..65535, a pod name and a node, each a plain scalar that
PyYAML reads as a string (or, for a port, an int). Anything else in any
endpoint of the item (comments, other keys, quoting, another order, an IPv6
address, a bad address) makes it decline the whole item, which is then read
as before (`blockyaml`, then the strict reader on doubt): what it reads, the
other readers read the same (tests/brain/test_fastendpoints.py).
"""

from __future__ import annotations

import re

from kpng_py.api import localv1
from kpng_py.brain.blockyaml import NotBlockStyle, Scalars
from kpng_py.brain.protowire import SHORT_VARINTS, VARINT, delimited, key, varint
from kpng_py.model import MAX_PORT

# A plain scalar of a safe alphabet (no space, colon, quote, `#`, indicator
# first): its line reads as `key: value` or `- value` and nothing else.
SCALAR = r"[A-Za-z0-9_./][A-Za-z0-9_./-]*"
_ENDPOINT = (rf"    endpoint:\n      ips:\n        v4:\n(?P<v4>(?:        - {SCALAR}\n)+)"
             r"      portoverrides:\n"
             rf"(?P<overrides>(?:      - name: {SCALAR}\n        port: {SCALAR}\n)+)")
_TOPOLOGY = rf"    topology:\n      node: (?P<node>{SCALAR})\n"
# One endpoint entry of `endpoints:` (at indent 2), keys as yaml.dump writes
# them: in the order given (podname first) or sorted.
_ENTRIES = (
    re.compile(rf"  - podname: (?P<pod>{SCALAR})\n" + _ENDPOINT + _TOPOLOGY),
    re.compile("  - " + _ENDPOINT[4:] + rf"    podname: (?P<pod>{SCALAR})\n" + _TOPOLOGY),
)
_V4_ITEM = re.compile(rf"        - ({SCALAR})\n")
_OVERRIDE_ITEM = re.compile(rf"      - name: ({SCALAR})\n        port: ({SCALAR})\n")
# Dotted quads that ipaddress reads as IPv4 (no leading zeros, each <= 255):
# most addresses of a big file, checked without building an address.
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                   r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")
_ENDPOINTS_LAST = "\n  endpoints:\n"
_ENDPOINTS_FIRST = "- endpoints:\n"
# A key of the services item, after its endpoints.
_NEXT_KEY = re.compile(r"  [A-Za-z0-9_]")


# An endpoint read here: its pod name (its key), its serialized localv1.Endpoint
# (without Local and Scopes), where Local belongs in those bytes (before
# PortOverrides) and its node. Ready, without zone hints.
FastEndpoint = tuple[str, bytes, int, str]


_IPS = key(localv1.Endpoint, "IPs")
_V4 = key(localv1.IPSet, "V4")
_OVERRIDE = key(localv1.Endpoint, "PortOverrides")
_NAME = key(localv1.PortName, "Name")
_PORT = key(localv1.PortName, "Port", VARINT)


def ipv4_set(block: str) -> bytes | None:
    """The bytes of a localv1.IPSet of the IPv4 addresses listed in `block`
    (`        - ADDRESS` lines); None if one is not an IPv4 address."""
    ipset = []
    for ip in _V4_ITEM.findall(block):
        # A dotted quad is a string to YAML 1.1 (no int, float or timestamp
        # reads as one): no need to resolve it.
        if not IPV4.fullmatch(ip):
            return None
        ipset.append(_V4 + SHORT_VARINTS[len(ip)] + ip.encode())  # at most 15 bytes
    return b"".join(ipset)


class FastEndpoints:
    """Reads the endpoints of the items of one file. The port overrides of
    an endpoint are usually those of every endpoint of the file: each text of
    them is read once."""

    def __init__(self, scalars: Scalars) -> None:
        self._read = scalars.read
        self._overrides: dict[str, bytes | None] = {}

    def split(self, item: str) -> tuple[str, list[FastEndpoint]] | None:
        """The item without its endpoints (a services item with only
        `service`) and its endpoints; None when any endpoint is not one read
        here, or two have one pod name. The endpoints come last (keys in
        the order given) or first (sorted) in the item."""
        if item.startswith(_ENDPOINTS_FIRST):
            head, body = "", item[len(_ENDPOINTS_FIRST):]
        else:
            at = item.find(_ENDPOINTS_LAST)
            if at < 0:
                return None
            head, body = item[:at + 1], item[at + len(_ENDPOINTS_LAST):]
        endpoints: list[FastEndpoint] = []
        pos, end = 0, len(body)
        first, second = _ENTRIES
        try:
            while pos < end:
                match = first.match(body, pos) or second.match(body, pos)
                if match is None:
                    break
                endpoint = self._endpoint(match)
                if endpoint is None:
                    return None
                endpoints.append(endpoint)
                pos = match.end()
        except NotBlockStyle:
            return None
        if pos < end:  # only the item's next key may follow endpoints that come first
            if head or not _NEXT_KEY.match(body, pos):
                return None
            head = "- " + body[pos + 2:]
        if not endpoints or len({e[0] for e in endpoints}) < len(endpoints):
            return None
        return head, endpoints

    def _endpoint(self, match: re.Match[str]) -> FastEndpoint | None:
        read = self._read
        pod, node = read(match["pod"]), read(match["node"])
        if type(pod) is not str or type(node) is not str:
            return None
        ipset = ipv4_set(match["v4"])
        if ipset is None:
            return None
        ips = delimited(_IPS, ipset)
        overrides_text = match["overrides"]
        overrides = self._overrides.get(overrides_text)
        if overrides is None:
            overrides = self._overrides[overrides_text] = self._port_overrides(overrides_text)
        if not overrides:
            return None
        return pod, ips + overrides, len(ips), node

    def _port_overrides(self, text: str) -> bytes:
        """The overrides' bytes; empty if one is not read here."""
        read = self._read
        wire = []
        for name_text, port_text in _OVERRIDE_ITEM.findall(text):
            name, port = read(name_text), read(port_text)
            if type(name) is not str or type(port) is not int or not 1 <= port <= MAX_PORT:
                return b""
            wire.append(delimited(_OVERRIDE, delimited(_NAME, name.encode())
                                   + _PORT + varint(port)))
        return b"".join(wire)
