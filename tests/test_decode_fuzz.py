"""Arbitrary bytes from the brain never crash the decoder or the state model,
only ordinary canonical addresses get through it, and messages near the gRPC
size limit pass while larger ones are refused with a hint naming the flag."""

from __future__ import annotations

import ipaddress
import string
import tempfile
from pathlib import Path

from google.protobuf.message import DecodeError
from hypothesis import given, settings, strategies as st

from kpng_py.api import localv1 as L
from kpng_py.client import ClientConfig
from kpng_py.decode import decode_endpoint, decode_service
from kpng_py.limits import Limits
from kpng_py.model import IPAddress
from kpng_py.metrics import Metrics
from kpng_py.server import Reply
from kpng_py.skips import Skips
from kpng_py.state import NodeState
from tests.streams.build import endpoint, port, reset, service, set_raw, set_service, sync
from tests.support.hostile import RawBrain
from tests.support.watch import RecordingSink, ScriptedSource, run_client, start

SKIPS = Skips(Metrics())


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_skipped(data: bytes) -> None:
    decode_service("default/fuzz", data, SKIPS, Limits())
    decode_endpoint("default/fuzz", "k", data, SKIPS)


# Every class of address a brain could send: any address (hypothesis favours
# special-purpose ranges), IPv4-mapped forms, scope ids, named special ones,
# and text that is not an address at all.
addresses = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=4).map(lambda ip: f"::ffff:{ip}"),
    st.tuples(st.ip_addresses(v=6), st.text(string.ascii_letters + string.digits, min_size=1,
                                            max_size=4)).map(lambda t: f"{t[0]}%{t[1]}"),
    st.sampled_from(["0.0.0.0", "::", "127.0.0.1", "::1", "169.254.169.254", "fe80::1",
                     "224.0.0.1", "ff02::1", "255.255.255.255", "10.96.0.10", "fd00::10"]),
    st.text(max_size=12),
)
address_lists = st.lists(addresses, max_size=4)


def usable(value: str, version: int) -> IPAddress | None:
    """What decode must make of `value` listed under IPv`version`, by
    ipaddress's own classification."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    if ip.version != version:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and (ip.scope_id or ip.ipv4_mapped):
        return None
    if ip.is_unspecified or ip.is_loopback or ip.is_link_local or ip.is_multicast:
        return None
    return None if ip == ipaddress.IPv4Address("255.255.255.255") else ip


def expected_ips(v4: list[str], v6: list[str]) -> list[IPAddress]:
    ips = [usable(v, 4) for v in v4] + [usable(v, 6) for v in v6]
    return [ip for ip in ips if ip is not None]


@settings(max_examples=500, deadline=None)
@given(address_lists, address_lists, address_lists, address_lists)
def test_only_usable_addresses_are_decoded(cluster_v4, cluster_v6, external, endpoint_ips) -> None:
    svc = service("fuzz", v4=cluster_v4, v6=cluster_v6, ports=[port("http", 80, target=8080)])
    svc.IPs.ExternalIPs.V4.extend(external)
    svc.IPs.LoadBalancerIPs.V6.extend(external)
    record = decode_service("default/fuzz", svc.SerializeToString(), SKIPS, Limits())
    cluster = expected_ips(cluster_v4, cluster_v6)
    first_per_family = [ip for i, ip in enumerate(cluster)
                        if all(other.version != ip.version for other in cluster[:i])]
    if first_per_family:
        (sp,) = record.ports
        assert list(sp.cluster_ips) == first_per_family
        assert list(sp.external_ips) == expected_ips(external, [])
        assert list(sp.load_balancer_ips) == expected_ips([], external)
    else:
        assert record.ports == ()

    ep = endpoint(v4=endpoint_ips, v6=endpoint_ips)
    decoded = decode_endpoint("default/fuzz", "k", ep.SerializeToString(), SKIPS)
    assert list(decoded.ips) == expected_ips(endpoint_ips, endpoint_ips)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 10, 11, 12, 77]),
                          st.sampled_from(["default/a", "default/a/k", "", "x/y/z/w", "a"]),
                          st.binary(max_size=60)), max_size=12))
def test_any_op_stream_is_applied_without_raising(items) -> None:
    state = NodeState(SKIPS)
    state.apply([reset()] + [set_raw(s, p, b) for s, p, b in items] + [sync()])


def big_service(size: int) -> L.OpItem:
    svc = service("big", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    svc.Annotations["filler"] = "x" * size
    return set_service(svc)


def test_messages_near_the_limit(tmp_path: Path) -> None:
    limit = 1 << 20
    near = Reply((reset(), big_service(limit - 200), sync()))
    source = ScriptedSource([near])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    sink.stop_after = 1
    try:
        run_client(ClientConfig(target, "n", max_msg_size=limit), sink, 20)
    finally:
        server.stop(0)
    assert len(sink.changesets) == 1

    over = Reply((reset(), big_service(limit + 10), sync()))
    source = ScriptedSource([over])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    try:
        run_client(ClientConfig(target, "n", max_msg_size=limit, error_delay=0.1), sink, 1)
    finally:
        server.stop(0)
    assert sink.changesets == []
    assert sink.errors and "raise --max-msg-size" in sink.errors[0]


def _not_a_sync(data: bytes) -> bool:
    try:
        return L.OpItem.FromString(data).WhichOneof("Op") != "Sync"
    except DecodeError:
        return True


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=40).filter(_not_a_sync), max_size=6),
                min_size=1, max_size=4))
def test_any_messages_on_the_wire_are_applied_or_counted_as_bad_ops(replies) -> None:
    """Raw messages from a brain, each change set ending with a Sync: every
    decodable one reaches the sink in order, each other one is one bad-op
    skip, and the stream never fails for them."""
    expected, undecodable = [], 0
    for blobs in replies:
        ops = []
        for blob in blobs:
            try:
                ops.append(L.OpItem.FromString(blob))
            except DecodeError:
                undecodable += 1
        expected.append(ops + [sync()])
    brain = RawBrain([[*blobs, sync()] for blobs in replies])
    metrics = Metrics()
    sink = RecordingSink()
    sink.stop_after = len(replies)
    with tempfile.TemporaryDirectory(prefix="kpng-fuzz-") as socket_dir:
        target = brain.start(Path(socket_dir) / "raw.sock")
        try:
            run_client(ClientConfig(target, "n"), sink, 20, metrics)
        finally:
            brain.stop()
    assert sink.changesets == expected and sink.errors == [] and brain.streams == 1
    assert (metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": "bad-op"})
            or 0) == undecodable
