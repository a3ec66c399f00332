"""`-c kube`: the checks' ClusterState said through a real Kubernetes API
server (lab/kube_control_plane.py), which `kpng-py kube` follows.

Each ServiceSpec becomes a selectorless Service (its ClusterIPs as the spec
gives them, its LoadBalancer ingress through the status subresource) and
EndpointSlices that the lab writes itself, as a controller would: one per
family and per set of resolved port numbers (named ports resolve to other
numbers in each pod), labelled `kubernetes.io/service-name` and managed by
the lab (`endpointslice.kubernetes.io/managed-by`), so that the cluster's
controller leaves them alone. An apply writes the difference from what the
last apply wrote, and returns, for each kind, the resourceVersion the brain
must have seen for the state to be in what it serves (docs/brain.md: each
state it makes names them). A slice that goes from a service that stays is
emptied first and then deleted: the answer to a delete carries no version.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from e2e.proxy import (
    SYNC_TIMEOUT,
    BackendKind,
    ControlPlane,
    Seat,
    SyncError,
    kpng_py,
    stop_cleanly,
)
from e2e.statefile import LOCAL_NODE, ClusterState, EndpointRef, PortSpec, ServiceSpec
from lab.cluster import ADDRESSING, Cluster, Family, ip_family
from lab.kube_control_plane import ControlPlaneError, KubeApi, KubeControlPlane, version_of
from lab.multinode import MultiNodeCluster
from lab.procs import JsonLog, Proc

NAMESPACE = "default"
SERVICES = f"/api/v1/namespaces/{NAMESPACE}/services"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "e2e.kpng-py.lab"  # not the controller's: it leaves these slices alone
ADDRESS_TYPES = {Family.IPV4: "IPv4", Family.IPV6: "IPv6"}
# The kinds an apply writes, as the brain's log names them (<kind>_resource_version).
KINDS = ("services", "endpointslices", "nodes")


class NotExpressible(ValueError):
    """A ServiceSpec the API refuses (the message says why): a check that
    uses one declares that it cannot run under `-c kube`."""


# -- ClusterState -> API objects ------------------------------------------
def service_object(spec: ServiceSpec, families: tuple[Family, ...]) -> dict[str, Any]:
    """The Service (without status) that says `spec`; NotExpressible if none can."""
    own = spec.families(families)
    _check_expressible(spec, own)
    body: dict[str, Any] = {
        "type": spec.type,
        "ports": [_service_port(port) for port in spec.ports],
        "ipFamilies": [ADDRESS_TYPES[f] for f in own],
        "ipFamilyPolicy": "RequireDualStack" if len(own) == 2 else "SingleStack",
    }
    if spec.headless:
        body["clusterIP"] = "None"
    else:
        ips = [str(spec.cluster_ip(f)) for f in own]
        body["clusterIP"], body["clusterIPs"] = ips[0], ips
    body.update(_optional_spec(spec, own))
    metadata: dict[str, Any] = {"name": spec.name, "namespace": NAMESPACE}
    if spec.labels:
        metadata["labels"] = dict(spec.labels)
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body}


def _check_expressible(spec: ServiceSpec, own: tuple[Family, ...]) -> None:
    if not own:
        raise NotExpressible(f"service {spec.name}: none of the cluster's families")
    if spec.type == "ExternalName":
        raise NotExpressible(f"service {spec.name}: the API refuses a ClusterIP on an "
                             "ExternalName Service (the check gives it one on purpose)")
    if spec.headless and spec.type in ("NodePort", "LoadBalancer"):
        raise NotExpressible(f"service {spec.name}: the API refuses a headless {spec.type} "
                             "Service")
    if spec.lb_ips and spec.type != "LoadBalancer":
        raise NotExpressible(f"service {spec.name}: LoadBalancer ingress on a {spec.type} "
                             "Service")
    if spec.source_ranges and spec.type != "LoadBalancer":
        raise NotExpressible(f"service {spec.name}: loadBalancerSourceRanges on a {spec.type} "
                             "Service")


def _service_port(port: PortSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": port.name, "protocol": port.protocol, "port": port.port,
                           "targetPort": port.target.value if port.target
                           else port.target_number}
    if port.node_port:
        out["nodePort"] = port.node_port
    return out


def _optional_spec(spec: ServiceSpec, own: tuple[Family, ...]) -> dict[str, Any]:
    """What the spec says beyond ports and addresses (the API's defaults otherwise)."""
    out: dict[str, Any] = {}
    external = [str(ip) for ip in spec.external_ips if ip_family(ip) in own]
    if external:
        out["externalIPs"] = external
    if spec.affinity_timeout is not None:
        out["sessionAffinity"] = "ClientIP"
        out["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": spec.affinity_timeout}}
    if spec.internal_traffic_local:
        out["internalTrafficPolicy"] = "Local"
    if spec.external_traffic_local:
        out["externalTrafficPolicy"] = "Local"
    if spec.health_check_node_port:
        out["healthCheckNodePort"] = spec.health_check_node_port
    if spec.source_ranges:
        out["loadBalancerSourceRanges"] = list(spec.source_ranges)
    if spec.type == "LoadBalancer":
        # No node port the spec does not give (the state file has none).
        out["allocateLoadBalancerNodePorts"] = all(p.node_port for p in spec.ports)
    if spec.traffic_distribution:
        out["trafficDistribution"] = spec.traffic_distribution
    return out


