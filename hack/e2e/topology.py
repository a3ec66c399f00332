"""The NodePort topology (`-t nodeport`): two nodes on one network, each with
its server pods, a client pod and its own backend watching the one brain,
and an external client on the network (lab/multinode.py, docs/e2e.md).

    node1: n1-srv0, n1-srv1, n1-client     node2: n2-srv0, n2-srv1, n2-client
    ext:   the external client (routes: the network, the VIP range via node1)

Every server pod runs the servers of lab/servers.py and lab/peer_server.py
(TCP and UDP WHOAMI_PORT: the pod's name and the client address it saw).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from e2e.proxy import BackendKind, ControlPlane, Seat
from e2e.statefile import ClusterState, ServiceSpec
from lab import clients
from lab.backends import LabPlaces
from lab.cluster import Family, Pod
from lab.multinode import MultiNodeCluster, Node, node_names
from lab.names import RunNames
from lab.pods import PodNetworkError
from lab.procs import in_namespace, run, wait_until
from lab.servers import peer_server_command, start_servers, wait_listening

log = logging.getLogger("e2e")

WHOAMI_PORT = 7100
NODE_COUNT = 2
SERVERS_PER_NODE = 2


def pod_names(node_index: int) -> list[str]:
    return [*(f"n{node_index}-srv{i}" for i in range(SERVERS_PER_NODE)), f"n{node_index}-client"]


def nodeport_places(names: RunNames) -> list[LabPlaces]:
    """Where the run's backends keep their dataplanes (also for the clean-up
    of a dead run's, which knows only its names)."""
    return [node_names(names, i, ()).places for i in range(1, NODE_COUNT + 1)]


@dataclass(frozen=True)
class NodePortEnv:
    """What a NodePort check needs (e2e.expect.CheckEnv)."""

    cluster: MultiNodeCluster
    control: ControlPlane
    kind: BackendKind
    base_state: ClusterState

    @property
    def families(self) -> tuple[Family, ...]:
        return self.cluster.families

    @property
    def client(self) -> Pod:
        """The external client."""
        assert self.cluster.external is not None
        return self.cluster.external

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.cluster.nodes

    def servers(self, node: Node | None = None) -> list[Pod]:
        """The server pods (of `node`)."""
        pods = self.cluster.pods_on(node) if node else list(self.cluster.pods.values())
        return [p for p in pods if "-srv" in p.name]

    def pod_client(self, node: Node) -> Pod:
        return next(p for p in self.cluster.pods_on(node) if p.name.endswith("-client"))

    def seat(self, node: Node) -> Seat:
        return next(s for s in self.control.seats if s.node_name == node.name)

    def shared(self, name: str) -> ServiceSpec:
        return next(s for s in self.base_state.services if s.name == name)


def seats(cluster: MultiNodeCluster) -> list[Seat]:
    return [Seat(node.name, node.places, functools.partial(cluster.spawn_on, node),
                 label=f"{node.name}-backend") for node in cluster.nodes]


def build(cluster: MultiNodeCluster) -> None:
    """Namespaces, pods, servers; checks that pods reach each other across
    the nodes, and that the external client reaches the nodes and no pod."""
    began = time.monotonic()
    cluster.build([pod_names(i) for i in range(1, NODE_COUNT + 1)])
    servers = [p for p in cluster.pods.values() if "-srv" in p.name]
    for pod in servers:
        running = start_servers(cluster, pod)
        running.append(cluster.spawn_in_pod(pod, "whoami",
                                            peer_server_command(pod.name, WHOAMI_PORT)))
        wait_listening(pod, running)
        wait_until(f"whoami server of {pod.name}", functools.partial(_whoami_listening, pod), 10.0)
    for family in cluster.families:
        _check_network(cluster, servers, family)
    cluster.workdir.joinpath("topology.txt").write_text(describe(cluster))
    log.info("nodeport cluster %s up in %.1f s (%s)", cluster.names.tag,
             time.monotonic() - began, ", ".join(f.value for f in cluster.families))


def _whoami_listening(pod: Pod) -> bool:
    out = run(in_namespace(pod.netns, ["ss", "-Hlntu", f"sport = :{WHOAMI_PORT}"])).stdout
    return {line.split()[0] for line in out.splitlines()} >= {"tcp", "udp"}


def _check_network(cluster: MultiNodeCluster, servers: list[Pod], family: Family) -> None:
    """Before any proxy: every client pod reaches every server pod directly
    (across nodes, through the routes between them); the external client
    reaches every node and no pod."""
    external = cluster.external
    assert external is not None
    for node in cluster.nodes:
        client = next(p for p in cluster.pods_on(node) if p.name.endswith("-client"))
        for pod in servers:
            for udp in (False, True):
                sample = clients.ask(client, pod.ip(family), WHOAMI_PORT, udp=udp)
                if set(sample.pods) != {pod.name} or sample.answers[0].seen_as != client.ip(family):
                    raise PodNetworkError(
                        f"{client.name} cannot reach pod {pod.name} at {pod.ip(family)} "
                        f"{'UDP' if udp else 'TCP'} directly (or is not seen as itself): "
                        f"{sample.describe()}")
        answer = clients.probe(external, "connect", str(node.ip(family)), "22", "--timeout", "1")
        if answer.get("errno") != "ECONNREFUSED":
            raise PodNetworkError(f"the external client does not reach {node.name} at "
                                  f"{node.ip(family)} (a refused port 22 expected): {answer}")
    sample = clients.ask(external, servers[0].ip(family), WHOAMI_PORT, timeout=0.5)
    if sample.answers:
        raise PodNetworkError(f"the external client reaches pod {servers[0].name} directly: "
                              f"it must reach the nodes only; {sample.describe()}")


def describe(cluster: MultiNodeCluster) -> str:
    """Who is where, for the logs and -d."""
    lines = []
    for node in cluster.nodes:
        lines.append(f"{node.name}: netns {node.netns}, "
                     + ", ".join(str(node.ip(f)) for f in cluster.families)
                     + f"; cgroup {node.cgroup}")
        for pod in cluster.pods_on(node):
            lines.append(f"  {pod.name}: netns {pod.netns}, "
                         + ", ".join(str(ip) for ip in pod.ips))
    if cluster.external is not None:
        lines.append(f"external client: netns {cluster.external.netns}, "
                     + ", ".join(str(cluster.external_source(f, second))
                                 for f in cluster.families for second in (False, True)))
    return "\n".join(lines) + "\n"
