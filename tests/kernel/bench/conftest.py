"""Fixtures of the eBPF backend's stage timing tests: new_sink, an applier's sink to a backend."""

from __future__ import annotations

from tests.support.sync_stages import new_sink

__all__ = ["new_sink"]  # a fixture, used by name
