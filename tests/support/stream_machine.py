"""The hypothesis state machine of generated brain streams through the state
model (NodeState): services over a small shared pool of ClusterIPs, in
canonical and refused spellings, so that they collide; endpoints; deletes,
syncs, restarts, and reconnects that miss deletes. At each Sync the change
sets it applied incrementally are checked against a from-scratch reference
(the oldest claim owns a frontend). Its test is
tests/state/test_tracker_properties.py; the eBPF map machine
(tests/support/map_machine.py) runs the same streams into the maps. Profiles
`ci` and `long` (HYPOTHESIS_PROFILE)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Frontend, ServicePort, ServicePortChanges, ServicePortName
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from tests.streams.build import delete, endpoint, port, reset, service, set_raw, sync
from tests.support.state import apply_synced

settings.register_profile("ci", max_examples=150, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, stateful_step_count=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SERVICES = ["s0", "s1", "s2"]
KEYS = ["a", "b", "c"]
PORT_NAMES = ["", "http", "dns"]

# Mostly valid, few numbers: ports of several services (and of one) collide.
ports = st.lists(st.builds(
    port, st.sampled_from(PORT_NAMES), st.sampled_from([80, 53, 80, 0, 70000]),
    st.sampled_from([L.TCP, L.UDP, L.TCP, L.SCTP]), st.sampled_from([0, 8080]),
    st.sampled_from(["", "web"])), max_size=3)
# Shared by every service: the valid ones collide, the others are refused
# (another spelling of a valid one, a special address, not an address).
V4_CLUSTER_IPS = ["10.96.0.1", "10.96.0.1", "10.96.0.2", "10.96.0.999", "::ffff:10.96.0.1",
                  "127.0.0.1"]
V6_CLUSTER_IPS = ["fd00::1", "fd00::1", "fd00::2", "fd00::1%a", "fd00::1%b", "::ffff:10.96.0.1",
                  "::"]
services = st.builds(
    lambda name, v4, v6, ps, itl, kind: service(
        name, v4=v4, v6=v6, ports=ps, InternalTrafficToLocal=itl, Type=kind),
    st.sampled_from(SERVICES), st.lists(st.sampled_from(V4_CLUSTER_IPS), max_size=1),
    st.lists(st.sampled_from(V6_CLUSTER_IPS), max_size=1), ports, st.booleans(),
    st.sampled_from(["ClusterIP", "NodePort", "ClusterIP", "ExternalName"]))
endpoints = st.builds(
    lambda v4, v6, local, internal, overrides: endpoint(v4, v6, local, internal, overrides),
    st.lists(st.sampled_from(["10.244.0.1", "10.244.0.2", "fd00::9", "127.0.0.1"]),
             max_size=2),
    st.lists(st.sampled_from(["fd00::5", "fd00::6", "fe80::5", "fd00::5%a", "::ffff:10.244.0.1"]),
             max_size=1),
    st.booleans(), st.booleans(),
    st.lists(st.tuples(st.sampled_from(PORT_NAMES + ["web"]), st.sampled_from([8080, 9090])),
             max_size=2))


def programmed(ports: list[ServicePort]) -> dict[ServicePortName, ServicePort]:
    return {p.name: p for p in ports}


class OldestClaimOwns:
    """Frontend ownership from scratch, given the claiming ports at each Sync:
    a claim's age is the Sync since which the port has claimed the frontend
    without a break."""

    def __init__(self) -> None:
        self.syncs = 0
        self.since: dict[tuple[ServicePortName, Frontend], int] = {}

    def publish(self, claiming: list[ServicePort]) -> dict[ServicePortName, ServicePort]:
        self.syncs += 1
        self.since = {(p.name, f): self.since.get((p.name, f), self.syncs)
                      for p in claiming for f in p.frontends()}
        owners: dict[Frontend, ServicePortName] = {}
        for (name, frontend), _ in sorted(self.since.items(),
                                          key=lambda claim: (claim[1], claim[0][0].sort_key())):
            owners.setdefault(frontend, name)
        published = {}
        for p in claiming:
            owned = {f for f in p.frontends() if owners[f] == p.name}
            if owned:
                published[p.name] = p.only_frontends(owned)
        return published


class StreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = NodeState(Skips(Metrics()))
        self.sent: dict[tuple[int, str], bytes] = {}  # what the brain has sent, by ref
        self.pending: list[L.OpItem] = [reset()]
        self.dataplane: dict[ServicePortName, ServicePort] = {}
        self.reference = OldestClaimOwns()
        self.expected: dict[ServicePortName, ServicePort] = {}
        self.claiming: list[ServicePort] = []  # as computed from scratch

    @rule(svc=services)
    def set_service(self, svc: L.Service) -> None:
        self._set(L.ServicesSet, f"default/{svc.Name}", svc.SerializeToString())

    @rule(name=st.sampled_from(SERVICES), v6=st.booleans(), protocol=st.sampled_from([L.TCP,
                                                                                    L.UDP]))
    def set_contender(self, name: str, v6: bool, protocol: int) -> None:
        """A valid service on the most contended frontends, so that owners
        come and go while others wait."""
        svc = service(name, v4=["10.96.0.1"], v6=["fd00::1"] if v6 else [],
                      ports=[port("http", 80, protocol, target=8080)])
        self.set_service(svc)

    @rule(svc=st.sampled_from(SERVICES), key=st.sampled_from(KEYS), ep=endpoints)
    def set_endpoint(self, svc: str, key: str, ep: L.Endpoint) -> None:
        self._set(L.EndpointsSet, f"default/{svc}/{key}", ep.SerializeToString())

    @rule(svc=st.sampled_from(SERVICES), key=st.sampled_from(KEYS + [None]))
    def delete(self, svc: str, key: str | None) -> None:
        ref = (L.ServicesSet, f"default/{svc}") if key is None else (
            L.EndpointsSet, f"default/{svc}/{key}")
        if ref in self.sent:
            del self.sent[ref]
            self.pending.append(delete(*ref))

    @rule()
    def sync(self) -> None:
        changes = apply_synced(self.state, self.pending + [sync()])
        self.pending = []
        self._program(changes)
        fresh = NodeState(Skips(Metrics()))
        fresh.apply(self._full_state() + [sync()])
        self.claiming = fresh.claiming_ports()
        self.expected = self.reference.publish(self.claiming)

    @rule()
    def restart(self) -> None:
        """A new process: its state starts from the brain's full state, so
        claims made at its first Sync go in name order."""
        self.state = NodeState(Skips(Metrics()))
        self.reference = OldestClaimOwns()
        self.pending = self._full_state()

    @rule(forget=st.sets(st.sampled_from(KEYS)))
    def reconnect(self, forget: set[str]) -> None:
        """The stream breaks mid change set; the new one re-sends the full state,
        minus endpoints deleted while disconnected."""
        self.sent = {ref: b for ref, b in self.sent.items()
                     if not (ref[0] == L.EndpointsSet and ref[1].rsplit("/", 1)[1] in forget)}
        self.pending = self._full_state()

    def _full_state(self) -> list[L.OpItem]:
        """What a new stream starts with: Reset and everything sent so far."""
        return [reset()] + [set_raw(s, p, b) for (s, p), b in self.sent.items()]

    def _set(self, ref_set: int, path: str, data: bytes) -> None:
        self.sent[(ref_set, path)] = data
        self.pending.append(set_raw(ref_set, path, data))

    def _program(self, changes: ServicePortChanges) -> None:
        if changes.full:
            self.dataplane.clear()
        for p in changes.removed:
            assert p.name in self.dataplane, f"removed {p.name} was never added"
            del self.dataplane[p.name]
        for old, new in changes.updated:
            assert self.dataplane.get(old.name) == old, "updated from a value never programmed"
            assert old != new, "an update that changes nothing"
        for p in changes.added:
            assert changes.full or p.name not in self.dataplane, f"added {p.name} twice"
        for p in changes.current():
            self.dataplane[p.name] = p

    @invariant()
    def incremental_equals_from_scratch(self) -> None:
        if self.pending:
            return  # only comparable at a Sync
        assert self.state.claiming_ports() == self.claiming
        assert self.dataplane == self.expected
        assert programmed(self.state.service_ports()) == self.dataplane

    @invariant()
    def published_ports_never_share_a_frontend(self) -> None:
        frontends = [f for p in self.dataplane.values() for f in p.frontends()]
        assert len(frontends) == len(set(frontends))
