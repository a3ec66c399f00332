"""NodeState: the node's view, port resolution, and churn-free resyncs."""

from __future__ import annotations

import ipaddress

import pytest

from kpng_py.api import localv1 as L
from kpng_py.decode import EndpointRecord
from kpng_py.metrics import Metrics
from kpng_py.model import ChangeSet, Protocol, ServicePort, ServicePortName
from kpng_py.skips import Skips
from kpng_py.state import NodeState, resolve_endpoint_port
from tests.streams.build import (
    delete, endpoint, port, reset, service, set_endpoint, set_raw, set_service, sync,
)


def new_state() -> tuple[NodeState, Metrics]:
    metrics = Metrics()
    return NodeState(Skips(metrics)), metrics


def web(ips=("10.96.0.10",), **fields) -> L.Service:
    return service("web", v4=ips, ports=[port("http", 80, target=8080)], **fields)


def pod(ip: str, **kw) -> L.Endpoint:
    return endpoint([ip], overrides=[("http", 8080)], **kw)


def endpoints_of(changes: ChangeSet) -> dict[str, list[str]]:
    return {str(p.name): [str(e) for e in p.cluster_endpoints()] for p in changes.current()}


def test_first_sync_is_full_and_later_ones_incremental() -> None:
    state, _ = new_state()
    first = state.apply([reset(), set_service(web()), set_endpoint("default", "web", "a", pod("10.244.0.5")), sync()])
    assert first.full and [str(p.name) for p in first.added] == ["default/web:http"]
    second = state.apply([set_endpoint("default", "web", "b", pod("10.244.0.6")), sync()])
    assert not second.full and not second.added and not second.removed
    assert endpoints_of(second) == {"default/web:http": ["10.244.0.5:8080", "10.244.0.6:8080"]}
    assert (second.service_changes, second.endpoint_changes) == (0, 1)


def test_resync_after_reconnect_reports_only_real_differences() -> None:
    state, _ = new_state()
    other = service("other", v4=["10.96.0.11"], ports=[port("http", 80, target=8080)])
    state.apply([reset(), set_service(web()), set_service(other),
                 set_endpoint("default", "web", "a", pod("10.244.0.5")),
                 set_endpoint("default", "web", "b", pod("10.244.0.6")),
                 set_endpoint("default", "other", "c", pod("10.244.0.7")), sync()])

    same = state.apply([reset(), set_service(web()), set_service(other),
                        set_endpoint("default", "web", "a", pod("10.244.0.5")),
                        set_endpoint("default", "web", "b", pod("10.244.0.6")),
                        set_endpoint("default", "other", "c", pod("10.244.0.7")), sync()])
    assert len(same) == 0 and not same.full
    assert (same.service_changes, same.endpoint_changes) == (0, 0)

    # "other" and endpoint b were deleted while disconnected: not re-sent
    changed = state.apply([reset(), set_service(web()),
                           set_endpoint("default", "web", "a", pod("10.244.0.5")), sync()])
    assert not changed.full and not changed.added
    assert [str(p.name) for p in changed.removed] == ["default/other:http"]
    assert endpoints_of(changed) == {"default/web:http": ["10.244.0.5:8080"]}
    assert [str(p.name) for p in state.service_ports()] == ["default/web:http"]


def test_work_is_proportional_to_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    state, _ = new_state()
    ops = [reset()]
    for i in range(300):
        ops.append(set_service(service(f"s{i}", v4=[f"10.96.1.{i % 250}"],
                                       ports=[port("http", 80, target=8080)])))
        ops.append(set_endpoint("default", f"s{i}", "p", pod(f"10.244.1.{i % 250}")))
    state.apply(ops + [sync()])

    computed: list[str] = []
    original = NodeState._compute_ports

    def spy(self, entry):
        computed.append(entry.record.name if entry.record else "?")
        return original(self, entry)

    monkeypatch.setattr(NodeState, "_compute_ports", spy)
    changes = state.apply([set_endpoint("default", "s7", "q", pod("10.244.2.1")), sync()])
    assert computed == ["s7"]
    assert [str(new.name) for _, new in changes.updated] == ["default/s7:http"]


def test_endpoints_before_their_service_and_deletes_in_kpng_order() -> None:
    state, _ = new_state()
    changes = state.apply([reset(), set_endpoint("default", "web", "a", pod("10.244.0.5")), sync()])
    assert len(changes) == 0
    changes = state.apply([set_service(web()), sync()])
    assert endpoints_of(changes) == {"default/web:http": ["10.244.0.5:8080"]}
    changes = state.apply([delete(L.EndpointsSet, "default/web/a"),
                           delete(L.ServicesSet, "default/web"), sync()])
    assert [str(p.name) for p in changes.removed] == ["default/web:http"]
    assert state.service_ports() == []


