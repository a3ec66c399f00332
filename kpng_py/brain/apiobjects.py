"""Kubernetes API objects (as the API server or kubectl gives them: plain
JSON values) mapped straight to the brain's values: a Service and its
EndpointSlices to a statefile.ServiceEntry and its EndpointInfos, a Node to
a statefile.Node. One mapping for `kpng-py file convert`, which writes the
values out as a state file (kpng_py/brain/convert.py), and `kpng-py kube`,
which serves them (kpng_py/brain/kube/cluster.py); the state file's reader
reads that file back into the same values.

As KPNG's kube watcher maps the objects:

- a Service becomes a localv1 Service: ClusterIPs by family, externalIPs,
  LoadBalancer ingress IPs, ports (a named targetPort becomes
  `TargetPortName`), ClientIP affinity, the traffic policies,
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

The state file reader's checks (statefile.CHECKS: IP families, port and
timeout ranges, CIDRs, protocols, the service's path) apply to each mapped
Service as to a file's; an endpoint's addresses are checked against its
slice's addressType and its port overrides by the same port check. What
fails is an ObjectError naming the object and the problem.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import replace
from typing import Any, Iterable, NamedTuple, NoReturn

from kpng_py.api import localv1
from kpng_py.brain.reader import check_message
from kpng_py.brain.statefile import (
    CHECKS,
    DEFAULT_NAMESPACE,
    SERVICE_PROXY_NAME_LABEL,
    EndpointInfo,
    Node,
    ServiceEntry,
    check_service_path,
    endpoint_hash,
)

PROTOCOLS = {"TCP": localv1.TCP, "UDP": localv1.UDP, "SCTP": localv1.SCTP}
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# Set by the EndpointSlice controller on the slices of a headless Service.
HEADLESS_LABEL = "service.kubernetes.io/headless"
ZONE_LABEL = "topology.kubernetes.io/zone"
_FAMILIES = {"IPv4": 4, "IPv6": 6}
# A LoadBalancer ingress IP's ipMode that kube-proxy programs (as when unset).
_VIP_MODE = "VIP"
_DEFAULT_AFFINITY_SECONDS = 10800
_INT32 = (-(1 << 31), (1 << 31) - 1)
# An IPv4 address as ipaddress writes it (no leading zeros): most addresses,
# taken as they are without making an address object.
_IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                   r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")


class ObjectError(ValueError):
    """An API object that cannot be mapped; the message names it."""


class LeftOut(enum.Enum):
    """Why kube-proxy programs nothing of a Service or an EndpointSlice."""

    # Selected out of its informers' lists and watches (both kinds): the
    # EndpointSlice controller copies a Service's labels onto its slices.
    OTHER_PROXY = f"labelled {SERVICE_PROXY_NAME_LABEL} (another proxy's)"
    HEADLESS_LABEL = f"labelled {HEADLESS_LABEL}"
    # Services it lists but skips (ShouldSkipService).
    HEADLESS = "without a ClusterIP (headless)"
    EXTERNAL_NAME = "of type ExternalName"


class _Blame:
    """What a state-file check blames for an object's field: the object."""

    def __init__(self, what: str) -> None:
        self._what = what

    def fail(self, problem: str) -> NoReturn:
        raise ObjectError(f"{self._what}: {problem}")


def name_of(obj: dict[str, Any]) -> tuple[str, str]:
    """An object's namespace (`default` if none) and name ("" if none)."""
    meta = _member(obj, "metadata")
    namespace, name = meta.get("namespace"), meta.get("name")
    return (namespace if isinstance(namespace, str) and namespace else DEFAULT_NAMESPACE,
            name if isinstance(name, str) else "")


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    return _member(_member(obj, "metadata"), "labels")


