"""healthCheckNodePort servers (kpng_py/healthcheck/service_health.py) on loopback:
what they answer, when they open, move and close (N11)."""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
from dataclasses import replace
from typing import Coroutine, Iterator

import pytest

from kpng_py.healthcheck.proxier_health import SyncHealth
from kpng_py.healthcheck.service_health import (
    HealthCheckNodePorts,
    HealthCheckService,
    ServiceName,
    health_check_services,
)
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import (
    Endpoint,
    Endpoints,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
)
from kpng_py.node.nodeport_addresses import LocalAddressSet, NodePortAddresses

LOOPBACK = ipaddress.ip_address("127.0.0.1")
LOCAL = LocalAddressSet(frozenset({LOOPBACK}))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _endpoint(ip: str, port: int = 8080, local: bool = True, external: bool = True) -> Endpoint:
    return Endpoint(ipaddress.ip_address(ip), port, local=local, external=external)


def _port(hc_port: int, *endpoints: Endpoint, name: str = "web", port_name: str = "http",
          type: str = "LoadBalancer", external_traffic_local: bool = True) -> ServicePort:
    return ServicePort(name=ServicePortName("ns", name, port_name, Protocol.TCP), type=type,
                       cluster_ips=(ipaddress.ip_address("10.96.0.1"),), port=80,
                       health_check_node_port=hc_port,
                       external_traffic_local=external_traffic_local,
                       endpoints=Endpoints.of(endpoints))


