"""Writes the demo's brain state as a kpng-py recording (stdout): what a KPNG
brain would send for three services of the demo's "pods".

    web      10.96.0.10, fd00:96::10  TCP 80  -> pod-1, pod-2 :8080 (nginx)
    dns      10.96.0.53               UDP 53  -> pod-1, pod-2 :5353 (dnsmasq)
    nothing  10.96.0.99               TCP 80  -> no endpoints: refused
"""

from __future__ import annotations

import sys

from kpng_py.api import localv1
from kpng_py.recording import RecordingWriter

PODS = {"pod-1": ("10.244.0.2", "fd00:244::2"), "pod-2": ("10.244.0.3", "fd00:244::3")}


def service(name: str, v4: str, v6: list[str], protocol: int, port: int,
            target: int) -> localv1.Service:
    return localv1.Service(
        Namespace="demo", Name=name, Type="ClusterIP",
        IPs=localv1.ServiceIPs(ClusterIPs=localv1.IPSet(V4=[v4], V6=v6)),
        Ports=[localv1.PortMapping(Protocol=protocol, Port=port, TargetPort=target)])


def set_op(ref_set: int, path: str, message) -> localv1.OpItem:
    return localv1.OpItem(Set=localv1.Value(Ref=localv1.Ref(Set=ref_set, Path=path),
                                            Bytes=message.SerializeToString()))


def main() -> None:
    writer = RecordingWriter(sys.stdout)
    writer.op(localv1.OpItem(Reset=localv1.EmptyOp()))
    services = [service("web", "10.96.0.10", ["fd00:96::10"], localv1.TCP, 80, 8080),
                service("dns", "10.96.0.53", [], localv1.UDP, 53, 5353),
                service("nothing", "10.96.0.99", [], localv1.TCP, 80, 8080)]
    for svc in services:
        writer.op(set_op(localv1.ServicesSet, f"demo/{svc.Name}", svc))
    for svc in services[:2]:
        for pod, (v4, v6) in PODS.items():
            endpoint = localv1.Endpoint(Hostname=pod, IPs=localv1.IPSet(V4=[v4], V6=[v6]),
                                        Local=True)
            writer.op(set_op(localv1.EndpointsSet, f"demo/{svc.Name}/{pod}", endpoint))
    writer.op(localv1.OpItem(Sync=localv1.EmptyOp()))
    writer.flush()


if __name__ == "__main__":
    main()
