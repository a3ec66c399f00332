"""Every kind of bad input from the brain gets exactly one log line and one
`kpng_py_skipped_total{reason}` increment, and the rest of its change set is
applied: the good service sent with it is programmed, the one programmed
before is untouched. Stream-level problems (a change set cut short, a message
over the size limit) get one warning and one count, and the watch goes on."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import grpc
import pytest

from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.logs import record_fields
from kpng_py.serve.server import Reply
from kpng_py.state.limits import MAX_ENDPOINT_IPS, Limits
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from kpng_py.watch.client import ClientConfig
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
from tests.support.hostile import Abort, RawBrain, Stall, Step
from tests.support.state import apply_synced
from tests.support.watch import RecordingSink, ScriptedSource, run_client, start

KEEP = "default/keep:http"
FRESH = "default/fresh:http"


def web(name: str, v4=("10.96.0.10",), ports=None, **fields) -> L.Service:
    return service(name, v4=list(v4), ports=ports or [port("http", 80, target=8080)], **fields)


def pod(*ips: str, overrides=(("http", 8080),)) -> L.Endpoint:
    return endpoint(list(ips), overrides=overrides)


def dual(name: str, v6: str, ns: str = "default") -> L.Service:
    return service(name, ns=ns, v6=[v6], ports=[port("http", 80, target=8080)])


def with_ips(name: str, v4: str, **ips: list[str]) -> L.Service:
    """A service whose external or load-balancer IPs are given."""
    svc = web(name, v4=[v4])
    for field, values in ips.items():
        getattr(svc.IPs, field).V4.extend(v for v in values if ":" not in v)
        getattr(svc.IPs, field).V6.extend(v for v in values if ":" in v)
    return svc


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
    limits: Limits = Limits()


# The second endpoint of KEEP is served, without what was wrong in it (a bad
# override falls back to the numeric targetPort).
BOTH_KEEP = {KEEP: ["10.244.0.5:8080", "10.244.0.6:8080"]}

# One of each class no service or endpoint may use.
SPECIAL_IPS = {
    "the unspecified IPv4 address": "0.0.0.0",
    "the unspecified IPv6 address": "::",
    "an IPv4 loopback address": "127.0.0.53",
    "the IPv6 loopback address": "::1",
    "the IPv4 metadata address (link-local)": "169.254.169.254",
    "an IPv6 link-local address": "fe80::1",
    "an IPv4 multicast address": "224.0.0.251",
    "an IPv6 multicast address": "ff02::fb",
    "the IPv4 limited broadcast address": "255.255.255.255",
}


def _special_cases() -> dict[str, Case]:
    cases = {}
    for what, ip in SPECIAL_IPS.items():
        v6 = ":" in ip
        cases[f"{what} as a ClusterIP"] = Case(
            (set_service(service("bad", v4=[] if v6 else [ip], v6=[ip] if v6 else [],
                                 ports=[port("http", 80, target=8080)])),), "special-ip")
        ips = L.IPSet(V4=["10.244.0.6"] + ([] if v6 else [ip]), V6=[ip] if v6 else [])
        cases[f"{what} as an endpoint IP"] = Case(
            (set_endpoint("default", "keep", "k1", ep_raw(ips)),), "special-ip", BOTH_KEEP)
    return cases


def _many_ips(count: int) -> L.Endpoint:
    return pod(*(f"10.244.{i // 250}.{i % 250 + 1}" for i in range(count)))

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
    # Canonical addresses only: another spelling of keep's VIP is refused.
    "keep's ClusterIP IPv4-mapped, in the IPv6 list": Case(
        (set_service(dual("intruder", "::ffff:10.96.0.10", ns="aaa")),), "bad-ip"),
    "keep's ClusterIP IPv4-mapped, in the IPv4 list": Case(
        (set_service(web("intruder", v4=["::ffff:10.96.0.10"])),), "bad-ip"),
    "a ClusterIP with a scope id": Case(
        (set_service(dual("scoped", "fd00::1%eth0")),), "bad-ip"),
    "an endpoint IP with a scope id": Case(
        (set_endpoint("default", "keep", "k1", ep_raw(L.IPSet(V4=["10.244.0.6"],
                                                              V6=["fd00::6%a"]))),),
        "bad-ip", BOTH_KEEP),
    "an IPv4-mapped endpoint IP": Case(
        (set_endpoint("default", "keep", "k1", ep_raw(L.IPSet(V4=["10.244.0.6"],
                                                              V6=["::ffff:10.244.0.6"]))),),
        "bad-ip", BOTH_KEEP),
    "a second IPv4 ClusterIP": Case(
        (set_service(web("two", v4=["10.96.0.14", "10.96.0.15"])),), "bad-ip",
        {"default/two:http": []}),
    **_special_cases(),
    "a special external IP": Case(
        (set_service(with_ips("ext", "10.96.0.14", ExternalIPs=["127.0.0.1"])),),
        "special-ip", {"default/ext:http": []}),
    "a special load-balancer IP": Case(
        (set_service(with_ips("lb", "10.96.0.14", LoadBalancerIPs=["::"])),),
        "special-ip", {"default/lb:http": []}),
    # keep claimed 10.96.0.10:80/TCP first: it keeps it, though "aaa" sorts first.
    "keep's frontend claimed by a service of another namespace": Case(
        (set_service(web("intruder", ns="aaa")),), "frontend-conflict"),
    "two ports of one service on one frontend": Case(
        (set_service(web("twin", v4=["10.96.0.14"], ports=[
            port("web", 80, target=8080), port("http", 80, target=8080)])),),
        "frontend-conflict", {"default/twin:http": []}),
    "an endpoint with more addresses than Kubernetes allows": Case(
        (set_endpoint("default", "keep", "k1", _many_ips(MAX_ENDPOINT_IPS + 1)),), "limit"),
    "a service over --max-service-ports": Case(
        (set_service(web("many", v4=["10.96.0.14"], ports=[
            port(f"p{i}", 80 + i, target=8080) for i in range(3)])),),
        "limit", limits=Limits(max_service_ports=2)),
    "a service growing over --max-service-endpoints": Case(
        (set_endpoint("default", "keep", "k1", pod("10.244.0.6", "10.244.0.8")),),
        "limit", limits=Limits(max_service_endpoints=2)),
    "a service that would bring the node over --max-endpoints": Case(
        (set_service(web("huge", v4=["10.96.0.14"])),
         set_endpoint("default", "huge", "h0", pod("10.244.0.8", "10.244.0.9"))),
        "limit", limits=Limits(max_endpoints=3)),
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
    state = NodeState(Skips(metrics), case.limits)
    state.apply(_base())
    before = state.service_ports()
    assert _skipped(metrics) == {}

    with caplog.at_level(logging.DEBUG, logger="kpng_py"):
        changes = apply_synced(state, _fresh() + list(case.ops) + [sync()])

    lines = [r for r in caplog.records if r.name.startswith("kpng_py")]
    assert [record_fields(r)["reason"] for r in lines] == [case.reason], [
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
        again = apply_synced(state, resync + [sync()])
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
    try:
        return _watch_target(target, RecordingSink(source), caplog, metrics, 1, **config)
    finally:
        server.stop(0)


def _watch_raw(replies: Sequence[Sequence[Step]], tmp_path: Path, caplog: pytest.LogCaptureFixture,
               metrics: Metrics, changesets: int = 1,
               **config) -> tuple[RawBrain, RecordingSink, list[logging.LogRecord]]:
    """`_watch` against a brain that sends raw bytes, until `changesets`."""
    brain = RawBrain(replies)
    target = brain.start(tmp_path / "raw.sock")
    try:
        return brain, *_watch_target(target, RecordingSink(), caplog, metrics, changesets, **config)
    finally:
        brain.stop()


def _watch_target(target: str, sink: RecordingSink, caplog: pytest.LogCaptureFixture,
                  metrics: Metrics, changesets: int,
                  **config) -> tuple[RecordingSink, list[logging.LogRecord]]:
    sink.stop_after = changesets
    with caplog.at_level(logging.WARNING, logger="kpng_py"):
        run_client(ClientConfig(target, "n", error_delay=0.05, **config), sink, 20, metrics)
    # Only warnings: a logging set-up left by an earlier test may let info through.
    return sink, [r for r in caplog.records
                  if r.name.startswith("kpng_py") and r.levelno >= logging.WARNING]


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
    assert record_fields(warnings[0])["reason"] == "incomplete-changeset"
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
    assert len(warnings) == 1 and "raise --max-msg-size" in record_fields(warnings[0])["error"]
    assert _skipped(metrics) == {"oversized-message": 1}
    assert _paths(sink.changesets) == [["default/fresh"]]


def test_an_undecodable_message_is_one_bad_op_and_the_stream_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not an OpItem at all (a Set whose length runs past the message): one
    bad-op skip; the ops around it are applied, and so are later change sets
    of the same stream."""
    metrics = Metrics()
    first: list[Step] = [reset(), b"\x12\xff", set_service(web("fresh")), sync()]
    second = [set_service(web("later", v4=["10.96.0.12"])), sync()]
    brain, sink, warnings = _watch_raw([first, second], tmp_path, caplog, metrics, changesets=2)
    assert len(warnings) == 1 and record_fields(warnings[0])["reason"] == "bad-op"
    assert "message 2 of a change set" in warnings[0].getMessage()
    assert _skipped(metrics) == {"bad-op": 1}
    assert _paths(sink.changesets) == [["default/fresh"], ["default/later"]]
    assert sink.errors == [] and brain.streams == 1


