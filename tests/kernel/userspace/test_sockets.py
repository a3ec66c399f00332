"""The socket filter that drops clients from outside (N8) or outside
loadBalancerSourceRanges (N13), in the kernel: a namespace of its own,
datagrams between addresses on its loopback."""

from __future__ import annotations

import json
import sys

import pytest

from lab.netns import netns
from lab.proxy_node import REPO
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

# In the namespace: a receiver whose filter allows `networks` and many host
# addresses besides (a program far beyond an 8-bit jump), and one sender
# per source.
_PROBE = """
import ipaddress, json, socket, sys
from backends.userspace.sockets import attach_source_filter
family, receiver, networks, sources, extra = json.loads(sys.argv[1])
af = socket.AF_INET6 if family == 6 else socket.AF_INET
others = [ipaddress.ip_network(ipaddress.ip_address(receiver) + 1000 + i) for i in range(extra)]
sock = socket.socket(af, socket.SOCK_DGRAM)
sock.bind((receiver, 5000))
attach_source_filter(sock, family, [*map(ipaddress.ip_network, networks), *others])
sock.settimeout(0.5)
got = {}
for source in sources:
    with socket.socket(af, socket.SOCK_DGRAM) as sender:
        sender.bind((source, 0))
        sender.sendto(source.encode(), (receiver, 5000))
    try:
        got[source] = sock.recv(100).decode() == source
    except TimeoutError:
        got[source] = False
print(json.dumps(got))
"""


@pytest.mark.parametrize("family, networks, passed, dropped", [
    # A mask inside the last word, loopback allowed as a network.
    (4, ["10.1.0.0/31", "127.0.0.0/8"], ["10.1.0.1", "127.0.0.1"], ["10.1.0.2"]),
    (6, ["fd00:1::/127", "::1/128"], ["fd00:1::1", "::1"], ["fd00:1::2"]),
    # Loopback not listed: refused like any other source.
    (4, ["10.1.0.1/32"], ["10.1.0.1"], ["10.1.0.2", "127.0.0.1"]),
    # A mask in a middle word of an IPv6 address.
    (6, ["fd00:1:0:8000::/49"], ["fd00:1:0:8001::1"], ["fd00:1::1", "::1"]),
    # Nothing allowed: everything dropped.
    (4, [], [], ["10.1.0.1", "127.0.0.1"]),
], ids=["v4-prefix", "v6-prefix", "v4-no-loopback", "v6-middle-word", "v4-none"])
def test_only_sources_in_the_allowed_networks_pass(family, networks, passed, dropped):
    require_root()
    receiver = "10.1.0.9" if family == 4 else "fd00:1::9"
    with netns("kpf") as ns:
        for ip in {receiver, *passed, *dropped} - {"127.0.0.1", "::1"}:
            ns.ip("addr", "add", ip, "dev", "lo", *(["nodad"] if family == 6 else []))
        done = ns.run(sys.executable, "-c", _PROBE, json.dumps(
            [family, receiver, networks, passed + dropped, 300 if family == 4 else 120]),
            cwd=REPO)
    assert json.loads(done.stdout) == {**{s: True for s in passed}, **{s: False for s in dropped}}
