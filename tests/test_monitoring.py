"""deploy/monitoring/: every series the Grafana dashboard and the alert rules
query is one kpng-py exports, their PromQL parses (promql-parser, the Rust
parser's bindings: syntax, function names and argument types), the
PrometheusRule has the shape the Prometheus Operator takes, and the
PodMonitor scrapes the port the DaemonSet serves them on."""

from __future__ import annotations

import json
import re

import promql_parser
import pytest
import yaml

from kpng_py.metrics.metrics import Metrics
from kpng_py.metrics.service_counters import ServiceCountersCollector
from kpng_py.state.skips import SkipReason
from tests.support.deploy import ROOT, daemonset_containers, manifests

MONITORING = ROOT / "deploy" / "monitoring"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
             "gauge": ("",), "info": ("_info",)}
# A dashboard variable's query: label_values(SELECTOR, LABEL) is Grafana's, not PromQL.
_LABEL_VALUES = re.compile(r"label_values\((?P<selector>.+), *[a-z_]+\)")
_TEMPLATED_LABEL = re.compile(r"\$labels\.([a-z_]+)")
_RULE_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
_SEVERITIES = {"critical", "warning", "info"}
_RELEASE = "kube-prometheus-stack"


def exported_series() -> set[str]:
    """The sample names kpng-py can export: its registry's (labelled
    families included before they have a child) and the per-service-port
    counters every backend registers."""
    families = [*Metrics().registry.collect(),
                *ServiceCountersCollector(dict, dict).describe()]
    return {family.name + suffix for family in families
            for suffix in _SUFFIXES.get(family.type, ("",))}


def selectors(expr: str) -> list[promql_parser.VectorSelector]:
    """What `expr` selects (raises ValueError if it does not parse)."""
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def series(expr: str) -> set[str | None]:
    """The metric names `expr` selects (None for a selector without one)."""
    return {selector.name for selector in selectors(expr)}


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "kpng-py-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            query = _LABEL_VALUES.fullmatch(variable["query"]["query"])
            assert query, variable
            exprs.append(query["selector"])
    return exprs


def monitoring_doc(name: str) -> dict:
    (doc,) = [d for d in yaml.safe_load_all((MONITORING / name).read_text()) if d]
    return doc


def alerts() -> list[dict]:
    return [rule for group in monitoring_doc("prometheusrule.yaml")["spec"]["groups"]
            for rule in group["rules"]]


def output_labels(node: promql_parser.Expr) -> set[str] | None:
    """The labels `node`'s result carries, None for a scalar. Every alert
    aggregates `by` its labels, so that its annotations can name them."""
    if isinstance(node, promql_parser.AggregateExpr):
        assert node.modifier is not None and node.modifier.type == promql_parser.AggModifierType.By
        return set(node.modifier.labels)
    if isinstance(node, promql_parser.BinaryExpr):  # a filter or arithmetic keeps its vector's
        labels = output_labels(node.lhs)
        return labels if labels is not None else output_labels(node.rhs)
    if isinstance(node, promql_parser.ParenExpr):
        return output_labels(node.expr)
    assert isinstance(node, (promql_parser.NumberLiteral, promql_parser.Call)), \
        f"aggregate {node} by the labels the alert names"
    return None


def test_every_series_the_dashboard_queries_is_exported() -> None:
    queried = set().union(*map(series, dashboard_exprs()))
    assert len(queried) >= 20
    assert queried - exported_series() == set()


def test_the_dashboard_shows_the_kube_proxy_sync_metrics_and_what_is_not_programmed() -> None:
    queried = set().union(*map(series, dashboard_exprs()))
    assert {"kubeproxy_sync_full_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "kpng_py_service_ports", "kpng_py_service_ports_not_programmed",
            "kpng_py_service_connections_total", "kpng_py_datapath_missing",
            "process_resident_memory_bytes"} <= queried


def test_what_is_not_programmed_is_shown_as_the_gauge_not_a_counters_increase() -> None:
    """A skip counter's increase over 5 minutes leaves the panel 5 minutes
    after the skip, while the port stays unprogrammed; the gauge does not."""
    for expr in dashboard_exprs():
        if "kpng_py_skipped_total" in series(expr):
            assert 'reason="capacity"' not in expr and "reason=~" not in expr
    (gauge,) = [e for e in dashboard_exprs()
                if "kpng_py_service_ports_not_programmed" in series(e)]
    assert "increase(" not in gauge and "rate(" not in gauge


