"""`kpng-py file convert`: a KPNG state file from what kubectl prints.

Input: `kubectl get nodes,svc,endpointslices -A -o yaml` (a v1 List; single
objects and `---`-separated documents are read too). Each object is mapped
by `kpng-py kube`'s mapping (kpng_py/brain/apiobjects.py) into the brain's
values, which are written out as the state file the built-in brain and
`kpng file` read (docs/brain.md): read back, the file is the very same
values.

Objects of other kinds, and what kube-proxy does not program, are skipped
with a count; an object that cannot be mapped (a slice's address not of its
addressType's family, a port out of range...) is an ObjectError naming it
and what is wrong with it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kpng_py.api import localv1
from kpng_py.brain.apiobjects import (
    Listing,
    left_out_service,
    left_out_slice,
    name_of,
    node_of,
    service_of,
    slice_endpoints,
    slice_service,
    with_endpoints,
)
from kpng_py.brain.statefile import ClusterState, EndpointInfo, ServiceEntry, endpoint_hash


class ConvertError(ValueError):
    """Input that is not Kubernetes objects; the message says what it is."""


@dataclass
class Conversion:
    """The state of what was read; `skipped` counts what was not mapped, by
    what it is."""

    state: ClusterState
    skipped: Counter = field(default_factory=Counter)


def convert(text: str) -> Conversion:
    services: dict[tuple[str, str], ServiceEntry] = {}
    left_out: set[tuple[str, str]] = set()  # Services kube-proxy does not program
    slices: dict[tuple[str, str], list[tuple[Listing, ...]]] = {}
    nodes = []
    skipped: Counter = Counter()
    for obj in _objects(text):
        kind = obj.get("kind")
        why = (left_out_service(obj) if kind == "Service" else
               left_out_slice(obj) if kind == "EndpointSlice" else None)
        if why is not None:
            skipped[f"{kind} {why.value}"] += 1
            if kind == "Service":
                left_out.add(name_of(obj))
        elif kind == "Service":
            service = service_of(obj)
            services[(service.namespace, service.name)] = service
        elif kind == "EndpointSlice":
            owner = slice_service(obj)
            if owner is None:
                skipped["EndpointSlice without a service or of addressType FQDN"] += 1
            else:
                slices.setdefault(owner, []).append(slice_endpoints(obj))
        elif kind == "Node":
            nodes.append(node_of(obj))
        else:
            skipped[str(kind)] += 1
    entries = tuple(with_endpoints(service, slices.get(key, ()))
                    for key, service in sorted(services.items()))
    for key, found in slices.items():
        if key in left_out:
            skipped["EndpointSlice of a Service left out"] += len(found)
        elif key not in services:
            skipped["EndpointSlice of a Service not in the input"] += len(found)
    return Conversion(ClusterState(tuple(nodes), entries), skipped)


def dump(conversion: Conversion) -> str:
    """The state file. The block style: the brain reads it on its fast path
    (docs/brain.md)."""
    state = conversion.state
    return yaml.safe_dump({
        "nodes": [{"name": n.name, "topology": {"node": n.name, "zone": n.zone}}
                  for n in state.nodes],
        "services": [{"service": state_members(localv1.Service.FromString(s.service)),
                      "endpoints": [_endpoint_entry(e) for e in s.endpoints]}
                     for s in state.services]}, sort_keys=False)


def _endpoint_entry(info: EndpointInfo) -> dict[str, Any]:
    # The key of an endpoint without a pod is its hash, which the reader
    # computes again.
    entry: dict[str, Any] = {} if info.key == endpoint_hash(info.endpoint) else {
        "podname": info.key}
    entry["endpoint"] = state_members(localv1.Endpoint.FromString(info.endpoint))
    # `serving` and `terminating` (kpng-py's extension) only where they are
    # not the defaults: upstream KPNG reads the file of a cluster without
    # terminating endpoints.
    entry["conditions"] = {"ready": info.ready,
                           **({} if info.serving else {"serving": False}),
                           **({"terminating": True} if info.terminating else {})}
    entry["topology"] = {"node": info.node, "zone": info.zone}
    hints = {"zones": list(info.hint_zones), "nodes": list(info.hint_nodes)}
    if any(hints.values()):
        entry["hints"] = {key: names for key, names in hints.items() if names}
    return entry


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
