"""`kpng-py kube` on what the lab's real API server sent (recorded by
tests/support/record_kube_api.py into tests/brain/data/kube/): its lists,
then its watch events while a pod turned unready, one terminated and went,
and a Service was deleted. Served through the fake API server, the brain's
views are those of the file brain on the same objects converted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from kpng_py.api import localv1
from kpng_py.brain.convert import convert, dump
from kpng_py.brain.kube.cluster import ClusterBuilder
from kpng_py.brain.statefile import ClusterState, parse_state
from kpng_py.brain.view import node_view
from kpng_py.metrics.metrics import Metrics
from kpng_py.state.skips import Skips
from tests.support.fake_apiserver import PATHS, FakeApiServer
from tests.support.kube_watcher import Following, kubectl_list
from tests.support.process import wait_until

DATA = Path(__file__).resolve().parent.parent / "data" / "kube"
NODES = ("node-a", "node-b")


def recorded_list(resource: str) -> dict:
    return json.loads((DATA / f"list-{resource}.json").read_text())


def recorded_events(resource: str) -> list[dict]:
    return [json.loads(line) for line in
            (DATA / f"watch-{resource}.jsonl").read_text().splitlines()]


def _converted(fake: FakeApiServer) -> ClusterState:
    return parse_state(dump(convert(kubectl_list(fake))).encode(), "converted.yaml")


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    for resource in PATHS:
        for obj in recorded_list(resource)["items"]:
            server.put(resource, obj)
    yield server
    server.stop()


def test_the_recording_is_what_a_real_server_sends() -> None:
    """What the brain relies on: lists with a resourceVersion, items with
    managedFields (which the brain drops), bookmarks in the watches; and no
    garbage collector runs in the lab: the deleted Service's slice stays."""
    services = recorded_list("services")
    assert services["kind"] == "ServiceList" and services["metadata"]["resourceVersion"]
    assert all(item["metadata"].get("managedFields") for item in services["items"])
    kinds = {event["type"] for resource in PATHS for event in recorded_events(resource)}
    assert kinds == {"MODIFIED", "DELETED", "BOOKMARK"}


def test_the_mapped_state_is_the_state_of_the_file_convert_writes() -> None:
    """One mapping: the values the kube brain serves are the very values the
    file brain reads from what `file convert` writes of the same objects."""
    stores = {resource: {f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}": obj
                         for obj in recorded_list(resource)["items"]} for resource in PATHS}
    state = ClusterBuilder(Skips(Metrics())).build(
        stores["services"], stores["endpointslices"], stores["nodes"])
    items = [{"kind": kind, **obj} for resource, kind in (
        ("services", "Service"), ("endpointslices", "EndpointSlice"), ("nodes", "Node"))
        for obj in recorded_list(resource)["items"]]
    converted = convert(yaml.safe_dump({"kind": "List", "items": items}))
    assert converted.state == state
    assert parse_state(dump(converted).encode(), "converted.yaml") == state
    assert sum(len(s.endpoints) for s in state.services) == 8


def test_the_recorded_lists_are_served_as_the_file_brain_serves_them_converted(
        fake: FakeApiServer) -> None:
    brain = Following(fake)
    try:
        converted = _converted(fake)
        for node in NODES:
            assert brain.view(node) == node_view(converted, node)
        web = {path: localv1.Endpoint.FromString(value)
               for (kind, path), value in brain.view("node-a").items()
               if kind == localv1.EndpointsSet and path.startswith("default/web/")}
        assert {path: (sorted(e.IPs.V4), sorted(e.IPs.V6),
                       sorted((o.Name, o.Port) for o in e.PortOverrides))
                for path, e in web.items()} == {
            "default/web/web-0": (["10.244.0.5"], ["fd00:10:244::5"],
                                  [("dns", 5353), ("http", 8080)]),
            "default/web/web-1": (["10.244.1.7"], ["fd00:10:244:1::7"],
                                  [("dns", 5353), ("http", 8080)])}
        # Left out as kube-proxy leaves them out: the headless db, the
        # ExternalName docs, mesh (labelled for another proxy, as its slices
        # are by the EndpointSlice controller) and lb's ingress IP of ipMode
        # Proxy.
        assert sorted(path for kind, path in brain.view() if kind == localv1.ServicesSet) == [
            "default/gone", "default/kubernetes", "default/lb", "default/web",
            "default/web-local"]
        lb = localv1.Service.FromString(brain.view()[(localv1.ServicesSet, "default/lb")])
        assert list(lb.IPs.LoadBalancerIPs.V4) == ["192.0.2.10"]
        assert (brain.skipped("headless"), brain.skipped("external-name"),
                brain.skipped("unknown-service")) == (1, 1, 0)
    finally:
        brain.watcher.stop()


def test_the_recorded_watch_events_are_followed(fake: FakeApiServer) -> None:
    brain = Following(fake)
    try:
        for resource in PATHS:
            for event in recorded_events(resource):
                obj = event["object"]
                if event["type"] == "DELETED":
                    fake.delete(resource, obj["metadata"].get("namespace", ""),
                                obj["metadata"]["name"])
                elif event["type"] == "BOOKMARK":
                    fake.bookmark(resource)
                else:
                    fake.put(resource, obj)
        converted = _converted(fake)
        wait_until(lambda: all(brain.view(node) == node_view(converted, node)
                               for node in NODES), "the views after the events")
        paths = {path for _, path in brain.view("node-a")}
        assert "default/gone" not in paths  # the deleted Service
        assert brain.skipped("unknown-service") == 1  # its slice, left
        assert not any(path.startswith("default/web/web-0") for path in paths)  # gone
        assert not any(path.startswith("default/web/web-1") for path in paths)  # unready
    finally:
        brain.watcher.stop()
