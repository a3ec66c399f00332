"""The NodePort e2e topology itself (lab/multinode.py), before any proxy:
pods reach each other across the nodes and see each other's own addresses,
the external client reaches the nodes but no pod, a VIP dies at node1 (and
a pod's packet to one is counted as escaped); with a kube-proxy-like NAT
by hand in node1, its NodePort and a VIP reach pods on either node, with the
client's address masqueraded or kept; teardown leaves nothing."""

from __future__ import annotations

import errno
import functools
import shutil

import pytest

from lab import clients, teardown
from lab.cluster import families_of_mode
from lab.multinode import MultiNodeCluster, vip
from lab.names import RunNames
from lab.procs import in_namespace, run, wait_until
from lab.servers import peer_server_command
from tests.support.kernel import require_root_bpf

pytestmark = pytest.mark.kernel

PORT = 7100
UNREACHABLE = (errno.errorcode[errno.EHOSTUNREACH], errno.errorcode[errno.EACCES])


def _listening(netns: str) -> bool:
    out = run(in_namespace(netns, ["ss", "-Hlntu", f"sport = :{PORT}"])).stdout
    return {line.split()[0] for line in out.splitlines()} >= {"tcp", "udp"}


def _reference_nat(cluster: MultiNodeCluster) -> str:
    """node1: its port 30100 to n2-a, masqueraded; VIP 1 to n1-a, the
    client's address kept."""
    rules = []
    for family in cluster.families:
        ip = "ip" if family.version == 4 else "ip6"

        def to(pod: str) -> str:
            return clients.host_literal(cluster.pods[pod].ip(family))

        rules += [f"{ip} daddr {cluster.nodes[0].ip(family)} udp dport 30100 meta mark set 1 "
                  f"dnat {ip} to {to('n2-a')}:{PORT}",
                  f"{ip} daddr {vip(family, 1)} tcp dport {PORT} dnat {ip} to {to('n1-a')}:{PORT}"]
    return ("table inet reference {\n"
            "  chain prerouting { type nat hook prerouting priority dstnat; policy accept;\n"
            + "".join(f"    {rule}\n" for rule in rules) + "  }\n"
            "  chain postrouting { type nat hook postrouting priority srcnat; policy accept;\n"
            "    meta mark 1 masquerade\n  }\n}\n")


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
            cluster.spawn_in_pod(pod, "whoami", peer_server_command(pod.name, PORT))
            wait_until(f"whoami in {pod.name}", functools.partial(_listening, pod.netns), 10.0)
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
        # What a proxy's packet path does (kube-proxy's nftables mode, by
        # hand): the topology carries it both ways, to either node's pod.
        run(in_namespace(node1.netns, ["nft", "-f", "-"]), stdin=_reference_nat(cluster))
        for family in cluster.families:
            masqueraded = clients.ask(external, node1.ip(family), 30100, udp=True)
            assert masqueraded.pods == {"n2-a": 1}, masqueraded.describe()
            assert masqueraded.answers[0].seen_as == node1.ip(family)
            assert masqueraded.answers[0].source == (str(node1.ip(family)), 30100)
            kept = clients.ask(external, vip(family, 1), PORT)  # routed to node1 by ext
            assert kept.pods == {"n1-a": 1}, kept.describe()
            assert kept.answers[0].seen_as == external.ip(family)
            second = cluster.external_source(family, second=True)  # only when bound to
            bound = clients.ask(external, vip(family, 1), PORT, source=second)
            assert bound.answers and bound.answers[0].seen_as == second, bound.describe()
    finally:
        problems = teardown.remove_run(names)
    assert problems == []
    assert teardown.leftovers(names) == []