def status_object(spec: ServiceSpec, families: tuple[Family, ...]) -> dict[str, Any]:
    """The Service's status: its LoadBalancer ingress IPs of the cluster's families."""
    own = spec.families(families)
    return {"loadBalancer": {"ingress": [{"ip": str(ip)} for ip in spec.lb_ips
                                         if ip_family(ip) in own]}}


def slice_objects(spec: ServiceSpec, families: tuple[Family, ...],
                  zone_of: Callable[[str], str]) -> dict[str, dict[str, Any]]:
    """The EndpointSlices of the spec's endpoints, by name: one per family
    and per tuple of resolved port numbers (`<service>-<family>-<numbers>`)."""
    groups: dict[tuple[int, ...], list[EndpointRef]] = {}
    for ref in spec.endpoints:
        numbers = tuple(port.backend_port(ref.pod) for port in spec.ports)
        groups.setdefault(numbers, []).append(ref)
    out = {}
    for family in spec.families(families):
        for numbers, refs in groups.items():
            name = "-".join([spec.name, family.value, *map(str, numbers)])
            out[name] = {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
                    SERVICE_NAME_LABEL: spec.name, MANAGED_BY_LABEL: MANAGED_BY}},
                "addressType": ADDRESS_TYPES[family],
                "endpoints": [_slice_endpoint(ref, family, zone_of) for ref in refs],
                "ports": [{"name": port.name, "protocol": port.protocol, "port": number}
                          for port, number in zip(spec.ports, numbers)]}
    return out


def _slice_endpoint(ref: EndpointRef, family: Family,
                    zone_of: Callable[[str], str]) -> dict[str, Any]:
    endpoint: dict[str, Any] = {
        "addresses": [str(ref.pod.ip(family))],
        "conditions": {"ready": ref.ready, "serving": ref.is_serving,
                       "terminating": ref.terminating},
        "nodeName": ref.node, "zone": zone_of(ref.node),
        "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": ref.pod.name}}
    hints = {"forZones": [{"name": zone} for zone in ref.hint_zones],
             "forNodes": [{"name": node} for node in ref.hint_nodes]}
    if any(hints.values()):
        endpoint["hints"] = {key: names for key, names in hints.items() if names}
    return endpoint


@dataclass
class ApiObjects:
    """What a ClusterState is in the API: Services, their statuses and
    EndpointSlices, each by name (ApiWriter keeps one up to date with what
    the API holds)."""

    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, state: ClusterState) -> ApiObjects:
        objects = cls()
        node_ports: dict[int, str] = {}
        for spec in state.services:
            for port in spec.ports:
                if port.node_port and node_ports.setdefault(port.node_port, spec.name) \
                        != spec.name:
                    raise NotExpressible(
                        f"services {node_ports[port.node_port]} and {spec.name}: the API "
                        f"gives node port {port.node_port} to one Service only, whatever "
                        "the protocol")
            objects.services[spec.name] = service_object(spec, state.families)
            objects.statuses[spec.name] = status_object(spec, state.families)
            objects.slices.update(slice_objects(spec, state.families, state.zone_of))
        return objects

    def record(self, kind: str, name: str, value: dict[str, Any] | None) -> None:
        """`value` is now the object `name` of `kind` (a field's name); None: gone."""
        objects = getattr(self, kind)
        if value is None:
            objects.pop(name, None)
        else:
            objects[name] = value


