"""Kubernetes objects as the API server sends them, for the tests of
`kpng-py kube` (the few members the brain reads, and some it must ignore)."""

from __future__ import annotations

from typing import Any


def api_service(name: str, cluster_ip: str, port: int = 80, target: int | str = 8080,
                namespace: str = "default", protocol: str = "TCP", **spec: Any) -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                     "ports": [{"name": "http", "port": port, "targetPort": target,
                                "protocol": protocol}], **spec},
            "status": {"loadBalancer": {}}}


def api_slice(name: str, service: str, addresses: list[str], address_type: str = "IPv4",
              port: int = 8080, namespace: str = "default", ready: bool = True,
              node: str = "node-a") -> dict:
    return {"metadata": {"name": name, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": address_type,
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": ready},
                           "nodeName": node,
                           "targetRef": {"kind": "Pod", "name": f"{name}-{index}"}}
                          for index, address in enumerate(addresses)]}


def api_node(name: str, zone: str = "") -> dict:
    labels = {"kubernetes.io/hostname": name}
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    return {"metadata": {"name": name, "labels": labels},
            "status": {"images": [{"names": ["big"], "sizeBytes": 1}]}}
