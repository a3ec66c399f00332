"""Prometheus metrics of one kpng-py process.

Names follow kube-proxy's where the meaning is the same, so existing dashboards
work; the rest are prefixed ``kpng_py_``. Each process owns its registry (no
module-level state), which the HTTP endpoint serves.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

_SYNC_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        # kube-proxy's counters and histograms have no `_created` series, and
        # dashboards do not expect them; prometheus_client has only this
        # process-wide switch for it.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes...
        PlatformCollector(registry=r)  # python_info
        def sync_histogram(name: str, documentation: str) -> Histogram:
            return Histogram(name, documentation, buckets=_SYNC_BUCKETS, registry=r)

        self.sync_duration = sync_histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "Time to apply one change set to the dataplane.")
        self.sync_full_duration = sync_histogram(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "Time to apply a change set that reconciles the whole dataplane (the first "
            "one, and those after a failed apply).")
        self.sync_partial_duration = sync_histogram(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "Time to apply a change set that changes only what it names.")
        self.sync_last_queued_timestamp = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "Unix time the last change set began to arrive (its changes queued for the "
            "dataplane); later than the last applied timestamp while one is pending.",
            registry=r,
        )
        self.no_local_endpoints = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Service ports with a Local traffic policy and no local endpoint (external: "
            "only those reachable from outside the node), by policy.",
            ["traffic_policy"], registry=r,
        )
        self.sync_last_timestamp = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "Unix time of the last applied change set.",
            registry=r,
        )
        self.endpoint_changes = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Endpoint objects changed (set or deleted) by the brain.",
            registry=r,
        )
        self.service_changes = Counter(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Service objects changed (set or deleted) by the brain.",
            registry=r,
        )
        self.brain_connected = Gauge(
            "kpng_py_brain_connected", "1 while the backend gets the brain's state: the "
            "watch stream to the brain is up, or the brain runs in this process (file ... "
            "to-local).", registry=r
        )
        self.api_server_connected = Gauge(
            "kpng_py_api_server_connected", "1 while `kpng-py kube` follows the Kubernetes API "
            "server: Services, EndpointSlices and Nodes listed and watched; 0 while a list or "
            "watch fails (the last state stays served).", registry=r
        )
        self.brain_reconnects = Counter(
            "kpng_py_brain_reconnects", "Watch streams re-opened after an error.", registry=r
        )
        self.changeset_ops = Histogram(
            "kpng_py_changeset_ops",
            "Ops (Set/Delete) per change set received from the brain.",
            buckets=(0, 1, 2, 5, 10, 100, 1000, 10000, 100000, 1000000),
            registry=r,
        )
        self.changeset_service_ports = Histogram(
            "kpng_py_changeset_service_ports",
            "Service ports added, updated or removed per applied change set.",
            buckets=(0, 1, 2, 5, 10, 100, 1000, 10000, 100000),
            registry=r,
        )
        self.skipped = Counter(
            "kpng_py_skipped", "Objects or ops skipped, by reason.", ["reason"], registry=r
        )
        self.dataplane_errors = Counter(
            "kpng_py_dataplane_errors", "Failures applying to the dataplane, by kind.", ["kind"],
            registry=r,
        )
        self.apply_retries = Counter(
            "kpng_py_apply_retries",
            "Whole-dataplane reconciles retried on a timer after a failed apply.", registry=r,
        )
        self.http_connections_dropped = Counter(
            "kpng_py_http_connections_dropped",
            "Connections to /healthz or /metrics closed unanswered: timeout (request not "
            "received or response not taken in time) or evicted (the oldest one, for a new "
            "one past the connection cap).",
            ["server", "reason"], registry=r,
        )
        self.map_entries = Gauge(
            "kpng_py_map_entries", "Entries in a dataplane map or table.", ["map"], registry=r
        )
        self.map_writes = Counter(
            "kpng_py_map_writes",
            "Entries written (created, updated or deleted) in a dataplane map or table.",
            ["map"], registry=r,
        )
        self.map_capacity = Gauge(
            "kpng_py_map_capacity", "Capacity of a dataplane map or table.", ["map"], registry=r
        )
        self.healthz_requests = Counter(
            "kubeproxy_proxy_healthz", "Answers of /healthz, by HTTP status code.", ["code"],
            registry=r,
        )
        self.livez_requests = Counter(
            "kubeproxy_proxy_livez", "Answers of /livez, by HTTP status code.", ["code"],
            registry=r,
        )
        self.service_ports = Gauge(
            "kpng_py_service_ports", "Service ports programmed in the dataplane (its last "
            "applied change set's state, without those it could not hold).", registry=r
        )
        self.service_ports_not_programmed = Gauge(
            "kpng_py_service_ports_not_programmed",
            "Service ports the brain sent that the dataplane does not hold now, by reason "
            "(capacity: a map or table is full; frontend-conflict: another service port owns "
            "its frontends; limit: its service is over a --max-* limit; cannot-listen: the "
            "userspace proxy cannot listen on one of its addresses).", ["reason"], registry=r,
        )
        self.datapath_missing = Gauge(
            "kpng_py_datapath_missing",
            "1 while a part of the datapath this process installed is gone (taken away by "
            "another process: a cleanup, a hand-made change), by object; 0 once it is back.",
            ["object"], registry=r,
        )
        self.datapath_restored = Counter(
            "kpng_py_datapath_restored",
            "Parts of the datapath found gone and put back, by object.", ["object"], registry=r,
        )