def _member(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """A member that is a mapping; {} if it is not (the mapping names it then)."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


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
    if (why := left_out_slice(obj)) is not None:
        return why
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        return None  # service_of names what is wrong
    if spec.get("type") == "ExternalName":
        return LeftOut.EXTERNAL_NAME
    if spec.get("clusterIP") in ("None", "", None):
        return LeftOut.HEADLESS
    return None


# -- Services ----------------------------------------------------------------------


def service_of(obj: dict[str, Any]) -> ServiceEntry:
    """The entry of a Service kube-proxy programs (left_out_service says None
    of it), without endpoints (`with_endpoints` adds them)."""
    namespace, name = name_of(obj)
    what = f"Service {namespace}/{name}"
    if not name:
        raise ObjectError("a Service without metadata.name")
    service = _service(obj, namespace, name, what)
    check_service_path(_Blame(what), service)
    check_message(service, CHECKS, lambda path: _Blame(f"{what} {path}"))
    return ServiceEntry(namespace, name, service.SerializeToString(deterministic=True),
                        service.InternalTrafficToLocal, service.ExternalTrafficToLocal, ())


def _service(obj: dict[str, Any], namespace: str, name: str, what: str) -> localv1.Service:
    spec, status = _mapping(obj.get("spec"), f"{what} spec"), \
        _mapping(obj.get("status"), f"{what} status")
    service = localv1.Service(Namespace=namespace, Name=name,
                              Type=_text(spec.get("type", "ClusterIP"), f"{what} type"))
    cluster_ips = spec.get("clusterIPs") or [spec["clusterIP"]]
    _set_ips(service.IPs.ClusterIPs, _by_family(cluster_ips, f"{what} clusterIPs"))
    _set_ips(service.IPs.ExternalIPs, _by_family(spec.get("externalIPs") or [],
                                                 f"{what} externalIPs"))
    ingress = _mapping(status.get("loadBalancer"), f"{what} status.loadBalancer").get(
        "ingress") or []
    lb_ips = _by_family([i["ip"] for i in ingress if isinstance(i, dict) and i.get("ip")
                         and (i.get("ipMode") or _VIP_MODE) == _VIP_MODE],
                        f"{what} LoadBalancer ingress")
    _set_ips(service.IPs.LoadBalancerIPs, lb_ips)
    if ranges := spec.get("loadBalancerSourceRanges"):
        service.IPFilters.add(TargetIPs=lb_ips, SourceRanges=[
            _text(r, f"{what} loadBalancerSourceRanges").strip() for r in ranges])
    for port in spec.get("ports") or []:
        service.Ports.append(_port_mapping(_mapping(port, f"{what} port"), what))
    if spec.get("sessionAffinity") == "ClientIP":
        config = _mapping(_mapping(spec.get("sessionAffinityConfig"), f"{what} affinity")
                          .get("clientIP"), f"{what} affinity")
        service.ClientIP.TimeoutSeconds = _int32(
            config.get("timeoutSeconds") or _DEFAULT_AFFINITY_SECONDS, f"{what} timeoutSeconds")
    service.ExternalTrafficToLocal = spec.get("externalTrafficPolicy") == "Local"
    service.InternalTrafficToLocal = spec.get("internalTrafficPolicy") == "Local"
    service.HealthCheckNodePort = _int32(spec.get("healthCheckNodePort") or 0,
                                         f"{what} healthCheckNodePort")
    return service


def _port_mapping(port: dict[str, Any], what: str) -> localv1.PortMapping:
    protocol = port.get("protocol", "TCP")
    if not isinstance(protocol, str) or protocol not in PROTOCOLS:
        raise ObjectError(f"{what} port {port.get('port')}: protocol {protocol!r} is not one of "
                          + ", ".join(PROTOCOLS))
    number = _int32(port.get("port") or 0, f"{what} port")
    mapping = localv1.PortMapping(Name=_text(port.get("name", ""), f"{what} port name"),
                                  Protocol=PROTOCOLS[protocol], Port=number,
                                  NodePort=_int32(port.get("nodePort") or 0, f"{what} nodePort"))
    target = port.get("targetPort", number)
    if isinstance(target, str) and not target.isdigit():
        mapping.TargetPortName = target
    else:
        mapping.TargetPort = _int32(int(target) if isinstance(target, str) else target,
                                    f"{what} targetPort")
    return mapping


def _by_family(addresses: Iterable[Any], what: str) -> localv1.IPSet:
    ips = localv1.IPSet()
    for text in addresses:
        (ips.V4 if _ip_version(text, what) == 4 else ips.V6).append(_normal(text))
    return ips


def _set_ips(target: localv1.IPSet, ips: localv1.IPSet) -> None:
    """`target` holds `ips`; left unset (not written out) when there are none."""
    if ips.V4 or ips.V6:
        target.MergeFrom(ips)


# -- EndpointSlices --------------------------------------------------------------


def slice_service(obj: dict[str, Any]) -> tuple[str, str] | None:
    """The (namespace, name) of the service an EndpointSlice is of; None for
    a slice without `kubernetes.io/service-name` or of addressType FQDN
    (which no proxy programs)."""
    namespace, _ = name_of(obj)
    service, address_type = _labels(obj).get(SERVICE_NAME_LABEL), obj.get("addressType")
    if not isinstance(service, str) or not service or not isinstance(address_type, str) \
            or address_type not in _FAMILIES:
        return None
    return namespace, service


class Listing(NamedTuple):
    """One endpoint as one slice lists it (a pod in an IPv4 and an IPv6
    slice is listed twice)."""

    pod: str
    addresses: tuple[str, ...]  # of the slice's family, checked
    ports: tuple[tuple[str, int], ...]  # the slice's port numbers by name
    overrides: bytes  # those ports as localv1.Endpoint.PortOverrides
    ready: bool
    serving: bool
    terminating: bool
    node: str | None  # None: not given
    zone: str | None
    hint_zones: tuple[str, ...]
    hint_nodes: tuple[str, ...]


def slice_endpoints(obj: dict[str, Any]) -> tuple[Listing, ...]:
    """The endpoints of a service's EndpointSlice (slice_service says whose);
    ObjectError naming the slice if one cannot be mapped."""
    what = "EndpointSlice {}/{}".format(*name_of(obj))
    ports = _slice_ports(obj, what)
    overrides = localv1.Endpoint(PortOverrides=[
        localv1.PortName(Name=name, Port=port) for name, port in sorted(ports)
    ]).SerializeToString(deterministic=True)
    address_type = obj["addressType"]
    family = _FAMILIES[address_type]
    listings = []
    for item in obj.get("endpoints") or []:
        item = _mapping(item, f"{what} endpoint")
        addresses = tuple(_address(text, family, address_type, what)
                          for text in item.get("addresses") or ())
        try:
            listings.append(_listing(item, addresses, ports, overrides))
        except ObjectError as err:  # named here: a name per endpoint costs at 100 000
            raise ObjectError(f"{what} endpoint {_endpoint_name(item, addresses)} {err}") \
                from None
    return tuple(listings)


def _listing(item: dict[str, Any], addresses: tuple[str, ...],
             ports: tuple[tuple[str, int], ...], overrides: bytes) -> Listing:
    """ObjectError naming the member (not the endpoint) if one is wrong."""
    ref = item.get("targetRef")
    pod = "" if ref is None else _text(_mapping(ref, "targetRef").get("name", ""),
                                       "targetRef.name")
    # As kube-proxy reads an EndpointSlice: an unknown readiness or serving
    # counts as true, an unknown terminating as false.
    conditions = _mapping(item.get("conditions"), "conditions")
    hints = item.get("hints")
    zones, nodes = ((), ()) if hints is None else (
        _names(_mapping(hints, "hints").get("forZones"), "hints.forZones"),
        _names(hints.get("forNodes"), "hints.forNodes"))
    node, zone = item.get("nodeName"), item.get("zone")
    return Listing(
        pod, addresses, ports, overrides, conditions.get("ready") is not False,
        conditions.get("serving") is not False, conditions.get("terminating") is True,
        None if node is None else _text(node, "nodeName"),
        None if zone is None else _text(zone, "zone"), zones, nodes)


def _endpoint_name(item: dict[str, Any], addresses: tuple[str, ...]) -> str:
    """Its pod's name, or else its addresses."""
    ref = item.get("targetRef")
    pod = ref.get("name") if isinstance(ref, dict) else None
    return pod if isinstance(pod, str) and pod else ",".join(addresses)


def _slice_ports(obj: dict[str, Any], what: str) -> tuple[tuple[str, int], ...]:
    """The slice's port numbers by name, each checked as a port override; a
    port without a number (all ports) gives no override."""
    ports = {}
    for port in obj.get("ports") or []:
        port = _mapping(port, f"{what} port")
        number = port.get("port")
        if number is None:
            continue
        name = _text(port.get("name", ""), f"{what} port name")
        check = _Blame(f"{what} port {name!r}")
        if type(number) is not int:
            check.fail(f"{number!r} is not a port number")
        CHECKS["localv1.PortName"](check, localv1.PortName(Name=name, Port=_int32(number, what)))
        ports[name] = number
    return tuple(ports.items())


def _address(text: Any, family: int, address_type: str, what: str) -> str:
    """An endpoint's address, of its slice's family."""
    if family == 4 and type(text) is str and _IPV4.fullmatch(text):
        return text
    if _ip_version(text, what) != family:
        raise ObjectError(f"{what}: {text} is not an {address_type} address, the slice's "
                          "addressType")
    return _normal(text)


# -- endpoints of a service ------------------------------------------------------


def with_endpoints(service: ServiceEntry, slices: Iterable[tuple[Listing, ...]]
                   ) -> ServiceEntry:
    """The service's entry with the endpoints of its slices' listings: one
    per pod (or address, without a pod), in the order first listed."""
    by_key: dict[str, list[Listing]] = {}
    for listings in slices:
        for listing in listings:
            by_key.setdefault(listing.pod or ",".join(listing.addresses), []).append(listing)
    return replace(service, endpoints=tuple(
        _endpoint(listings[0]) if len(listings) == 1 else _endpoint(_merged(listings))
        for listings in by_key.values()))


def _merged(listings: list[Listing]) -> Listing:
    """A pod listed in several slices (one per family, or two while it
    moves): its addresses once, the ports of all (the last listing's number
    for a name), ready (serving) only if every listing says so and
    terminating if one does; the last listing's node, zone and hints that
    give them."""
    addresses = list(dict.fromkeys(a for listing in listings for a in listing.addresses))
    ports = dict(p for listing in listings for p in listing.ports)
    overrides = localv1.Endpoint(PortOverrides=[
        localv1.PortName(Name=name, Port=port) for name, port in sorted(ports.items())
    ]).SerializeToString(deterministic=True)
    last = listings[-1]
    return Listing(
        last.pod, tuple(sorted(addresses, key=lambda a: ":" in a)), tuple(ports.items()),
        overrides, all(x.ready for x in listings), all(x.serving for x in listings),
        any(x.terminating for x in listings),
        next((x.node for x in reversed(listings) if x.node is not None), None),
        next((x.zone for x in reversed(listings) if x.zone is not None), None),
        next((x.hint_zones for x in reversed(listings) if x.hint_zones), ()),
        next((x.hint_nodes for x in reversed(listings) if x.hint_nodes), ()))


def _endpoint(listing: Listing) -> EndpointInfo:
    addresses = listing.addresses
    ips = localv1.Endpoint(IPs=localv1.IPSet(
        V4=[a for a in addresses if ":" not in a], V6=[a for a in addresses if ":" in a])
    ).SerializeToString() if addresses else b""
    wire = ips + listing.overrides
    return EndpointInfo(
        key=listing.pod or endpoint_hash(wire), endpoint=wire, local_at=len(ips),
        ready=listing.ready, node=listing.node or "", hint_zones=listing.hint_zones,
        serving=listing.serving, terminating=listing.terminating,
        hint_nodes=listing.hint_nodes, zone=listing.zone or "")


# -- Nodes -----------------------------------------------------------------------


def node_of(obj: dict[str, Any]) -> Node:
    _, name = name_of(obj)
    if not name:
        raise ObjectError("a Node without metadata.name")
    return Node(name, _text(_labels(obj).get(ZONE_LABEL, ""), f"Node {name} zone label"))


# -- values ----------------------------------------------------------------------


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, (dict, type(None))):
        raise ObjectError(f"{what}: expected a mapping, found {value!r}")
    return value or {}


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ObjectError(f"{what}: expected a string, found {value!r}")
    return value


def _int32(value: Any, what: str) -> int:
    if type(value) is not int or not _INT32[0] <= value <= _INT32[1]:
        raise ObjectError(f"{what}: {value!r} is not a number the API allows")
    return value


def _names(references: Any, what: str) -> tuple[str, ...]:
    """The names of a list of `{name: ...}` (forZones, forNodes)."""
    if references is None:
        return ()
    if not isinstance(references, list):
        raise ObjectError(f"{what}: expected a list, found {references!r}")
    names = tuple(_mapping(reference, what).get("name") for reference in references)
    if not all(isinstance(name, str) and name for name in names):
        raise ObjectError(f"{what}: each entry needs a name, found {references!r}")
    return names  # type: ignore[return-value]


def _ip_version(text: Any, what: str) -> int:
    try:
        if not isinstance(text, str):
            raise ValueError(text)
        return ipaddress.ip_address(text).version
    except ValueError as err:
        raise ObjectError(f"{what}: {text!r} is not an IP address") from err


def _normal(text: str) -> str:
    """The address as the state file's reader keeps it (ipaddress's form)."""
    return text if _IPV4.fullmatch(text) else str(ipaddress.ip_address(text))
