"""The ClusterState of the API server's objects, mapped as `kpng-py file
convert` maps them (kpng_py/brain/convert.py) and read as the state file's
entries are read (kpng_py/brain/statefile.py): the kube brain serves what
the file brain would serve for the same objects written out by `convert`.

A service's entry is made again only when its Service or one of its
EndpointSlices has a new resourceVersion: a relist that changed nothing
gives the very same entries, an equal state, and no new version.

What kube-proxy does not program is left out (convert.left_out_service,
left_out_slice): a Service without a ClusterIP or of type ExternalName is
logged and counted as the backends count it when a brain serves one
(headless, external-name); Services and EndpointSlices labelled for another
proxy or as headless are left out silently, as kube-proxy never sees them.

What cannot be programmed is skipped, logged once for each version of the
object, counted in kpng_py_skipped_total{reason}, and the rest is served:
a Service that cannot be mapped (bad-service), an EndpointSlice that cannot
be mapped (bad-endpointslice: an address not of its addressType's family, a
port out of range), a slice of a Service that does not exist
(unknown-service).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kpng_py.api import localv1
from kpng_py.brain.convert import ConvertError, LeftOut, check_slice, left_out_service, \
    left_out_slice, node_of, service_entry, service_of, slice_service
from kpng_py.brain.kube.reflector import Store
from kpng_py.brain.settings import StateFileError
from kpng_py.brain.statefile import ClusterState, Node, ServiceEntry, read_node, \
    read_service_entry
from kpng_py.state.skips import SkipReason, Skips

# An object's key in its store and its resourceVersion.
Version = tuple[str, str]
# The Services left out that are counted, as a backend counts them.
_COUNTED = {LeftOut.HEADLESS: SkipReason.HEADLESS, LeftOut.EXTERNAL_NAME: SkipReason.EXTERNAL_NAME}


@dataclass(frozen=True)
class _Mapped:
    """A Service at one version: mapped, or None if it cannot be or is left out."""

    version: str
    service: localv1.Service | None


@dataclass(frozen=True)
class _Built:
    """A service's entry and the versions of what it was made of."""

    inputs: tuple[str, tuple[Version, ...]]
    entry: ServiceEntry | None


@dataclass
class ClusterBuilder:
    """Makes ClusterStates from the stores, again and again, keeping what it
    made of each object's version."""

    skips: Skips
    _services: dict[str, _Mapped] = field(default_factory=dict)
    _built: dict[str, _Built] = field(default_factory=dict)
    _bad_slices: set[Version] = field(default_factory=set)  # reported
    _orphans: set[Version] = field(default_factory=set)  # reported

    def build(self, services: Store, slices: Store, nodes: Store) -> ClusterState:
        mapped = {key: self._mapped(key, obj) for key, obj in services.items()}
        self._services = mapped
        by_service = self._slices_by_service(slices, mapped)
        built = {}
        for key in sorted(mapped):
            service = mapped[key].service
            if service is None:
                continue
            built[key] = self._entry(key, mapped[key], service, by_service.get(key, []))
        self._built = built
        return ClusterState(
            nodes=self._nodes(nodes),
            services=tuple(b.entry for b in built.values() if b.entry is not None))

    def _mapped(self, key: str, obj: dict[str, Any]) -> _Mapped:
        version = _version(obj)
        known = self._services.get(key)
        if known is not None and known.version == version:
            return known
        why = left_out_service(obj)
        if why is not None:
            if why in _COUNTED:
                self.skips.skip(_COUNTED[why], f"Service {key}",
                                f"{why.value}: not programmed, as by kube-proxy")
            return _Mapped(version, None)
        try:
            return _Mapped(version, service_of(obj))
        except ConvertError as err:
            self.skips.skip(SkipReason.BAD_SERVICE, f"Service {key}", str(err))
            return _Mapped(version, None)

    def _slices_by_service(self, slices: Store, services: dict[str, _Mapped]
                           ) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """The slices of each service, but those reported bad; a slice of a
        service that does not exist is reported once for each version."""
        by_service: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        orphans = set()
        self._bad_slices &= {(key, _version(obj)) for key, obj in slices.items()}
        for key, obj in sorted(slices.items()):
            owner = slice_service(obj)
            if owner is None or left_out_slice(obj) is not None:
                # Not a service's (addressType FQDN, or no service-name
                # label), or labelled as kube-proxy does not watch it.
                continue
            version = (key, _version(obj))
            if version in self._bad_slices:
                continue
            service = "/".join(owner)
            if service not in services:
                orphans.add(version)
                if version not in self._orphans:
                    self.skips.skip(SkipReason.UNKNOWN_SERVICE, f"EndpointSlice {key}",
                                    f"its service {service} does not exist")
                continue
            by_service.setdefault(service, []).append((key, obj))
        self._orphans = orphans
        return by_service

    def _entry(self, key: str, mapped: _Mapped, service: localv1.Service,
               slices: list[tuple[str, dict[str, Any]]]) -> _Built:
        """The service's entry; `slices` (sorted by key) are its slices."""
        inputs = (mapped.version, tuple((k, _version(obj)) for k, obj in slices))
        known = self._built.get(key)
        if known is not None and known.inputs == inputs:
            return known
        try:
            entry = service_entry(service, [obj for _, obj in slices])
        except ConvertError:  # one of the slices: skip those that do not map
            entry = service_entry(service, [obj for k, obj in slices if self._slice_maps(k, obj)])
        try:
            return _Built(inputs, read_service_entry(entry, f"Service {key}"))
        except StateFileError as err:
            self.skips.skip(SkipReason.BAD_SERVICE, f"Service {key}", str(err))
            return _Built(inputs, None)

    def _slice_maps(self, key: str, obj: dict[str, Any]) -> bool:
        """Whether the slice maps; reported (and remembered) if not."""
        try:
            check_slice(obj)
        except ConvertError as err:
            self._bad_slices.add((key, _version(obj)))
            self.skips.skip(SkipReason.BAD_ENDPOINT_SLICE, f"EndpointSlice {key}", str(err))
            return False
        return True

    def _nodes(self, nodes: Store) -> tuple[Node, ...]:
        read = []
        for key, obj in sorted(nodes.items()):
            try:
                read.append(read_node(node_of(obj), f"Node {key[1:]}"))
            except StateFileError as err:
                self.skips.skip(SkipReason.BAD_NODE, f"Node {key[1:]}", str(err))
        return tuple(read)


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
