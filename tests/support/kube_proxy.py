"""The ports of the tests of kube-proxy's rulesets (lab/kube_proxy), as
kube-proxy's own tests name them, and the cluster's pod range."""

from __future__ import annotations

import ipaddress

from kpng_py.model import Endpoint, Endpoints, Protocol, ServicePort, ServicePortName

CLUSTER_CIDR = "10.244.0.0/16"


def cluster_ip_port(name: str, vip: str, *endpoints: str, port_name: str = "p80") -> ServicePort:
    """ns1/<name>:<port_name>, TCP port 80 at ClusterIP `vip`, to endpoints "ip:port"."""
    eps = Endpoints.of(Endpoint(ipaddress.ip_address(e.rsplit(":", 1)[0].strip("[]")),
                                int(e.rsplit(":", 1)[1]))
                       for e in endpoints)
    return ServicePort(name=ServicePortName("ns1", name, port_name, Protocol.TCP),
                       type="ClusterIP", cluster_ips=(ipaddress.ip_address(vip),), port=80,
                       target_port=80, endpoints=eps)


SVC1 = cluster_ip_port("svc1", "172.30.0.41", "10.180.0.1:80", "10.180.0.2:80", "10.180.0.3:80")
V6 = cluster_ip_port("svc6", "fd00:10:96::41", "[fd00:10:244::1]:80", "[fd00:10:244::2]:80")
