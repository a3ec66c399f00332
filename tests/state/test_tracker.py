"""NodeState: the node's view, port resolution, and churn-free resyncs."""

from __future__ import annotations

import ipaddress
import logging

import pytest

from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Protocol, ServicePort, ServicePortChanges, ServicePortName
from kpng_py.state.decode import DecodedEndpoint, EndpointTail
from kpng_py.state.limits import Limits
from kpng_py.state.skips import SkipReason, Skips
from kpng_py.state.tracker import NodeState, resolve_endpoint_port
from tests.streams.build import (
    SCENARIOS,
    delete,
    endpoint,
    port,
    reset,
    service,
    set_endpoint,
    set_raw,
    set_service,
    sync,
)
from tests.support.state import apply_synced


def new_state() -> tuple[NodeState, Metrics]:
    metrics = Metrics()
    return NodeState(Skips(metrics)), metrics


def web(ips=("10.96.0.10",), **fields) -> L.Service:
    return service("web", v4=ips, ports=[port("http", 80, target=8080)], **fields)


def pod(*ips: str, **kw) -> L.Endpoint:
    return endpoint(list(ips), overrides=[("http", 8080)], **kw)


def endpoints_of(changes: ServicePortChanges) -> dict[str, list[str]]:
    return {str(p.name): [str(e) for e in p.cluster_endpoints()] for p in changes.current()}


def test_first_sync_is_full_and_later_ones_incremental() -> None:
    state, _ = new_state()
    first = apply_synced(state, [reset(), set_service(web()),
                                 set_endpoint("default", "web", "a", pod("10.244.0.5")), sync()])
    assert first.full and [str(p.name) for p in first.added] == ["default/web:http"]
    second = apply_synced(state, [set_endpoint("default", "web", "b", pod("10.244.0.6")), sync()])
    assert not second.full and not second.added and not second.removed
    assert endpoints_of(second) == {"default/web:http": ["10.244.0.5:8080", "10.244.0.6:8080"]}
    assert (second.service_changes, second.endpoint_changes) == (0, 1)


def test_a_second_reset_drops_what_only_the_first_stream_sent() -> None:
    """A first stream's Reset has nothing to forget; a Reset after values
    came, even within the same change set, forgets what is not re-sent."""
    state, _ = new_state()
    other = service("other", v4=["10.96.0.11"], ports=[port("http", 80, target=8080)])
    changes = apply_synced(state, [reset(), set_service(web()), set_service(other),
                                   set_endpoint("default", "web", "a", pod("10.244.0.5")),
                                   set_endpoint("default", "web", "b", pod("10.244.0.6")),
                                   reset(), set_service(web()),
                                   set_endpoint("default", "web", "b", pod("10.244.0.6")), sync()])
    assert changes.full and endpoints_of(changes) == {"default/web:http": ["10.244.0.6:8080"]}
    assert [str(p.name) for p in state.service_ports()] == ["default/web:http"]


def test_frontends_unpickled_elsewhere_hash_as_made_there() -> None:
    """A Frontend keeps its hash, which holds string hashes that differ per
    process: one sent to another process (the userspace tests' node driver
    gets its change sets pickled) is a key there like one made there."""
    import pickle
    import subprocess
    import sys

    sp = ServicePort(name=ServicePortName("default", "web", "http", Protocol.TCP),
                     type="ClusterIP", cluster_ips=(ipaddress.ip_address("fd00::a"),), port=80)
    sp.frontends()  # made, with their hashes, before it is pickled
    check = ("import pickle, sys; from kpng_py.model import Frontend; "
             "sp = pickle.loads(sys.stdin.buffer.read()); f = sp.frontends()[0]; "
             "print({Frontend(f.ip, f.port, f.protocol): 1}.get(f))")
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", check], input=pickle.dumps(sp),
                              capture_output=True, env={"PYTHONHASHSEED": seed}, check=True)
        assert done.stdout.strip() == b"1", done.stderr


