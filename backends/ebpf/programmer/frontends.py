"""What a service port's frontends are to hold in the maps."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import KeyedFrontend
from backends.ebpf.maps.layout import L4ADDR_PAD
from kpng_py.model import ServicePort


class FrontendSpec(NamedTuple):
    """What a frontend's entries hold: its endpoints (packed lb_l4addr), its
    affinity timeout and the flag of its kind (maps.KIND_FLAGS)."""

    targets: tuple[bytes, ...]
    affinity_timeout: int
    kind_flag: int


FrontendSpecs = dict[KeyedFrontend, FrontendSpec]


def keyed_frontends(port: ServicePort) -> tuple[KeyedFrontend, ...]:
    """Each frontend of a service port as the maps key it, in `frontends()` order."""
    return tuple(KeyedFrontend(frontend) for frontend in port.frontends())


def frontends_of(port: ServicePort,
                 keyed: Sequence[KeyedFrontend] | None = None) -> FrontendSpecs:
    """Each frontend (`keyed`: `keyed_frontends(port)`, when they are known)
    with its endpoints (the endpoints of its family that cluster traffic may
    use), affinity timeout and kind."""
    # The frontends of a family (ClusterIPs, node port, ExternalIPs, LB IPs)
    # share their endpoints' targets: packed once per family.
    targets: dict[int, tuple[bytes, ...]] = {}
    specs: FrontendSpecs = {}
    for frontend in keyed_frontends(port) if keyed is None else keyed:
        version = frontend.ip_version
        if version not in targets:
            targets[version] = tuple(target + L4ADDR_PAD
                                     for target in port.endpoints.targets(version))
        specs[frontend] = FrontendSpec(targets[version], port.affinity_timeout_seconds,
                                       maps.KIND_FLAGS[port.frontend_kind(frontend.frontend)])
    return specs
