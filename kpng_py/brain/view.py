"""One node's view of the cluster state, as kube-proxy 1.35 decides it for
that node (its CategorizeEndpoints), expressed in localv1 as KPNG's brain
serves it for a WatchReq with that NodeName: every service (but those labelled
for another proxy with service.kubernetes.io/service-proxy-name, which
kube-proxy leaves alone too), and of their endpoints those that the node may
use, each marked Local or not and with its Scopes.

For node N and one service, two sets of endpoints:

- the cluster scope: the ready endpoints, narrowed by topology hints (below);
  if the service has no ready endpoint at all, its serving and terminating
  ones (KEP-1669: connections keep being served through a rolling update);
- the node-local scope: the endpoints on N (topology.node == N) that are
  ready; if none on N is ready, those on N that are serving and terminating.
  Hints do not narrow it.

Topology hints narrow the cluster scope only when the ready endpoints agree:
if every ready endpoint has node hints and one names N, the cluster scope is
the ready endpoints hinted for N (trafficDistribution PreferSameNode); else if
every ready endpoint has zone hints and one names N's zone, those hinted for
that zone; else (some endpoint without hints, a zone no hint names, a node
without a zone: zone "") all the ready endpoints.

Each endpoint is Local when it runs on N; Scopes.Internal is set when it is in
the node-local scope for a service with InternalTrafficToLocal, in the cluster
scope otherwise, and Scopes.External likewise with ExternalTrafficToLocal,
but for one difference: with ExternalTrafficToLocal, External is set only on
N's ready endpoints. kube-proxy serves external traffic with N's serving and
terminating endpoints too while its health-check node port already answers
503 (it counts ready endpoints only); localv1 cannot say "serve, but do not
count", and backends count the Local endpoints with External, so the health
check is kept right (docs/spec/node-port-behaviours.md, N11) and external
traffic reaching N meanwhile is dropped, as KPNG did. An endpoint with neither
scope is left out.
"""

from __future__ import annotations

from typing import NamedTuple

from kpng_py.api import localv1
from kpng_py.brain.statefile import ClusterState, EndpointInfo, ReadyEndpoints, ServiceEntry

# (Ref.Set, Ref.Path): where a value lives in the localv1 API.
Ref = tuple[localv1.Set, str]
# Every value of a node's view, serialized, by where it lives.
NodeView = dict[Ref, bytes]


def node_view(state: ClusterState, node_name: str) -> NodeView:
    zone = state.zone_of(node_name)
    view: NodeView = {}
    for service in state.services:
        if service.proxy_name:  # another proxy's (service.kubernetes.io/service-proxy-name)
            continue
        path = service.path
        view[(localv1.ServicesSet, path)] = service.service
        choice = NodeChoice.of(service.ready_endpoints, node_name, zone)
        for info in service.endpoints:
            endpoint = endpoint_for_node(service, info, choice)
            if endpoint is not None:
                view[(localv1.EndpointsSet, f"{path}/{info.key}")] = endpoint
    return view


class NodeChoice(NamedTuple):
    """Which of one service's endpoints a node takes, per scope (above). A
    tuple: one is made per service and node."""

    node: str
    # The cluster scope: ready endpoints (else serving and terminating ones).
    any_ready: bool
    # The node-local scope: ready endpoints on the node (else serving and
    # terminating ones on the node).
    local_ready: bool
    # The cluster scope's ready endpoints are those whose node hints name the
    # node (PreferSameNode), or else whose zone hints name `zone` (not None:
    # PreferSameZone); neither: all of them.
    same_node: bool
    zone: str | None
    narrowed: bool  # same_node, or zone is not None

    @classmethod
    def of(cls, ready: ReadyEndpoints, node: str, zone: str) -> NodeChoice:
        same_node = ready.hinted_nodes is not None and node in ready.hinted_nodes
        same_zone = (not same_node and ready.hinted_zones is not None
                     and zone in ready.hinted_zones)
        return cls(node, bool(ready.nodes), node in ready.nodes, same_node,
                   zone if same_zone else None, same_node or same_zone)

    def in_cluster_scope(self, info: EndpointInfo) -> bool:
        if not self.any_ready:
            return info.serving and info.terminating
        if not info.ready:
            return False
        if self.same_node:
            return self.node in info.hint_nodes
        return self.zone is None or self.zone in info.hint_zones

    def in_local_scope(self, info: EndpointInfo) -> bool:
        if info.node != self.node:
            return False
        return info.ready if self.local_ready else info.serving and info.terminating


def endpoint_for_node(service: ServiceEntry, info: EndpointInfo,
                      choice: NodeChoice) -> bytes | None:
    """The serialized Endpoint node `choice.node` gets, or None if it gets none:
    the endpoint's bytes with Local and Scopes spliced in where a
    deterministic serialization writes them (fields in number order)."""
    on_node = info.node == choice.node
    if info.ready and not choice.narrowed:
        # Most endpoints: in the cluster scope, and in the local one if on
        # the node (which then has a ready endpoint).
        cluster, local = True, on_node
    else:
        cluster, local = choice.in_cluster_scope(info), choice.in_local_scope(info)
    internal = local if service.internal_traffic_local else cluster
    # Without the node-local fallback: see the module's docstring.
    external = local and info.ready if service.external_traffic_local else cluster
    if not (internal or external):
        return None
    at = info.local_at
    return (info.endpoint[:at] + _LOCAL[on_node] + info.endpoint[at:]
            + _SCOPES[(internal, external)])


def _scopes(internal: bool, external: bool) -> bytes:
    return localv1.Endpoint(Scopes=localv1.EndpointScopes(
        Internal=internal, External=external)).SerializeToString(deterministic=True)


# Local (field 3) and Scopes (field 5, the last) as protobuf writes them.
_LOCAL = {local: localv1.Endpoint(Local=local).SerializeToString() for local in (False, True)}
_SCOPES = {(internal, external): _scopes(internal, external)
           for internal in (False, True) for external in (False, True)}
