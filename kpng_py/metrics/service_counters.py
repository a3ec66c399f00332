"""Per-service-port connection counters, as every backend exports them:
`kpng_py_service_connections_total` and `kpng_py_service_rejections_total`,
labelled `service_port` (kube-proxy's `ns/name:port`) and `protocol`; and,
from a backend that counts per endpoint when asked (its cardinality is the
node's endpoints), `kpng_py_service_endpoint_connections_total` with an
`endpoint` ("ip:port") label too.

A backend gives the collector a function that reads its counts at each
scrape (the eBPF backend from its pinned per-CPU map, the userspace one from
its listeners); a service port that is gone is no longer exported.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kpng_py.model import ServicePortName


@dataclass(frozen=True)
class ServiceCounts:
    """What clients did with a service port (or one of its frontends)."""

    # Sockets sent to an endpoint: TCP connections, UDP sockets (once per
    # endpoint, however many datagrams they send).
    translated: int = 0
    # Connects and sends refused: the service port had no endpoint for them.
    rejected: int = 0

    def __add__(self, other: ServiceCounts) -> ServiceCounts:
        return ServiceCounts(self.translated + other.translated, self.rejected + other.rejected)


class ServiceCountersCollector(Collector):
    """`kpng_py_service_connections_total` and
    `kpng_py_service_rejections_total`, by service port and protocol,
    read from the backend at each scrape."""

    def __init__(self, read: Callable[[], Mapping[ServicePortName, ServiceCounts]],
                 read_endpoints: Callable[[], Mapping[tuple[ServicePortName, str], int]]
                 | None = None) -> None:
        self._read = read
        self._read_endpoints = read_endpoints

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield from self._families()
        if self._read_endpoints is not None:
            yield self._endpoint_family()

    def collect(self) -> Iterator[CounterMetricFamily]:
        connections, rejections = self._families()
        for name, counts in sorted(self._read().items(), key=lambda item: item[0].sort_key()):
            labels = [str(name), name.protocol.value]
            connections.add_metric(labels, counts.translated)
            rejections.add_metric(labels, counts.rejected)
        yield connections
        yield rejections
        if self._read_endpoints is not None:
            endpoints = self._endpoint_family()
            for (name, endpoint), count in sorted(self._read_endpoints().items(),
                                                  key=lambda item: (item[0][0].sort_key(),
                                                                    item[0][1])):
                endpoints.add_metric([str(name), name.protocol.value, endpoint], count)
            yield endpoints

    @staticmethod
    def _endpoint_family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "kpng_py_service_endpoint_connections",
            "Connections (TCP) and sockets (UDP, once per endpoint) a service port's "
            "frontends sent to this endpoint.",
            labels=["service_port", "protocol", "endpoint"])

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, CounterMetricFamily]:
        labels = ["service_port", "protocol"]
        return (CounterMetricFamily(
                    "kpng_py_service_connections",
                    "Connections (TCP) and sockets (UDP, once per backend) a service port's "
                    "frontends sent to one of its endpoints.", labels=labels),
                CounterMetricFamily(
                    "kpng_py_service_rejections",
                    "Connects and sends to a service port refused because it had no endpoint.",
                    labels=labels))


def add_endpoint_counters_flag(parser: argparse.ArgumentParser) -> None:
    """`--endpoint-counters`, as every backend that can count per endpoint takes it."""
    parser.add_argument("--endpoint-counters", action="store_true",
                        help="count connections per endpoint too "
                             "(kpng_py_service_endpoint_connections_total; one series per "
                             "endpoint of the node; default: per service port only)")
