"""Arbitrary bytes from the brain: the decoder refuses what does not parse
with one counted skip and decodes the rest as the same message re-encoded
decodes, the state model programs exactly the values in force (the last one
of each object that decodes), only ordinary canonical addresses get through,
and messages near the gRPC size limit pass while larger ones are refused with
a hint naming the flag."""

from __future__ import annotations

import ipaddress
import string
import tempfile
from pathlib import Path

from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import MAX_PORT, IPAddress
from kpng_py.serve.server import Reply
from kpng_py.state.decode import (
    DecodedEndpoint,
    EndpointTails,
    decode_endpoint,
    decode_service,
    split_endpoint_path,
)
from kpng_py.state.limits import Limits
from kpng_py.state.skips import SkipReason, Skips
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
from tests.support.hostile import RawBrain
from tests.support.watch import RecordingSink, ScriptedSource, run_client, start

SKIPS = Skips(Metrics())
METRICS = Metrics()


class RecordedSkips(Skips):
    """Counts as Skips does, and keeps (reason, object) of each skip."""

    def __init__(self) -> None:
        super().__init__(METRICS)
        self.seen: list[tuple[SkipReason, str]] = []

    def skip(self, reason: SkipReason, obj: str, detail: str) -> None:
        assert detail, f"a skip of {obj} without a reason"
        self.seen.append((reason, obj))
        super().skip(reason, obj, detail)


def _parses(message_type, data: bytes):
    try:
        return message_type.FromString(data)
    except DecodeError:
        return None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_skipped(data: bytes) -> None:
    """Bytes that are no Service (no Endpoint) are one bad-bytes skip naming
    the object; any others decode as their message re-encoded does, with the
    same skips, into ports a dataplane can program."""
    skips = RecordedSkips()
    record = decode_service("default/fuzz", data, skips, Limits())
    svc = _parses(L.Service, data)
    if svc is None:
        assert record is None and skips.seen == [(SkipReason.BAD_BYTES, "service default/fuzz")]
    else:
        again = RecordedSkips()
        assert record is not None
        assert record == decode_service("default/fuzz", svc.SerializeToString(), again, Limits())
        assert again.seen == skips.seen
        for sp in record.ports:
            assert 0 < sp.port <= MAX_PORT and sp.cluster_ips
            assert len({ip.version for ip in sp.cluster_ips}) == len(sp.cluster_ips)

    skips = RecordedSkips()
    decoded = decode_endpoint("default/fuzz", "k", data, skips)
    ep = _parses(L.Endpoint, data)
    if ep is None:
        assert decoded is None
        assert skips.seen == [(SkipReason.BAD_BYTES, "endpoint default/fuzz/k")]
    else:
        again = RecordedSkips()
        reencoded = decode_endpoint("default/fuzz", "k", ep.SerializeToString(), again)
        assert _decoded_value(decoded) == _decoded_value(reencoded)
        assert again.seen == skips.seen
        assert decoded is None or all(0 < p <= MAX_PORT for _, p in decoded.port_overrides)


def _decoded_value(record: DecodedEndpoint | None) -> DecodedEndpoint | None:
    """The record without the bytes it came from (a re-encoding may differ)."""
    return None if record is None else record._replace(raw=b"")


def _ips_field(v4: list[str], v6: list[str]) -> bytes:
    ipset = L.IPSet(V4=v4, V6=v6).SerializeToString()
    return bytes([0x12, len(ipset)]) + ipset if len(ipset) < 0x80 else b""


# What may follow an endpoint's IPs: the brain's own encodings, values that
# need a skip, more IPs (merged into the first), garbage.
_TAILS = st.one_of(
    st.builds(lambda local, overrides, scopes: L.Endpoint(
        Local=local, PortOverrides=[L.PortName(Name=n, Port=p) for n, p in overrides],
        Scopes=scopes).SerializeToString(),
        st.booleans(), st.lists(st.tuples(st.sampled_from(["", "http", "dns"]),
                                          st.sampled_from([0, 53, 8080, 70000])), max_size=2),
        st.sampled_from([None, L.EndpointScopes(Internal=True),
                         L.EndpointScopes(Internal=True, External=True)])),
    st.builds(_ips_field, st.lists(st.sampled_from(["10.244.0.9", "x"]), max_size=2),
              st.just([])),
    st.binary(max_size=12),
)