def test_resync_after_reconnect_reports_only_real_differences() -> None:
    state, _ = new_state()
    other = service("other", v4=["10.96.0.11"], ports=[port("http", 80, target=8080)])
    state.apply([reset(), set_service(web()), set_service(other),
                 set_endpoint("default", "web", "a", pod("10.244.0.5")),
                 set_endpoint("default", "web", "b", pod("10.244.0.6")),
                 set_endpoint("default", "other", "c", pod("10.244.0.7")), sync()])

    same = apply_synced(state, [reset(), set_service(web()), set_service(other),
                                set_endpoint("default", "web", "a", pod("10.244.0.5")),
                                set_endpoint("default", "web", "b", pod("10.244.0.6")),
                                set_endpoint("default", "other", "c", pod("10.244.0.7")), sync()])
    assert len(same) == 0 and not same.full
    assert (same.service_changes, same.endpoint_changes) == (0, 0)

    # "other" and endpoint b were deleted while disconnected: not re-sent
    changed = apply_synced(state, [reset(), set_service(web()),
                                   set_endpoint("default", "web", "a", pod("10.244.0.5")), sync()])
    assert not changed.full and not changed.added
    assert [str(p.name) for p in changed.removed] == ["default/other:http"]
    assert endpoints_of(changed) == {"default/web:http": ["10.244.0.5:8080"]}
    assert [str(p.name) for p in state.service_ports()] == ["default/web:http"]


def test_work_is_proportional_to_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    state, _ = new_state()
    ops = [reset()]
    for i in range(300):
        ops.append(set_service(service(f"s{i}", v4=[f"10.96.{i // 250}.{i % 250 + 1}"],
                                       ports=[port("http", 80, target=8080)])))
        ops.append(set_endpoint("default", f"s{i}", "p", pod(f"10.244.1.{i % 250}")))
    state.apply(ops + [sync()])

    computed: list[str] = []
    original = NodeState._compute_ports

    def spy(self, entry):
        computed.append(entry.decoded.name if entry.decoded else "?")
        return original(self, entry)

    monkeypatch.setattr(NodeState, "_compute_ports", spy)
    changes = apply_synced(state, [set_endpoint("default", "s7", "q", pod("10.244.2.1")), sync()])
    assert computed == ["s7"]
    assert [str(new.name) for _, new in changes.updated] == ["default/s7:http"]


def test_endpoints_before_their_service_and_deletes_in_kpng_order() -> None:
    state, _ = new_state()
    changes = apply_synced(state, [reset(), set_endpoint("default", "web", "a", pod("10.244.0.5")),
                                   sync()])
    assert len(changes) == 0
    changes = apply_synced(state, [set_service(web()), sync()])
    assert endpoints_of(changes) == {"default/web:http": ["10.244.0.5:8080"]}
    changes = apply_synced(state, [delete(L.EndpointsSet, "default/web/a"),
                                   delete(L.ServicesSet, "default/web"), sync()])
    assert [str(p.name) for p in changes.removed] == ["default/web:http"]
    assert state.service_ports() == []


