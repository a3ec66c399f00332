"""Builds the recorded-stream fixtures in this folder.

Each scenario is the op stream a KPNG brain sends (Reset, Sets in KPNG's op
order, Sync, ...), written in the recording format (docs/recording-format.md).
`<name>.jsonl` is the recording; `<name>.expected.jsonl` is what `to-print`
must print for it, one line per Sync — reviewed by hand, never regenerated
from the code under test.

    .venv/bin/python -m tests.streams.build          # rewrite the recordings
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Callable, Iterable

from kpng_py.api import localv1 as L
from kpng_py.serve.recording import RecordingWriter

HERE = Path(__file__).resolve().parent

Op = L.OpItem
Scenario = Callable[[], Iterable[Op | str]]  # an OpItem, or a disconnect reason


# -- building blocks ----------------------------------------------------------

def reset() -> Op:
    return Op(Reset=L.EmptyOp())


def sync() -> Op:
    return Op(Sync=L.EmptyOp())


def set_raw(ref_set: int, path: str, data: bytes) -> Op:
    return Op(Set=L.Value(Ref=L.Ref(Set=ref_set, Path=path), Bytes=data))


def set_service(svc: L.Service) -> Op:
    return set_raw(L.ServicesSet, f"{svc.Namespace}/{svc.Name}", svc.SerializeToString())


def set_endpoint(ns: str, svc: str, key: str, ep: L.Endpoint) -> Op:
    return set_raw(L.EndpointsSet, f"{ns}/{svc}/{key}", ep.SerializeToString())


def delete(ref_set: int, path: str) -> Op:
    return Op(Delete=L.Ref(Set=ref_set, Path=path))


def service(name: str, v4: Iterable[str] = (), v6: Iterable[str] = (),
            ports: Iterable[L.PortMapping] = (), ns: str = "default", **fields) -> L.Service:
    return L.Service(Namespace=ns, Name=name, Type=fields.pop("Type", "ClusterIP"),
                     IPs=L.ServiceIPs(ClusterIPs=L.IPSet(V4=list(v4), V6=list(v6)),
                                      Headless=fields.pop("Headless", False)),
                     Ports=list(ports), **fields)


def port(name: str, number: int, protocol: int = L.TCP, target: int = 0,
         target_name: str = "") -> L.PortMapping:
    return L.PortMapping(Name=name, Protocol=protocol, Port=number, TargetPort=target,
                         TargetPortName=target_name)


def endpoint(v4: Iterable[str] = (), v6: Iterable[str] = (), local: bool = False,
             internal: bool = True, overrides: Iterable[tuple[str, int]] = (),
             external: bool = True) -> L.Endpoint:
    """An endpoint as KPNG's brain sends it: one override per named port."""
    return L.Endpoint(IPs=L.IPSet(V4=list(v4), V6=list(v6)), Local=local,
                      PortOverrides=[L.PortName(Name=n, Port=p) for n, p in overrides],
                      Scopes=L.EndpointScopes(Internal=internal, External=external))


def http_endpoint(v4: str) -> L.Endpoint:
    """An endpoint of one IPv4 address that serves the port named `http` on 8080."""
    return endpoint([v4], overrides=[("http", 8080)])


# -- scenarios ----------------------------------------------------------------

def initial_state():
    yield reset()
    yield set_service(service("web", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)]))
    yield set_service(service("api", ns="prod", v4=["10.96.0.20"],
                              ports=[port("grpc", 9000, target=9000)]))
    yield set_endpoint("default", "web", "web-0", http_endpoint("10.244.0.5"))
    yield set_endpoint("default", "web", "web-1", http_endpoint("10.244.0.6"))
    yield set_endpoint("prod", "api", "api-0", endpoint(["10.244.1.9"], overrides=[("grpc", 9000)]))
    yield sync()


