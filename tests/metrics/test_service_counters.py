"""ServiceCountersCollector: what the backend counts, read at each scrape,
by service port and protocol (and by endpoint when asked); a service port
that is gone is no longer exported."""

from __future__ import annotations

import argparse

from prometheus_client import CollectorRegistry, generate_latest

from kpng_py.metrics.service_counters import (
    ServiceCountersCollector,
    ServiceCounts,
    add_endpoint_counters_flag,
)
from kpng_py.model import Protocol, ServicePortName

WEB = ServicePortName("default", "web", "http", Protocol.TCP)
DNS = ServicePortName("kube-system", "dns", "dns", Protocol.UDP)


def scrape(collector: ServiceCountersCollector) -> list[str]:
    registry = CollectorRegistry()
    registry.register(collector)
    return [line for line in generate_latest(registry).decode().splitlines()
            if not line.startswith("#")]


def test_counts_are_read_at_each_scrape_and_a_gone_port_is_not_exported() -> None:
    counts = {WEB: ServiceCounts(translated=3, rejected=1)}
    collector = ServiceCountersCollector(lambda: counts)
    assert scrape(collector) == [
        'kpng_py_service_connections_total{protocol="TCP",service_port="default/web:http"} 3.0',
        'kpng_py_service_rejections_total{protocol="TCP",service_port="default/web:http"} 1.0',
    ]
    counts = {DNS: ServiceCounts(translated=2)}
    assert scrape(collector) == [
        'kpng_py_service_connections_total{protocol="UDP",service_port="kube-system/dns:dns"} 2.0',
        'kpng_py_service_rejections_total{protocol="UDP",service_port="kube-system/dns:dns"} 0.0',
    ]


def test_endpoint_counts_only_when_asked() -> None:
    without = ServiceCountersCollector(dict)
    with_endpoints = ServiceCountersCollector(dict, lambda: {(WEB, "10.244.0.5:8080"): 4})
    assert [family.name for family in without.describe()] == [
        "kpng_py_service_connections", "kpng_py_service_rejections"]
    assert scrape(with_endpoints) == [
        'kpng_py_service_endpoint_connections_total{endpoint="10.244.0.5:8080",'
        'protocol="TCP",service_port="default/web:http"} 4.0']


def test_counts_of_frontends_add_up() -> None:
    total = ServiceCounts(translated=2, rejected=1) + ServiceCounts(translated=5)
    assert total == ServiceCounts(translated=7, rejected=1)


def test_the_endpoint_counters_flag_is_off_by_default() -> None:
    parser = argparse.ArgumentParser()
    add_endpoint_counters_flag(parser)
    assert not parser.parse_args([]).endpoint_counters
    assert parser.parse_args(["--endpoint-counters"]).endpoint_counters
