"""Helpers of the userspace backend's tests: what a started listener gives
back, and the proxy's metrics read by name."""

from __future__ import annotations

from backends.userspace.context import Tally
from backends.userspace.listener import Listener
from kpng_py.metrics.metrics import Metrics

Started = tuple[Listener, Tally, int]


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """A sample of the proxy's metrics (0 if absent)."""
    return metrics.registry.get_sample_value(name, labels) or 0