def endpoints_churn():
    web = service("web", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    yield reset()
    yield set_service(web)
    yield set_endpoint("default", "web", "web-0", http_endpoint("10.244.0.5"))
    yield sync()
    # scale up to three
    yield set_endpoint("default", "web", "web-1", http_endpoint("10.244.0.6"))
    yield set_endpoint("default", "web", "web-2", http_endpoint("10.244.0.7"))
    yield sync()
    # web-0 goes away, web-1 is replaced by a pod with a new IP
    yield delete(L.EndpointsSet, "default/web/web-0")
    yield set_endpoint("default", "web", "web-1", http_endpoint("10.244.0.16"))
    yield sync()
    # scale to zero: the service port stays, with no endpoints (a reject)
    yield delete(L.EndpointsSet, "default/web/web-1")
    yield delete(L.EndpointsSet, "default/web/web-2")
    yield sync()


def named_ports():
    # targetPort is a name: each pod resolves it to its own number.
    svc = service("app", v4=["10.96.0.30"], ports=[
        port("http", 80, target_name="web"),
        port("metrics", 9090, target_name="prom"),
    ])
    yield reset()
    yield set_service(svc)
    # as from a real cluster: overrides named like the service ports
    yield set_endpoint("default", "app", "app-a", endpoint(
        ["10.244.0.11"], overrides=[("http", 8080), ("metrics", 9100)]))
    yield set_endpoint("default", "app", "app-b", endpoint(
        ["10.244.0.12"], overrides=[("http", 8081), ("metrics", 9101)]))
    # as from a hand-written state file: overrides named like the target port
    yield set_endpoint("default", "app", "app-c", endpoint(
        ["10.244.0.13"], overrides=[("web", 8082), ("prom", 9102)]))
    # no override for metrics and no numeric targetPort: left out of that port
    yield set_endpoint("default", "app", "app-d", endpoint(
        ["10.244.0.14"], overrides=[("http", 8083)]))
    yield sync()


def tcp_udp_same_port():
    dns = service("kube-dns", ns="kube-system", v4=["10.96.0.53"], ports=[
        port("dns", 53, L.UDP, target=5353),
        port("dns-tcp", 53, L.TCP, target=5353),
    ])
    yield reset()
    yield set_service(dns)
    for i in (1, 2):
        yield set_endpoint("kube-system", "kube-dns", f"coredns-{i}", endpoint(
            [f"10.244.0.{50 + i}"], overrides=[("dns", 5353), ("dns-tcp", 5353)]))
    yield sync()
    # the TCP port is removed from the service; UDP stays as it was
    del dns.Ports[1]
    yield set_service(dns)
    yield sync()


def dual_stack():
    yield reset()
    yield set_service(service("web", v4=["10.96.0.10"], v6=["fd00:10:96::a"],
                              ports=[port("http", 80, target=8080)]))
    yield set_service(service("v6only", v6=["fd00:10:96::b"], ports=[port("", 443, target=8443)]))
    yield set_endpoint("default", "web", "web-0", endpoint(
        ["10.244.0.5"], ["fd00:10:244::5"], overrides=[("http", 8080)]))
    yield set_endpoint("default", "web", "web-1", endpoint(
        ["10.244.0.6"], ["fd00:10:244::6"], overrides=[("http", 8080)]))
    yield set_endpoint("default", "v6only", "v6-0", endpoint(
        v6=["fd00:10:244::20"], overrides=[("", 8443)]))
    yield sync()


def service_deleted():
    web = service("web", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    other = service("other", v4=["10.96.0.11"], ports=[port("http", 80, target=8080)])
    shared = http_endpoint("10.244.0.5")
    yield reset()
    yield set_service(web)
    yield set_service(other)
    yield set_endpoint("default", "web", "pod-0", shared)
    yield set_endpoint("default", "other", "pod-0", shared)
    yield sync()
    # KPNG's order: a service's endpoints are deleted before it
    yield delete(L.EndpointsSet, "default/web/pod-0")
    yield delete(L.ServicesSet, "default/web")
    yield sync()
    # recreated (with a new ClusterIP, as after kubectl delete + apply)
    web.IPs.ClusterIPs.V4[:] = ["10.96.0.12"]
    yield set_service(web)
    yield set_endpoint("default", "web", "pod-0", shared)
    yield sync()


def internal_traffic_local():
    # The brain computed Scopes for node-a: only local endpoints are Internal.
    svc = service("local", v4=["10.96.0.40"], ports=[port("http", 80, target=8080)],
                  InternalTrafficToLocal=True)
    yield reset()
    yield set_service(svc)
    yield set_endpoint("default", "local", "on-node", endpoint(
        ["10.244.0.5"], local=True, internal=True, overrides=[("http", 8080)]))
    yield set_endpoint("default", "local", "elsewhere", endpoint(
        ["10.244.1.5"], local=False, internal=False, overrides=[("http", 8080)]))
    yield sync()
    # the local pod goes: endpoints exist elsewhere, none usable here -> reject
    yield delete(L.EndpointsSet, "default/local/on-node")
    yield sync()
    # policy switched back to Cluster: the brain re-sends scopes
    svc.InternalTrafficToLocal = False
    yield set_service(svc)
    yield set_endpoint("default", "local", "elsewhere", endpoint(
        ["10.244.1.5"], local=False, internal=True, overrides=[("http", 8080)]))
    yield sync()


def session_affinity():
    yield reset()
    yield set_service(service("sticky", v4=["10.96.0.50"], ports=[port("http", 80, target=8080)],
                              ClientIP=L.ClientIPAffinity(TimeoutSeconds=30)))
    yield set_service(service("sticky-default", v4=["10.96.0.51"],
                              ports=[port("http", 80, target=8080)],
                              ClientIP=L.ClientIPAffinity()))
    yield set_endpoint("default", "sticky", "s-0", http_endpoint("10.244.0.5"))
    yield set_endpoint("default", "sticky-default", "s-0",
                       http_endpoint("10.244.0.5"))
    yield sync()
    # affinity turned off
    yield set_service(service("sticky", v4=["10.96.0.50"], ports=[port("http", 80, target=8080)]))
    yield sync()


def reconnect():
    web = service("web", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    gone = service("gone", v4=["10.96.0.11"], ports=[port("http", 80, target=8080)])
    yield reset()
    yield set_service(web)
    yield set_service(gone)
    yield set_endpoint("default", "web", "web-0", http_endpoint("10.244.0.5"))
    yield set_endpoint("default", "web", "web-1", http_endpoint("10.244.0.6"))
    yield sync()
    # the brain dies in the middle of a change set
    yield set_endpoint("default", "web", "web-2", http_endpoint("10.244.0.7"))
    yield "UNAVAILABLE: brain restarted"
    # the new brain's full state: web-1 and the service "gone" were deleted
    # meanwhile, web-2 exists; unchanged objects are re-sent as they were
    yield reset()
    yield set_service(web)
    yield set_endpoint("default", "web", "web-0", http_endpoint("10.244.0.5"))
    yield set_endpoint("default", "web", "web-2", http_endpoint("10.244.0.7"))
    yield sync()


def large_state():
    """1000 services x 2 endpoints, then a one-endpoint change."""
    yield reset()
    for i in range(1000):
        yield set_service(service(f"svc-{i:04d}", v4=[f"10.96.{i // 250}.{i % 250 + 1}"],
                                  ports=[port("http", 80, target=8080)]))
    for i in range(1000):
        for j in range(2):
            yield set_endpoint("default", f"svc-{i:04d}", f"pod-{i:04d}-{j}", endpoint(
                [f"10.244.{i // 125}.{(i % 125) * 2 + j + 1}"], overrides=[("http", 8080)]))
    yield sync()
    yield delete(L.EndpointsSet, "default/svc-0500/pod-0500-1")
    yield sync()


def bad_inputs():
    good = service("good", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    yield reset()
    yield set_service(good)
    yield set_endpoint("default", "good", "g-0", http_endpoint("10.244.0.5"))
    # garbage bytes for a new service and for an endpoint: skipped
    yield set_raw(L.ServicesSet, "default/garbage", b"\xff\xff\xff\xff\x0f")
    yield set_raw(L.EndpointsSet, "default/good/garbage", b"\x12\x07\x0a\x05garb")
    # bad IPs: a ClusterIP that is not an IP, an endpoint IP of the wrong family
    yield set_service(service("badip", v4=["10.96.0.300"], ports=[port("http", 80, target=8080)]))
    yield set_endpoint("default", "good", "g-1", endpoint(["fd00:10:244::9", "10.244.0.x"],
                                                          overrides=[("http", 8080)]))
    # port 0 and a port beyond 65535 (port 2 of the same service survives)
    yield set_service(service("badport", v4=["10.96.0.12"], ports=[
        port("zero", 0, target=8080), port("huge", 70000, target=8080),
        port("ok", 81, target=8081)]))
    yield set_endpoint("default", "badport", "b-0", endpoint(["10.244.0.7"], overrides=[
        ("ok", 8081)]))
    # SCTP and an unknown protocol: skipped, TCP port of the same service kept
    yield set_service(service("sctp", v4=["10.96.0.13"], ports=[
        port("sctp", 3868, L.SCTP, target=3868), port("weird", 99, 7, target=99),
        port("tcp", 3869, target=3869)]))
    # headless and ExternalName: nothing to program
    yield set_service(service("headless", ports=[port("http", 80, target=8080)], Headless=True))
    yield set_service(service("ext", ports=[port("http", 80)], Type="ExternalName"))
    # an unknown Set, a Set of a set backends are not given, bad paths, unknown deletes
    yield set_raw(99, "default/whatever", b"")
    yield set_raw(L.GlobalNodeInfos, "node-a", b"")
    yield set_raw(L.ServicesSet, "no-namespace", good.SerializeToString())
    yield set_raw(L.EndpointsSet, "default/good", b"")
    # endpoints of a service never sent are kept aside; a duplicate endpoint
    # (same IP and port under another key) is programmed once
    yield set_endpoint("default", "nosuch", "n-0", http_endpoint("10.244.0.9"))
    yield set_endpoint("default", "good", "g-dup", http_endpoint("10.244.0.5"))
    yield delete(L.ServicesSet, "default/never-seen")
    yield delete(L.EndpointsSet, "default/good/never-seen")
    yield sync()
    # garbage replacing a good service keeps the good version in force
    yield set_raw(L.ServicesSet, "default/good", b"\x0a\xff\xff")
    yield set_endpoint("default", "good", "g-2", http_endpoint("10.244.0.8"))
    yield sync()


def hostile_frontends():
    """Issue 12: other spellings of a VIP, special addresses and a second claim
    on one frontend; the owner is the service port that claimed it first."""
    http = [port("http", 80, target=8080)]
    keep = service("keep", v4=["10.96.0.10"], v6=["fd00:10:96::a"], ports=http)
    same = service("same", ns="attack", v4=["10.96.0.10"], ports=http)
    half = service("half", ns="attack", v4=["10.96.0.20"], v6=["fd00:10:96::a"], ports=http)
    others = [
        service("mapped", ns="evil", v6=["::ffff:10.96.0.10"], ports=http),
        service("scoped", ns="evil", v6=["fd00:10:96::a%eth0"], ports=http),
        service("any", ns="evil", v4=["0.0.0.0"], v6=["::"], ports=http),
        service("metadata", ns="evil", v4=["169.254.169.254"], ports=http),
    ]
    pods = [
        ("default", "keep", "keep-0", endpoint(["10.244.0.5"], ["fd00:10:244::5"],
                                               overrides=[("http", 8080)])),
        ("attack", "same", "same-0", http_endpoint("10.244.9.9")),
        ("attack", "half", "half-0", endpoint(["10.244.9.8"], ["fd00:10:244::98"],
                                              overrides=[("http", 8080)])),
    ]
    yield reset()
    yield set_service(keep)
    yield set_endpoint(*pods[0])
    yield sync()
    # refused: another spelling of keep's VIPs, unspecified and link-local VIPs,
    # and an endpoint address in the node's loopback (its other address stays)
    for svc in others:
        yield set_service(svc)
    yield set_endpoint("default", "keep", "keep-1", endpoint(["127.0.0.1", "10.244.0.6"],
                                                             overrides=[("http", 8080)]))
    # keep claimed both its VIPs first, though "attack" sorts before "default":
    # same gets nothing, half only its own v4 VIP
    yield set_service(same)
    yield set_service(half)
    yield set_endpoint(*pods[1])
    yield set_endpoint(*pods[2])
    yield sync()
    # the refused ones go: nothing changes
    yield delete(L.ServicesSet, "evil/mapped")
    yield delete(L.ServicesSet, "evil/scoped")
    yield sync()
    # keep goes: same takes its v4 VIP, half its v6 VIP, in the same change set
    yield delete(L.EndpointsSet, "default/keep/keep-0")
    yield delete(L.EndpointsSet, "default/keep/keep-1")
    yield delete(L.ServicesSet, "default/keep")
    yield sync()
    # a reconnect re-sends the same state, keep included again: the owners stay
    yield "UNAVAILABLE: brain restarted"
    yield reset()
    for svc in (keep, same, half, others[2], others[3]):
        yield set_service(svc)
    for pod in pods:
        yield set_endpoint(*pod)
    yield sync()


def node_ports():
    """Issue 15: ExternalIPs, LB IPs and node ports are frontends: a second
    claim on a node port waits, and a type back to ClusterIP ends the node
    port (its ExternalIP stays: kube-proxy serves those on every type)."""
    def with_node_port(number: int, node_port: int) -> L.PortMapping:
        mapping = port("http", number, target=8080)
        mapping.NodePort = node_port
        return mapping

    web = service("web", v4=["10.96.0.10"], ports=[with_node_port(80, 30080)], Type="NodePort")
    web.IPs.ExternalIPs.V4.append("192.0.2.10")
    lb = service("lb", v4=["10.96.0.11"], v6=["fd00:10:96::b"], Type="LoadBalancer",
                 ports=[with_node_port(443, 30443)], ExternalTrafficToLocal=True)
    lb.IPs.LoadBalancerIPs.V4.append("198.51.100.1")
    lb.IPs.LoadBalancerIPs.V6.append("2001:db8::1")
    late = service("late", ns="other", v4=["10.96.0.12"], ports=[with_node_port(80, 30080)],
                   Type="NodePort")
    yield reset()
    yield set_service(web)
    yield set_service(lb)
    yield set_endpoint("default", "web", "web-0", endpoint(["10.244.0.5"],
                                                           overrides=[("http", 8080)]))
    yield set_endpoint("default", "lb", "lb-0", endpoint(["10.244.0.6"], ["fd00:10:244::6"],
                                                         local=True, overrides=[("http", 8080)]))
    yield sync()
    # late asks for web's node port: served on its ClusterIP only
    yield set_service(late)
    yield sync()
    # web back to ClusterIP: its node port goes, late's node port comes
    cluster_ip = L.Service()
    cluster_ip.CopyFrom(web)
    cluster_ip.Type = "ClusterIP"
    yield set_service(cluster_ip)
    yield sync()


def load_balancer():
    """Issue 31: what an operator checks of a LoadBalancer with
    externalTrafficPolicy Local: the endpoints traffic from outside uses
    (this node's only), what it gets without one (dropped while endpoints
    exist elsewhere, refused in a family with none), its health-check node
    port and its source ranges (IPv4 only: its IPv6 LB IP admits no one)."""
    mapping = port("https", 443, target=8443)
    mapping.NodePort = 30443
    lb = service("shop", v4=["10.96.0.60"], v6=["fd00:10:96::3c"], Type="LoadBalancer",
                 ports=[mapping], ExternalTrafficToLocal=True, HealthCheckNodePort=32100,
                 IPFilters=[L.IPFilter(SourceRanges=["203.0.113.0/24", "192.0.2.0/24"])])
    lb.IPs.LoadBalancerIPs.V4.append("198.51.100.60")
    lb.IPs.LoadBalancerIPs.V6.append("2001:db8::60")
    https = [("https", 8443)]
    # The brain's scopes for node-a: the pod elsewhere is not External.
    here = endpoint(["10.244.0.60"], ["fd00:10:244::60"], local=True, overrides=https)
    elsewhere = endpoint(["10.244.1.60"], ["fd00:10:244:1::60"], external=False, overrides=https)
    yield reset()
    yield set_service(lb)
    yield set_endpoint("default", "shop", "shop-0", here)
    yield set_endpoint("default", "shop", "shop-1", elsewhere)
    yield sync()
    # the local pod goes: outside traffic is dropped in both families
    yield delete(L.EndpointsSet, "default/shop/shop-0")
    yield sync()
    # the pod elsewhere loses its IPv6 address: IPv6 from outside is refused
    yield set_endpoint("default", "shop", "shop-1", endpoint(
        ["10.244.1.60"], external=False, overrides=https))
    yield sync()
    # policies switched to eTP Cluster, iTP Local: no health-check server
    # (the port stays in the message), the pod elsewhere serves outside
    # traffic only
    lb.ExternalTrafficToLocal, lb.InternalTrafficToLocal = False, True
    yield set_service(lb)
    yield set_endpoint("default", "shop", "shop-1", endpoint(
        ["10.244.1.60"], internal=False, overrides=https))
    yield sync()


SCENARIOS: dict[str, Scenario] = {
    "initial-state": initial_state,
    "endpoints-churn": endpoints_churn,
    "named-ports": named_ports,
    "tcp-udp-same-port": tcp_udp_same_port,
    "dual-stack": dual_stack,
    "service-deleted": service_deleted,
    "internal-traffic-local": internal_traffic_local,
    "session-affinity": session_affinity,
    "reconnect": reconnect,
    "large-state": large_state,
    "bad-inputs": bad_inputs,
    "hostile-frontends": hostile_frontends,
    "node-ports": node_ports,
    "load-balancer": load_balancer,
}


def render(scenario: Scenario) -> str:
    out = io.StringIO()
    writer = RecordingWriter(out)
    for item in scenario():
        if isinstance(item, str):
            writer.disconnect(item)
        else:
            writer.op(item)
    return out.getvalue()


def main() -> None:
    for name, scenario in SCENARIOS.items():
        (HERE / f"{name}.jsonl").write_text(render(scenario), encoding="utf-8")
        print(f"wrote {name}.jsonl", file=sys.stderr)


if __name__ == "__main__":
    main()
