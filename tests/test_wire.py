"""proto/localv1.proto is KPNG's localv1 on the wire.

The bytes here are built by hand from the field numbers and wire types of
docs/spec/localv1-wire.md, not by the generated code, so a renumbered or
retyped field fails these tests.
"""

from __future__ import annotations

from kpng_py.api import LEGACY_WATCH_METHOD, WATCH_METHOD, localv1

VARINT, LEN = 0, 2


def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def field_varint(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value)


def field_bytes(number: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return tag(number, LEN) + varint(len(data)) + data


def ipset(v4: list[str], v6: list[str]) -> bytes:
    return b"".join(field_bytes(1, ip) for ip in v4) + b"".join(field_bytes(2, ip) for ip in v6)


def assert_same_both_ways(message, raw: bytes) -> None:
    assert type(message).FromString(raw) == message
    assert message.SerializeToString(deterministic=True) == raw


SERVICE_BYTES = b"".join([
    field_bytes(1, "default"),                                    # Namespace
    field_bytes(2, "web"),                                        # Name
    field_bytes(3, "ClusterIP"),                                  # Type
    field_bytes(4, b"".join([                                     # IPs: ServiceIPs
        field_bytes(1, ipset(["10.96.0.10"], ["fd00:10:96::a"])),  # ClusterIPs
        field_bytes(2, ipset(["192.0.2.7"], [])),                  # ExternalIPs
        field_varint(3, 1),                                        # Headless
        field_bytes(4, ipset(["198.51.100.1"], [])),               # LoadBalancerIPs
    ])),
    field_varint(5, 1),                                           # MapIP
    field_bytes(6, b"".join([                                     # Ports: PortMapping
        field_bytes(1, "http"), field_varint(2, 1), field_varint(3, 80),
        field_varint(4, 30080), field_varint(5, 8080), field_bytes(6, "web"),
    ])),
    field_bytes(6, field_varint(2, 2) + field_varint(3, 53)),     # a second port: UDP 53
    field_varint(7, 1),                                           # ExternalTrafficToLocal
    field_bytes(8, field_bytes(1, "app") + field_bytes(2, "web")),    # Labels entry
    field_bytes(9, field_bytes(1, "note") + field_bytes(2, "x")),     # Annotations entry
    field_bytes(10, field_bytes(1, ipset(["192.0.2.7"], [])) + field_bytes(2, "10.0.0.0/8")),
    field_bytes(11, field_varint(1, 300)),                        # ClientIP: TimeoutSeconds
    field_varint(12, 1),                                          # InternalTrafficToLocal
    field_varint(13, 31000),                                      # HealthCheckNodePort
])


def test_service_fields() -> None:
    svc = localv1.Service(
        Namespace="default", Name="web", Type="ClusterIP",
        IPs=localv1.ServiceIPs(
            ClusterIPs=localv1.IPSet(V4=["10.96.0.10"], V6=["fd00:10:96::a"]),
            ExternalIPs=localv1.IPSet(V4=["192.0.2.7"]),
            Headless=True,
            LoadBalancerIPs=localv1.IPSet(V4=["198.51.100.1"])),
        MapIP=True,
        Ports=[localv1.PortMapping(Name="http", Protocol=localv1.TCP, Port=80, NodePort=30080,
                                   TargetPort=8080, TargetPortName="web"),
               localv1.PortMapping(Protocol=localv1.UDP, Port=53)],
        ExternalTrafficToLocal=True,
        Labels={"app": "web"},
        Annotations={"note": "x"},
        IPFilters=[localv1.IPFilter(TargetIPs=localv1.IPSet(V4=["192.0.2.7"]),
                                    SourceRanges=["10.0.0.0/8"])],
        ClientIP=localv1.ClientIPAffinity(TimeoutSeconds=300),
        InternalTrafficToLocal=True,
        HealthCheckNodePort=31000,
    )
    assert_same_both_ways(svc, SERVICE_BYTES)
    assert svc.WhichOneof("SessionAffinity") == "ClientIP"


def test_endpoint_fields() -> None:
    raw = b"".join([
        field_bytes(1, "web-0"),                                  # Hostname
        field_bytes(2, ipset(["10.244.0.5"], ["fd00:10:244::5"])),  # IPs
        field_varint(3, 1),                                       # Local
        field_bytes(4, field_bytes(1, "http") + field_varint(2, 8080)),  # PortOverrides
        field_bytes(5, field_varint(1, 1) + field_varint(2, 1)),  # Scopes
    ])
    ep = localv1.Endpoint(
        Hostname="web-0", IPs=localv1.IPSet(V4=["10.244.0.5"], V6=["fd00:10:244::5"]),
        Local=True, PortOverrides=[localv1.PortName(Name="http", Port=8080)],
        Scopes=localv1.EndpointScopes(Internal=True, External=True))
    assert_same_both_ways(ep, raw)


def ref(set_number: int, path: str) -> bytes:
    return field_varint(1, set_number) + field_bytes(2, path)


def test_op_items() -> None:
    cases = {
        field_bytes(1, b""): localv1.OpItem(Sync=localv1.EmptyOp()),
        field_bytes(2, field_bytes(1, ref(1, "default/web")) + field_bytes(2, b"\x01\x02")):
            localv1.OpItem(Set=localv1.Value(
                Ref=localv1.Ref(Set=localv1.ServicesSet, Path="default/web"), Bytes=b"\x01\x02")),
        field_bytes(3, ref(2, "default/web/web-0")):
            localv1.OpItem(Delete=localv1.Ref(Set=localv1.EndpointsSet, Path="default/web/web-0")),
        field_bytes(4, b""): localv1.OpItem(Reset=localv1.EmptyOp()),
    }
    for raw, op in cases.items():
        assert_same_both_ways(op, raw)
    assert {localv1.OpItem.FromString(raw).WhichOneof("Op") for raw in cases} == {
        "Sync", "Set", "Delete", "Reset"}


def test_watch_req_and_enums() -> None:
    assert_same_both_ways(localv1.WatchReq(NodeName="node-a"), field_bytes(1, "node-a"))
    assert {name: localv1.Set.Value(name) for name in localv1.Set.keys()} == {
        "UnknownSet": 0, "ServicesSet": 1, "EndpointsSet": 2,
        "GlobalServiceInfos": 10, "GlobalEndpointInfos": 11, "GlobalNodeInfos": 12}
    assert {name: localv1.Protocol.Value(name) for name in localv1.Protocol.keys()} == {
        "UnknownProtocol": 0, "TCP": 1, "UDP": 2, "SCTP": 3}


def test_package_service_and_method() -> None:
    descriptor = localv1.DESCRIPTOR
    assert descriptor.package == "localv1"
    watch = descriptor.services_by_name["Sets"].methods_by_name["Watch"]
    assert watch.input_type.full_name == "localv1.WatchReq"
    assert watch.output_type.full_name == "localv1.OpItem"
    assert watch.client_streaming and watch.server_streaming
    assert WATCH_METHOD == "/localv1.Sets/Watch"
    assert LEGACY_WATCH_METHOD == "/localnetv1.Endpoints/Watch"
