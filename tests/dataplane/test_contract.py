"""What the applier reads of any backend through the contract: its apply
stages and what it does not hold, also from a backend without the methods."""

from __future__ import annotations

from typing import Mapping

from kpng_py.dataplane.contract import Backend, backend_not_programmed, backend_stages
from tests.support.dataplane import OldBackend


class Reporting(OldBackend):
    """A backend with both methods, returning what it was given."""

    def __init__(self, stages: Mapping[str, object], missing: Mapping[str, int]) -> None:
        self._stages, self._missing = stages, missing

    def apply_stages(self) -> Mapping[str, object]:
        return self._stages

    def not_programmed(self) -> Mapping[str, int]:
        return self._missing


def as_backend(backend: object) -> Backend:
    return backend  # type: ignore[return-value]


def test_stages_are_rounded_and_only_numbers_kept() -> None:
    backend = Reporting({"plan_ms": 1.23456, "write_ms": 2, "note": "slow"}, {})
    assert backend_stages(as_backend(backend)) == {"plan_ms": 1.23, "write_ms": 2}


def test_what_is_not_programmed_is_a_copy_by_reason() -> None:
    missing = {"capacity": 2}
    counts = backend_not_programmed(as_backend(Reporting({}, missing)))
    missing["capacity"] = 3
    assert counts == {"capacity": 2}


def test_a_backend_without_the_methods_reports_nothing() -> None:
    backend = as_backend(OldBackend())
    assert (backend_stages(backend), backend_not_programmed(backend)) == ({}, {})
