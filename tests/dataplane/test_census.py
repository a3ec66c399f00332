"""DataplaneCensus: the service ports the dataplane holds and those with a
Local traffic policy and no local endpoint, kept from each applied change set."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import ip_address
from typing import Any

from kpng_py.dataplane.census import EXTERNAL, INTERNAL, DataplaneCensus, reachable_from_outside
from kpng_py.model import (
    Endpoint,
    Endpoints,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
)

REMOTE = Endpoint(ip_address("10.244.1.5"), 8080)
LOCAL = Endpoint(ip_address("10.244.0.5"), 8080, local=True)


def service_port(name: str, **fields: Any) -> ServicePort:
    return ServicePort(ServicePortName("default", name, "http", Protocol.TCP), "ClusterIP",
                       (ip_address("10.96.0.10"),), 80, **fields)


def census_of(*changes: ServicePortChanges) -> DataplaneCensus:
    census = DataplaneCensus()
    for change in changes:
        census.applied(change)
    return census


def test_a_port_is_reachable_from_outside_through_any_frontend_but_its_cluster_ips() -> None:
    assert not reachable_from_outside(service_port("web"))
    assert reachable_from_outside(service_port("web", external_ips=(ip_address("192.0.2.1"),)))
    assert reachable_from_outside(service_port("web",
                                               load_balancer_ips=(ip_address("192.0.2.2"),)))
    assert reachable_from_outside(service_port("web", node_port_families=(IPFamily.V4,)))


def test_service_ports_are_counted_from_added_and_removed() -> None:
    web, db = service_port("web"), service_port("db")
    census = census_of(ServicePortChanges(added=(web, db), full=True),
                       ServicePortChanges(removed=(db,)))
    assert census.service_ports == 1


def test_a_full_change_set_starts_the_counts_over() -> None:
    internal_local = service_port("web", internal_traffic_local=True)
    census = census_of(ServicePortChanges(added=(internal_local, service_port("db")), full=True),
                       ServicePortChanges(added=(service_port("api"),), full=True))
    assert (census.service_ports, census.no_local_endpoints(INTERNAL)) == (1, 0)


def test_local_policies_without_a_local_endpoint_are_counted_by_policy() -> None:
    internal = service_port("internal", internal_traffic_local=True, endpoints=(REMOTE,))
    served = service_port("served", internal_traffic_local=True, endpoints=(LOCAL,))
    external = service_port("external", external_traffic_local=True,
                            node_port_families=(IPFamily.V4,), endpoints=(REMOTE,))
    cluster_only = service_port("cluster-only", external_traffic_local=True)
    census = census_of(ServicePortChanges(added=(internal, served, external, cluster_only),
                                          full=True))
    assert (census.no_local_endpoints(INTERNAL), census.no_local_endpoints(EXTERNAL)) == (1, 1)


def test_an_endpoint_counts_as_local_only_in_the_scope_it_serves() -> None:
    external_only = replace(LOCAL, internal=False)
    port = service_port("web", internal_traffic_local=True, external_traffic_local=True,
                        node_port_families=(IPFamily.V4,), endpoints=(external_only,))
    census = census_of(ServicePortChanges(added=(port,), full=True))
    assert (census.no_local_endpoints(INTERNAL), census.no_local_endpoints(EXTERNAL)) == (1, 0)


def test_an_update_or_removal_takes_a_port_off_the_count() -> None:
    without = service_port("web", internal_traffic_local=True, endpoints=(REMOTE,))
    served = replace(without, endpoints=Endpoints.of((LOCAL,)))
    other = service_port("db", internal_traffic_local=True)
    census = census_of(ServicePortChanges(added=(without, other), full=True))
    assert census.no_local_endpoints(INTERNAL) == 2
    census.applied(ServicePortChanges(updated=((without, served),)))
    assert census.no_local_endpoints(INTERNAL) == 1
    census.applied(ServicePortChanges(removed=(other,)))
    assert census.no_local_endpoints(INTERNAL) == 0
