"""Property: whatever the stream, applying each ChangeSet incrementally gives
the same programmed state as computing it from scratch from the objects the
brain has sent so far (reconnects and resyncs included)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kpng_py.api import localv1 as L
from kpng_py.metrics import Metrics
from kpng_py.model import ChangeSet, ServicePort, ServicePortName
from kpng_py.skips import Skips
from kpng_py.state import NodeState
from tests.streams.build import delete, endpoint, port, reset, service, set_raw, sync

settings.register_profile("ci", max_examples=150, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, stateful_step_count=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SERVICES = ["s0", "s1", "s2"]
KEYS = ["a", "b", "c"]
PORT_NAMES = ["", "http", "dns"]

ports = st.lists(st.builds(
    port, st.sampled_from(PORT_NAMES), st.sampled_from([0, 53, 80, 70000]),
    st.sampled_from([L.TCP, L.UDP, L.SCTP]), st.sampled_from([0, 8080]),
    st.sampled_from(["", "web"])), max_size=3)
services = st.builds(
    lambda name, v4, v6, ps, itl, kind: service(
        name, v4=v4, v6=v6, ports=ps, InternalTrafficToLocal=itl, Type=kind),
    st.sampled_from(SERVICES), st.lists(st.sampled_from(["10.96.0.1", "10.96.0.999"]), max_size=1),
    st.lists(st.sampled_from(["fd00::1"]), max_size=1), ports, st.booleans(),
    st.sampled_from(["ClusterIP", "NodePort", "ExternalName"]))
endpoints = st.builds(
    lambda v4, v6, local, internal, overrides: endpoint(v4, v6, local, internal, overrides),
    st.lists(st.sampled_from(["10.244.0.1", "10.244.0.2", "fd00::9"]), max_size=2),
    st.lists(st.sampled_from(["fd00::5", "fd00::6"]), max_size=1),
    st.booleans(), st.booleans(),
    st.lists(st.tuples(st.sampled_from(PORT_NAMES + ["web"]), st.sampled_from([8080, 9090])),
             max_size=2))


def programmed(ports: list[ServicePort]) -> dict[ServicePortName, ServicePort]:
    return {p.name: p for p in ports}


class StreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = NodeState(Skips(Metrics()))
        self.sent: dict[tuple[int, str], bytes] = {}  # what the brain has sent, by ref
        self.pending: list[L.OpItem] = [reset()]
        self.dataplane: dict[ServicePortName, ServicePort] = {}

    @rule(svc=services)
    def set_service(self, svc: L.Service) -> None:
        self._set(L.ServicesSet, f"default/{svc.Name}", svc.SerializeToString())

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
        changes = self.state.apply(self.pending + [sync()])
        self.pending = []
        self._program(changes)

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

    def _program(self, changes: ChangeSet) -> None:
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
        fresh = NodeState(Skips(Metrics()))
        fresh.apply(self._full_state() + [sync()])
        assert self.dataplane == programmed(fresh.service_ports())
        assert programmed(self.state.service_ports()) == self.dataplane


TestStreams = StreamMachine.TestCase
