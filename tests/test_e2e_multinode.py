"""The NodePort e2e topology itself (lab/multinode.py), before any proxy:
pods reach each other across the nodes and see each other's own addresses,
the external client reaches the nodes but no pod, a VIP dies at node1 (and
a pod's packet to one is counted as escaped), teardown leaves nothing."""

from __future__ import annotations

import errno
import shutil
import sys
from pathlib import Path

import pytest

from lab import clients, teardown
from lab.cluster import families_of_mode
from lab.multinode import MultiNodeCluster, vip
from lab.names import RunNames
from lab.procs import in_namespace, run, wait_until
from tests.support.kernel import require_root_bpf

pytestmark = pytest.mark.kernel

WHOAMI = str(Path(__file__).resolve().parents[1] / "lab" / "whoami_server.py")
PORT = 7100
UNREACHABLE = (errno.errorcode[errno.EHOSTUNREACH], errno.errorcode[errno.EACCES])


def _listening(netns: str) -> bool:
    out = run(in_namespace(netns, ["ss", "-Hlntu", f"sport = :{PORT}"])).stdout
    return {line.split()[0] for line in out.splitlines()} >= {"tcp", "udp"}


def test_two_nodes_and_an_external_client():
    require_root_bpf()
    if shutil.which("nft") is None:
        pytest.skip("needs nft (hack/setup.sh installs it)")
    names = RunNames.for_this_process()
    cluster = MultiNodeCluster(names, families_of_mode("dual"), names.make_workdir())
    try:
        cluster.build([["n1-a"], ["n2-a"]])
        a, b = cluster.pods["n1-a"], cluster.pods["n2-a"]
        for pod in (a, b):
            cluster.spawn_in_pod(pod, "whoami", [sys.executable, WHOAMI, pod.name, str(PORT)])
            wait_until(f"whoami in {pod.name}", lambda p=pod: _listening(p.netns), 10.0)
        external = cluster.external
        assert external is not None
        node1 = cluster.nodes[0]
        for family in cluster.families:
            for udp in (False, True):  # across the nodes, no NAT on the way
                sample = clients.ask(a, b.ip(family), PORT, udp=udp)
                assert sample.pods == {"n2-a": 1}, sample.describe()
                assert sample.answers[0].seen_as == a.ip(family)
            # The node's host is a client too, in its node's cgroup.
            sample = clients.ask(node1.host, b.ip(family), PORT)
            assert sample.answers and sample.answers[0].seen_as == node1.ip(family)
            answer = clients.probe(external, "connect", str(node1.ip(family)), "22")
            assert answer["errno"] == "ECONNREFUSED"  # the node itself, nothing listens
            assert not clients.ask(external, a.ip(family), PORT, timeout=0.5).answers
            # A VIP: routed to node1, which has no route for it.
            answer = clients.probe(external, "connect", str(vip(family, 0)), str(PORT))
            assert answer["errno"] in UNREACHABLE
            before = cluster.escaped_packets(family)
            answer = clients.probe(a, "connect", str(vip(family, 0)), str(PORT))
            assert answer["errno"] in UNREACHABLE
            assert cluster.escaped_packets(family) > before
    finally:
        problems = teardown.remove_run(names)
    assert problems == []
    assert teardown.leftovers(names) == []
