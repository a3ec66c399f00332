"""The `service` of a services item as generators write a plain ClusterIP
service, read with one regular expression and written straight to its bytes.

What `yaml.dump` writes for `{namespace, name, type, ips: {clusterips: {v4}},
ports: [{name, protocol, port, targetport}]}`, its keys in this order or
sorted (the item's text without its endpoints, which fastendpoints.py reads).
Read only when every scalar is a plain one that PyYAML reads as a string (the
names, the type, IPv4 addresses) or an int (protocol 1, 2 or 3, port
1..65535, target port 0..65535), and the names have no '/'; anything else is
read as before (blockyaml, then the strict reader on doubt), which reads what
this reads the same (tests/brain/test_fastservices.py).
"""

from __future__ import annotations

import re

from kpng_py.api import localv1
from kpng_py.brain.blockyaml import NotBlockStyle, Scalars
from kpng_py.brain.fastendpoints import SCALAR, ipv4_set
from kpng_py.brain.protowire import VARINT, delimited, key, varint
from kpng_py.model import MAX_PORT

_V4 = rf"    ips:\n      clusterips:\n        v4:\n(?P<v4>(?:        - {SCALAR}\n)+)"
_PORTS = r"    ports:\n(?P<ports>(?:    - name: {s}\n(?:      [a-z]+: {s}\n){{3}})+)".format(
    s=SCALAR)


def _line(name: str) -> str:
    return rf"    {name}: (?P<{name}>{SCALAR})\n"


# The head as given (keys in the order above) or sorted, and the order of a
# port's keys after its name in each.
_LAYOUTS = (
    (re.compile("- service:\n" + _line("namespace") + _line("name") + _line("type") + _V4
                + _PORTS), ("protocol", "port", "targetport")),
    (re.compile("- service:\n" + _V4 + _line("name") + _line("namespace") + _PORTS
                + _line("type")), ("port", "protocol", "targetport")),
)
_PORT_ITEM = re.compile(r"    - name: ({s})\n      ([a-z]+): ({s})\n      ([a-z]+): ({s})\n"
                        r"      ([a-z]+): ({s})\n".format(s=SCALAR))
_PROTOCOLS = (localv1.TCP, localv1.UDP, localv1.SCTP)
_NAMESPACE, _NAME, _TYPE = (key(localv1.Service, f) for f in ("Namespace", "Name", "Type"))
_IPS, _CLUSTER_IPS = key(localv1.Service, "IPs"), key(localv1.ServiceIPs, "ClusterIPs")
_PORTS_KEY = key(localv1.Service, "Ports")
_PORT_NAME = key(localv1.PortMapping, "Name")
_PORT_NUMBERS = tuple(key(localv1.PortMapping, f, VARINT)
                      for f in ("Protocol", "Port", "TargetPort"))


def fast_service(head: str, scalars: Scalars) -> tuple[str, str, bytes] | None:
    """The service's namespace, name and serialized localv1.Service; None
    when the head is not one read here."""
    for layout, port_keys in _LAYOUTS:
        match = layout.fullmatch(head)
        if match is not None:
            try:
                return _service(match, port_keys, scalars)
            except NotBlockStyle:
                return None
    return None


def _service(match: re.Match[str], port_keys: tuple[str, ...],
             scalars: Scalars) -> tuple[str, str, bytes] | None:
    read = scalars.read
    namespace, name, kind = (read(match[k]) for k in ("namespace", "name", "type"))
    if (type(namespace) is not str or type(name) is not str or type(kind) is not str
            or "/" in namespace or "/" in name or "/" in kind):
        return None
    ips = ipv4_set(match["v4"])
    if ips is None:
        return None
    ports = []
    for port_name, *pairs in _PORT_ITEM.findall(match["ports"]):
        if tuple(pairs[0::2]) != port_keys:
            return None
        numbers = dict(zip(port_keys, map(read, pairs[1::2])))
        port_text = read(port_name)
        protocol, port, target = numbers["protocol"], numbers["port"], numbers["targetport"]
        if (type(port_text) is not str or type(protocol) is not int
                or type(port) is not int or type(target) is not int
                or protocol not in _PROTOCOLS or not 1 <= port <= MAX_PORT
                or not 0 <= target <= MAX_PORT):
            return None
        wire = [delimited(_PORT_NAME, port_text.encode())]
        for field, number in zip(_PORT_NUMBERS, (protocol, port, target)):
            if number:
                wire += (field, varint(number))
        ports.append(delimited(_PORTS_KEY, b"".join(wire)))
    service = (delimited(_NAMESPACE, namespace.encode()) + delimited(_NAME, name.encode())
               + delimited(_TYPE, kind.encode())
               + delimited(_IPS, delimited(_CLUSTER_IPS, ips)) + b"".join(ports))
    return namespace, name, service