def owner(slice_object: dict[str, Any]) -> str:
    return slice_object["metadata"]["labels"][SERVICE_NAME_LABEL]


# -- the difference, as API calls -----------------------------------------
@dataclass(frozen=True)
class Write:
    """One call, and what it makes of the applied objects once it succeeded:
    each record is (which of ApiObjects' maps, a name, its object; None: gone)."""

    method: str
    path: str
    body: dict[str, Any] | None
    records: tuple[tuple[str, str, dict[str, Any] | None], ...]
    # The kind whose resourceVersion in the answer the brain must reach;
    # None: no version to wait for (a delete's answer may have none).
    tracked: str | None
    content_type: str = "application/json"


def _create_service(name: str, after: ApiObjects) -> Iterator[Write]:
    yield Write("POST", SERVICES, after.services[name], (
        ("services", name, after.services[name]), ("statuses", name, NO_STATUS)), "services")
    if after.statuses[name] != NO_STATUS:
        yield _status(name, after.statuses[name])


# A new Service's status, and one without LoadBalancer ingress.
NO_STATUS: dict[str, Any] = {"loadBalancer": {"ingress": []}}


def _status(name: str, status: dict[str, Any]) -> Write:
    return Write("PATCH", f"{SERVICES}/{name}/status", {"status": status},
                 (("statuses", name, status),), "services", "application/merge-patch+json")


def _delete_slice(name: str) -> Write:
    return Write("DELETE", f"{SLICES}/{name}", None, (("slices", name, None),), None)


def _identity(service: dict[str, Any]) -> tuple:
    """What an update cannot change: a new one is a new Service."""
    spec = service["spec"]
    return spec.get("clusterIP"), spec.get("clusterIPs"), spec["ipFamilies"]


def _kept(name: str, before: ApiObjects, after: ApiObjects) -> bool:
    """Whether the Service `name` is in both and the same one (not made anew)."""
    return name in before.services and name in after.services and \
        _identity(before.services[name]) == _identity(after.services[name])


def plan(before: ApiObjects, after: ApiObjects) -> list[Write]:
    """The calls that make the API's objects `after` from `before`: the
    Services, their slices, the slices that go, the Services that go."""
    return [*_service_writes(before, after), *_slice_writes(before, after),
            *_slices_gone(before, after),
            *(write for name in before.services if name not in after.services
              for write in _delete_service(name, before))]


def _service_writes(before: ApiObjects, after: ApiObjects) -> Iterator[Write]:
    for name, service in after.services.items():
        if not _kept(name, before, after):
            if name in before.services:
                yield from _delete_service(name, before)
            yield from _create_service(name, after)
            continue
        if before.services[name] != service:
            yield Write("PUT", f"{SERVICES}/{name}", service, (("services", name, service),),
                        "services")
        if before.statuses[name] != after.statuses[name]:
            yield _status(name, after.statuses[name])


def _slice_writes(before: ApiObjects, after: ApiObjects) -> Iterator[Write]:
    """New and changed slices (all of a Service made anew are new)."""
    for name, endpoint_slice in after.slices.items():
        old = before.slices.get(name)
        record = (("slices", name, endpoint_slice),)
        if old is None or not _kept(owner(endpoint_slice), before, after):
            yield Write("POST", SLICES, endpoint_slice, record, "endpointslices")
        elif old != endpoint_slice:
            yield Write("PUT", f"{SLICES}/{name}", endpoint_slice, record, "endpointslices")


