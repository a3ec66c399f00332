"""What a service port's frontends are to hold in the maps."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import FrontendKeys, HostPort
from backends.ebpf.maps.layout import L4ADDR_PAD
from kpng_py.model import ServicePort

class FrontendSpec(NamedTuple):
    """What a frontend's entries hold: its endpoints (packed lb_l4addr), its
    affinity timeout and the flag of its kind (maps.KIND_FLAGS)."""

    targets: tuple[bytes, ...]
    affinity_timeout: int
    kind_flag: int


FrontendSpecs = dict[FrontendKeys, FrontendSpec]


def frontend_keys(port: ServicePort) -> tuple[FrontendKeys, ...]:
    """The keys of each frontend of a service port, in `frontends()` order."""
    return tuple(FrontendKeys(HostPort(frontend.ip, frontend.port), frontend.protocol)
                 for frontend in port.frontends())


def frontends_of(port: ServicePort, keys: Sequence[FrontendKeys] | None = None) -> FrontendSpecs:
    """Each frontend (`keys`: `frontend_keys(port)`, when they are known) with
    its endpoints (the endpoints of its family that cluster traffic may use),
    affinity timeout and kind."""
    # The frontends of a family (ClusterIPs, node port, ExternalIPs, LB IPs)
    # share their endpoints' targets: packed once per family.
    targets: dict[int, tuple[bytes, ...]] = {}
    specs: FrontendSpecs = {}
    for frontend, keys_of in zip(port.frontends(), frontend_keys(port) if keys is None else keys):
        version = keys_of.vip.ip.version
        if version not in targets:
            targets[version] = tuple(target + L4ADDR_PAD
                                     for target in port.endpoints.targets(version))
        specs[keys_of] = FrontendSpec(targets[version], port.affinity_timeout_seconds,
                                      maps.KIND_FLAGS[port.frontend_kind(frontend)])
    return specs
