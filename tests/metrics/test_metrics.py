"""Metrics: each process's own registry, with kube-proxy's names and no
`_created` series."""

from __future__ import annotations

from prometheus_client import generate_latest

from kpng_py.metrics.metrics import Metrics


def test_each_metrics_has_its_own_registry() -> None:
    one, other = Metrics(), Metrics()
    one.skipped.labels("bad-port").inc()
    one.sync_duration.observe(0.003)
    assert one.registry.get_sample_value("kpng_py_skipped_total", {"reason": "bad-port"}) == 1
    assert other.registry.get_sample_value("kpng_py_skipped_total", {"reason": "bad-port"}) is None
    assert other.registry.get_sample_value(
        "kubeproxy_sync_proxy_rules_duration_seconds_count") == 0


def test_no_series_has_a_created_timestamp() -> None:
    metrics = Metrics()
    metrics.brain_reconnects.inc()
    metrics.sync_full_duration.observe(0.5)
    exposition = generate_latest(metrics.registry).decode()
    assert "kpng_py_brain_reconnects_total 1.0" in exposition
    assert "_created" not in exposition


def test_the_process_and_the_python_are_exported() -> None:
    samples = {sample.name for family in Metrics().registry.collect()
               for sample in family.samples}
    assert {"process_resident_memory_bytes", "python_info"} <= samples


def test_a_sync_over_half_a_minute_is_in_no_bucket_but_inf() -> None:
    metrics = Metrics()
    metrics.sync_duration.observe(31)
    sample = metrics.registry.get_sample_value
    name = "kubeproxy_sync_proxy_rules_duration_seconds_bucket"
    assert (sample(name, {"le": "30.0"}), sample(name, {"le": "+Inf"})) == (0, 1)
    assert sample(name, {"le": "0.001"}) == 0