def _slices_gone(before: ApiObjects, after: ApiObjects) -> Iterator[Write]:
    """Slices that go from a Service that stays: emptied (the version to
    wait for), then deleted."""
    for name, old in before.slices.items():
        if name not in after.slices and _kept(owner(old), before, after):
            emptied = {**old, "endpoints": []}
            yield Write("PUT", f"{SLICES}/{name}", emptied, (("slices", name, emptied),),
                        "endpointslices")
            yield _delete_slice(name)


def _delete_service(name: str, before: ApiObjects) -> list[Write]:
    """Its slices, then the Service (whose answer has the version of its
    deletion); a state without the Service has none of its endpoints."""
    slices = [_delete_slice(s) for s, obj in before.slices.items() if owner(obj) == name]
    return slices + [Write("DELETE", f"{SERVICES}/{name}", None, (
        ("services", name, None), ("statuses", name, None)), "services")]


# -- applying -------------------------------------------------------------
class ApiWriter:
    """Writes ClusterStates to the API server, each as the difference from
    what it wrote before (what the API holds, also after a failed call)."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._applied = ApiObjects()

    def register_nodes(self, state: ClusterState, addresses: Mapping[str, Sequence[str]]
                       ) -> None:
        """The state's nodes as a kubelet registers them (name, addresses, zone)."""
        for name, zone in state.nodes:
            self._api.register_node(name, addresses.get(name, ()), zone)

    def apply(self, state: ClusterState) -> dict[str, int]:
        """Write the difference; for each kind written, the resourceVersion
        the brain must reach (empty: nothing to write)."""
        after = ApiObjects.of(state)
        targets: dict[str, int] = {}
        for write in plan(self._applied, after):
            answer = self._api.request(write.method, write.path, write.body, write.content_type)
            for kind, name, value in write.records:
                self._applied.record(kind, name, value)
            if write.tracked is not None:
                version = int(answer["metadata"]["resourceVersion"])
                targets[write.tracked] = max(targets.get(write.tracked, 0), version)
        return targets


def node_addresses(cluster: Cluster | MultiNodeCluster) -> dict[str, list[str]]:
    """Each node's InternalIPs: a NodePort node's on the network; the service
    topology's node has its pods' gateway (its other nodes run nothing)."""
    if isinstance(cluster, MultiNodeCluster):
        return {node.name: [str(node.ip(f)) for f in cluster.families] for node in cluster.nodes}
    return {LOCAL_NODE: [str(ADDRESSING[f].gateway) for f in cluster.families]}


# -- what the brain has served --------------------------------------------
class ServedVersions:
    """Follows the log of `kpng-py -v kube ... to-local --node-name NODE`:
    the resourceVersions each state of the brain was made from, and the
    latest version the node has applied (its view answered with no op, or
    answered and then `sync applied`). docs/brain.md says what is logged."""

    def __init__(self, log: JsonLog, node: str) -> None:
        self._log = log
        self._node = node
        self._seen = 0  # records of the log read
        self._states: list[tuple[int, dict[str, int]]] = []
        self._applied = 0
        self._pending: int | None = None  # answered with ops, not applied yet

    def served(self, targets: dict[str, int]) -> bool:
        """Whether the node applied a state that has every write whose
        answer had these resourceVersions."""
        self._log.poll()
        for _, record in self._log.records[self._seen:]:
            self._read(record)
        self._seen = len(self._log.records)
        return any(self._applied >= version and all(
            at.get(kind, 0) >= target for kind, target in targets.items())
            for version, at in self._states)

    def _read(self, record: dict[str, Any]) -> None:
        message = record.get("msg")
        if message in ("state from the API server published",
                       "state from the API server unchanged"):
            self._states.append((int(record["version"]), {
                kind: int(record[f"{kind}_resource_version"] or 0) for kind in KINDS}))
        elif message == "node view answered" and record.get("node") == self._node:
            if record["ops"]:
                self._pending = int(record["version"])
            else:
                self._applied = max(self._applied, int(record["version"]))
        elif message == "sync applied" and self._pending is not None:
            self._applied = max(self._applied, self._pending)
            self._pending = None

    def describe(self, targets: dict[str, int]) -> str:
        """What was seen, for a timeout's message."""
        last = self._states[-1] if self._states else None
        return (f"waited for resourceVersions {targets}; the brain's last state: "
                + (f"version {last[0]} at {last[1]}" if last else "none")
                + f"; node {self._node} applied version {self._applied}")