def _v4_entries_field(entries: list[bytes]) -> bytes:
    """An IPs field of V4 entries written by hand: any bytes in each, as a
    hostile brain could send them (protobuf would refuse some)."""
    ipset = b"".join(bytes([0x0A, len(entry)]) + entry for entry in entries)
    return bytes([0x12, len(ipset)]) + ipset if len(ipset) < 0x80 else b""


_V4_ENTRY = st.sampled_from([b"10.244.0.5", b"127.0.0.1", b"010.1.2.3", b"1.2.3.4 ", b"0.0.0.0",
                             b"224.0.0.1", b"10.1.2.3\x00", b"\xff\xfe", b"::1"]) \
    | st.binary(max_size=8)
_SHARING = st.lists(st.tuples(st.builds(_ips_field, st.lists(st.sampled_from(
    ["10.244.0.5", "10.244.0.6", "127.0.0.1", "bad"]), max_size=2),
    st.lists(st.sampled_from(["fd00::5", "::1"]), max_size=1)) | st.binary(max_size=6)
    | st.builds(_v4_entries_field, st.lists(_V4_ENTRY, max_size=3)),
    _TAILS), max_size=12)


@settings(max_examples=300, deadline=None)
@given(_SHARING)
def test_endpoints_decode_alike_with_shared_tails(values: list[tuple[bytes, bytes]]) -> None:
    """Endpoints that share the bytes after their IPs decode, with the
    tails of earlier ones remembered, as each does alone: same record, same
    skips."""
    tails = EndpointTails()
    for prefix, tail in values:
        data = prefix + tail
        # An earlier endpoint of the service with this tail and an ordinary address.
        decode_endpoint("default/fuzz", "first", _ips_field(["10.244.0.7"], []) + tail,
                        RecordedSkips(), tails)
        alone, shared = RecordedSkips(), RecordedSkips()
        assert (decode_endpoint("default/fuzz", "k", data, shared, tails)
                == decode_endpoint("default/fuzz", "k", data, alone))
        assert shared.seen == alone.seen


def test_only_short_tails_are_remembered() -> None:
    """What the decoder remembers of a brain's values is bounded per value:
    a tail over `longest` bytes is decoded anew each time."""
    tail = L.Endpoint(PortOverrides=[L.PortName(Name="http", Port=8080)],
                      Scopes=L.EndpointScopes(Internal=True)).SerializeToString()
    for longest, shared in ((len(tail), True), (len(tail) - 1, False)):
        tails = EndpointTails(longest=longest)
        a, b = (decode_endpoint("default/web", key, _ips_field([ip], []) + tail, SKIPS, tails)
                for key, ip in (("a", "10.244.0.5"), ("b", "10.244.0.6")))
        assert a is not None and b is not None
        assert a.port_overrides == b.port_overrides == (("http", 8080),)
        assert (a.port_overrides is b.port_overrides) == shared


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
    assert record is not None
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
    assert decoded is not None and list(decoded.ips) == expected_ips(endpoint_ips, endpoint_ips)


# Good values among the garbage, on paths that fit them, so that something is
# programmed and garbage has a good version to replace.
_GOOD_SERVICES = [service(name, ns=ns, v4=[v4], v6=[v6], ports=[port("http", 80, target=8080)])
                  for ns, name, v4, v6 in (("default", "a", "10.96.0.10", "fd00::a"),
                                           ("x", "y", "10.96.0.20", "fd00::b"))]
_GOOD_ENDPOINTS = [endpoint(["10.244.0.5"], overrides=[("http", 8080)]),
                   endpoint(["10.244.0.6"], ["fd00:10:244::6"], overrides=[("http", 8081)])]
