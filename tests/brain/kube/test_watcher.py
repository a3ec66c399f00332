"""`kpng-py kube` against a fake API server on loopback: the first state,
changes coalesced, relists on 410 Gone, bookmarks, outages, bad input."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from kpng_py.api import localv1
from kpng_py.brain.convert import convert, dump
from kpng_py.brain.statefile import parse_state
from kpng_py.brain.view import node_view
from kpng_py.runtime.logs import record_fields
from tests.support.fake_apiserver import FakeApiServer
from tests.support.kube_objects import api_node, api_service, api_slice
from tests.support.kube_watcher import Following, kubectl_list
from tests.support.process import wait_until


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("nodes", api_node("node-a", zone="z1"))
    server.put("services", api_service("web", "10.96.0.10"))
    server.put("endpointslices", api_slice("web-abc", "web", ["10.244.0.5", "10.244.1.7"]))
    server.put("services", api_service("db", "10.96.0.11", port=5432, target=5432))
    yield server
    server.stop()


@pytest.fixture
def following(fake: FakeApiServer) -> Iterator[Following]:
    brain = Following(fake)
    yield brain
    brain.watcher.stop()


def test_the_state_is_the_file_brains_for_the_same_objects_converted(
        fake: FakeApiServer, following: Following) -> None:
    converted = parse_state(dump(convert(kubectl_list(fake))).encode(), "converted.yaml")
    for node in ("node-a", "node-b"):
        assert following.view(node) == node_view(converted, node)
    assert following.endpoints("default/web") == ["10.244.0.5", "10.244.1.7"]
    # Listed in pages of two: three lists of services (and the rest).
    assert fake.requests.count("list services") == 1
    assert following.connected() == 1


def test_a_burst_of_changes_is_published_as_one_version(fake: FakeApiServer,
                                                        following: Following) -> None:
    for index in range(20):
        fake.put("endpointslices", api_slice("web-abc", "web", [f"10.244.2.{index}"]))
    wait_until(lambda: following.endpoints("default/web") == ["10.244.2.19"], "the last edit")
    assert following.snapshots.version == 2


@pytest.mark.parametrize("as_event", [True, False], ids=["error-event", "http-410"])
def test_a_relist_after_410_gone_that_changed_nothing_makes_no_new_version(
        fake: FakeApiServer, as_event: bool) -> None:
    fake.expired_as_event = as_event
    brain = Following(fake)
    try:
        fake.forget()  # the next watch from any version seen is too old
        for resource in ("services", "endpointslices", "nodes"):
            fake.wait_for_request(f"list {resource}", count=2)
        fake.put("services", api_service("cache", "10.96.0.12"))  # still followed
        wait_until(lambda: (localv1.ServicesSet, "default/cache") in brain.view(), "cache")
        assert brain.snapshots.version == 2
        assert brain.connected() == 1
    finally:
        brain.watcher.stop()


def test_a_bookmark_is_where_the_next_watch_starts(fake: FakeApiServer,
                                                   following: Following) -> None:
    fake.wait_for_request("watch nodes@")
    fake.bookmark("nodes")
    fake.wait_for_request(f"watch nodes@{fake.version}")  # after the server ended the watch
    assert fake.requests.count("list nodes") == 1


def test_an_outage_keeps_the_last_state_and_a_return_with_nothing_changed_no_new_version(
        fake: FakeApiServer, following: Following) -> None:
    before = following.view()
    assert following.health.status()[0]
    fake.down()
    wait_until(lambda: following.connected() == 0, "the API server lost")
    wait_until(lambda: not following.health.status()[0], "/healthz 503 after its timeout")
    assert following.health.status()[1]["apiServerConnected"] is False
    assert following.view() == before and following.snapshots.version == 1
    lists = fake.requests.count("list services")
    fake.up()
    wait_until(lambda: following.connected() == 1, "the API server back")
    assert fake.requests.count("list services") > lists  # the return relists
    assert following.health.status()[0]
    assert "apiServerConnected" not in following.health.status()[1]
    assert following.snapshots.version == 1


def test_what_changed_during_an_outage_is_published_on_return(
        fake: FakeApiServer, following: Following) -> None:
    fake.down()
    wait_until(lambda: following.connected() == 0, "the API server lost")
    fake.delete("services", "default", "db")
    fake.put("endpointslices", api_slice("web-abc", "web", ["10.244.3.1"]))
    fake.up()
    wait_until(lambda: following.endpoints("default/web") == ["10.244.3.1"], "the new slice")
    assert (localv1.ServicesSet, "default/db") not in following.view()
    assert following.snapshots.version == 2


def test_what_cannot_be_programmed_is_skipped_once_counted_and_the_rest_served(
        fake: FakeApiServer, following: Following, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kpng_py.state.skips")
    fake.put("endpointslices", api_slice("web-v6", "web", ["fd00::5"]))  # IPv4 slice
    fake.put("endpointslices", api_slice("web-port", "web", ["10.244.0.9"], port=70000))
    fake.put("endpointslices", api_slice("ghost-abc", "ghost", ["10.244.0.8"]))
    fake.put("services", api_service("quic", "10.96.0.13", protocol="QUIC"))
    fake.put("endpointslices", api_slice("web-def", "web", ["10.244.0.6"]))
    wait_until(lambda: "10.244.0.6" in following.endpoints("default/web"), "the good slice")
    # Another change to web: the bad slices are not reported again.
    fake.put("endpointslices", api_slice("web-def", "web", ["10.244.0.7"]))
    wait_until(lambda: "10.244.0.7" in following.endpoints("default/web"), "its edit")
    assert following.endpoints("default/web") == ["10.244.0.5", "10.244.0.7", "10.244.1.7"]
    assert (localv1.ServicesSet, "default/quic") not in following.view()
    assert (following.skipped("bad-endpointslice"), following.skipped("unknown-service"),
            following.skipped("bad-service")) == (2, 1, 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "kpng_py.state.skips"]
    assert sorted(lines) == [
        "skipped EndpointSlice default/ghost-abc: its service default/ghost does not exist",
        "skipped EndpointSlice default/web-port: EndpointSlice default/web-port port 'http': "
        "port 70000; set port to a number in 1..65535",
        "skipped EndpointSlice default/web-v6: EndpointSlice default/web-v6: fd00::5 is not an "
        "IPv4 address, the slice's addressType",
        "skipped Service default/quic: Service default/quic port 80: protocol 'QUIC' is not "
        "one of TCP, UDP, SCTP"]
    # Fixed, the slice is served.
    fake.put("endpointslices", api_slice("web-v6", "web", ["10.244.0.4"]))
    wait_until(lambda: "10.244.0.4" in following.endpoints("default/web"), "the fixed slice")


def test_a_node_heartbeat_makes_no_new_version(fake: FakeApiServer,
                                               following: Following) -> None:
    node = api_node("node-a", zone="z1")
    node["status"]["conditions"] = [{"type": "Ready", "lastHeartbeatTime": "now"}]
    fake.put("nodes", node)
    fake.put("services", api_service("cache", "10.96.0.12"))
    wait_until(lambda: (localv1.ServicesSet, "default/cache") in following.view(), "cache")
    fake.put("nodes", node)
    fake.bookmark("services")
    fake.wait_for_request(f"watch services@{fake.version}")
    assert following.snapshots.version == 2


def _labelled(obj: dict, label: str) -> dict:
    obj["metadata"].setdefault("labels", {})[label] = "another-proxy"
    return obj


def test_what_kube_proxy_does_not_program_is_left_out(fake: FakeApiServer,
                                                      following: Following) -> None:
    """As kube-proxy 1.35: objects labelled for another proxy or headless are
    not looked at (no count for a slice whose Service is not there), headless
    and ExternalName Services are skipped with a count, an ingress IP of a
    proxying load balancer (ipMode Proxy) is not programmed."""
    proxy_name, headless = "service.kubernetes.io/service-proxy-name", \
        "service.kubernetes.io/headless"
    fake.put("services", _labelled(api_service("mesh", "10.96.0.20"), proxy_name))
    fake.put("endpointslices", _labelled(api_slice("mesh-abc", "mesh", ["10.244.0.20"]),
                                         proxy_name))
    fake.put("endpointslices", _labelled(api_slice("gone-abc", "gone", ["10.244.0.21"]),
                                         headless))
    fake.put("services", api_service("none", "None", clusterIPs=["None"]))
    fake.put("services", api_service("docs", "", type="ExternalName", clusterIPs=[],
                                     externalName="docs.example.com"))
    lb = api_service("lb", "10.96.0.30", type="LoadBalancer")
    lb["status"]["loadBalancer"] = {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP"},
                                                {"ip": "192.0.2.11", "ipMode": "Proxy"},
                                                {"ip": "192.0.2.12"}]}
    fake.put("services", lb)
    wait_until(lambda: (localv1.ServicesSet, "default/lb") in following.view(), "lb")
    assert sorted(path for kind, path in following.view() if kind == localv1.ServicesSet) == [
        "default/db", "default/lb", "default/web"]
    service = localv1.Service.FromString(following.view()[(localv1.ServicesSet, "default/lb")])
    assert list(service.IPs.LoadBalancerIPs.V4) == ["192.0.2.10", "192.0.2.12"]
    assert (following.skipped("headless"), following.skipped("external-name"),
            following.skipped("unknown-service")) == (1, 1, 0)
    # Labelled later, a Service is left out with its endpoints.
    fake.put("services", _labelled(api_service("web", "10.96.0.10"), proxy_name))
    wait_until(lambda: not following.endpoints("default/web"), "web left out")
    assert (localv1.ServicesSet, "default/web") not in following.view()


def _records(caplog: pytest.LogCaptureFixture, message: str) -> list[dict]:
    return [record_fields(r) for r in caplog.records if r.getMessage() == message]


def test_each_state_names_the_resource_version_of_each_kind_it_was_made_from(
        fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """What a client that wrote objects waits for: a state made from every
    write it made (an unchanged state too, at debug level)."""
    caplog.set_level(logging.DEBUG, logger="kpng_py.brain.kube.watcher")
    listed = fake.version
    brain = Following(fake)
    try:
        fake.put("services", api_service("cache", "10.96.0.12"))
        cache_at = fake.version
        wait_until(lambda: len(_records(caplog, "state from the API server published")) == 2,
                   "the state with cache")
        first, second = _records(caplog, "state from the API server published")
        assert first == {**first, "version": 1, "services_resource_version": str(listed),
                         "endpointslices_resource_version": str(listed),
                         "nodes_resource_version": str(listed)}
        assert second == {**second, "version": 2, "services_resource_version": str(cache_at),
                          "endpointslices_resource_version": str(listed)}
        fake.put("nodes", api_node("node-a", zone="z1"))  # the same: no new version
        node_at = fake.version
        wait_until(lambda: bool(_records(caplog, "state from the API server unchanged")),
                   "a rebuild")
        (unchanged,) = _records(caplog, "state from the API server unchanged")
        assert unchanged == {"version": 2, "services_resource_version": str(cache_at),
                             "endpointslices_resource_version": str(listed),
                             "nodes_resource_version": str(node_at)}
    finally:
        brain.watcher.stop()
