"""Service ports and their netfilter objects, for the tests of the netfilter
table's plan, transactions and conntrack cleaning (no kernel)."""

from __future__ import annotations

import ipaddress
import json

from backends.ebpf.netfilter.plan import PortObjects, port_objects
from backends.ebpf.netfilter.txn import Transaction
from kpng_py.model import Endpoint, Endpoints, IPFamily, Protocol, ServicePort, ServicePortName

ip = ipaddress.ip_address

# The service chain of `web()` in IPv4.
SVC = "svc4-ns/web/http/tcp"


def web(*endpoints: Endpoint, **fields) -> ServicePort:
    return ServicePort(ServicePortName("ns", "web", "http", Protocol.TCP), "LoadBalancer",
                       (ip("10.96.0.1"),), 80, node_port=30080,
                       node_port_families=(IPFamily.V4,), endpoints=Endpoints.of(endpoints),
                       **fields)


def ep(last: int, local: bool = True, external: bool = True) -> Endpoint:
    return Endpoint(ip(f"10.244.0.{last}"), 8080, local=local, external=external)


def objects(port: ServicePort, bad: list[str] | None = None) -> PortObjects:
    return port_objects(port, (bad if bad is not None else []).append)


def change(old: ServicePort | None, new: ServicePort | None) -> list[dict]:
    txn = Transaction()
    txn.change(objects(old) if old else PortObjects(), objects(new) if new else PortObjects())
    return [json.loads(command) for command in txn.commands()]