def test_scopes_decide_cluster_endpoints() -> None:
    state, _ = new_state()
    changes = state.apply([
        reset(), set_service(web(InternalTrafficToLocal=True)),
        set_endpoint("default", "web", "here", pod("10.244.0.5", local=True, internal=True)),
        set_endpoint("default", "web", "there", pod("10.244.1.5", internal=False)),
        sync()])
    (sp,) = changes.added
    assert sp.internal_traffic_local
    assert [str(e) for e in sp.endpoints] == ["10.244.0.5:8080", "10.244.1.5:8080"]
    assert [str(e) for e in sp.cluster_endpoints()] == ["10.244.0.5:8080"]


def test_missing_scopes_are_derived_like_the_brain() -> None:
    state, _ = new_state()
    bare = lambda ip, local: L.Endpoint(IPs=L.IPSet(V4=[ip]), Local=local,  # noqa: E731
                                        PortOverrides=[L.PortName(Name="http", Port=8080)])
    changes = state.apply([
        reset(), set_service(web(InternalTrafficToLocal=True)),
        set_endpoint("default", "web", "here", bare("10.244.0.5", True)),
        set_endpoint("default", "web", "there", bare("10.244.1.5", False)), sync()])
    assert endpoints_of(changes) == {"default/web:http": ["10.244.0.5:8080"]}


def test_garbage_keeps_the_previous_version_in_force() -> None:
    state, metrics = new_state()
    state.apply([reset(), set_service(web()), set_endpoint("default", "web", "a", pod("10.244.0.5")), sync()])
    changes = state.apply([set_raw(L.ServicesSet, "default/web", b"\x0a\xff"),
                           set_raw(L.EndpointsSet, "default/web/a", b"\x12\xff"), sync()])
    assert len(changes) == 0
    assert [str(e) for e in state.service_ports()[0].endpoints] == ["10.244.0.5:8080"]
    assert metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": "bad-bytes"}) == 2


def test_unresolved_port_is_reported_once_per_version() -> None:
    state, metrics = new_state()
    svc = service("app", v4=["10.96.0.30"], ports=[port("metrics", 9090, target_name="prom")])
    no_port = endpoint(["10.244.0.14"], overrides=[("http", 8083)])
    state.apply([reset(), set_service(svc), set_endpoint("default", "app", "d", no_port), sync()])
    state.apply([set_endpoint("default", "app", "e", pod("10.244.0.15")), sync()])
    assert metrics.registry.get_sample_value(
        "kpng_py_skipped_total", {"reason": "unresolved-port"}) == 2  # d, then e
    state.apply([set_endpoint("default", "app", "f", endpoint(["10.244.0.16"], overrides=[("prom", 1)])), sync()])
    assert metrics.registry.get_sample_value(
        "kpng_py_skipped_total", {"reason": "unresolved-port"}) == 2


def test_full_changeset_holds_everything() -> None:
    state, _ = new_state()
    state.apply([reset(), set_service(web()), sync()])
    full = state.full_changeset()
    assert full.full and [str(p.name) for p in full.added] == ["default/web:http"]


def _port(name: str = "http", target: int = 0, target_name: str = "") -> ServicePort:
    return ServicePort(name=ServicePortName("default", "web", name, Protocol.TCP),
                       type="ClusterIP", cluster_ips=(ipaddress.ip_address("10.96.0.10"),),
                       port=80, target_port=target, target_port_name=target_name)


def _ep(*overrides: tuple[str, int]) -> EndpointRecord:
    return EndpointRecord("k", (), overrides, False, None)


@pytest.mark.parametrize("sp, ep, expected", [
    (_port("http", 1, "web"), _ep(("http", 8080), ("web", 9090)), 8080),  # 1. by port name
    (_port("", 1), _ep(("", 8080)), 8080),  # an unnamed port matches an unnamed override
    (_port("http", 1, "web"), _ep(("web", 9090)), 9090),  # 2. by target port name
    (_port("http", 7070, ""), _ep(("other", 1)), 7070),  # 3. numeric target port
    (_port("http", 0, "web"), _ep(("other", 1)), None),  # 4. none
])
def test_port_rule(sp: ServicePort, ep: EndpointRecord, expected: int | None) -> None:
    assert resolve_endpoint_port(sp, ep) == expected


def test_duplicate_endpoints_resolve_the_same_whatever_order_they_came_in() -> None:
    """Of two endpoints with one address, the first by key wins (a resync can
    re-send them in another order)."""
    ops = {"a": set_endpoint("default", "web", "a", pod("10.244.0.5", local=True)),
           "b": set_endpoint("default", "web", "b", pod("10.244.0.5", local=False))}
    for order in ("ab", "ba"):
        state, _ = new_state()
        state.apply([reset(), set_service(web())] + [ops[key] for key in order] + [sync()])
        (sp,) = state.service_ports()
        assert [(str(e), e.local) for e in sp.endpoints] == [("10.244.0.5:8080", True)]
