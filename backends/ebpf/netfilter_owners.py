"""One owner per frontend from outside in the netfilter table.

The state model gives each ClusterIP frontend one owner; node ports,
ExternalIPs and LB IPs are not its frontends (yet), and two service ports may
claim the same one (two services with one ExternalIP and port, or a brain
that sends one node port twice). nftables refuses a map element whose key
is there already, which would fail every transaction: the first claimant
keeps the frontend, later ones go without it (a counted skip) and get it
when it is released.
"""

from __future__ import annotations

from dataclasses import replace

from backends.ebpf.netfilter_plan import FAMILIES, NO_ENDPOINT_NODEPORTS, SERVICE_NODEPORTS
from backends.ebpf.netfilter_plan import Element, PortObjects, per_family
from kpng_py.model import ServicePortName

Frontend = tuple  # an address . proto . port key, or ("node port", family, proto, port)

_NODE_PORT_FAMILY = {per_family(base, family): family for family in FAMILIES
                     for base in (SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS)}


def frontend_of(element: Element) -> Frontend:
    """What a map element serves: ExternalIP/LB IP . proto . port, or a node
    port of one family."""
    family = _NODE_PORT_FAMILY.get(element.map)
    return element.key if family is None else ("node port", family.value, *element.key)


class FrontendOwners:
    def __init__(self) -> None:
        self._owner: dict[Frontend, ServicePortName] = {}
        self._owned: dict[ServicePortName, set[Frontend]] = {}
        self.waiting: dict[ServicePortName, set[Frontend]] = {}  # claimed, owned by others

    def reset(self) -> None:
        self._owner.clear()
        self._owned.clear()
        self.waiting.clear()

    def release(self, name: ServicePortName) -> None:
        for frontend in self._owned.pop(name, ()):
            del self._owner[frontend]
        self.waiting.pop(name, None)

    def claim(self, name: ServicePortName, objects: PortObjects) -> tuple[PortObjects,
                                                                        set[Frontend]]:
        """`objects` without the elements of frontends another port owns, and
        those frontends."""
        if not objects.elements:
            return objects, set()
        owned = self._owned.setdefault(name, set())
        kept, lost = set(), set()
        for element in objects.elements:
            frontend = frontend_of(element)
            if self._owner.setdefault(frontend, name) == name:
                owned.add(frontend)
                kept.add(element)
            else:
                lost.add(frontend)
        if lost:
            self.waiting[name] = lost
        return replace(objects, elements=frozenset(kept)), lost

    def freed(self) -> list[ServicePortName]:
        """Waiting ports one of whose frontends has no owner now."""
        return [name for name, wanted in self.waiting.items()
                if any(frontend not in self._owner for frontend in wanted)]
