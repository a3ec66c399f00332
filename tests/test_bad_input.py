"""Every kind of bad input from the brain gets exactly one log line and one
`kpng_py_skipped_total{reason}` increment, and the rest of its change set is
applied: the good service sent with it is programmed, the one programmed
before is untouched. Stream-level problems (a change set cut short, a message
over the size limit) get one warning and one count, and the watch goes on."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from kpng_py.api import localv1 as L
from kpng_py.client import ClientConfig
from kpng_py.metrics import Metrics
from kpng_py.server import Reply
from kpng_py.skips import Skips
from kpng_py.state import NodeState
from tests.streams.build import (
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
from tests.support.watch import RecordingSink, ScriptedSource, run_client, start

KEEP = "default/keep:http"
FRESH = "default/fresh:http"


def web(name: str, v4=("10.96.0.10",), ports=None, **fields) -> L.Service:
    return service(name, v4=list(v4), ports=ports or [port("http", 80, target=8080)], **fields)


def pod(*ips: str, overrides=(("http", 8080),)) -> L.Endpoint:
    return endpoint(list(ips), overrides=overrides)


def ep_raw(ips: L.IPSet, overrides=(("http", 8080),)) -> L.Endpoint:
    """An endpoint whose IPs are given as they arrive (families unchecked)."""
    return L.Endpoint(IPs=ips, PortOverrides=[L.PortName(Name=n, Port=p) for n, p in overrides],
                      Scopes=L.EndpointScopes(Internal=True, External=True))


@dataclass(frozen=True)
class Case:
    ops: tuple[L.OpItem, ...]
    reason: str
    # What the state holds afterwards, besides KEEP (unchanged) and FRESH.
    also: dict[str, list[str]] | None = None


# The second endpoint of KEEP is served, without what was wrong in it (a bad
# override falls back to the numeric targetPort).
BOTH_KEEP = {KEEP: ["10.244.0.5:8080", "10.244.0.6:8080"]}

CASES = {
    "garbage bytes for a new service": Case(
        (set_raw(L.ServicesSet, "default/bad", b"\x0a\xff"),), "bad-bytes"),
    "garbage bytes replacing a programmed service": Case(
        (set_raw(L.ServicesSet, "default/keep", b"\x0a\xff"),), "bad-bytes"),
    "garbage bytes replacing a programmed endpoint": Case(
        (set_raw(L.EndpointsSet, "default/keep/k0", b"\x12\xff"),), "bad-bytes"),
    "garbage bytes for a new endpoint": Case(
        (set_raw(L.EndpointsSet, "default/keep/k9", b"\x12\xff"),), "bad-bytes"),
    "a Set of an unknown set": Case(
        (set_raw(77, "default/x", b"\x0a\x01x"),), "unknown-set"),
    "a Set of a global set": Case(
        (set_raw(L.GlobalEndpointInfos, "default/keep/k0", b""),), "unknown-set"),
    "an endpoint of an unknown service": Case(
        (set_endpoint("default", "ghost", "g0", pod("10.244.0.9")),), "unknown-service"),
    "a Delete of an unknown service": Case(
        (delete(L.ServicesSet, "default/ghost"),), "unknown-delete"),
    "a Delete of an unknown endpoint": Case(
        (delete(L.EndpointsSet, "default/keep/nope"),), "unknown-delete"),
    "a Delete of an unknown set": Case(
        (delete(77, "default/keep"),), "unknown-delete"),
    "an invalid ClusterIP": Case(
        (set_service(web("bad", v4=["10.96.0.999"])),), "bad-ip"),
    "an IPv6 ClusterIP in the IPv4 list": Case(
        (set_service(web("bad", v4=["fd00::1"])),), "bad-ip"),
    "an IPv6 endpoint IP in the IPv4 list": Case(
        (set_endpoint("default", "keep", "k1", ep_raw(L.IPSet(V4=["10.244.0.6", "fd00::6"]))),),
        "bad-ip", BOTH_KEEP),
    "a non-IP endpoint address": Case(
        (set_endpoint("default", "keep", "k1", ep_raw(L.IPSet(V4=["pod-6"]))),), "bad-ip"),
    "service port 0": Case(
        (set_service(web("bad", ports=[port("http", 0, target=8080)])),), "bad-port"),
    "service port 65536": Case(
        (set_service(web("bad", ports=[port("http", 65536, target=8080)])),), "bad-port"),
    "target port 70000": Case(
        (set_service(web("bad", ports=[port("http", 80, target=70000)])),), "bad-port"),
    "an endpoint port override 0": Case(
        (set_endpoint("default", "keep", "k1", pod("10.244.0.6", overrides=[("http", 0)])),),
        "bad-port", BOTH_KEEP),
    "an endpoint port override 70000": Case(
        (set_endpoint("default", "keep", "k1", pod("10.244.0.6", overrides=[("http", 70000)])),),
        "bad-port", BOTH_KEEP),
    "the same endpoint under two keys": Case(
        (set_endpoint("default", "keep", "k1", pod("10.244.0.5")),), "duplicate-endpoint"),
    "one endpoint listing its IP twice": Case(
        (set_endpoint("default", "keep", "k1", pod("10.244.0.6", "10.244.0.6")),),
        "duplicate-endpoint", BOTH_KEEP),
    "an empty service name": Case(
        (set_raw(L.ServicesSet, "default/", web("x").SerializeToString()),), "bad-path"),
    "an empty service path": Case(
        (set_raw(L.ServicesSet, "", web("x").SerializeToString()),), "bad-path"),
    "an empty endpoint key": Case(
        (set_raw(L.EndpointsSet, "default/keep/", pod("10.244.0.6").SerializeToString()),),
        "bad-path"),
    "an empty namespace in an endpoint path": Case(
        (set_raw(L.EndpointsSet, "/keep/k1", pod("10.244.0.6").SerializeToString()),),
        "bad-path"),
    "an SCTP port": Case(
        (set_service(web("bad", ports=[port("sctp", 80, L.SCTP, target=8080)])),),
        "unsupported-protocol"),
    "an unknown protocol": Case(
        (set_service(web("bad", ports=[port("seven", 80, 7, target=8080)])),),
        "unsupported-protocol"),
    "two ports with one name and protocol": Case(
        (set_service(web("twice", v4=["10.96.0.12"], ports=[
            port("http", 80, target=8080), port("http", 81, target=8080)])),),
        "duplicate-port", {"default/twice:http": []}),
    "an affinity timeout over a day": Case(
        (set_service(web("sticky", v4=["10.96.0.13"], ClientIP=L.ClientIPAffinity(
            TimeoutSeconds=90000))),),
        "bad-affinity", {"default/sticky:http": []}),
}


def _base() -> list[L.OpItem]:
    return [reset(), set_service(web("keep")),
            set_endpoint("default", "keep", "k0", pod("10.244.0.5")), sync()]


def _fresh() -> list[L.OpItem]:
    """The good part of the change set that carries the bad input."""
    return [set_service(web("fresh", v4=["10.96.0.11"])),
            set_endpoint("default", "fresh", "f0", pod("10.244.0.7"))]


def _skipped(metrics: Metrics) -> dict[str, float]:
    return {s.labels["reason"]: s.value for family in metrics.registry.collect()
            if family.name == "kpng_py_skipped" for s in family.samples
            if s.name == "kpng_py_skipped_total"}


def _endpoints(state: NodeState) -> dict[str, list[str]]:
    return {str(p.name): [str(e) for e in p.cluster_endpoints()] for p in state.service_ports()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_line_one_count_and_the_rest_applied(name: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    case = CASES[name]
    metrics = Metrics()
    state = NodeState(Skips(metrics))
    state.apply(_base())
    before = state.service_ports()
    assert _skipped(metrics) == {}

    with caplog.at_level(logging.DEBUG, logger="kpng_py"):
        changes = state.apply(_fresh() + list(case.ops) + [sync()])

    lines = [r for r in caplog.records if r.name.startswith("kpng_py")]
    assert [r.kpng_fields["reason"] for r in lines] == [case.reason], [
        r.getMessage() for r in lines]
    assert _skipped(metrics) == {case.reason: 1}
    assert FRESH in [str(p.name) for p in changes.added]
    expected = {KEEP: ["10.244.0.5:8080"], FRESH: ["10.244.0.7:8080"], **(case.also or {})}
    assert _endpoints(state) == expected
    if KEEP not in (case.also or {}):
        assert [p for p in state.service_ports() if str(p.name) == KEEP] == before

    # A reconnect re-sends the latest value at each path: nothing is reported
    # again, nothing changes.
    caplog.clear()
    latest = {(op.Set.Ref.Set, op.Set.Ref.Path): op
              for op in _base() + _fresh() + list(case.ops) if op.HasField("Set")}
    resync = [reset(), *latest.values()]
    with caplog.at_level(logging.DEBUG, logger="kpng_py"):
        again = state.apply(resync + [sync()])
    assert [r.getMessage() for r in caplog.records if r.name.startswith("kpng_py")] == []
    assert _skipped(metrics) == {case.reason: 1}
    assert len(again) == 0


def test_a_refused_value_is_reported_once_until_it_changes_or_goes(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    state = NodeState(Skips(metrics))
    garbage = set_raw(L.ServicesSet, "default/bad", b"\x0a\xff")
    other_garbage = set_raw(L.ServicesSet, "default/bad", b"\x0a\xfe")
    steps = [
        ([reset(), garbage], 1),  # reported
        ([garbage], 0),  # the same value again
        ([other_garbage], 1),  # a new bad value
        ([delete(L.ServicesSet, "default/bad")], 0),  # its end: nothing to say
        ([delete(L.ServicesSet, "default/bad")], 1),  # now an unknown path
    ]
    for ops, lines in steps:
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="kpng_py"):
            state.apply(ops + [sync()])
        assert len([r for r in caplog.records if r.name.startswith("kpng_py")]) == lines, ops
    assert _skipped(metrics) == {"bad-bytes": 2, "unknown-delete": 1}


def _watch(replies: list[Reply], tmp_path: Path, caplog: pytest.LogCaptureFixture,
           metrics: Metrics, **config) -> tuple[RecordingSink, list[logging.LogRecord]]:
    """Run a watch client against scripted replies until its first change set;
    returns what it applied and the warnings it logged."""
    source = ScriptedSource(replies)
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    sink.stop_after = 1
    try:
        with caplog.at_level(logging.WARNING, logger="kpng_py"):
            run_client(ClientConfig(target, "n", error_delay=0.05, **config), sink, 20, metrics)
    finally:
        server.stop(0)
    return sink, [r for r in caplog.records if r.name.startswith("kpng_py")]


def _paths(changesets: list[list[L.OpItem]]) -> list[list[str]]:
    return [[op.Set.Ref.Path for op in ops if op.HasField("Set")] for ops in changesets]


def test_a_change_set_cut_short_is_dropped_with_one_line_and_one_count(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The brain fails mid change set (as when it is killed): those ops are
    never applied; the next stream's full state is."""
    metrics = Metrics()
    cut_short = Reply((reset(), set_service(web("lost"))), close_reason="brain crashed")
    whole = Reply((reset(), set_service(web("fresh")), sync()))
    sink, warnings = _watch([cut_short, whole], tmp_path, caplog, metrics)
    assert [r.getMessage() for r in warnings] == ["watch stream to the brain failed"]
    assert warnings[0].kpng_fields["reason"] == "incomplete-changeset"
    assert _skipped(metrics) == {"incomplete-changeset": 1}
    assert _paths(sink.changesets) == [["default/fresh"]]


def test_a_message_over_the_size_limit_gets_one_line_and_one_count(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Even as the first message of a stream (nothing partial to drop)."""
    metrics = Metrics()
    big = web("big")
    big.Annotations["filler"] = "x" * 5000
    oversized = Reply((set_service(big), sync()))
    whole = Reply((reset(), set_service(web("fresh")), sync()))
    sink, warnings = _watch([oversized, whole], tmp_path, caplog, metrics, max_msg_size=4096)
    assert len(warnings) == 1 and "raise --max-msg-size" in warnings[0].kpng_fields["error"]
    assert _skipped(metrics) == {"oversized-message": 1}
    assert _paths(sink.changesets) == [["default/fresh"]]
