"""`kpng-py file convert`: a KPNG state file from what kubectl prints.

Input: `kubectl get nodes,svc,endpointslices -A -o yaml` (a v1 List; single
objects and `---`-separated documents are read too). Output: the state file
the built-in brain and `kpng file` read (docs/brain.md), mapped as KPNG's
kube watcher maps the API objects:

- a Service becomes a localv1 Service: ClusterIPs by family,
  externalIPs, LoadBalancer ingress IPs, ports (a named targetPort
  becomes `targetportname`), ClientIP affinity, the traffic policies,
  healthCheckNodePort, loadBalancerSourceRanges as an IPFilter on the LB IPs;
- an EndpointSlice (`kubernetes.io/service-name`) gives its service's
  endpoints: one per pod, its IPv4 and IPv6 slices merged, with the slice's
  named ports as port overrides, its conditions (ready, serving,
  terminating), node, zone, and zone and node hints;
- a Node gives its name and `topology.kubernetes.io/zone`.

What kube-proxy 1.35 does not program is left out (`left_out_service`,
`left_out_slice`): Services and EndpointSlices labelled
`service.kubernetes.io/service-proxy-name` (another proxy's) or
`service.kubernetes.io/headless` (its informers select them out), Services
without a ClusterIP (headless) and of type ExternalName (skipped), and
LoadBalancer ingress IPs whose `ipMode` is not VIP (a proxying load
balancer: its traffic arrives for the endpoints already).

Objects of other kinds and those left out are skipped with a count; a Service or EndpointSlice
that cannot be mapped (a slice's address not of its addressType's family, a
port out of range...) names the object and what is wrong with it. The
per-object functions (service_of, slice_service, service_entry, node_of)
are also `kpng-py kube`'s mapping of the API server's objects, which skips
such an object instead (kpng_py/brain/kube/cluster.py).
"""

from __future__ import annotations

import enum
import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kpng_py.api import localv1
from kpng_py.brain.statefile import SERVICE_PROXY_NAME_LABEL
from kpng_py.model import MAX_PORT

PROTOCOLS = {"TCP": localv1.TCP, "UDP": localv1.UDP, "SCTP": localv1.SCTP}
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# Set by the EndpointSlice controller on the slices of a headless Service.
HEADLESS_LABEL = "service.kubernetes.io/headless"
ZONE_LABEL = "topology.kubernetes.io/zone"
_FAMILIES = ("IPv4", "IPv6")
# A LoadBalancer ingress IP's ipMode that kube-proxy programs (as when unset).
_VIP_MODE = "VIP"


class LeftOut(enum.Enum):
    """Why kube-proxy programs nothing of a Service or an EndpointSlice."""

    # Selected out of its informers' lists and watches (both kinds): the
    # EndpointSlice controller copies a Service's labels onto its slices.
    OTHER_PROXY = f"labelled {SERVICE_PROXY_NAME_LABEL} (another proxy's)"
    HEADLESS_LABEL = f"labelled {HEADLESS_LABEL}"
    # Services it lists but skips (ShouldSkipService).
    HEADLESS = "without a ClusterIP (headless)"
    EXTERNAL_NAME = "of type ExternalName"


class ConvertError(ValueError):
    """An object that cannot be mapped; the message names it."""


@dataclass
class Conversion:
    """What was read, by kind; `skipped` counts objects of other kinds."""

    state: dict[str, list[dict[str, Any]]]
    skipped: Counter = field(default_factory=Counter)


