"""KPNG's state file (`kpng file -i FILE`), parsed strictly into frozen values.

The format (docs/spec/state-file.md, docs/brain.md): `nodes` (KPNG's
globalv1 Node) and `services`, each a localv1 `service` with its `endpoints`
(globalv1 EndpointInfo, with kpng-py's extension: `serving` and `terminating`
in `conditions`, `nodes` in `hints`). Keys are the upstream field names
lower-cased and enums are integers. Defaults are upstream's: namespace
`default`; an endpoint's namespace and service name come from its service; an
endpoint without `conditions` is ready.

Anything that cannot be served is an error naming the file, the line, the place
and the problem, and the whole file is rejected: unknown keys, wrong types, IPs
of the wrong family, ports out of range, unknown protocols, duplicates.

Two readers, one reading: the text is read fast into plain values
(`plainload`: json, or yaml-rs, a YAML parser in Rust) and then through
`PlainValue`; a text the fast path has a doubt about, and any file with a
problem, is read again by the strict reader (`reader.Value`), which names the
line of each problem. Both go through the same functions below, so they
accept the same files and build the same state.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain
from typing import Callable, NamedTuple, Sequence, TypeVar

from kpng_py.api import localv1
from kpng_py.brain.items import split_services
from kpng_py.brain.plainload import Plain, Unchecked, plain_document
from kpng_py.brain.plainvalue import PlainValue
from kpng_py.brain.processes import ReadProcesses, read_in_order
from kpng_py.brain.reader import Blame, FieldChecks, StateFileError, Value, read_document
from kpng_py.model import MAX_AFFINITY_TIMEOUT_SECONDS, MAX_PORT
from kpng_py.runtime.collector import collector_paused, freeze_survivors

T = TypeVar("T")
# A document as either reader gives it (the same accessors).
Doc = Value | PlainValue
# Dotted quads that ipaddress reads as IPv4 (no leading zeros, each <= 255):
# most addresses of a big file, checked without building an address.
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                  r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")
DEFAULT_NAMESPACE = "default"
_PROTOCOLS = {localv1.TCP: "TCP", localv1.UDP: "UDP", localv1.SCTP: "SCTP"}
# Computed per node by the brain: a file may carry them (KPNG's own dumps do),
# but they are overwritten.
_PER_NODE_ENDPOINT_FIELDS = ("Local", "Scopes")


@dataclass(frozen=True)
class Node:
    name: str
    zone: str


class EndpointInfo(NamedTuple):
    """One endpoint of a service, before the per-node view. A 10 000-service
    file has 100 000: a tuple is made in a fraction of a dataclass's time."""

    key: str  # the pod name, or a hex hash of `endpoint`
    endpoint: bytes  # a serialized localv1.Endpoint, without Local and Scopes
    local_at: int  # where in `endpoint` Local is written (before PortOverrides)
    ready: bool
    node: str  # topology.node: where the endpoint runs
    hint_zones: tuple[str, ...]  # empty: no zone hints
    # kpng-py's extension of upstream's format (docs/spec/state-file.md): the
    # EndpointSlice conditions and node hints the per-node view needs to
    # decide as kube-proxy does (kpng_py/brain/view.py).
    serving: bool = True
    terminating: bool = False
    hint_nodes: tuple[str, ...] = ()  # empty: no node hints
    zone: str = ""  # topology.zone: not used by the view, kept for `file convert`'s output


@dataclass(frozen=True, slots=True)
class ReadyEndpoints:
    """What a service's ready endpoints say that every node's view decides
    with (kpng_py/brain/view.py): the same for every node, so summed up once
    per entry."""

    nodes: frozenset[str]  # where they run (topology.node)
    # What their node (zone) hints name; None when one of them has none.
    hinted_nodes: frozenset[str] | None
    hinted_zones: frozenset[str] | None

    @classmethod
    def of(cls, endpoints: tuple[EndpointInfo, ...]) -> ReadyEndpoints:
        ready = [info for info in endpoints if info.ready]
        return cls(frozenset(info.node for info in ready),
                   _hinted([info.hint_nodes for info in ready]),
                   _hinted([info.hint_zones for info in ready]))