def test_scopes_decide_cluster_endpoints() -> None:
    state, _ = new_state()
    changes = apply_synced(state, [
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
    changes = apply_synced(state, [
        reset(), set_service(web(InternalTrafficToLocal=True)),
        set_endpoint("default", "web", "here", bare("10.244.0.5", True)),
        set_endpoint("default", "web", "there", bare("10.244.1.5", False)), sync()])
    assert endpoints_of(changes) == {"default/web:http": ["10.244.0.5:8080"]}


def test_garbage_keeps_the_previous_version_in_force() -> None:
    state, metrics = new_state()
    state.apply([reset(), set_service(web()),
                 set_endpoint("default", "web", "a", pod("10.244.0.5")), sync()])
    changes = apply_synced(state, [set_raw(L.ServicesSet, "default/web", b"\x0a\xff"),
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
    state.apply([set_endpoint("default", "app", "f",
                              endpoint(["10.244.0.16"], overrides=[("prom", 1)])), sync()])
    assert metrics.registry.get_sample_value(
        "kpng_py_skipped_total", {"reason": "unresolved-port"}) == 2


@pytest.mark.parametrize("name, target_name, looked_for", [
    ("http", "http", "no port override named 'http' (the port's name and its targetPort)"),
    ("http", "web", "no port override named 'http' (the port's name) or 'web' (its targetPort)"),
    ("", "web", "no port override named 'web' (its targetPort)"),
    ("http", "", "no port override named 'http' (the port's name)"),
    ("", "", "no unnamed port override (the port has no name)"),
])
def test_an_unresolved_port_names_each_override_looked_for_once(
        caplog: pytest.LogCaptureFixture, name: str, target_name: str, looked_for: str) -> None:
    state, _ = new_state()
    svc = service("app", v4=["10.96.0.30"], ports=[port(name, 80, target_name=target_name)])
    other = endpoint(["10.244.0.14"], overrides=[("other", 8083)])
    with caplog.at_level(logging.INFO, logger="kpng_py.state.skips"):
        state.apply([reset(), set_service(svc), set_endpoint("default", "app", "d", other), sync()])
    (message,) = [r.getMessage() for r in caplog.records if r.name == "kpng_py.state.skips"]
    assert message.endswith(f": {looked_for} and no numeric targetPort"), message


def test_full_changeset_holds_everything() -> None:
    state, _ = new_state()
    state.apply([reset(), set_service(web()), sync()])
    full = state.full_changeset()
    assert full.full and [str(p.name) for p in full.added] == ["default/web:http"]


def _port(name: str = "http", target: int = 0, target_name: str = "") -> ServicePort:
    return ServicePort(name=ServicePortName("default", "web", name, Protocol.TCP),
                       type="ClusterIP", cluster_ips=(ipaddress.ip_address("10.96.0.10"),),
                       port=80, target_port=target, target_port_name=target_name)


def _ep(*overrides: tuple[str, int]) -> DecodedEndpoint:
    return DecodedEndpoint(b"", EndpointTail(overrides, False, None))


@pytest.mark.parametrize("sp, ep, expected", [
    (_port("http", 1, "web"), _ep(("http", 8080), ("web", 9090)), 8080),  # 1. by port name
    (_port("", 1), _ep(("", 8080)), 8080),  # an unnamed port matches an unnamed override
    (_port("http", 1, "web"), _ep(("web", 9090)), 9090),  # 2. by target port name
    (_port("http", 7070, ""), _ep(("other", 1)), 7070),  # 3. numeric target port
    (_port("http", 0, "web"), _ep(("other", 1)), None),  # 4. none
])
def test_port_rule(sp: ServicePort, ep: DecodedEndpoint, expected: int | None) -> None:
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


# -- frontend ownership ---------------------------------------------------------

def vip(name: str, v4=(), v6=(), ns: str = "default", number: int = 80) -> L.Service:
    return service(name, ns=ns, v4=v4, v6=v6, ports=[port("http", number, target=8080)])


def published(state: NodeState) -> dict[str, list[str]]:
    """Each published service port with its ClusterIPs."""
    return {str(p.name): [str(ip) for ip in p.cluster_ips] for p in state.service_ports()}


def names(ports) -> list[str]:
    return [str(p.name) for p in ports]


def skipped(metrics: Metrics, reason: str) -> float:
    return metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": reason}) or 0


def test_the_issue_s_intruders_change_nothing() -> None:
    """Issue 12: `::ffff:10.96.0.10` beside `10.96.0.10`, and `fd00::1%a` and
    `%b` beside `fd00::1`, are refused; deleting the intruders and a Reset
    with only the good state then change nothing."""
    state, metrics = new_state()
    keep = vip("keep", v4=["10.96.0.10"], v6=["fd00::1"])
    good = [set_service(keep), set_endpoint("default", "keep", "k0", pod("10.244.0.5"))]
    intruders = [set_service(vip("mapped", ns="other", v6=["::ffff:10.96.0.10"])),
                 set_service(vip("scope-a", ns="other", v6=["fd00::1%a"])),
                 set_service(vip("scope-b", ns="other", v6=["fd00::1%b"]))]
    first = apply_synced(state, [reset(), *good, *intruders, sync()])
    assert names(first.added) == ["default/keep:http"]
    assert published(state) == {"default/keep:http": ["10.96.0.10", "fd00::1"]}
    assert skipped(metrics, "bad-ip") == 3

    gone = apply_synced(state, [delete(L.ServicesSet, f"other/{n}")
                                for n in ("mapped", "scope-a", "scope-b")] + [sync()])
    assert len(gone) == 0
    assert len(apply_synced(state, [reset(), *good, sync()])) == 0
    assert published(state) == {"default/keep:http": ["10.96.0.10", "fd00::1"]}


def test_a_waiting_claimant_takes_over_in_the_same_changeset() -> None:
    state, metrics = new_state()
    state.apply([reset(), set_service(vip("keep", v4=["10.96.0.10"])), sync()])
    # "aaa" sorts before "default": keep owns the VIP because it claimed it first.
    intruder = vip("intruder", ns="aaa", v4=["10.96.0.10"])
    waits = apply_synced(state, [set_service(intruder), set_endpoint("aaa", "intruder", "i0",
                                                                      pod("10.244.0.9")), sync()])
    assert len(waits) == 0 and skipped(metrics, "frontend-conflict") == 1
    assert published(state) == {"default/keep:http": ["10.96.0.10"]}
    assert state.not_published() == {SkipReason.FRONTEND_CONFLICT: 1}

    # keep's own updates do not give the VIP away, nor report the intruder again
    kept = apply_synced(state, [set_endpoint("default", "keep", "k0", pod("10.244.0.5")),
                                set_service(vip("keep", v4=["10.96.0.10"], number=80)), sync()])
    assert names(new for _, new in kept.updated) == ["default/keep:http"]
    assert skipped(metrics, "frontend-conflict") == 1

    taken = apply_synced(state, [delete(L.EndpointsSet, "default/keep/k0"),
                                 delete(L.ServicesSet, "default/keep"), sync()])
    assert names(taken.removed) == ["default/keep:http"]
    assert [(str(p.name), [str(e) for e in p.endpoints]) for p in taken.added] == [
        ("aaa/intruder:http", ["10.244.0.9:8080"])]
    assert published(state) == {"aaa/intruder:http": ["10.96.0.10"]}
    assert state.not_published() == {}

    # keep comes back: now it is the one that waits
    back = apply_synced(state, [set_service(vip("keep", v4=["10.96.0.10"])), sync()])
    assert len(back) == 0 and skipped(metrics, "frontend-conflict") == 2
    assert state.not_published() == {SkipReason.FRONTEND_CONFLICT: 1}


def test_an_owner_that_changes_its_clusterip_hands_the_old_one_over() -> None:
    state, _ = new_state()
    state.apply([reset(), set_service(vip("a", v4=["10.96.0.10"])),
                 set_service(vip("b", v4=["10.96.0.10"])), sync()])
    assert published(state) == {"default/a:http": ["10.96.0.10"]}
    moved = apply_synced(state, [set_service(vip("a", v4=["10.96.0.11"])), sync()])
    assert names(new for _, new in moved.updated) == ["default/a:http"]
    assert names(moved.added) == ["default/b:http"]
    assert published(state) == {"default/a:http": ["10.96.0.11"], "default/b:http": ["10.96.0.10"]}


def test_a_port_is_published_with_the_clusterips_it_owns() -> None:
    state, _ = new_state()
    state.apply([reset(), set_service(vip("keep", v4=["10.96.0.10"])), sync()])
    half = apply_synced(state, [set_service(vip("half", v4=["10.96.0.10"], v6=["fd00::1"])),
                                sync()])
    assert [[str(ip) for ip in p.cluster_ips] for p in half.added] == [["fd00::1"]]
    assert [str(f) for p in state.claiming_ports() for f in p.frontends()] == [
        "10.96.0.10:80/TCP", "[fd00::1]:80/TCP", "10.96.0.10:80/TCP"]
    whole = apply_synced(state, [delete(L.ServicesSet, "default/keep"), sync()])
    assert [([str(ip) for ip in old.cluster_ips], [str(ip) for ip in new.cluster_ips])
            for old, new in whole.updated] == [(["fd00::1"], ["10.96.0.10", "fd00::1"])]


def test_the_oldest_waiting_claim_takes_over_then_the_first_by_name() -> None:
    state, _ = new_state()
    state.apply([reset(), set_service(vip("owner", v4=["10.96.0.10"])), sync()])
    state.apply([set_service(vip("zed", v4=["10.96.0.10"])), sync()])
    state.apply([set_service(vip("bee", v4=["10.96.0.10"])),
                 set_service(vip("ant", v4=["10.96.0.10"])), sync()])
    for gone, heir in (("owner", "zed"), ("zed", "ant"), ("ant", "bee")):
        changes = apply_synced(state, [delete(L.ServicesSet, f"default/{gone}"), sync()])
        assert (names(changes.removed), names(changes.added)) == (
            [f"default/{gone}:http"], [f"default/{heir}:http"])


def test_in_one_full_state_ties_go_in_name_order_whatever_the_op_order() -> None:
    ops = [set_service(vip("b", v4=["10.96.0.10"])), set_service(vip("a", v4=["10.96.0.10"]))]
    for order in (ops, ops[::-1]):
        state, _ = new_state()
        state.apply([reset(), *order, sync()])
        assert published(state) == {"default/a:http": ["10.96.0.10"]}


def test_a_reconnect_keeps_the_owners(caplog: pytest.LogCaptureFixture) -> None:
    state, metrics = new_state()
    keep = set_service(vip("keep", v4=["10.96.0.10"]))
    intruder = set_service(vip("intruder", ns="aaa", v4=["10.96.0.10"]))
    state.apply([reset(), keep, sync()])
    state.apply([intruder, sync()])
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kpng_py"):
        again = apply_synced(state, [reset(), intruder, keep, sync()])
    assert len(again) == 0 and caplog.records == []
    assert published(state) == {"default/keep:http": ["10.96.0.10"]}
    assert skipped(metrics, "frontend-conflict") == 1


def test_a_new_version_of_a_waiting_port_is_reported_again() -> None:
    state, metrics = new_state()
    state.apply([reset(), set_service(vip("keep", v4=["10.96.0.10"])),
                 set_service(vip("other", v4=["10.96.0.10"])), sync()])
    state.apply([set_endpoint("default", "other", "o0", pod("10.244.0.7")), sync()])
    assert skipped(metrics, "frontend-conflict") == 1
    state.apply([set_service(vip("other", v4=["10.96.0.10"], v6=["fd00::7"])), sync()])
    assert skipped(metrics, "frontend-conflict") == 2
    assert published(state) == {"default/keep:http": ["10.96.0.10"],
                                "default/other:http": ["fd00::7"]}


# -- limits ---------------------------------------------------------------------

def test_a_service_over_the_limit_is_refused_before_its_endpoints_are_resolved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = NodeState(Skips(Metrics()), Limits(max_service_endpoints=4))
    resolved: list[str] = []
    original = NodeState._resolve

    def spy(self, entry, record, sp, endpoints):
        resolved.append(str(sp.name))
        return original(self, entry, record, sp, endpoints)

    monkeypatch.setattr(NodeState, "_resolve", spy)
    two_ports = service("big", v4=["10.96.0.10"], ports=[port("http", 80, target=8080),
                                                           port("dns", 53, target=53)])
    state.apply([reset(), set_service(two_ports),
                 set_endpoint("default", "big", "a", pod("10.244.0.5", "10.244.0.6")), sync()])
    assert len(resolved) == 2
    resolved.clear()
    refused = apply_synced(state, [set_endpoint("default", "big", "b", pod("10.244.0.7")), sync()])
    assert len(refused) == 0 and resolved == []
    assert [len(p.endpoints) for p in state.service_ports()] == [2, 2]


def test_room_made_under_the_node_limit_lets_a_refused_service_in() -> None:
    metrics = Metrics()
    state = NodeState(Skips(metrics), Limits(max_endpoints=3))
    state.apply([reset(), set_service(vip("zed", v4=["10.96.0.10"])),
                 set_endpoint("default", "zed", "z0", pod("10.244.0.5", "10.244.0.6")), sync()])
    refused = apply_synced(state, [
        set_service(vip("bee", v4=["10.96.0.11"])),
        set_endpoint("default", "bee", "b0", pod("10.244.0.7", "10.244.0.8")), sync()])
    assert len(refused) == 0 and skipped(metrics, "limit") == 1
    assert state.not_published() == {SkipReason.LIMIT: 1}  # bee's port, while it is out
    # nothing else changes: bee stays out and is not reported again
    assert len(apply_synced(state, [set_endpoint("default", "zed", "z1", pod("10.244.0.9")),
                                    delete(L.EndpointsSet, "default/zed/z1"), sync()])) == 0
    assert skipped(metrics, "limit") == 1
    # zed shrinks: bee gets in in the same change set (zed is taken first, though
    # bee sorts first, so that its room counts)
    room = apply_synced(state, [set_endpoint("default", "zed", "z0", pod("10.244.0.5")), sync()])
    assert names(room.added) == ["default/bee:http"]
    assert state.not_published() == {}
    assert names(new for _, new in room.updated) == ["default/zed:http"]
    assert skipped(metrics, "limit") == 1
    # bee grows too, in the same Sync as zed shrinks to nothing: it fits
    grow = apply_synced(state, [delete(L.EndpointsSet, "default/zed/z0"),
                                set_endpoint("default", "bee", "b1", pod("10.244.0.9")), sync()])
    assert names(new for _, new in grow.updated) == ["default/bee:http", "default/zed:http"]
    assert skipped(metrics, "limit") == 1


def test_the_hostile_frontends_scenario_is_counted_by_reason() -> None:
    """tests/streams/hostile-frontends: what to-print shows is checked by
    tests/test_streams.py; here each refusal is counted once."""
    state, metrics = new_state()
    state.apply(op for op in SCENARIOS["hostile-frontends"]() if not isinstance(op, str))
    assert {reason: skipped(metrics, reason) for reason in (
        "bad-ip", "special-ip", "frontend-conflict", "no-cluster-ip")} == {
        "bad-ip": 2,  # keep's VIPs IPv4-mapped and with a scope id
        "special-ip": 4,  # 0.0.0.0, ::, 169.254.169.254, the endpoint's 127.0.0.1
        # same and half wait for keep's VIPs; after the reconnect keep waits for both
        "frontend-conflict": 4,
        "no-cluster-ip": 0,  # the refused ClusterIPs' own lines say it all
    }


def node_port_service(name: str, node_port: int, type_: str = "NodePort", v4=("10.96.0.20",),
                      v6=(), external=(), lb=()) -> L.Service:
    mapping = port("http", 80, target=8080)
    mapping.NodePort = node_port
    svc = service(name, v4=v4, v6=v6, ports=[mapping], Type=type_)
    svc.IPs.ExternalIPs.V4.extend(external)
    svc.IPs.LoadBalancerIPs.V4.extend(lb)
    return svc


def frontends_by_kind(state: NodeState) -> dict[str, list[tuple[str, str]]]:
    return {str(p.name): [(str(f), p.frontend_kind(f).value) for f in p.frontends()]
            for p in state.service_ports()}


def test_external_ips_lb_ips_and_node_ports_are_frontends_of_their_kind() -> None:
    """An address listed twice is one frontend, of the first list's kind; a
    node port is one frontend per family of the service's ClusterIPs."""
    state, _ = new_state()
    state.apply([reset(), set_service(node_port_service(
        "lb", 30080, "LoadBalancer", v6=["fd00::20"], external=["192.0.2.1", "192.0.2.2"],
        lb=["192.0.2.2", "198.51.100.1"])), sync()])
    assert frontends_by_kind(state) == {"default/lb:http": [
        ("10.96.0.20:80/TCP", "ClusterIP"), ("[fd00::20]:80/TCP", "ClusterIP"),
        ("192.0.2.1:80/TCP", "ExternalIP"), ("192.0.2.2:80/TCP", "ExternalIP"),
        ("198.51.100.1:80/TCP", "LoadBalancerIP"),
        ("0.0.0.0:30080/TCP", "NodePort"), ("[::]:30080/TCP", "NodePort")]}


def test_a_node_port_is_served_for_node_port_and_load_balancer_services_only() -> None:
    state, _ = new_state()
    state.apply([reset(), set_service(node_port_service("cip", 30081, "ClusterIP")),
                 set_service(node_port_service("np", 30082, v4=["10.96.0.21"])),
                 set_service(node_port_service("none", 0, "LoadBalancer", v4=["10.96.0.22"])),
                 sync()])
    assert {name: [f for f, kind in frontends if kind == "NodePort"]
            for name, frontends in frontends_by_kind(state).items()} == {
        "default/cip:http": [], "default/np:http": ["0.0.0.0:30082/TCP"],
        "default/none:http": []}


def test_two_services_on_one_node_port_conflict_and_the_second_takes_it_over_later() -> None:
    """The first claimant keeps the node port; the other is published with
    its ClusterIP only, and gets the node port in the Sync the owner lets it go."""
    state, metrics = new_state()
    state.apply([reset(), set_service(node_port_service("first", 30080)),
                 set_service(node_port_service("second", 30080, v4=["10.96.0.21"])), sync()])
    assert [f for f, _ in frontends_by_kind(state)["default/second:http"]] == ["10.96.0.21:80/TCP"]
    assert state.service_ports()[1].node_port_families == ()
    assert skipped(metrics, "frontend-conflict") == 1
    moved = apply_synced(state, [set_service(node_port_service("first", 30090)), sync()])
    assert sorted(names(new for _, new in moved.updated)) == [
        "default/first:http", "default/second:http"]
    assert {name: [f for f, kind in frontends if kind == "NodePort"]
            for name, frontends in frontends_by_kind(state).items()} == {
        "default/first:http": ["0.0.0.0:30090/TCP"], "default/second:http": ["0.0.0.0:30080/TCP"]}


def test_an_external_ip_on_another_services_clusterip_goes_to_the_first_claimant() -> None:
    state, _ = new_state()
    state.apply([reset(), set_service(vip("owner", v4=["10.96.0.10"])), sync()])
    state.apply([set_service(node_port_service("ext", 0, "ClusterIP", external=["10.96.0.10"])),
                 sync()])
    assert frontends_by_kind(state)["default/ext:http"] == [("10.96.0.20:80/TCP", "ClusterIP")]
    assert [str(ip) for ip in state.service_ports()[0].external_ips] == []
