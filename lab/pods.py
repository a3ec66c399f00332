"""The standard set of pods: three server pods running every server of
servers.py and a client pod, checked to reach each other before any proxy
runs (the e2e suite and the cluster's own tests build this one)."""

from __future__ import annotations

import logging
import time

from lab import clients
from lab.cluster import Cluster, Family, Pod
from lab.servers import ContainerPort, start_servers, wait_listening

log = logging.getLogger("e2e")

SERVER_PODS = ("srv-0", "srv-1", "srv-2")
CLIENT_POD = "client"


class PodNetworkError(Exception):
    """The pods do not reach each other directly; the message says which and how."""


def build_cluster(cluster: Cluster) -> tuple[tuple[Pod, ...], Pod]:
    """Namespaces, pods, servers; checks that the client reaches every server
    directly. Returns the server pods and the client pod."""
    began = time.monotonic()
    cluster.build([*SERVER_PODS, CLIENT_POD])
    servers = tuple(cluster.pods[name] for name in SERVER_PODS)
    running = {pod: start_servers(cluster, pod) for pod in servers}
    for pod, pod_servers in running.items():
        wait_listening(pod, pod_servers)
    client = cluster.pods[CLIENT_POD]
    for family in cluster.families:
        _check_pod_network(client, servers, family)
    log.info("cluster %s up in %.1f s (%s)", cluster.names.tag, time.monotonic() - began,
             ", ".join(f.value for f in cluster.families))
    return servers, client


def _check_pod_network(client: Pod, servers: tuple[Pod, ...], family: Family) -> None:
    """Before any proxy: the client reaches every server directly."""
    for pod in servers:
        ip = pod.ip(family)
        seen = [
            clients.http(client, ip, ContainerPort.HTTP.number(pod)),
            clients.http(client, ip, ContainerPort.ALT.number(pod)),
            clients.dns(client, ip),
            clients.dns(client, ip, tcp=True),
        ]
        for sample in seen:
            if set(sample.pods) != {pod.name}:
                raise PodNetworkError(f"the client cannot reach pod {pod.name} at {ip} "
                                      f"directly: {sample.describe()}")
        echo = clients.probe(client, "udp-echo", str(ip), str(ContainerPort.ECHO_UDP.number(pod)))
        if not (echo["ok"] and echo["equal"]):
            raise PodNetworkError(f"no UDP echo from pod {pod.name} at {ip}: {echo}")
