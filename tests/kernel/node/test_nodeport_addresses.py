"""The node's addresses followed through netlink
(kpng_py/node/nodeport_addresses.py `LocalAddressFollower`), in a namespace
of the test's own."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from typing import Iterator

import pytest

from lab.netns import NetNS, netns
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

_FOLLOW = """
import json, sys
from kpng_py.node.nodeport_addresses import LocalAddressFollower

def show(found):
    print(json.dumps({"addresses": sorted(map(str, found.addresses)),
                      "primary": sorted(map(str, found.primary))}), flush=True)

follower = LocalAddressFollower(show, ignore_interfaces=["ignored0"])
show(follower.start())
sys.stdin.readline()
follower.stop()
print("stopped", flush=True)
"""


class Follower:
    """The follower in `ns`, its reports read as they come."""

    def __init__(self, ns: NetNS) -> None:
        self._process = subprocess.Popen(
            ns.exec_args(sys.executable, "-c", _FOLLOW), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.strip())

    def next_line(self) -> str:
        """The next report as written, or "stopped"."""
        return self._lines.get(timeout=20)

    def report(self) -> dict:
        """The next report."""
        line = self.next_line()
        assert line != "stopped", "the follower stopped instead of reporting"
        return json.loads(line)

    def stop(self) -> None:
        assert self._process.stdin is not None
        if self._process.poll() is None:
            self._process.stdin.write("\n")
            self._process.stdin.flush()
        self._process.wait(timeout=20)


@pytest.fixture
def node() -> Iterator[NetNS]:
    require_root()
    with netns("kpna") as ns:
        # no dummy driver on every kernel: a veth pair inside the namespace, and a bridge
        ns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth0peer")
        ns.ip("link", "set", "eth0peer", "up")
        ns.ip("link", "set", "eth0", "up")
        ns.ip("addr", "add", "10.0.0.5/24", "dev", "eth0", "nodad")
        ns.ip("-6", "addr", "add", "fd00::5/64", "dev", "eth0", "nodad")
        ns.ip("link", "add", "ignored0", "type", "bridge")
        ns.ip("link", "set", "ignored0", "up")
        ns.ip("addr", "add", "10.96.0.10/32", "dev", "ignored0")
        yield ns


def test_the_follower_sees_the_addresses_and_each_change(node: NetNS) -> None:
    """Loopback counts, link-local and the ignored interface's do not; an
    address added later, and one removed, are each one report."""
    follower = Follower(node)
    try:
        assert follower.report() == {"addresses": ["10.0.0.5", "127.0.0.1", "::1", "fd00::5"],
                                   "primary": []}
        node.ip("addr", "add", "10.0.1.7/24", "dev", "eth0")
        assert follower.report()["addresses"] == [
            "10.0.0.5", "10.0.1.7", "127.0.0.1", "::1", "fd00::5"]
        node.ip("addr", "del", "10.0.0.5/24", "dev", "eth0")
        assert follower.report()["addresses"] == ["10.0.1.7", "127.0.0.1", "::1", "fd00::5"]
        node.ip("route", "add", "default", "dev", "eth0")  # a route inside the namespace only
        assert follower.report()["primary"] == ["10.0.1.7"]
        node.ip("-6", "route", "add", "default", "dev", "eth0", "src", "fd00::5")
        assert follower.report()["primary"] == ["10.0.1.7", "fd00::5"]
    finally:
        follower.stop()
    assert follower.next_line() == "stopped"