@dataclass
class _Endpoint:
    pod: str
    v4: list[str] = field(default_factory=list)
    v6: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    # As kube-proxy reads an EndpointSlice: an unknown readiness or serving
    # counts as true, an unknown terminating as false. A pod listed in several
    # slices (one per family, or two while it moves) is ready (serving) only
    # if every slice says so, and terminating if one does.
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node: str = ""
    zone: str = ""
    hint_zones: list[str] = field(default_factory=list)
    hint_nodes: list[str] = field(default_factory=list)

    def add(self, item: dict[str, Any], ips: localv1.IPSet, ports: dict[str, int],
            what: str) -> None:
        """One more listing of the endpoint (`what`, for errors), in a slice
        with these ports."""
        self.v4 += [ip for ip in ips.V4 if ip not in self.v4]
        self.v6 += [ip for ip in ips.V6 if ip not in self.v6]
        self.ports.update(ports)
        conditions = _mapping(item.get("conditions"), f"{what} conditions")
        self.ready = self.ready and conditions.get("ready") is not False
        self.serving = self.serving and conditions.get("serving") is not False
        self.terminating = self.terminating or conditions.get("terminating") is True
        self.node = item.get("nodeName", self.node)
        self.zone = item.get("zone", self.zone)
        hints = _mapping(item.get("hints"), f"{what} hints")
        self.hint_zones = _names(hints.get("forZones"), f"{what} hints.forZones") \
            or self.hint_zones
        self.hint_nodes = _names(hints.get("forNodes"), f"{what} hints.forNodes") \
            or self.hint_nodes


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, (dict, type(None))):
        raise ConvertError(f"{what}: expected a mapping, found {value!r}")
    return value or {}


def _names(references: Any, what: str) -> list[str]:
    """The names of a list of `{name: ...}` (forZones, forNodes)."""
    if not isinstance(references, (list, type(None))):
        raise ConvertError(f"{what}: expected a list, found {references!r}")
    names = [_mapping(reference, what).get("name") for reference in references or []]
    if not all(isinstance(name, str) and name for name in names):
        raise ConvertError(f"{what}: each entry needs a name, found {references!r}")
    return names


def convert(text: str) -> Conversion:
    services: dict[tuple[str, str], localv1.Service] = {}
    left_out: set[tuple[str, str]] = set()  # Services kube-proxy does not program
    slices: dict[tuple[str, str], list[dict[str, Any]]] = {}
    nodes: list[dict[str, Any]] = []
    skipped: Counter = Counter()
    for obj in _objects(text):
        kind = obj.get("kind")
        why = (left_out_service(obj) if kind == "Service" else
               left_out_slice(obj) if kind == "EndpointSlice" else None)
        if why is not None:
            skipped[f"{kind} {why.value}"] += 1
            if kind == "Service":
                left_out.add(_name(obj))
        elif kind == "Service":
            service = service_of(obj)
            services[(service.Namespace, service.Name)] = service
        elif kind == "EndpointSlice":
            owner = slice_service(obj)
            if owner is None:
                skipped["EndpointSlice without a service or of addressType FQDN"] += 1
            else:
                slices.setdefault(owner, []).append(obj)
        elif kind == "Node":
            nodes.append(node_of(obj))
        else:
            skipped[str(kind)] += 1
    entries = [service_entry(service, slices.get(key, ()))
               for key, service in sorted(services.items())]
    for key, found in slices.items():
        if key in left_out:
            skipped["EndpointSlice of a Service left out"] += len(found)
        elif key not in services:
            skipped["EndpointSlice of a Service not in the input"] += len(found)
    return Conversion({"nodes": nodes, "services": entries}, skipped)


def dump(conversion: Conversion) -> str:
    # The block style: the brain reads it on its fast path (docs/brain.md).
    return yaml.safe_dump(conversion.state, sort_keys=False)


def _objects(text: str) -> Iterator[dict[str, Any]]:
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise ConvertError(f"not YAML: {err}") from err
    for document in documents:
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ConvertError("not a Kubernetes object or List (`kubectl get ... -o yaml`)")
        if "kind" not in document:
            raise ConvertError(
                "not a Kubernetes object or List (`kubectl get ... -o yaml`): it has no kind"
                + ("; it is a KPNG state file already: give it to `kpng-py file -i` as it is"
                   if {"nodes", "services"} & document.keys() else ""))
        if document.get("kind", "").endswith("List"):
            yield from (item for item in document.get("items") or [] if isinstance(item, dict))
        else:
            yield document


