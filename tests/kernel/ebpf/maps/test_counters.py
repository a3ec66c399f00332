"""Per-service-port counters, counted by the programs in the kernel for a
real client in the lab's cgroup: each TCP connect and each UDP socket (once
per endpoint, not per datagram) translated, each refusal of a service without
endpoints; exported as Prometheus counters, shown by `ebpf dump`, deleted
with their frontends, and kept across a restart of the backend."""

from __future__ import annotations

import errno

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import open_pinned_map
from backends.ebpf.maps import counters
from backends.ebpf.maps import layout as maps
from backends.ebpf.tools.dump import read_dump
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.state.skips import Skips
from lab.socket_lab import Agent, Lab
from tests.support.ebpf import datapath_config
from tests.support.ebpf_datapath import added, follower_in, removed, service_port

pytestmark = pytest.mark.kernel

TCP = service_port("counted", ["10.96.9.1", "fd00:96::9:1"], 80, endpoints=[1, 2],
                   port_name="http")
UDP = service_port("counted", ["10.96.9.1", "fd00:96::9:1"], 53, endpoints=[1, 2, 3],
                   protocol="UDP", target_port=5353, port_name="dns")
EMPTY = service_port("refusing", ["10.96.9.2"], 80)


def exported(metrics: Metrics, metric: str, service_port: str, protocol: str) -> float | None:
    return metrics.registry.get_sample_value(
        f"kpng_py_service_{metric}_total", {"service_port": service_port, "protocol": protocol})


def test_connections_sockets_and_refusals_are_counted_per_service_port(
        backend: EbpfBackend, agent: Agent, metrics: Metrics, the_lab: Lab) -> None:
    backend.apply(added(TCP, UDP, EMPTY))
    for host, family, times in (("10.96.9.1", 4, 7), ("fd00:96::9:1", 6, 3)):
        for _ in range(times):
            assert agent.call("tcp", host=host, port=80, family=family)["ok"]
    for datagrams in (5, 2):  # two sockets: two, however many datagrams each sends
        sock = agent.call("udp_open", family=4)["sock"]
        for _ in range(datagrams):
            assert agent.call("udp_sendto", sock=sock, host="10.96.9.1", port=53)["ok"]
        agent.call("udp_close", sock=sock)
    for _ in range(4):
        assert agent.call("tcp", host="10.96.9.2", port=80,
                          family=4)["errno"] == errno.ECONNREFUSED

    # Both ClusterIPs of the TCP port add up to its 10 connections.
    assert exported(metrics, "connections", "default/counted:http", "TCP") == 10
    assert exported(metrics, "rejections", "default/counted:http", "TCP") == 0
    assert exported(metrics, "connections", "default/counted:dns", "UDP") == 2
    assert exported(metrics, "connections", "default/refusing", "TCP") == 0
    assert exported(metrics, "rejections", "default/refusing", "TCP") == 4
    # Per endpoint only with --endpoint-counters: neither counted nor exported.
    endpoint_counters = open_pinned_map(the_lab.bpffs_dir, maps.ENDPOINT_COUNTERS)
    assert counters.read_endpoint_counts(endpoint_counters) == {}
    endpoint_counters.close()
    assert not any(metric.name == "kpng_py_service_endpoint_connections"
                   for metric in metrics.registry.collect())
    by_vip = {(svc["vip"], svc["port"], svc["protocol"]): svc
              for svc in read_dump(the_lab.bpffs_dir)["services"]}
    assert by_vip["10.96.9.1", 80, "TCP"]["connections"] == 7
    assert by_vip["fd00:96::9:1", 80, "TCP"]["connections"] == 3
    assert by_vip["10.96.9.2", 80, "TCP"]["rejections"] == 4

    # Counted under their service ids in the pinned map, which a restarted
    # backend adopts with the frontends' ids: the counts go on. An entry no
    # frontend has (a program counted while its frontend went) is deleted by
    # the next full change set.
    stray = 999_999
    counter_map = open_pinned_map(the_lab.bpffs_dir, maps.COUNTERS)
    counter_map.put_many([stray], [counter_map.value_type()])
    restarted_metrics = Metrics()
    restarted = EbpfBackend(datapath_config(the_lab), restarted_metrics,
                            Skips(restarted_metrics), follower=follower_in(the_lab))
    backend.close()
    try:
        restarted.setup()
        restarted.apply(ServicePortChanges(added=(TCP, UDP, EMPTY), full=True))
        assert exported(restarted_metrics, "connections", "default/counted:http", "TCP") == 10
        assert stray not in counters.read_counts(counter_map)
        assert agent.call("tcp", host="10.96.9.1", port=80, family=4)["ok"]
        assert exported(restarted_metrics, "connections", "default/counted:http", "TCP") == 11

        # A removed service port's counters go with its frontends.
        before = set(counters.read_counts(counter_map))
        restarted.apply(removed(TCP, EMPTY))
        after = set(counters.read_counts(counter_map))
        # Gone: the two TCP ClusterIPs' and EMPTY's; left: the UDP ClusterIP used.
        assert len(before - after) == 3 and len(after) == 1
        assert exported(restarted_metrics, "connections", "default/counted:http", "TCP") is None
        assert exported(restarted_metrics, "connections", "default/counted:dns", "UDP") == 2
    finally:
        counter_map.close()
        restarted.close()

