"""The socket filter that drops clients from outside (N8), in the kernel:
a namespace of its own, datagrams between addresses on its loopback."""

from __future__ import annotations

import json
import sys

import pytest

from lab.netns import netns
from lab.proxy_node import REPO
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

# In the namespace: a receiver with the filter, allowing `allowed` and many
# others (a program far beyond an 8-bit jump), and one sender per source.
_PROBE = """
import ipaddress, json, socket, sys
from backends.userspace.sockets import attach_source_filter
family, receiver, allowed, refused, extra = json.loads(sys.argv[1])
af = socket.AF_INET6 if family == 6 else socket.AF_INET
others = [ipaddress.ip_address(receiver) + 1000 + i for i in range(extra)]
sock = socket.socket(af, socket.SOCK_DGRAM)
sock.bind((receiver, 5000))
attach_source_filter(sock, family, [ipaddress.ip_address(allowed), *others])
sock.settimeout(0.5)
got = {}
for source in (allowed, refused, "::1" if family == 6 else "127.0.0.1"):
    with socket.socket(af, socket.SOCK_DGRAM) as sender:
        sender.bind((source, 0))
        sender.sendto(source.encode(), (receiver, 5000))
    try:
        got[source] = sock.recv(100).decode() == source
    except TimeoutError:
        got[source] = False
print(json.dumps(got))
"""


@pytest.mark.parametrize("family, receiver, allowed, refused, extra", [
    (4, "10.1.0.9", "10.1.0.1", "10.1.0.2", 300),
    (6, "fd00:1::9", "fd00:1::1", "fd00:1::2", 120),
])
def test_only_allowed_sources_and_loopback_pass(family, receiver, allowed, refused, extra):
    require_root()
    with netns("kpf") as ns:
        for ip in (receiver, allowed, refused):
            ns.ip("addr", "add", ip, "dev", "lo", *(["nodad"] if family == 6 else []))
        done = ns.run(sys.executable, "-c", _PROBE,
                      json.dumps([family, receiver, allowed, refused, extra]), cwd=REPO)
    loopback = "::1" if family == 6 else "127.0.0.1"
    assert json.loads(done.stdout) == {allowed: True, refused: False, loopback: True}