def test_every_series_the_alerts_use_is_exported() -> None:
    used = set().union(*(series(rule["expr"]) for rule in alerts()))
    assert used - exported_series() == set()
    assert {"kpng_py_service_ports_not_programmed", "kpng_py_dataplane_errors_total",
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "kpng_py_brain_connected", "kpng_py_datapath_missing",
            "kpng_py_map_entries", "kpng_py_map_capacity"} <= used


def test_the_rules_are_a_prometheus_rule_the_operator_takes() -> None:
    rule = monitoring_doc("prometheusrule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["metadata"]["namespace"] == "kube-system"
    assert set(rule["spec"]) == {"groups"}
    names = [group["name"] for group in rule["spec"]["groups"]]
    assert len(names) == len(set(names))
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"]
    alert_names = [a["alert"] for a in alerts()]
    assert len(alert_names) == len(set(alert_names))
    for alert in alerts():
        assert set(alert) <= _RULE_KEYS and re.fullmatch(r"KpngPy[A-Za-z]+", alert["alert"])
        assert promql_parser.parse_duration(alert["for"]).total_seconds() > 0, alert["alert"]
        assert alert["labels"]["severity"] in _SEVERITIES
        assert all(isinstance(v, str) for v in (*alert["labels"].values(),
                                                *alert["annotations"].values()))


def test_each_alert_says_what_happened_and_what_to_do_about_it() -> None:
    for alert in alerts():
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, alert["alert"]
        assert all(len(text) > 40 for text in annotations.values()), alert["alert"]
        named = set(_TEMPLATED_LABEL.findall(" ".join(annotations.values())))
        labels = output_labels(promql_parser.parse(alert["expr"]))
        assert labels is not None and "instance" in named and named <= labels, alert["alert"]


def test_staleness_is_a_change_set_waiting_not_a_quiet_cluster() -> None:
    """A quiet cluster sends no change set for hours: an alert on the last
    applied timestamp alone would fire there."""
    applied = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
    queued = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
    using = [a for a in alerts() if applied in series(a["expr"])]
    assert using and all(queued in series(a["expr"]) for a in using)


def test_the_not_programmed_alert_covers_every_reason() -> None:
    (alert,) = [a for a in alerts() if "kpng_py_service_ports_not_programmed" in series(a["expr"])]
    (selector,) = selectors(alert["expr"])
    assert str(selector.matchers) == "{}"  # no reason left out
    for reason in (SkipReason.CAPACITY, SkipReason.FRONTEND_CONFLICT):
        assert reason.value in alert["annotations"]["description"]


def test_a_kube_prometheus_stack_install_selects_the_monitor_and_the_rules() -> None:
    """Its Prometheus selects PodMonitors and PrometheusRules by
    `release: <helm release>`; docs/deploy.md says how to change it."""
    for name in ("podmonitor.yaml", "prometheusrule.yaml"):
        assert monitoring_doc(name)["metadata"]["labels"]["release"] == _RELEASE
    deploy_doc = (ROOT / "docs" / "deploy.md").read_text()
    for text in (f"release: {_RELEASE}", "podMonitorSelectorNilUsesHelmValues=false",
                 "ruleSelectorNilUsesHelmValues=false", "prometheusrule.yaml"):
        assert text in deploy_doc


@pytest.mark.parametrize("manifest", ["kpng-py.yaml", "kpng-py-kube.yaml"])
def test_the_pod_monitor_scrapes_the_daemonsets_metrics_port(manifest: str) -> None:
    """Of either layout."""
    monitor = monitoring_doc("podmonitor.yaml")
    (daemonset,) = [m for m in manifests(manifest) if m["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["metadata"]
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [
        daemonset["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"]
             for p in daemonset_containers(manifest)["kpng-py"]["ports"]}
    assert ports[endpoint["port"]] == int(pod["annotations"]["prometheus.io/port"])
    assert endpoint["path"] == pod["annotations"]["prometheus.io/path"]


def test_a_broken_expression_or_an_unknown_series_is_caught() -> None:
    """The checks above can fail: the parser refuses what Prometheus refuses."""
    for broken in ("sum(rate(kpng_py_skipped_total[5m])", "rate(kpng_py_skipped_total)",
                   "increse(kpng_py_skipped_total[5m])"):
        try:
            series(broken)
        except ValueError:
            continue
        raise AssertionError(f"{broken!r} parsed")
    assert series("kpng_py_service_port_not_programmed") - exported_series()