def test_a_resource_exhausted_status_from_the_brain_is_reported_as_the_brains(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Only grpcio's own limit is an oversized message with advice to raise
    --max-msg-size; the brain's status is what it says."""
    metrics = Metrics()
    refused: list[Step] = [reset(), set_service(web("lost")),
                           Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota")]
    whole = [reset(), set_service(web("fresh")), sync()]
    _, sink, warnings = _watch_raw([refused, whole], tmp_path, caplog, metrics)
    assert len(warnings) == 1
    error = record_fields(warnings[0])["error"]
    assert "the brain answered RESOURCE_EXHAUSTED: quota" in error and "--max-msg-size" not in error
    assert _skipped(metrics) == {"incomplete-changeset": 1}
    assert _paths(sink.changesets) == [["default/fresh"]]


def test_a_change_set_that_stalls_is_dropped_and_retried(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Ops stop coming before the Sync: after --changeset-stall-timeout the
    stream is dropped (one line, one count) and the next one applies."""
    metrics = Metrics()
    stalled: list[Step] = [reset(), set_service(web("lost")), Stall()]
    whole = [reset(), set_service(web("fresh")), sync()]
    _, sink, warnings = _watch_raw([stalled, whole], tmp_path, caplog, metrics,
                                   changeset_stall_timeout=0.3)
    assert len(warnings) == 1 and "--changeset-stall-timeout" in record_fields(warnings[0])["error"]
    assert _skipped(metrics) == {"incomplete-changeset": 1}
    assert _paths(sink.changesets) == [["default/fresh"]]
    assert sink.started == 2  # each change set was seen starting


def test_a_quiet_brain_between_change_sets_is_not_a_stall(tmp_path: Path) -> None:
    """The deadline is only inside a change set: a brain with nothing new to
    say keeps its stream."""
    brain = RawBrain([[reset(), set_service(web("fresh")), sync()]])
    target = brain.start(tmp_path / "raw.sock")
    sink = RecordingSink()
    try:
        run_client(ClientConfig(target, "n", changeset_stall_timeout=0.1), sink, 1.5)
    finally:
        brain.stop()
    assert _paths(sink.changesets) == [["default/fresh"]]
    assert sink.errors == [] and brain.streams == 1


def test_a_change_set_over_max_changeset_size_is_dropped_with_one_line_and_one_count(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A brain that never Syncs cannot make the client buffer without limit."""
    metrics = Metrics()
    big = [web(f"big-{i}", Annotations={"filler": "x" * 1000}) for i in range(5)]
    endless: list[Step] = [reset(), *(set_service(svc) for svc in big), Stall()]
    whole = [reset(), set_service(web("fresh")), sync()]
    _, sink, warnings = _watch_raw([endless, whole], tmp_path, caplog, metrics,
                                   max_changeset_size=3000)
    assert len(warnings) == 1 and "--max-changeset-size" in record_fields(warnings[0])["error"]
    assert record_fields(warnings[0])["reason"] == "oversized-changeset"
    assert _skipped(metrics) == {"oversized-changeset": 1}
    assert _paths(sink.changesets) == [["default/fresh"]]
