"""The ClusterState of the API server's objects, mapped by the mapping
`kpng-py file convert` uses (kpng_py/brain/apiobjects.py) straight into the
brain's values, with the state file reader's checks: the kube brain serves
what the file brain serves for the same objects written out by `convert`.

Each Service and EndpointSlice is mapped again only when it has a new
resourceVersion, and a service's entry made again only when its Service or
one of its slices has: a relist that changed nothing gives the very same
entries, an equal state, and no new version; a change of one slice maps
that slice.

What kube-proxy does not program is left out (apiobjects.left_out_service,
left_out_slice): a Service without a ClusterIP or of type ExternalName is
logged and counted as the backends count it when a brain serves one
(headless, external-name); Services and EndpointSlices labelled for another
proxy or as headless are left out silently, as kube-proxy never sees them.

What cannot be programmed is skipped, logged once for each version of the
object, counted in kpng_py_skipped_total{reason}, and the rest is served:
a Service that cannot be mapped (bad-service), an EndpointSlice that cannot
be mapped (bad-endpointslice: an address not of its addressType's family, a
port out of range), a slice of a Service that does not exist
(unknown-service), a Node that cannot be mapped (bad-node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

from kpng_py.brain.apiobjects import (
    LeftOut,
    Listing,
    ObjectError,
    left_out_service,
    left_out_slice,
    node_of,
    service_of,
    slice_endpoints,
    slice_service,
    with_endpoints,
)
from kpng_py.brain.kube.reflector import Store
from kpng_py.brain.statefile import ClusterState, Node, ServiceEntry
from kpng_py.state.skips import SkipReason, Skips

T = TypeVar("T")
# A service's slice, mapped: the key of its service and its endpoints' listings.
SliceOf = tuple[str, tuple[Listing, ...]]
# The Services left out that are counted, as a backend counts them.
_COUNTED = {LeftOut.HEADLESS: SkipReason.HEADLESS, LeftOut.EXTERNAL_NAME: SkipReason.EXTERNAL_NAME}


@dataclass(frozen=True)
class _Mapped(Generic[T]):
    """An object at one version: mapped, or None if it cannot be or is left out."""

    version: str
    value: T | None


@dataclass(frozen=True)
class _Built:
    """A service's entry and the versions of what it was made of."""

    inputs: tuple[str, tuple[tuple[str, str], ...]]
    entry: ServiceEntry


@dataclass
class ClusterBuilder:
    """Makes ClusterStates from the stores, again and again, keeping what it
    made of each object's version."""

    skips: Skips
    _services: dict[str, _Mapped[ServiceEntry]] = field(default_factory=dict)
    _slices: dict[str, _Mapped[SliceOf]] = field(default_factory=dict)
    _nodes: dict[str, _Mapped[Node]] = field(default_factory=dict)
    _built: dict[str, _Built] = field(default_factory=dict)
    _orphans: set[tuple[str, str]] = field(default_factory=set)  # reported

    def build(self, services: Store, slices: Store, nodes: Store) -> ClusterState:
        self._services = _mapped_all(services, self._services, self._service)
        self._slices = _mapped_all(slices, self._slices, self._slice)
        self._nodes = _mapped_all(nodes, self._nodes, self._node)
        by_service = self._slices_by_service()
        built = {}
        for key, service in sorted(self._services.items()):
            if service.value is not None:
                built[key] = self._entry(key, service.version, service.value,
                                         by_service.get(key, []))
        self._built = built
        return ClusterState(
            nodes=tuple(node.value for _, node in sorted(self._nodes.items())
                        if node.value is not None),
            services=tuple(b.entry for b in built.values()))

    def _service(self, key: str, obj: dict[str, Any]) -> ServiceEntry | None:
        why = left_out_service(obj)
        if why is not None:
            if why in _COUNTED:
                self.skips.skip(_COUNTED[why], f"Service {key}",
                                f"{why.value}: not programmed, as by kube-proxy")
            return None
        try:
            return service_of(obj)
        except ObjectError as err:
            self.skips.skip(SkipReason.BAD_SERVICE, f"Service {key}", str(err))
            return None

    def _slice(self, key: str, obj: dict[str, Any]) -> SliceOf | None:
        """A service's slice, mapped; None if it is not one (addressType FQDN,
        no service-name label), is left out, or cannot be mapped (reported)."""
        owner = slice_service(obj)
        if owner is None or left_out_slice(obj) is not None:
            return None
        try:
            return "/".join(owner), slice_endpoints(obj)
        except ObjectError as err:
            self.skips.skip(SkipReason.BAD_ENDPOINT_SLICE, f"EndpointSlice {key}", str(err))
            return None

    def _node(self, key: str, obj: dict[str, Any]) -> Node | None:
        try:
            return node_of(obj)
        except ObjectError as err:
            self.skips.skip(SkipReason.BAD_NODE, f"Node {key[1:]}", str(err))
            return None

    def _slices_by_service(self) -> dict[str, list[tuple[str, _Mapped[SliceOf]]]]:
        """Each service's slices (mapped) by key, sorted; a slice of a service
        that does not exist is reported once for each version."""
        by_service: dict[str, list[tuple[str, _Mapped[SliceOf]]]] = {}
        orphans = set()
        for key, mapped in sorted(self._slices.items()):
            if mapped.value is None:
                continue
            service = mapped.value[0]
            if service not in self._services:
                orphans.add((key, mapped.version))
                if (key, mapped.version) not in self._orphans:
                    self.skips.skip(SkipReason.UNKNOWN_SERVICE, f"EndpointSlice {key}",
                                    f"its service {service} does not exist")
                continue
            by_service.setdefault(service, []).append((key, mapped))
        self._orphans = orphans
        return by_service

    def _entry(self, key: str, version: str, service: ServiceEntry,
               slices: list[tuple[str, _Mapped[SliceOf]]]) -> _Built:
        inputs = (version, tuple((k, mapped.version) for k, mapped in slices))
        known = self._built.get(key)
        if known is not None and known.inputs == inputs:
            return known
        return _Built(inputs, with_endpoints(
            service, [mapped.value[1] for _, mapped in slices if mapped.value is not None]))


def _mapped_all(store: Store, known: dict[str, _Mapped[T]],
                mapping: Callable[[str, dict[str, Any]], T | None]) -> dict[str, _Mapped[T]]:
    """Each object of the store, mapped (again only if its version is new)."""
    mapped = {}
    for key, obj in store.items():
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        old = known.get(key)
        mapped[key] = old if old is not None and old.version == version else \
            _Mapped(version, mapping(key, obj))
    return mapped