def _get(port: int, path: str = "/some/path") -> tuple[int, dict[str, str], dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


class _Healthy:
    def __init__(self) -> None:
        self.healthy = True

    def status(self) -> tuple[bool, dict]:
        return self.healthy, {}


@pytest.fixture
def servers() -> Iterator[tuple[HealthCheckNodePorts, _Healthy, Metrics]]:
    metrics = Metrics()
    health = _Healthy()
    checks = HealthCheckNodePorts(metrics, NodePortAddresses())
    checks.start(LOCAL, health)
    yield checks, health, metrics
    checks.close()


def test_services_are_counted_once_per_service_and_local_external_address():
    ports = [
        _port(30100, _endpoint("10.0.0.1"), _endpoint("10.0.0.2", local=False),
              _endpoint("10.0.0.3", external=False)),
        # The same pod behind the service's second port counts once.
        _port(30100, _endpoint("10.0.0.1", 9090), port_name="metrics"),
        _port(30200, _endpoint("10.0.0.9"), name="cluster", external_traffic_local=False),
        _port(30300, _endpoint("10.0.0.9"), name="nodeport", type="NodePort"),
        _port(0, _endpoint("10.0.0.9"), name="none"),
    ]
    assert health_check_services(ports) == {
        ServiceName("ns", "web"): HealthCheckService(30100, 1)}


def test_a_dual_stack_pod_is_one_local_endpoint():
    """Its two addresses count once (the family with most), as kube-proxy's
    count of one family's endpoints."""
    ports = [_port(30100, _endpoint("10.0.0.1"), _endpoint("fd00::1"), _endpoint("10.0.0.2"))]
    assert health_check_services(ports) == {
        ServiceName("ns", "web"): HealthCheckService(30100, 2)}


def test_any_path_answers_with_kube_proxys_body_and_headers(servers):
    checks, health, _ = servers
    port = _free_port()
    checks.apply(ServicePortChanges(added=(_port(port, _endpoint("10.0.0.1"),
                                                 _endpoint("10.0.0.2")),), full=True))
    for path in ("/", "/healthz", "/any/thing?x=1"):
        status, headers, body = _get(port, path)
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert body == {"service": {"namespace": "ns", "name": "web"}, "localEndpoints": 2,
                        "serviceProxyHealthy": True}
    health.healthy = False
    status, _, body = _get(port)
    assert status == 503 and body["serviceProxyHealthy"] is False and body["localEndpoints"] == 2


def test_no_local_endpoint_is_503_and_a_removed_service_closes(servers):
    checks, _, _ = servers
    port = _free_port()
    with_one = _port(port, _endpoint("10.0.0.1"))
    without = _port(port, _endpoint("10.0.0.1", local=False))
    checks.apply(ServicePortChanges(added=(with_one,), full=True))
    assert _get(port)[0] == 200
    checks.apply(ServicePortChanges(updated=((with_one, without),)))
    status, _, body = _get(port)
    assert status == 503 and body["localEndpoints"] == 0
    checks.apply(ServicePortChanges(removed=(without,)))
    assert _refused(port)
    assert checks.serving == {}


def test_losing_the_health_check_port_or_moving_it(servers):
    checks, _, _ = servers
    first, second = _free_port(), _free_port()
    served = _port(first, _endpoint("10.0.0.1"))
    moved = replace(served, health_check_node_port=second)
    checks.apply(ServicePortChanges(added=(served,), full=True))
    checks.apply(ServicePortChanges(updated=((served, moved),)))
    assert _refused(first) and _get(second)[0] == 200
    # eTP back to Cluster: no health check any more.
    cluster = replace(moved, external_traffic_local=False)
    checks.apply(ServicePortChanges(updated=((moved, cluster),)))
    assert _refused(second)
    # A full change set without it closes it too.
    checks.apply(ServicePortChanges(updated=((cluster, served),)))
    checks.apply(ServicePortChanges(added=(), full=True))
    assert _refused(first)


def test_servers_follow_the_allowed_node_addresses(servers):
    checks, _, _ = servers
    port = _free_port()
    checks.apply(ServicePortChanges(added=(_port(port, _endpoint("10.0.0.1")),), full=True))
    checks.addresses_changed(LocalAddressSet(frozenset()))
    assert _refused(port)
    checks.addresses_changed(LOCAL)
    assert _get(port)[0] == 200


@pytest.fixture
def holder() -> Iterator[socket.socket]:
    """A port another process listens on (until the test closes it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def _bind_errors(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "kpng_py_dataplane_errors_total", {"kind": "healthcheck-bind"})


def _cluster_only(ip: str) -> ServicePort:
    """A service port of another service, without a health check."""
    return _port(0, _endpoint(ip), name="other", type="ClusterIP", external_traffic_local=False)


def test_a_port_held_by_another_process_is_counted_once_and_served_when_free(servers, holder):
    checks, _, metrics = servers
    port = holder.getsockname()[1]
    service = _port(port, _endpoint("10.0.0.1"))
    checks.apply(ServicePortChanges(added=(service,), full=True))
    checks.apply(ServicePortChanges(updated=((service, service),)))
    assert _bind_errors(metrics) == 1
    holder.close()
    checks.apply(ServicePortChanges(updated=((service, service),)))
    assert _get(port)[0] == 200


def test_ports_without_a_health_check_do_not_call_the_servers_thread(servers, monkeypatch):
    checks, _, _ = servers
    served = _port(_free_port(), _endpoint("10.0.0.1"))
    cluster_only = _cluster_only("10.0.0.2")
    checks.apply(ServicePortChanges(added=(served, cluster_only), full=True))
    calls: list[object] = []

    def call(coroutine: Coroutine[None, None, None]) -> None:
        calls.append(coroutine)
        coroutine.close()

    monkeypatch.setattr(checks, "_call", call)
    moved = replace(cluster_only, endpoints=Endpoints.of([_endpoint("10.0.0.3")]))
    checks.apply(ServicePortChanges(updated=((cluster_only, moved),)))
    checks.apply(ServicePortChanges(removed=(moved,)))
    assert calls == []
    checks.apply(ServicePortChanges(updated=((served, replace(served, endpoints=Endpoints())),)))
    assert len(calls) == 1


def test_a_failed_bind_is_retried_by_a_change_set_of_other_ports(servers, holder):
    checks, _, metrics = servers
    port = holder.getsockname()[1]
    other = _cluster_only("10.0.0.2")
    checks.apply(ServicePortChanges(added=(_port(port, _endpoint("10.0.0.1")), other),
                                    full=True))
    assert _bind_errors(metrics) == 1
    holder.close()
    checks.apply(ServicePortChanges(updated=((other, other),)))
    assert _get(port)[0] == 200


def test_the_answer_carries_what_healthz_says():
    metrics = Metrics()
    checks = HealthCheckNodePorts(metrics, NodePortAddresses())
    health = SyncHealth(timeout=60)
    checks.start(LOCAL, health)
    try:
        port = _free_port()
        checks.apply(ServicePortChanges(added=(_port(port, _endpoint("10.0.0.1")),),
                                        full=True))
        # Nothing applied yet: /healthz says unhealthy, and so does the answer.
        assert _get(port)[0] == 503
        health.changeset_applied()
        assert _get(port)[0] == 200
    finally:
        checks.close()


def test_without_anyone_saying_what_healthz_says_the_proxy_is_not_healthy():
    checks = HealthCheckNodePorts(Metrics(), NodePortAddresses())
    checks.start(LOCAL, None)
    try:
        port = _free_port()
        checks.apply(ServicePortChanges(added=(_port(port, _endpoint("10.0.0.1")),),
                                        full=True))
        status, _, body = _get(port)
        assert status == 503 and body["serviceProxyHealthy"] is False
    finally:
        checks.close()