def _name(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "default", meta.get("name") or ""


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    labels = (obj.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def left_out_slice(obj: dict[str, Any]) -> LeftOut | None:
    """Why kube-proxy does not watch this EndpointSlice (or Service), or None."""
    labels = _labels(obj)
    if SERVICE_PROXY_NAME_LABEL in labels:
        return LeftOut.OTHER_PROXY
    if HEADLESS_LABEL in labels:
        return LeftOut.HEADLESS_LABEL
    return None


def left_out_service(obj: dict[str, Any]) -> LeftOut | None:
    """Why kube-proxy programs nothing of this Service, or None."""
    spec = obj.get("spec") or {}
    if (why := left_out_slice(obj)) is not None:
        return why
    if spec.get("type") == "ExternalName":
        return LeftOut.EXTERNAL_NAME
    if spec.get("clusterIP") in ("None", "", None):
        return LeftOut.HEADLESS
    return None


def _by_family(addresses: Iterable[str], what: str) -> localv1.IPSet:
    ips = localv1.IPSet()
    for text in addresses:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError as err:
            raise ConvertError(f"{what}: {text!r} is not an IP address") from err
        (ips.V4 if ip.version == 4 else ips.V6).append(str(ip))
    return ips


def _set_ips(target: localv1.IPSet, ips: localv1.IPSet) -> None:
    """`target` holds `ips`; left unset (not written out) when there are none."""
    if ips.V4 or ips.V6:
        target.MergeFrom(ips)


def service_of(obj: dict[str, Any]) -> localv1.Service:
    """The Service kube-proxy programs (left_out_service says None of it)."""
    namespace, name = _name(obj)
    what = f"Service {namespace}/{name}"
    if not name:
        raise ConvertError("a Service without metadata.name")
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    service = localv1.Service(Namespace=namespace, Name=name, Type=spec.get("type", "ClusterIP"))
    cluster_ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    _set_ips(service.IPs.ClusterIPs, _by_family(cluster_ips, f"{what} clusterIPs"))
    _set_ips(service.IPs.ExternalIPs, _by_family(spec.get("externalIPs") or [],
                                                 f"{what} externalIPs"))
    ingress = (status.get("loadBalancer") or {}).get("ingress") or []
    lb_ips = _by_family([i["ip"] for i in ingress
                         if i.get("ip") and (i.get("ipMode") or _VIP_MODE) == _VIP_MODE],
                        f"{what} LoadBalancer ingress")
    _set_ips(service.IPs.LoadBalancerIPs, lb_ips)
    if ranges := spec.get("loadBalancerSourceRanges"):
        service.IPFilters.add(TargetIPs=lb_ips, SourceRanges=ranges)
    for port in spec.get("ports") or []:
        service.Ports.append(_port_mapping(port, what))
    if spec.get("sessionAffinity") == "ClientIP":
        config = (spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}
        service.ClientIP.TimeoutSeconds = int(config.get("timeoutSeconds") or 10800)
    service.ExternalTrafficToLocal = spec.get("externalTrafficPolicy") == "Local"
    service.InternalTrafficToLocal = spec.get("internalTrafficPolicy") == "Local"
    service.HealthCheckNodePort = int(spec.get("healthCheckNodePort") or 0)
    return service


def _port_mapping(port: dict[str, Any], what: str) -> localv1.PortMapping:
    protocol = port.get("protocol", "TCP")
    if protocol not in PROTOCOLS:
        raise ConvertError(f"{what} port {port.get('port')}: protocol {protocol!r} is not one of "
                           + ", ".join(PROTOCOLS))
    mapping = localv1.PortMapping(Name=port.get("name", ""), Protocol=PROTOCOLS[protocol],
                                  Port=int(port.get("port") or 0),
                                  NodePort=int(port.get("nodePort") or 0))
    target = port.get("targetPort", mapping.Port)
    if isinstance(target, str) and not target.isdigit():
        mapping.TargetPortName = target
    else:
        mapping.TargetPort = int(target)
    return mapping


def slice_service(obj: dict[str, Any]) -> tuple[str, str] | None:
    """The (namespace, name) of the service an EndpointSlice is of; None for
    a slice without `kubernetes.io/service-name` or of addressType FQDN
    (which no proxy programs)."""
    namespace, _ = _name(obj)
    service = ((obj.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL)
    if not service or obj.get("addressType") not in _FAMILIES:
        return None
    return namespace, service


def service_entry(service: localv1.Service, slices: Iterable[dict[str, Any]]
                  ) -> dict[str, Any]:
    """A `services` entry of the state file: the service and the endpoints of
    its EndpointSlices (each a slice of it: slice_service says so)."""
    return {"service": state_members(service),
            "endpoints": [_endpoint_entry(e) for e in _endpoints(slices).values()]}


def check_slice(obj: dict[str, Any]) -> None:
    """ConvertError naming the slice if service_entry cannot map it."""
    _endpoints([obj])


def _endpoints(slices: Iterable[dict[str, Any]]) -> dict[str, _Endpoint]:
    """One service's endpoints by pod (or address, without a pod)."""
    by_pod: dict[str, _Endpoint] = {}
    for obj in slices:
        what = "EndpointSlice {}/{}".format(*_name(obj))
        ports = _slice_ports(obj, what)
        for item in obj.get("endpoints") or []:
            pod = (item.get("targetRef") or {}).get("name", "")
            addresses = item.get("addresses") or []
            endpoint = by_pod.setdefault(pod or ",".join(addresses), _Endpoint(pod))
            ips = _by_family(addresses, what)
            _check_family(ips, obj["addressType"], what)
            endpoint.add(item, ips, ports, f"{what} endpoint {pod or ','.join(addresses)}")
    return by_pod


def _slice_ports(obj: dict[str, Any], what: str) -> dict[str, int]:
    """The slice's port numbers by name; a port without a number (all ports)
    gives no override."""
    ports = {}
    for port in obj.get("ports") or []:
        number = port.get("port")
        if number is None:
            continue
        if not isinstance(number, int) or not 1 <= number <= MAX_PORT:
            raise ConvertError(f"{what} port {port.get('name', '')!r}: {number!r} is not a port "
                               f"number (1..{MAX_PORT})")
        ports[port.get("name", "")] = number
    return ports


def _check_family(ips: localv1.IPSet, address_type: str, what: str) -> None:
    """A slice's addresses are all of its addressType's family."""
    other = ips.V6 if address_type == "IPv4" else ips.V4
    if other:
        raise ConvertError(f"{what}: {other[0]} is not an {address_type} address, the slice's "
                           "addressType")


def _endpoint_entry(endpoint: _Endpoint) -> dict[str, Any]:
    wire = localv1.Endpoint()
    wire.IPs.V4.extend(endpoint.v4)
    wire.IPs.V6.extend(endpoint.v6)
    for name, port in sorted(endpoint.ports.items()):
        wire.PortOverrides.add(Name=name, Port=port)
    entry: dict[str, Any] = {"podname": endpoint.pod} if endpoint.pod else {}
    entry["endpoint"] = state_members(wire)
    # `serving` and `terminating` (kpng-py's extension) only where they are
    # not the defaults: upstream KPNG reads the file of a cluster without
    # terminating endpoints.
    entry["conditions"] = {"ready": endpoint.ready,
                           **({} if endpoint.serving else {"serving": False}),
                           **({"terminating": True} if endpoint.terminating else {})}
    entry["topology"] = {"node": endpoint.node, "zone": endpoint.zone}
    hints = {"zones": endpoint.hint_zones, "nodes": endpoint.hint_nodes}
    if any(hints.values()):
        entry["hints"] = {key: names for key, names in hints.items() if names}
    return entry


def node_of(obj: dict[str, Any]) -> dict[str, Any]:
    """A `nodes` entry of the state file."""
    _, name = _name(obj)
    zone = ((obj.get("metadata") or {}).get("labels") or {}).get(ZONE_LABEL, "")
    return {"name": name, "topology": {"node": name, "zone": zone}}


def state_members(message: Message) -> dict[str, Any]:
    """A message as the state file writes it: field names lower-cased, enums
    as numbers, unset fields left out, a oneof's member under the oneof's
    name (`sessionaffinity: {clientip: ...}`)."""
    members: dict[str, Any] = {}
    for descriptor, value in message.ListFields():
        oneof = descriptor.containing_oneof
        into = members.setdefault(oneof.name.lower(), {}) if oneof is not None else members
        into[descriptor.name.lower()] = _state_value(descriptor, value)
    return members


def _state_value(descriptor: FieldDescriptor, value: Any) -> Any:
    if descriptor.message_type is None:
        return list(value) if descriptor.is_repeated else value
    if descriptor.message_type.GetOptions().map_entry:
        return dict(value)
    if descriptor.is_repeated:
        return [state_members(v) for v in value]
    return state_members(value)
