"""One node's view of the cluster state, as KPNG's brain computes it for a
WatchReq with that NodeName: every service (but those labelled for another
proxy with service.kubernetes.io/service-proxy-name, which kube-proxy leaves
alone too), and of their endpoints those that the node may use, each marked
Local or not and with its Scopes.

For node N, an endpoint is left out when it is not ready, or when it has zone
hints and none is N's zone (the zone of an unknown node is ""). It is Local
when it runs on N (topology.node == N). Its Scopes follow the service's
traffic policies: Internal = Local or not InternalTrafficToLocal, External =
Local or not ExternalTrafficToLocal; an endpoint with neither scope is left
out.
"""

from __future__ import annotations

from kpng_py.api import localv1
from kpng_py.brain.statefile import ClusterState, EndpointInfo, ServiceEntry

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
        for info in service.endpoints:
            endpoint = endpoint_for_node(service, info, node_name, zone)
            if endpoint is not None:
                view[(localv1.EndpointsSet, f"{path}/{info.key}")] = endpoint
    return view


def endpoint_for_node(service: ServiceEntry, info: EndpointInfo, node_name: str,
                      zone: str) -> bytes | None:
    """The serialized Endpoint node `node_name` gets, or None if it gets none:
    the endpoint's bytes with Local and Scopes spliced in where a
    deterministic serialization writes them (fields in number order)."""
    if not info.ready or (info.hint_zones and zone not in info.hint_zones):
        return None
    local = info.node == node_name
    internal = local or not service.internal_traffic_local
    external = local or not service.external_traffic_local
    if not (internal or external):
        return None
    at = info.local_at
    return (info.endpoint[:at] + _LOCAL[local] + info.endpoint[at:]
            + _SCOPES[(internal, external)])


def _scopes(internal: bool, external: bool) -> bytes:
    return localv1.Endpoint(Scopes=localv1.EndpointScopes(
        Internal=internal, External=external)).SerializeToString(deterministic=True)


# Local (field 3) and Scopes (field 5, the last) as protobuf writes them.
_LOCAL = {local: localv1.Endpoint(Local=local).SerializeToString() for local in (False, True)}
_SCOPES = {(internal, external): _scopes(internal, external)
           for internal in (False, True) for external in (False, True)}