_GOOD_OPS = ([set_service(svc) for svc in _GOOD_SERVICES]
             + [set_endpoint(ns, name, key, ep) for ns, name in (("default", "a"), ("x", "y"))
                for key in ("k", "z/w") for ep in _GOOD_ENDPOINTS])
_PATHS = ["default/a", "default/a/k", "", "x/y", "x/y/z/w", "a"]
# Bytes that are no Service and no Endpoint (a bad tag, a truncated field).
_UNDECODABLE = [b"\xff\xff\xff\xff\x0f", b"\x0a\xff\xff", b"\x12\x07\x0a\x05garb", b"\x00"]
fuzzed_ops = st.one_of(
    st.builds(set_raw, st.sampled_from([0, 1, 2, 10, 11, 12, 77]), st.sampled_from(_PATHS),
              st.binary(max_size=60)),
    st.sampled_from(_GOOD_OPS),
    st.builds(lambda good, data: set_raw(good.Set.Ref.Set, good.Set.Ref.Path, data),
              st.sampled_from(_GOOD_OPS), st.sampled_from(_UNDECODABLE)),
    st.builds(delete, st.sampled_from([1, 2]), st.sampled_from(_PATHS)),
)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="a/", max_size=8))
def test_an_endpoint_path_is_three_parts_none_empty_the_key_any(path: str) -> None:
    """`ns/svc/key`: the first two slashes split it; the key may hold more."""
    parts = path.split("/", 2)
    expected = ((f"{parts[0]}/{parts[1]}", parts[2])
                if len(parts) == 3 and all(parts) else None)
    assert split_endpoint_path(path) == expected


def _decodes(ref_set: int, path: str, data: bytes) -> bool:
    """Whether the state model may put this value in force (its own checks
    aside, which a fresh state applies alike)."""
    skips = RecordedSkips()
    if ref_set == L.ServicesSet:
        return decode_service(path, data, skips, Limits()) is not None
    split = split_endpoint_path(path)
    return (ref_set == L.EndpointsSet and split is not None
            and decode_endpoint(*split, data, skips) is not None)


def values_in_force(ops: list[L.OpItem]) -> list[L.OpItem]:
    """By hand: per object, the last value that decodes since it was last
    deleted (a refused value leaves the previous one in force)."""
    in_force: dict[tuple[int, str], bytes] = {}
    for op in ops:
        if op.WhichOneof("Op") == "Delete":
            in_force.pop((op.Delete.Set, op.Delete.Path), None)
            continue
        ref = (op.Set.Ref.Set, op.Set.Ref.Path)
        if _decodes(*ref, op.Set.Bytes):
            in_force[ref] = op.Set.Bytes
    return [set_raw(s, p, data) for (s, p), data in sorted(in_force.items())]


@settings(max_examples=200, deadline=None)
@given(st.lists(fuzzed_ops, max_size=14))
def test_any_op_stream_programs_the_values_in_force(ops) -> None:
    """The first Sync of any stream is a full change set of exactly what a
    fresh state computes from the values in force; each refused value is
    counted as skipped (at least once: a value refused again at once is not)."""
    skips = RecordedSkips()
    state = NodeState(skips)
    changes = state.apply([reset(), *ops, sync()])
    assert changes is not None and changes.full and not changes.updated + changes.removed
    assert list(changes.added) == state.service_ports()
    fresh = NodeState(SKIPS)
    fresh.apply([reset(), *values_in_force(ops), sync()])
    assert state.service_ports() == fresh.service_ports()
    refused = {(op.Set.Ref.Set, op.Set.Ref.Path, op.Set.Bytes) for op in ops
               if op.WhichOneof("Op") == "Set" and not _decodes(
                   op.Set.Ref.Set, op.Set.Ref.Path, op.Set.Bytes)}
    assert len(skips.seen) >= len(refused), "a refused value was not reported"


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
