"""Skips: one log line and one `kpng_py_skipped_total{reason}` increment per
skipped object; info for what a healthy cluster has, warnings for bad input."""

from __future__ import annotations

import logging

import pytest

from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.logs import record_fields
from kpng_py.state.skips import SkipReason, Skips


def skipped(metrics: Metrics, reason: SkipReason) -> float | None:
    return metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": reason.value})


@pytest.mark.parametrize("reason, level", [
    (SkipReason.HEADLESS, logging.INFO),
    (SkipReason.EXTERNAL_NAME, logging.INFO),
    (SkipReason.BAD_PORT, logging.WARNING),
    (SkipReason.LIMIT, logging.WARNING),
])
def test_one_line_and_one_count_per_skip(caplog: pytest.LogCaptureFixture,
                                         reason: SkipReason, level: int) -> None:
    metrics = Metrics()
    with caplog.at_level(logging.INFO, logger="kpng_py.state.skips"):
        Skips(metrics).skip(reason, "default/web", "why, and what to do")
    (record,) = caplog.records
    assert record.levelno == level
    assert record.getMessage() == "skipped default/web: why, and what to do"
    assert record_fields(record) == {"reason": reason.value, "object": "default/web"}
    assert skipped(metrics, reason) == 1


def test_a_bad_source_range_is_a_bad_ip_naming_the_entry_and_the_fix(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    with caplog.at_level(logging.INFO, logger="kpng_py.state.skips"):
        Skips(metrics).bad_source_range("default/web:http", "10.0.0.0/33")
    (record,) = caplog.records
    assert "'10.0.0.0/33' is no CIDR" in record.getMessage()
    assert "spec.loadBalancerSourceRanges" in record.getMessage()
    assert skipped(metrics, SkipReason.BAD_IP) == 1
