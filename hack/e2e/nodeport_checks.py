"""The NodePort topology's checks: docs/spec/node-port-behaviours.md,
N1-N19 (and N0, the topology's own sanity), named with the N number and, in
`upstream`, the Kubernetes e2e test that checks the same
(test/e2e/network/service.go).

Three services exist from the first sync (np: NodePort, web: NodePort for
HTTP and echo, local: LoadBalancer with externalTrafficPolicy Local and a
healthCheckNodePort); checks that change them get them back afterwards, as in
the service topology. Every other service is created by its check.

A behaviour that cannot apply to a backend is reported "n/a: <why>" (the
check's `not_applicable`), never a silent pass.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import signal
import time
from typing import Callable, Sequence

from e2e.checks import (
    DNS_UDP,
    ECHO_TCP,
    HTTP,
    SERVICE_PROXY_NAME,
    Applicability,
    Check,
    _judge_restart_loop,
    all_families,
    always,
    follow_udp_socket,
    loop_served_since,
    loop_under_way,
    register_in,
    stop_backend,
)
from e2e.expect import CheckFailed, CheckRun, refused_at_once
from e2e.proxy import BackendKind
from e2e.statefile import ZONE, ClusterState, EndpointRef, PortSpec, ServiceSpec
from e2e.topology import WHOAMI_PORT, NodePortEnv, describe
from lab import clients
from lab.clients import PeerSample, StreamingProbe, host_literal
from lab.cluster import Family, IPAddress, Pod
from lab.multinode import MultiNodeCluster, Node, vip
from lab.procs import in_namespace, run

NODEPORT_CHECKS: list[Check[NodePortEnv]] = []

# An expectation that binds its loop's variables as a lambda's defaults is
# marked `# type: ignore[misc]  # mypy#15459`: mypy cannot infer such a
# lambda against the Callable it is passed as (an open mypy bug; pyright can).

# N3, the one place to flip: whether a process on the node reaches a NodePort
# at the loopback address (127.0.0.1, ::1). A socket-level translation serves
# it safely (no route_localnet, CVE-2020-8558), as Cilium does; packets to
# 127/8 from outside are never accepted.
LOCALHOST_NODEPORTS_SERVED = True
SPREAD_ATTEMPTS = 32       # P(one of 4 endpoints unseen) = 4 * (3/4)^32 < 1e-3 per try
AFFINITY_BURST = 12
DROP_TIMEOUT = 1.0         # a dropped packet: no answer within this (a reset comes at once)
UDP_FOLLOW_TIMEOUT = 15.0  # stale conntrack entries go with the sync that removed the endpoint


def proxy_in_process(kind: BackendKind) -> bool:
    """A proxy whose dataplane is its own process (kube-proxy's userspace
    mode; lab.backends says it does not survive a restart): it opens
    the connection to the endpoint itself."""
    return not kind.survives_restart


def keeps_client_address(kind: BackendKind) -> str | None:
    if proxy_in_process(kind):
        return "userspace proxies do not keep the client's address (docs/userspace.md)"
    return None


def keeps_connections_across_restart(kind: BackendKind) -> str | None:
    if proxy_in_process(kind):
        return ("a proxy in a process cannot keep its connections across its own restart "
                "(S13 checks that it serves again)")
    return None


def nodeport_check(name: str, upstream: str, translated: bool = False,
                   not_applicable: Applicability = always, kube_cannot: str | None = None
                   ) -> Callable[[Callable[[CheckRun[NodePortEnv]], None]],
                                 Callable[[CheckRun[NodePortEnv]], None]]:
    """Register a check of this topology (every family of the cluster)."""
    return register_in(NODEPORT_CHECKS, name, upstream, all_families, translated,
                       not_applicable, kube_cannot)


# -- services -------------------------------------------------------------
def who(node_port: int) -> tuple[PortSpec, PortSpec]:
    """TCP and UDP to the whoami servers, on `node_port` of every node."""
    return (PortSpec("who-tcp", "TCP", WHOAMI_PORT, target_number=WHOAMI_PORT,
                     node_port=node_port),
            PortSpec("who-udp", "UDP", WHOAMI_PORT, target_number=WHOAMI_PORT,
                     node_port=node_port))


def vips(index: int) -> tuple[IPAddress, ...]:
    """VIP number `index` of each family (a service keeps its cluster's)."""
    return tuple(vip(f, index) for f in Family)


NP_PORT, LOCAL_PORT, HEALTH_PORT = 30100, 30200, 31200
WEB_HTTP = dataclasses.replace(HTTP, node_port=30080)
WEB_ECHO = dataclasses.replace(ECHO_TCP, node_port=30070)
LOCAL_LB = 1


def refs(cluster: MultiNodeCluster, pods: Sequence[Pod]) -> list[EndpointRef]:
    """Endpoints on the pods' own nodes."""
    return [EndpointRef(p, cluster.node_of[p.name].name) for p in pods]


def _servers(cluster: MultiNodeCluster, *names: str) -> list[Pod]:
    return [cluster.pods[n] for n in names]


def _local_endpoints(cluster: MultiNodeCluster) -> list[Pod]:
    """Two on node1, one on node2."""
    return _servers(cluster, "n1-srv0", "n1-srv1", "n2-srv0")


def base_state(cluster: MultiNodeCluster) -> ClusterState:
    servers = [p for p in cluster.pods.values() if "-srv" in p.name]
    local = ServiceSpec("local", 2, who(LOCAL_PORT), type="LoadBalancer",
                        lb_ips=vips(LOCAL_LB), external_traffic_local=True,
                        health_check_node_port=HEALTH_PORT)
    return ClusterState(cluster.families, (
        ServiceSpec("np", 0, who(NP_PORT), type="NodePort").with_endpoints(
            *refs(cluster, servers)),
        ServiceSpec("web", 1, (WEB_HTTP, WEB_ECHO), type="NodePort").with_endpoints(
            *refs(cluster, servers)),
        local.with_endpoints(*refs(cluster, _local_endpoints(cluster))),
    ), nodes=tuple((n.name, ZONE) for n in cluster.nodes))


# -- expectations ---------------------------------------------------------
def _where(ip: IPAddress | str, port: int, udp: bool) -> str:
    return f"{host_literal(ip)}:{port}/{'UDP' if udp else 'TCP'}"


def expect_answers(t: CheckRun[NodePortEnv], client: Pod, ip: IPAddress | str, port: int,
                   pods: Sequence[Pod], udp: bool = False, connected: bool = False,
                   source: IPAddress | None = None,
                   seen_as: set[IPAddress] | None = None,
                   attempts: int | None = None) -> PeerSample:
    """New sockets from `client` to ip:port reach every pod of `pods` and
    only them; getpeername() (TCP, connected UDP) or recvfrom() (unconnected
    UDP) names ip:port; the pods saw the client as one of `seen_as` if given."""
    names = {p.name for p in pods}
    want = (str(ip), port)
    unconnected = udp and not connected

    def problem(sample: PeerSample) -> str | None:
        if sample.failures or set(sample.pods) != names:
            return f"expected {', '.join(sorted(names))}; {sample.describe()}"
        for answer in sample.answers:
            if seen_as is not None and answer.seen_as not in seen_as:
                return (f"{answer.pod} saw the client as {answer.seen_as}, expected "
                        f"{' or '.join(sorted(str(a) for a in seen_as))}")
            got = answer.source if unconnected else answer.peer
            if got != want:
                call = "recvfrom()" if unconnected else "getpeername()"
                return f"{call} names {got}, expected {want}"
        return None

    count = attempts or (SPREAD_ATTEMPTS if len(pods) > 1 else 4)
    kind = "unconnected " if unconnected else ("connected " if udp else "")
    return t.eventually(
        f"{kind}{_where(ip, port, udp)} from {client.name}"
        + (f" (source {source})" if source else ""),
        lambda: clients.ask(client, ip, port, count, udp, connected, source,
                            until_failure=True), problem)


def expect_refused(t: CheckRun[NodePortEnv], client: Pod, ip: IPAddress | str, port: int,
                   udp: bool = False) -> dict:
    """connect() (TCP) or the first exchange (connected UDP: the ICMP port
    unreachable) fails at once with ECONNREFUSED."""
    return t.eventually(f"{_where(ip, port, udp)} from {client.name} rejected with "
                        "ECONNREFUSED within 1 s",
                        lambda: clients.probe(client, "connect", str(ip), str(port),
                                              *(["--udp"] if udp else [])), refused_at_once)


def expect_dropped(t: CheckRun[NodePortEnv], client: Pod, ip: IPAddress | str, port: int,
                   udp: bool = False, source: IPAddress | None = None) -> PeerSample:
    """No answer and no error: the packets are dropped (a timeout)."""
    def problem(sample: PeerSample) -> str | None:
        if sample.answers or set(sample.errors) != {"timeout"}:
            return f"expected a timeout (dropped); {sample.describe()}"
        return None

    return t.eventually(
        f"{_where(ip, port, udp)} from {client.name}" + (f" (source {source})" if source else "")
        + " dropped", lambda: clients.ask(client, ip, port, 2, udp, source=source,
                                          timeout=DROP_TIMEOUT), problem)


def expect_unanswered(t: CheckRun[NodePortEnv], client: Pod, ip: IPAddress | str,
                      port: int) -> PeerSample:
    """Nothing answers (refused, unreachable or a timeout: any failure)."""
    return t.eventually(f"{_where(ip, port, False)} from {client.name} not served",
                        lambda: clients.ask(client, ip, port, 2, timeout=DROP_TIMEOUT),
                        lambda s: s.describe() if s.answers else None)


def _one_pod(t: CheckRun[NodePortEnv], client: Pod, ip: IPAddress | str, port: int,
             among: Sequence[Pod]) -> str:
    """The one pod a burst of new connections (one after the other) reaches."""
    names = {p.name for p in among}

    def problem(sample: PeerSample) -> str | None:
        if sample.failures or len(sample.pods) != 1 or not set(sample.pods) <= names:
            return f"expected every connection to reach one same pod; {sample.describe()}"
        return None

    sample = t.eventually(f"{_where(ip, port, False)} from {client.name} with ClientIP "
                          "affinity", lambda: clients.ask(client, ip, port, AFFINITY_BURST,
                                                          until_failure=True), problem)
    return next(iter(sample.pods))


def _no_listener(node: Node, port: int) -> None:
    out = run(in_namespace(node.netns, ["ss", "-Hlntu", f"sport = :{port}"])).stdout
    if out.strip():
        raise CheckFailed(f"a socket still listens on port {port} in {node.name}: "
                          f"{' | '.join(out.splitlines())}")


def _node_addresses(node: Node, family: Family) -> set[IPAddress]:
    """The addresses a masqueraded client shows as: the node's own on the
    network, or its pods' gateway (the address towards a local pod)."""
    return {node.ip(family), node.plan(family).gateway}


# -- N0 -------------------------------------------------------------------
@nodeport_check("N0/clusterip-from-each-node", "(sanity of the topology) a ClusterIP from a "
                "pod of each node reaches the pods of both nodes", translated=True)
def clusterip_from_each_node(t: CheckRun[NodePortEnv]) -> None:
    env, np = t.env, t.env.shared("np")
    for node in env.nodes:
        client = env.pod_client(node)
        for udp in (False, True):
            t.each_family(f"{'UDP' if udp else 'TCP'} from {client.name}",
                          lambda f, c=client, u=udp:  # type: ignore[misc]  # mypy#15459
                          expect_answers(t, c, np.cluster_ip(f), WHOAMI_PORT, env.servers(),
                                         udp=u, connected=u))


# -- N1, N2, N3 -----------------------------------------------------------
_MODES = ((False, False, "TCP"), (True, True, "connected UDP"), (True, False, "unconnected UDP"))


@nodeport_check("N1/nodeport-from-outside", "should be able to create a functioning NodePort "
                "service [Conformance]")
def nodeport_from_outside(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    for node in env.nodes:
        for udp, connected, mode in _MODES:
            t.each_family(f"{mode} to {node.name}'s address", functools.partial(
                _node_port_answers, t, env.client, node, udp, connected))


@nodeport_check("N2/nodeport-from-own-node", "should be able to create a functioning NodePort "
                "service (from a pod and from the node to its own address)", translated=True)
def nodeport_from_own_node(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    for node in env.nodes:
        for client in (env.pod_client(node), node.host):
            for udp, connected, mode in _MODES:
                t.each_family(f"{mode} from {client.name}", functools.partial(
                    _node_port_answers, t, client, node, udp, connected))


def _node_port_answers(t: CheckRun[NodePortEnv], client: Pod, node: Node, udp: bool,
                       connected: bool, family: Family) -> PeerSample:
    """NP_PORT at `node`'s address of `family` answers `client` from every server."""
    return expect_answers(t, client, node.ip(family), NP_PORT, t.env.servers(), udp, connected)


def _loopback(family: Family) -> str:
    return "127.0.0.1" if family is Family.IPV4 else "::1"


@nodeport_check("N3/localhost-nodeport", "localhost_nodeports.go: NodePort at the node's "
                "loopback address (" + ("served" if LOCALHOST_NODEPORTS_SERVED else "refused")
                + ", nodeport_checks.LOCALHOST_NODEPORTS_SERVED)")
def localhost_nodeport(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    host = env.nodes[0].host
    if LOCALHOST_NODEPORTS_SERVED:
        t.each_family("TCP", lambda f: expect_answers(t, host, _loopback(f), NP_PORT,
                                                      env.servers()))
        t.each_family("UDP", lambda f: expect_answers(t, host, _loopback(f), NP_PORT,
                                                      env.servers(), udp=True, connected=True))
    else:
        t.each_family("TCP", lambda f: expect_refused(t, host, _loopback(f), NP_PORT))


# -- N4, N5, N6 -----------------------------------------------------------
@nodeport_check("N4/same-nodeport-tcp-and-udp", "should be able to update service type to "
                "NodePort listening on same port number but different protocols",
                kube_cannot="its TCP and its UDP Service share node port 30400; the API "
                            "gives a node port to one Service only")
def same_nodeport_tcp_and_udp(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    tcp, udp = who(30400)
    n1, n2 = env.cluster.pods["n1-srv0"], env.cluster.pods["n2-srv0"]
    tcp_only = ServiceSpec("same-tcp", 3, (tcp,), type="NodePort").with_endpoints(
        *refs(env.cluster, [n1]))
    udp_only = ServiceSpec("same-udp", 4, (udp,), type="NodePort").with_endpoints(
        *refs(env.cluster, [n2]))
    t.apply(tcp_only, udp_only)
    node = env.nodes[0]
    t.each_family("TCP service", lambda f: expect_answers(t, env.client, node.ip(f), 30400, [n1]))
    t.each_family("UDP service", lambda f: expect_answers(t, env.client, node.ip(f), 30400, [n2],
                                                          udp=True, connected=True))
    t.apply(delete=["same-tcp"])
    t.each_family("TCP deleted: UDP", lambda f: expect_answers(
        t, env.client, node.ip(f), 30400, [n2], udp=True, connected=True))
    t.each_family("TCP deleted: TCP", lambda f: expect_refused(t, env.client, node.ip(f), 30400))


@nodeport_check("N5/release-nodeport-on-delete", "should release NodePorts on delete")
def release_nodeport(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    updown = ServiceSpec("updown", 5, who(30500), type="NodePort").with_endpoints(
        *refs(env.cluster, env.servers()))
    node = env.nodes[0]

    def released(family: Family) -> None:
        expect_refused(t, env.client, node.ip(family), 30500)
        for each in env.nodes:
            _no_listener(each, 30500)

    t.apply(updown)
    t.each_family("created", lambda f: expect_answers(t, env.client, node.ip(f), 30500,
                                                      env.servers()))
    t.apply(delete=["updown"])
    t.each_family("deleted", released)
    t.apply(updown)
    t.each_family("re-created", lambda f: expect_answers(t, env.client, node.ip(f), 30500,
                                                         env.servers()))
    t.apply(dataclasses.replace(updown, type="ClusterIP", ports=who(0)))
    t.each_family("type changed to ClusterIP", released)


@nodeport_check("N6/no-endpoints-rejected", "should be rejected when no endpoints exist "
                "(NodePort, ExternalIP, LoadBalancer IP)")
def no_endpoints_rejected(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    empty = ServiceSpec("empty", 6, who(30600), type="LoadBalancer", external_ips=vips(6),
                        lb_ips=vips(7))
    t.apply(empty)
    node = env.nodes[0]
    for udp in (False, True):
        proto = "UDP" if udp else "TCP"
        t.each_family(f"NodePort {proto}",
                      lambda f, u=udp: expect_refused(  # type: ignore[misc]  # mypy#15459
                          t, env.client, node.ip(f), 30600, u))
        t.each_family(f"ExternalIP {proto}",
                      lambda f, u=udp: expect_refused(  # type: ignore[misc]  # mypy#15459
                          t, env.client, vip(f, 6), WHOAMI_PORT, u))
        t.each_family(f"LB IP {proto}",
                      lambda f, u=udp: expect_refused(  # type: ignore[misc]  # mypy#15459
                          t, env.client, vip(f, 7), WHOAMI_PORT, u))


# -- N7 .. N11: externalTrafficPolicy Local, and Cluster (N10) ------------
@nodeport_check("N7/external-local-keeps-source", "should work for type=LoadBalancer with "
                "externalTrafficPolicy Local (only local endpoints; the client's source IP "
                "kept)", not_applicable=keeps_client_address)
def external_local_keeps_source(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    source = env.cluster.external_source
    for node in env.nodes:
        local = [p for p in _local_endpoints(env.cluster) if env.cluster.node_of[p.name] == node]
        for udp in (False, True):
            t.each_family(f"{'UDP' if udp else 'TCP'} to {node.name}'s NodePort",
                          lambda f, n=node, pods=local, u=udp:  # type: ignore[misc]  # mypy#15459
                          expect_answers(t, env.client, n.ip(f), LOCAL_PORT, pods, u,
                                         seen_as={source(f)}))
    node1_local = [p for p in _local_endpoints(env.cluster) if p.name.startswith("n1-")]
    t.each_family("TCP to the LB IP (routed to node1)", lambda f: expect_answers(
        t, env.client, vip(f, LOCAL_LB), WHOAMI_PORT, node1_local, seen_as={source(f)}))


@nodeport_check("N8/external-local-no-local-endpoint-drops", "should only target nodes with "
                "endpoints (externalTrafficPolicy Local: no local endpoint, dropped)")
def external_local_drops(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    local = env.shared("local")
    node1_only = _servers(env.cluster, "n1-srv0", "n1-srv1")
    t.apply(local.with_endpoints(*refs(env.cluster, node1_only)))
    node1, node2 = env.nodes
    for udp in (False, True):
        t.each_family(f"{'UDP' if udp else 'TCP'} to node2 (no local endpoint)",
                      lambda f, u=udp: expect_dropped(  # type: ignore[misc]  # mypy#15459
                          t, env.client, node2.ip(f), LOCAL_PORT, u))
    t.each_family("TCP to node1 (both endpoints local)", lambda f: expect_answers(
        t, env.client, node1.ip(f), LOCAL_PORT, node1_only))


@nodeport_check("N9/external-local-from-the-node", "externalTrafficPolicy Local from a pod or "
                "the host of a node: cluster endpoints are used (userspace: with "
                "--cluster-cidr)", translated=True)
def external_local_from_the_node(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    node2 = env.nodes[1]
    every = _local_endpoints(env.cluster)
    for client in (env.pod_client(node2), node2.host):
        t.each_family(f"{client.name} to its node's NodePort",
                      lambda f, c=client: expect_answers(  # type: ignore[misc]  # mypy#15459
                          t, c, node2.ip(f), LOCAL_PORT, every))
    t.each_family(f"{env.pod_client(node2).name} to the LB IP", lambda f: expect_answers(
        t, env.pod_client(node2), vip(f, LOCAL_LB), WHOAMI_PORT, every))


# -- N10 ------------------------------------------------------------------
@nodeport_check("N10/external-cluster-masquerades", "externalTrafficPolicy Cluster from "
                "outside: masqueraded to the node (remote and local endpoint, as kube-proxy)")
def external_cluster_masquerades(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    node1 = env.nodes[0]
    remote = ServiceSpec("remote", 7, who(30700), type="NodePort")
    for pod in _servers(env.cluster, "n2-srv0", "n1-srv0"):
        t.apply(remote.with_endpoints(*refs(env.cluster, [pod])))
        where = "remote" if pod.name.startswith("n2") else "local"
        for udp in (False, True):
            t.each_family(f"{where} endpoint {pod.name}, {'UDP' if udp else 'TCP'}",
                          lambda f, p=pod, u=udp:  # type: ignore[misc]  # mypy#15459
                          expect_answers(t, env.client, node1.ip(f), 30700, [p], u,
                                         seen_as=_node_addresses(node1, f)))


def _health(t: CheckRun[NodePortEnv], node: Node, family: Family, code: int,
            local_endpoints: int) -> None:
    want_body = {"service": {"namespace": "default", "name": "local"},
                 "localEndpoints": local_endpoints, "serviceProxyHealthy": True}
    want_headers = {"content-type": "application/json", "x-content-type-options": "nosniff"}

    def problem(answer: dict) -> str | None:
        if not answer["ok"]:
            return f"no answer: {answer['errno']}"
        if answer["status"] != code:
            return f"status {answer['status']}, expected {code}; body {answer['body'][:200]!r}"
        headers = {k: answer["headers"].get(k) for k in want_headers}
        if headers != want_headers:
            return f"headers {headers}, expected {want_headers}"
        try:
            body = json.loads(answer["body"])
        except ValueError:
            return f"the body is not JSON: {answer['body'][:200]!r}"
        return None if body == want_body else f"body {body}, expected {want_body}"

    t.eventually(f"GET http://{host_literal(node.ip(family))}:{HEALTH_PORT}/any/path on "
                 f"{node.name}", lambda: clients.probe(
                     t.env.client, "http-get", str(node.ip(family)), str(HEALTH_PORT),
                     "--path", "/any/path"), problem)


@nodeport_check("N11/health-check-node-port", "should fail health check node port if there "
                "are only terminating endpoints (healthCheckNodePort: codes, body, headers)")
def health_check_node_port(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    node1, node2 = env.nodes
    local = env.shared("local")
    t.each_family("node1 (2 local endpoints)", lambda f: _health(t, node1, f, 200, 2))
    t.each_family("node2 (1 local endpoint)", lambda f: _health(t, node2, f, 200, 1))
    t.apply(local.with_endpoints(*refs(env.cluster, _servers(env.cluster, "n1-srv0",
                                                             "n1-srv1"))))
    t.each_family("node2 without a local endpoint", lambda f: _health(t, node2, f, 503, 0))
    t.apply(delete=["local"])
    t.each_family("service deleted: closed", lambda f: expect_refused(
        t, env.client, node1.ip(f), HEALTH_PORT))


# -- N13, N14 -------------------------------------------------------------
def _host_range(ip: IPAddress) -> str:
    return f"{ip}/{ip.max_prefixlen}"


@nodeport_check("N13/load-balancer-source-ranges", "should only allow access from service "
                "loadbalancer source ranges (loadbalancer.go)")
def load_balancer_source_ranges(t: CheckRun[NodePortEnv]) -> None:
    env, cluster = t.env, t.env.cluster
    node1 = env.nodes[0]
    allowed = [_host_range(cluster.external_source(f)) for f in env.families]
    allowed += [_host_range(node1.ip(f)) for f in env.families]
    ranged = ServiceSpec("ranged", 8, who(30800), type="LoadBalancer", external_ips=vips(8),
                         lb_ips=vips(9), source_ranges=tuple(allowed)).with_endpoints(
        *refs(cluster, env.servers()))
    t.apply(ranged)
    servers, client = env.servers(), env.client

    def second(family: Family) -> IPAddress:
        return cluster.external_source(family, second=True)

    t.each_family("LB IP from a source in the ranges", lambda f: expect_answers(
        t, client, vip(f, 9), WHOAMI_PORT, servers, source=cluster.external_source(f)))
    t.each_family("LB IP from a source outside them", lambda f: expect_dropped(
        t, client, vip(f, 9), WHOAMI_PORT, source=second(f)))
    t.each_family("NodePort from outside the ranges (not filtered)", lambda f: expect_answers(
        t, client, node1.ip(f), 30800, servers, source=second(f)))
    t.each_family("ExternalIP from outside the ranges (not filtered)", lambda f: expect_answers(
        t, client, vip(f, 8), WHOAMI_PORT, servers, source=second(f)))
    t.each_family("LB IP from node1 (its address in the ranges)", lambda f: expect_answers(
        t, node1.host, vip(f, 9), WHOAMI_PORT, servers))


@nodeport_check("N14/external-ip-not-on-a-node", "should be possible to connect to a service "
                "via ExternalIP when the external IP is not assigned to a node", translated=True)
def external_ip(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    extip = ServiceSpec("extip", 9, who(0), external_ips=vips(10)).with_endpoints(
        *refs(env.cluster, env.servers()))
    t.apply(extip)
    node1 = env.nodes[0]
    for client in (env.pod_client(node1), node1.host, env.client):
        t.each_family(f"from {client.name}",
                      lambda f, c=client: expect_answers(  # type: ignore[misc]  # mypy#15459
                          t, c, vip(f, 10), WHOAMI_PORT, env.servers()))


# -- N15, N16, N17 --------------------------------------------------------
def _sticky(env: NodePortEnv) -> ServiceSpec:
    return ServiceSpec("sticky", 10, who(31000), type="LoadBalancer", lb_ips=vips(11),
                       affinity_timeout=10800).with_endpoints(*refs(env.cluster, env.servers()))


def _shared_by(t: CheckRun[NodePortEnv], client: Pod, first: tuple[IPAddress, int],
               then: tuple[IPAddress, int]) -> None:
    """A burst to `first` sticks to one pod; a burst to `then` sticks to it too."""
    env = t.env
    pod = _one_pod(t, client, *first, env.servers())
    expect_answers(t, client, *then, [env.cluster.pods[pod]], attempts=AFFINITY_BURST)


@nodeport_check("N15/session-affinity", "should have session affinity work for NodePort "
                "service; should be able to switch session affinity for NodePort service")
def session_affinity(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    node1, servers = env.nodes[0], env.servers()
    sticky = _sticky(env)
    t.apply(sticky)
    t.each_family("outside: the NodePort", lambda f: _one_pod(
        t, env.client, node1.ip(f), 31000, servers))
    t.each_family("outside: the LB IP", lambda f: _one_pod(
        t, env.client, vip(f, 11), WHOAMI_PORT, servers))
    pod_client = env.pod_client(node1)
    t.each_family("pod: the NodePort", lambda f: _one_pod(
        t, pod_client, node1.ip(f), 31000, servers))
    t.apply(dataclasses.replace(sticky, affinity_timeout=None))
    t.each_family("switched to None: spread", lambda f: expect_answers(
        t, env.client, node1.ip(f), 31000, servers))
    t.apply(sticky)
    t.each_family("switched back to ClientIP", lambda f: _one_pod(
        t, env.client, node1.ip(f), 31000, servers))


@nodeport_check("N15/affinity-shared-across-frontends", "session affinity shared by the "
                "NodePort and the LB IP of one service port (kube-proxy: one affinity per "
                "service port)")
def affinity_shared_across_frontends(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    node1 = env.nodes[0]
    t.apply(_sticky(env))
    t.each_family("outside: NodePort, then the LB IP", lambda f: _shared_by(
        t, env.client, (node1.ip(f), 31000), (vip(f, 11), WHOAMI_PORT)))


@nodeport_check("N15/affinity-shared-on-the-node", "session affinity shared by the ClusterIP "
                "and the NodePort of one service port, for a pod of the node")
def affinity_shared_on_the_node(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    node1 = env.nodes[0]
    sticky = _sticky(env)
    t.apply(sticky)
    pod_client = env.pod_client(node1)
    t.each_family("pod: ClusterIP, then the NodePort", lambda f: _shared_by(
        t, pod_client, (sticky.cluster_ip(f), WHOAMI_PORT), (node1.ip(f), 31000)))


@nodeport_check("N16/hairpin", "a pod reaching itself through a NodePort or an LB IP",
                translated=True)
def hairpin(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    pod = env.cluster.pods["n1-srv0"]
    node1 = env.nodes[0]
    t.apply(ServiceSpec("hairpin", 11, who(31100), type="LoadBalancer",
                        lb_ips=vips(12)).with_endpoints(*refs(env.cluster, [pod])))
    t.each_family("its node's NodePort", lambda f: expect_answers(t, pod, node1.ip(f), 31100,
                                                                  [pod]))
    t.each_family("the LB IP", lambda f: expect_answers(t, pod, vip(f, 12), WHOAMI_PORT, [pod]))


@nodeport_check("N17/udp-stale-conntrack", "should be able to preserve UDP traffic when server "
                "pod cycles for a NodePort service")
def udp_stale_conntrack(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    old, new = env.cluster.pods["n1-srv0"], env.cluster.pods["n1-srv1"]
    node1 = env.nodes[0]
    cycle = ServiceSpec("udp-cycle", 12, (dataclasses.replace(DNS_UDP, node_port=31053),),
                        type="NodePort")
    t.apply(cycle.with_endpoints(*refs(env.cluster, [old])))
    follow_udp_socket(t, env.client, lambda f: [str(node1.ip(f)), "31053", "--connected"],
                      old, new, lambda: t.apply(cycle.with_endpoints(*refs(env.cluster, [new]))),
                      f"{old.name} replaced by {new.name} (same source port)",
                      UDP_FOLLOW_TIMEOUT)


# -- N18 ------------------------------------------------------------------
@nodeport_check("N18/restart-keeps-nodeport-connections", "should work after restarting "
                "kube-proxy (NodePort: an established connection and new ones throughout)",
                not_applicable=keeps_connections_across_restart)
def restart(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    node1 = env.nodes[0]
    seat = env.seat(node1)
    loops = {f: StreamingProbe(env.client, "http-loop", str(node1.ip(f)),
                               str(WEB_HTTP.node_port), str(node1.ip(f)),
                               str(WEB_ECHO.node_port)) for f in t.active()}
    try:
        t.each_family("before the restart", lambda f: loop_under_way(loops[f]))
        if not t.active():
            return
        stop_backend(t, env.control.backend_of(seat), signal.SIGTERM)
        restarted = time.monotonic()
        env.control.start_backend(seat)
        t.each_family("after the restart", lambda f: loop_served_since(
            loops[f], restarted, "ten new connections after the restart"))
    finally:
        lines = {f: loop.stop() for f, loop in loops.items()}
    for family in t.active():
        _judge_restart_loop(t, family, lines[family])


# -- N19 ------------------------------------------------------------------
@nodeport_check("N19/not-programmed", "should implement service.kubernetes.io/"
                "service-proxy-name; Headless / ExternalName ignored (with node ports)",
                kube_cannot="its headless Service has node ports and its ExternalName "
                            "Service a ClusterIP, which the API refuses (S18 checks "
                            "service-proxy-name through it)")
def not_programmed(t: CheckRun[NodePortEnv]) -> None:
    env = t.env
    servers = refs(env.cluster, env.servers())
    headless = ServiceSpec("headless", 13, who(31900), type="NodePort",
                           headless=True).with_endpoints(*servers)
    extname = ServiceSpec("extname", 14, who(31901), type="ExternalName",
                          external_ips=vips(13)).with_endpoints(*servers)
    other = ServiceSpec("other-proxy", 15, who(31902), type="NodePort",
                        labels=((SERVICE_PROXY_NAME, "another-proxy"),)).with_endpoints(*servers)
    t.apply(headless, extname, other)
    node1 = env.nodes[0]
    for name, port in (("headless", 31900), ("ExternalName", 31901), ("other proxy's", 31902)):
        t.each_family(f"{name} NodePort",
                      lambda f, p=port: expect_unanswered(  # type: ignore[misc]  # mypy#15459
                          t, env.client, node1.ip(f), p))
    t.each_family("ExternalName's ExternalIP", lambda f: expect_unanswered(
        t, env.client, vip(f, 13), WHOAMI_PORT))
    t.each_family("other services", lambda f: expect_answers(t, env.client, node1.ip(f),
                                                             NP_PORT, env.servers()))


# -- -d -------------------------------------------------------------------
def poke_help(env: NodePortEnv) -> str:
    cluster, control = env.cluster, env.control
    family = env.families[0]
    node1 = env.nodes[0]
    enter = f"nsenter --net=/run/netns/{env.client.netns} --"
    lines = [f"NodePort cluster {cluster.names.tag} is up ({control.kind.name} backends, "
             f"{'/'.join(f.value for f in env.families)}). Poke it:",
             f"  {enter} curl -s http://{host_literal(node1.ip(family))}:{WEB_HTTP.node_port}/"
             "    # from the external client",
             *(f"  {line}" for line in describe(cluster).splitlines()),
             *(f"  {line}" for line in control.poke_help()),
             f"  logs: {cluster.workdir}/*.log",
             *(f"  {' '.join(control.kind.lab.inspect(s.places))}      # {s.node_name}'s dataplane"
               for s in control.seats)]
    return "\n".join(lines)