def _hinted(hints: list[tuple[str, ...]]) -> frozenset[str] | None:
    return frozenset(chain.from_iterable(hints)) if all(hints) else None


SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"


@dataclass(frozen=True)
class ServiceEntry:
    namespace: str
    name: str
    service: bytes  # a serialized localv1.Service, the same for every node
    internal_traffic_local: bool
    external_traffic_local: bool
    endpoints: tuple[EndpointInfo, ...]
    # Its service.kubernetes.io/service-proxy-name label ("": none): such a
    # service is another proxy's, and no node's view has it (as kube-proxy).
    proxy_name: str = ""

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.name}"

    @cached_property
    def ready_endpoints(self) -> ReadyEndpoints:
        return ReadyEndpoints.of(self.endpoints)


@dataclass(frozen=True)
class ClusterState:
    nodes: tuple[Node, ...] = ()
    services: tuple[ServiceEntry, ...] = ()

    def zone_of(self, node_name: str) -> str:
        """The node's zone; "" for an unknown node (as upstream)."""
        return next((n.zone for n in self.nodes if n.name == node_name), "")


def parse_state(data: bytes, file: str) -> ClusterState:
    """The file's state; StateFileError naming the line and the problem."""
    return StateReader(file).read(data)


class StateReader:
    """Reads the versions of one state file. The services of a file that
    writes them as items (items.py: YAML's `- ` under `services:`, the
    entries of a flow sequence under a top-level `services:` in YAML, flow
    style throughout included, or `"services"` in JSON) are read item by
    item, and an item whose text is the same as in the last version read is
    not read again: a one-endpoint edit of a big file reads one service. The
    items to read of a big file are read by two processes (processes.py)."""

    def __init__(self, file: str, processes: ReadProcesses | None = None) -> None:
        self._file = file
        self._processes = processes or ReadProcesses.available()
        self._services: dict[str, ServiceEntry] = {}  # by item text, of the last version

    def read(self, data: bytes) -> ClusterState:
        """The state; StateFileError naming the line and the problem."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise StateFileError(f"{self._file}: not UTF-8 text (byte {err.start})") from err
        with collector_paused():  # a million new objects, none of them garbage
            state = self.read_plain(text, data)
            if state is None:
                state = read_strict(text, self._file)
            # The state is long-lived (its values are freed, without cycles,
            # when a later version replaces them): no collection walks it.
            freeze_survivors()
            return state

    def read_plain(self, text: str, data: bytes | None = None) -> ClusterState | None:
        """The state as the fast path reads it; None when it does not vouch
        for the text (a problem to name, or a doubt). `data`: the text's
        UTF-8 bytes, if the caller has them (read without a copy)."""
        skeleton, items = split_services(text)
        try:
            document = plain_document(skeleton, data if skeleton is text else None)
            in_place = _taken_services(document)
            if items and in_place:
                return None  # services both in place and as items: not one document
            state = _cluster_state(PlainValue(document))
            services = self._item_services(items)
            entries = ([services[item] for item in items] if items
                       else read_in_order(_plain_service_entry, in_place))
        except Unchecked:
            return None
        if len({entry.path for entry in entries}) < len(entries):
            return None  # two services with one name: the strict reader says where
        self._services = services
        return replace(state, services=tuple(entries))

    def _item_services(self, items: list[str]) -> dict[str, ServiceEntry]:
        """Each item's service: the last version's where its text is the
        same, else read (by two processes if many)."""
        known = self._services
        unread = [item for item in dict.fromkeys(items) if item not in known]
        read = dict(zip(unread, self._processes.read_each(_service_item, unread.copy())))
        return {item: known.get(item) or read[item] for item in items}


def _taken_services(document: Plain) -> list[Plain]:
    """The document's list of services, taken out of it (then read in order,
    each one's plain values let go once read: a big document's values are
    not all kept beside the state they become); empty if it has none, or
    something else in its place."""
    if type(document) is dict and type(document.get("services")) is list:
        return document.pop("services")
    return []


def _plain_service_entry(plain: Plain) -> ServiceEntry:
    return _service_entry(PlainValue(plain))


def _service_item(item: str) -> ServiceEntry:
    plain = plain_document(item)
    if type(plain) is not list or len(plain) != 1:
        raise Unchecked("a services item that is not one entry")
    return _service_entry(PlainValue(plain[0]))


def read_strict(text: str, file: str) -> ClusterState:
    """The state of any file, or the error naming the file, line and place."""
    return _cluster_state(read_document(text, file))


def _cluster_state(document: Doc) -> ClusterState:
    top = document.mapping(("nodes", "services"), _kubernetes_hints(document.place.file))
    return ClusterState(
        nodes=_unique(top["nodes"].sequence(), _node, lambda n: n.name, "node"),
        services=_unique(top["services"].sequence(), _service_entry, lambda s: s.path,
                         "service"))


# The top-level keys of what `kubectl get ... -o yaml` prints (a List, or one
# object), which `kpng-py file convert` reads.
_KUBERNETES_KEYS = ("apiVersion", "kind", "items", "metadata", "spec")


def _kubernetes_hints(file: str) -> dict[str, str]:
    hint = ("the file holds Kubernetes objects (`kubectl get ... -o yaml`), not a KPNG state: "
            f"run `kpng-py file convert -i {file} -o state.yaml` first and give state.yaml to -i")
    return dict.fromkeys(_KUBERNETES_KEYS, hint)


def _unique(values: Sequence[Doc], read: Callable[[Doc], T], key: Callable[[T], str],
            what: str) -> tuple[T, ...]:
    """Read each value; two with the same key are an error naming both."""
    first_by_key: dict[str, Doc] = {}
    items: list[T] = []
    for value in values:
        item = read(value)
        first = first_by_key.setdefault(key(item), value)
        if first is not value:
            value.fail(f"{what} {key(item)!r} is already defined at {first.place.path} "
                       f"(line {first.place.line}); remove one")
        items.append(item)
    return tuple(items)


def _node(value: Doc) -> Node:
    members = value.mapping(("name", "labels", "annotations", "topology"))
    name = members["name"].string()
    if not name:
        value.fail("a node needs a name")
    members["labels"].string_map()  # checked; the brain does not use them
    members["annotations"].string_map()
    return Node(name, members["topology"].mapping(("node", "zone"))["zone"].string())


# -- services --------------------------------------------------------------------


def _service_entry(value: Doc) -> ServiceEntry:
    members = value.mapping(("service", "endpoints"))
    if members["service"].is_null:
        value.fail("each entry of services needs a `service`")
    service = members["service"].message(localv1.Service, CHECKS)
    service.Namespace = service.Namespace or DEFAULT_NAMESPACE
    check_service_path(members["service"], service)
    return ServiceEntry(
        service.Namespace, service.Name, service.SerializeToString(deterministic=True),
        service.InternalTrafficToLocal, service.ExternalTrafficToLocal,
        _unique(members["endpoints"].sequence(), _endpoint_info, lambda e: e.key, "endpoint"),
        service.Labels.get(SERVICE_PROXY_NAME_LABEL, ""))


def check_service_path(value: Blame, service: localv1.Service) -> None:
    """Its namespace and name make a path: non-empty, without '/'."""
    for label, name in (("namespace", service.Namespace), ("name", service.Name)):
        if not name or "/" in name:
            value.fail(f"the service {label} {name!r} must be non-empty and without '/'")


_ENDPOINT_INFO_KEYS = ("hash", "namespace", "sourcename", "servicename", "podname",
                       "endpoint", "conditions", "topology", "hints")


def _endpoint_info(value: Doc) -> EndpointInfo:
    members = value.mapping(_ENDPOINT_INFO_KEYS)
    # Checked for type only: upstream overwrites these from the service.
    members["hash"].integer(0, (1 << 64) - 1)
    for key in ("namespace", "sourcename", "servicename"):
        members[key].string()
    if members["endpoint"].is_null:
        value.fail("an endpoint needs `endpoint` (its ips and port overrides)")
    endpoint = members["endpoint"].message(localv1.Endpoint, CHECKS)
    for name in _PER_NODE_ENDPOINT_FIELDS:
        endpoint.ClearField(name)
    wire = endpoint.SerializeToString(deterministic=True)
    # Fields are written in number order: Local (3) belongs where
    # PortOverrides (4) starts, after the fields before it.
    endpoint.ClearField("PortOverrides")
    local_at = endpoint.ByteSize()
    ready, serving, terminating = _conditions(members["conditions"])
    hints = members["hints"].mapping(("zones", "nodes"))
    topology = members["topology"].mapping(("node", "zone"))
    return EndpointInfo(
        key=members["podname"].string() or endpoint_hash(wire),
        endpoint=wire,
        local_at=local_at,
        ready=ready,
        node=topology["node"].string(),
        hint_zones=tuple(z.string() for z in hints["zones"].sequence()),
        serving=serving,
        terminating=terminating,
        hint_nodes=tuple(n.string() for n in hints["nodes"].sequence()),
        zone=topology["zone"].string(),
    )


def _conditions(value: Doc) -> tuple[bool, bool, bool]:
    """(ready, serving, terminating). As upstream: no `conditions` means
    ready; `conditions` without `ready` means not ready. As an EndpointSlice
    (kube-proxy reads it so): without `serving`, serving; without
    `terminating`, not terminating."""
    if value.is_null:
        return True, True, False
    members = value.mapping(("ready", "serving", "terminating"))
    serving = members["serving"]
    return (members["ready"].boolean(), serving.is_null or serving.boolean(),
            members["terminating"].boolean())


def endpoint_hash(endpoint: bytes) -> str:
    """The key of an endpoint without a pod name: 64 bits of a hash of its bytes,
    in hex. Stable across runs and nodes (Local and Scopes are not hashed)."""
    return hashlib.blake2b(endpoint, digest_size=8).hexdigest()


# -- field checks ----------------------------------------------------------------


def _ip_of(version: int) -> Callable[[Blame, str], None]:
    def check(value: Blame, text: str) -> None:
        if version == 4 and IPV4.fullmatch(text):
            return
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            value.fail(f"{text!r} is not an IP address")
        if ip.version != version:
            value.fail(f"{text} is not an IPv{version} address; list it under "
                       f"v{ip.version}")
    return check


def _cidr(value: Blame, text: str) -> None:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        value.fail(f"{text!r} is not a CIDR (e.g. 10.0.0.0/8 or fd00::/64)")


def _in_range(low: int, high: int, what: str) -> Callable[[Blame, int], None]:
    def check(value: Blame, number: int) -> None:
        if not low <= number <= high:
            value.fail(f"{what} {number} is outside {low}..{high}")
    return check


def _require_port(value: Blame, port: int) -> None:
    if not 1 <= port <= MAX_PORT:
        given = f"port {port}" if port else "no port"
        value.fail(f"{given}; set port to a number in 1..{MAX_PORT}")


def _port_mapping(value: Blame, mapping: localv1.PortMapping) -> None:
    """Every service port needs a protocol (unlike upstream, which would serve
    UnknownProtocol, a port no backend can program) and a port number."""
    if mapping.Protocol not in _PROTOCOLS:
        given = f"protocol {mapping.Protocol}" if mapping.Protocol else "no protocol"
        value.fail(f"{given}; set protocol to "
                   + ", ".join(f"{n} ({name})" for n, name in _PROTOCOLS.items()))
    _require_port(value, mapping.Port)


def _port_override(value: Blame, override: localv1.PortName) -> None:
    _require_port(value, override.Port)


_OPTIONAL_PORT = _in_range(0, MAX_PORT, "port (0: none)")
CHECKS: FieldChecks = {
    "localv1.IPSet.V4": _ip_of(4),
    "localv1.IPSet.V6": _ip_of(6),
    "localv1.IPFilter.SourceRanges": _cidr,
    "localv1.PortMapping": _port_mapping,
    "localv1.PortMapping.NodePort": _OPTIONAL_PORT,
    "localv1.PortMapping.TargetPort": _OPTIONAL_PORT,
    "localv1.PortName": _port_override,
    "localv1.Service.HealthCheckNodePort": _OPTIONAL_PORT,
    "localv1.ClientIPAffinity.TimeoutSeconds": _in_range(
        0, MAX_AFFINITY_TIMEOUT_SECONDS, "timeout (0: the default 10800 s)"),
}