# -- the control plane of `-c kube` -----------------------------------------
class ApiServerControlPlane(ControlPlane):
    """The lab's Kubernetes control plane for the run, the checks' states
    written to it (ApiWriter), and on each seat's node `kpng-py kube
    --kubeconfig ... to-local --node-name NODE to-X`: the brain and the
    backend in one process, which reaches the API server through the lab's
    relay into the node's namespace. Its log at debug level says which
    version of its state the node applied (ServedVersions)."""

    name = "kube"

    def __init__(self, cluster: Cluster | MultiNodeCluster, kind: BackendKind,
                 state: ClusterState, seats: Sequence[Seat] = ()) -> None:
        super().__init__(cluster, kind, state, seats)
        self.control = KubeControlPlane(cluster.names, cluster.workdir,
                                        [str(ADDRESSING[f].service_cidr)
                                         for f in cluster.families])
        self.kubeconfig = cluster.workdir / "kubeconfig"
        self._writer: ApiWriter | None = None
        self._relays: list[Proc] = []
        self._served: dict[str, ServedVersions] = {}  # by seat label

    def start(self) -> None:
        api = self.control.start()
        self.kubeconfig.write_text(api.access.kubeconfig())
        self._writer = ApiWriter(api)
        self._writer.register_nodes(self.state, node_addresses(self.cluster))
        self._write(self.state)
        relay = self.control.relay_command()
        self._relays = [seat.spawn(f"{seat.label}-api-relay", relay) for seat in self.seats]
        for seat in self.seats:
            self.start_backend(seat)

    @classmethod
    def describe(cls) -> str:
        return f"kube ({version_of('kube-apiserver')}, {version_of('etcd')})"

    def _backend_command(self, seat: Seat) -> list[str]:
        # -v: the brain's states and the node's answered versions (ServedVersions).
        return kpng_py("-v", "kube", "--kubeconfig", str(self.kubeconfig), "to-local",
                       "--node-name", seat.node_name)

    def _on_backend_started(self, seat: Seat) -> None:
        self._served[seat.label] = ServedVersions(self._running[seat.label].log,
                                                  seat.node_name)

    def _helpers(self) -> list[Proc]:
        return list(self._relays)

    def _stop_helpers(self) -> list[str]:
        # socat's exit code on SIGTERM is 143.
        problems = [stop_cleanly(relay, clean=(0, -15, 143)) for relay in self._relays]
        try:
            self.control.stop()
        except (ControlPlaneError, TimeoutError) as err:
            problems.append(f"the Kubernetes control plane did not stop: {err}")
        return [p for p in problems if p is not None]

    def apply(self, state: ClusterState) -> None:
        if state == self.state:
            return
        targets = self._write(state)
        self.state = state
        for seat in self.seats:
            served = self._served[seat.label]
            self._wait(seat, functools.partial(served.served, targets), SYNC_TIMEOUT,
                       functools.partial(_after_writes, served, targets))

    def write_while_backend_down(self, state: ClusterState) -> None:
        self._write(state)
        self.state = state

    def _write(self, state: ClusterState) -> dict[str, int]:
        assert self._writer is not None
        try:
            return self._writer.apply(state)
        except NotExpressible as err:
            raise SyncError(f"the Kubernetes API cannot say this check's state: {err} (the "
                            "check must say so: its kube_cannot)") from None
        except ControlPlaneError as err:
            raise SyncError(f"the API server refused a write: {err}") from None

    def poke_help(self) -> list[str]:
        assert self.control.api is not None
        access = self.control.api.access
        return [f"API server {access.url}, kubeconfig {self.kubeconfig} (edit objects; "
                "the brains follow), e.g.:",
                f"  curl --cacert {access.ca} -H 'Authorization: Bearer {access.token}' "
                f"{access.url}/api/v1/namespaces/{NAMESPACE}/services"]


def _after_writes(served: ServedVersions, targets: dict[str, int]) -> str:
    return f"after the writes to the API server ({served.describe(targets)})"
