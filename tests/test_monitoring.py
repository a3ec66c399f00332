"""deploy/monitoring/: every series the Grafana dashboard queries is one
kpng-py exports, and the PodMonitor scrapes the port the DaemonSet serves
them on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from kpng_py.metrics import Metrics
from tests.test_deploy import daemonset_containers, manifests

MONITORING = Path(__file__).resolve().parent.parent / "deploy" / "monitoring"
_SERIES = re.compile(r"\b(?:kubeproxy|kpng_py|process)_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
             "gauge": ("",), "info": ("_info",)}


def exported_series() -> set[str]:
    """The sample names kpng-py's registry can export (labelled families
    included before they have a child)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "kpng-py-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [variable["query"]["query"] for variable in dashboard["templating"]["list"]
              if isinstance(variable.get("query"), dict)]
    return exprs


def test_every_series_the_dashboard_queries_is_exported() -> None:
    queried = {name for expr in dashboard_exprs() for name in _SERIES.findall(expr)}
    exported = exported_series()
    assert len(queried) >= 15
    assert queried - exported == set()


def test_the_dashboard_shows_the_kube_proxy_sync_metrics() -> None:
    queried = " ".join(dashboard_exprs())
    for name in ("kubeproxy_sync_full_proxy_rules_duration_seconds_bucket",
                 "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket",
                 "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                 "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                 "kpng_py_service_ports", "process_resident_memory_bytes"):
        assert name in queried


def test_the_pod_monitor_scrapes_the_daemonsets_metrics_port() -> None:
    (monitor,) = [d for d in yaml.safe_load_all((MONITORING / "podmonitor.yaml").read_text())
                  if d]
    (daemonset,) = [m for m in manifests() if m["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["metadata"]
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [
        daemonset["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in daemonset_containers()["kpng-py"]["ports"]}
    assert ports[endpoint["port"]] == int(pod["annotations"]["prometheus.io/port"])
    assert endpoint["path"] == pod["annotations"]["prometheus.io/path"]
