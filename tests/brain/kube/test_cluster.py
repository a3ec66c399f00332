"""The kube brain's ClusterBuilder: what it maps again when an object changes."""

from __future__ import annotations

import pytest

from kpng_py.brain import apiobjects
from kpng_py.brain.kube import cluster
from kpng_py.brain.kube.cluster import ClusterBuilder
from kpng_py.metrics.metrics import Metrics
from kpng_py.state.skips import Skips
from tests.support.kube_objects import api_service, api_slice


def _versioned(obj: dict, version: str) -> dict:
    obj["metadata"]["resourceVersion"] = version
    return obj


def test_a_changed_slice_is_mapped_again_alone_and_the_other_entries_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mapped: list[str] = []

    def counting(obj: dict) -> tuple[apiobjects.Listing, ...]:
        mapped.append(obj["metadata"]["name"])
        return apiobjects.slice_endpoints(obj)

    monkeypatch.setattr(cluster, "slice_endpoints", counting)
    builder = ClusterBuilder(Skips(Metrics()))
    services = {f"default/s{i}": _versioned(api_service(f"s{i}", f"10.96.0.{i}"), "1")
                for i in range(3)}
    slices = {f"default/s{i}-{half}": _versioned(
        api_slice(f"s{i}-{half}", f"s{i}", [f"10.244.{i}.{half}"]), "1")
        for i in range(3) for half in (1, 2)}
    first = builder.build(services, slices, {})
    assert len(mapped) == 6
    slices["default/s1-2"] = _versioned(api_slice("s1-2", "s1", ["10.244.9.9"]), "2")
    second = builder.build(services, slices, {})
    assert mapped[6:] == ["s1-2"]
    assert second.services[0] is first.services[0] and second.services[2] is first.services[2]
    assert [e.key for e in second.services[1].endpoints] == ["s1-1-0", "s1-2-0"]
    assert second.services[1] != first.services[1]
    assert builder.build(services, slices, {}) == second and mapped[7:] == []
