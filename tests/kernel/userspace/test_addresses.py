"""`--interface`: the backend manages only an interface that is its own.

Each test runs the backend (`node_driver`) in a network namespace of its own,
with links made there; nothing touches the host's interfaces.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Callable, Iterator

import pytest

from backends.userspace.context import MARKER
from kpng_py.model import Protocol, ServicePortChanges
from lab.netns import NetNS, netns
from lab.proxy_node import (
    REPO,
    NodeBackend,
    SetupRefused,
    addresses,
    node_starter,
    service_port,
)
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

STALE = ("10.96.5.5/32", "fd00:10:96::5/128")
SERVED = ("10.96.0.20/32", "fd00:10:96::20/128")
# Addresses of kinds the backend never removes: not host addresses, or link-local.
FOREIGN = ("192.0.2.1/24", "fd00:99::1/64", "fe80::99/128")


@pytest.fixture
def ns() -> Iterator[NetNS]:
    require_root()
    with netns() as the_ns:
        yield the_ns


@pytest.fixture
def start(ns: NetNS) -> Iterator[Callable[..., NodeBackend]]:
    with node_starter(ns) as start_backend:
        yield start_backend


def _add_link(ns: NetNS, name: str, kind: str, *held: str, alias: str = "") -> None:
    """A link, up, holding the addresses `held`; kind "own" is what the backend would
    create here (a dummy, or a bridge on kernels without the dummy driver)."""
    if kind == "own":
        try:
            ns.ip("link", "add", name, "type", "dummy")
        except subprocess.CalledProcessError:
            ns.ip("link", "add", name, "type", "bridge")
    elif kind == "veth":
        ns.ip("link", "add", name, "type", "veth", "peer", "name", f"{name}p")
    else:
        ns.ip("link", "add", name, "type", kind)
    if alias:
        ns.ip("link", "set", "dev", name, "alias", alias)
    ns.ip("link", "set", name, "up")
    for address in held:
        ns.ip("addr", "add", address, "dev", name, *(["nodad"] if ":" in address else []))


def _alias(ns: NetNS, name: str) -> str | None:
    return json.loads(ns.ip("-j", "-d", "link", "show", "dev", name).stdout)[0].get("ifalias")


def _full(*cluster_ips: str) -> ServicePortChanges:
    return ServicePortChanges(added=(service_port("web", Protocol.TCP, cluster_ips, 80),),
                              full=True)


def test_the_loopback_interface_is_refused_even_when_marked(ns, start):
    ns.ip("link", "set", "dev", "lo", "alias", MARKER)
    before = addresses(ns, "lo")
    assert {"127.0.0.1/8", "::1/128"} <= before
    with pytest.raises(SetupRefused, match=r"'lo'.*loopback.*--interface"):
        start("--interface", "lo")
    assert addresses(ns, "lo") == before


@pytest.mark.parametrize("kind, alias, reason", [
    ("veth", "", "veth link"),
    ("veth", MARKER, "veth link"),
    ("own", "", "not marked as kpng-py's"),
    ("own", "an operator's dummy", "not marked as kpng-py's"),
    ("bridge-with-port", MARKER, "bridge with 1 port"),
])
def test_a_link_that_is_not_the_backends_own_is_refused_and_left_untouched(
        ns, start, kind, alias, reason):
    if kind == "bridge-with-port":
        _add_link(ns, "kpbr0", "bridge", *STALE, *FOREIGN, alias=alias)
        _add_link(ns, "kpport0", "veth")
        ns.ip("link", "set", "kpport0", "master", "kpbr0")
        name = "kpbr0"
    else:
        name = "kpother0"
        _add_link(ns, name, kind, *STALE, *FOREIGN, alias=alias)
    before = addresses(ns, name)
    with pytest.raises(SetupRefused) as refused:
        start("--interface", name)
    message = str(refused.value)
    assert f"{name!r}" in message and reason in message and "--interface" in message
    # Marking helps only an interface of a kind the backend creates.
    assert (f"ip link set dev {name} alias '{MARKER}'" in message) == (kind == "own")
    assert addresses(ns, name) == before
    assert _alias(ns, name) == (alias or None)


def test_a_marked_interface_is_adopted_and_only_stale_cluster_ips_are_removed(ns, start):
    _add_link(ns, "kpown0", "own", *STALE, *FOREIGN, alias=MARKER)
    start("--interface", "kpown0").apply(_full(*(a.split("/")[0] for a in SERVED)))
    held = addresses(ns, "kpown0")
    assert set(SERVED) <= held and set(FOREIGN) <= held
    assert not set(STALE) & held


def test_the_interface_the_backend_creates_is_marked_and_adopted_by_the_next_run(ns, start):
    first = start()
    first.apply(_full("10.96.5.5"))
    first.close()
    assert _alias(ns, "kpng-py0") == MARKER
    start().apply(_full("10.96.0.20"))
    assert {"10.96.0.20/32"} <= addresses(ns, "kpng-py0")
    assert "10.96.5.5/32" not in addresses(ns, "kpng-py0")


def test_upgrade_an_unmarked_default_interface_holding_only_cluster_ips_is_adopted(ns, start):
    """An earlier version created kpng-py0 without the marker: it is adopted
    and marked, so the upgraded node serves without anyone's help."""
    _add_link(ns, "kpng-py0", "own", *STALE, "fe80::99/128")
    start().apply(_full("10.96.0.20"))
    assert _alias(ns, "kpng-py0") == MARKER
    held = addresses(ns, "kpng-py0")
    assert {"10.96.0.20/32", "fe80::99/128"} <= held and not set(STALE) & held


def test_upgrade_an_unmarked_default_interface_holding_other_addresses_is_refused(ns, start):
    _add_link(ns, "kpng-py0", "own", *STALE, "192.0.2.1/24")
    before = addresses(ns, "kpng-py0")
    with pytest.raises(SetupRefused, match=r"'kpng-py0'.*not marked.*holds 192\.0\.2\.1/24"):
        start()
    assert addresses(ns, "kpng-py0") == before and _alias(ns, "kpng-py0") is None


def test_to_userspace_refuses_lo_with_an_error_that_names_the_fix(ns, tmp_path):
    """As an operator runs it: the command exits 2 with the reason; `lo` keeps
    its addresses. (The brain's socket does not exist: setup comes first.)"""
    before = addresses(ns, "lo")
    done = subprocess.run(ns.exec_args(
        sys.executable, "-m", "kpng_py.cmd.cli", "local", "--api", f"unix://{tmp_path}/brain.sock",
        "to-userspace", "--interface", "lo"), cwd=REPO, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 2, done.stderr
    assert "kpng-py: error: refusing to manage the interface 'lo'" in done.stderr
    assert "Traceback" not in done.stderr
    assert addresses(ns, "lo") == before
