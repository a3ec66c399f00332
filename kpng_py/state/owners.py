"""Who owns each frontend of the node state.

Several service ports may claim one frontend (address, port, protocol), but a
dataplane can send it to only one of them. The owner is the claimant whose
claim is the oldest: claims made in one Sync (a full state included) are
ordered by service port name. An owner keeps a frontend for as long as it
claims it, whatever else changes in it; when it stops (removed, or its
ClusterIP, port or protocol changed), the oldest waiting claimant takes over
in the same Sync.

Work per Sync is proportional to the claims that changed: waiting claimants are
indexed by frontend.
"""

from __future__ import annotations

from typing import Mapping

from kpng_py.model import Frontend, ServicePortName


class FrontendOwners:
    def __init__(self) -> None:
        # What each service port claims: its `frontends()` (a few, held by
        # the port already).
        self._claims: dict[ServicePortName, tuple[Frontend, ...]] = {}
        self._owners: dict[Frontend, ServicePortName] = {}
        # frontend -> the claimants that do not own it, with the Sync they
        # claimed it in
        self._waiting: dict[Frontend, dict[ServicePortName, int]] = {}
        self._syncs = 0

    def owner(self, frontend: Frontend) -> ServicePortName | None:
        return self._owners.get(frontend)

    def update(self, claims: Mapping[ServicePortName, tuple[Frontend, ...]]
               ) -> set[ServicePortName]:
        """One Sync: `claims` has every frontend each changed service port
        claims now, each once (none for a port that is gone). Returns the
        other service ports that took over a frontend."""
        self._syncs += 1
        freed: set[Frontend] = set()
        claimed: set[Frontend] = set()
        for name, frontends in claims.items():
            before = self._claims.get(name, ())
            for frontend in [f for f in before if f not in frontends]:
                if self._owners.get(frontend) == name:
                    del self._owners[frontend]
                    freed.add(frontend)
                else:
                    self._stop_waiting(frontend, name)
            for frontend in [f for f in frontends if f not in before]:
                self._waiting.setdefault(frontend, {})[name] = self._syncs
                claimed.add(frontend)
            if frontends:
                self._claims[name] = frontends
            else:
                self._claims.pop(name, None)
        taken_over: set[ServicePortName] = set()
        for frontend in freed | claimed:
            if frontend not in self._owners and frontend in self._waiting:
                taken_over.add(self._hand_over(frontend))
        return taken_over - claims.keys()

    def _hand_over(self, frontend: Frontend) -> ServicePortName:
        waiting = self._waiting[frontend]
        owner = next(iter(waiting)) if len(waiting) == 1 else min(
            waiting, key=lambda name: (waiting[name], name.sort_key()))
        self._owners[frontend] = owner
        self._stop_waiting(frontend, owner)
        return owner

    def _stop_waiting(self, frontend: Frontend, name: ServicePortName) -> None:
        waiting = self._waiting[frontend]
        del waiting[name]
        if not waiting:
            del self._waiting[frontend]
