"""One resource listed and watched into a store (kpng_py/brain/kube/reflector.py),
against the fake API server on loopback: pages, events, bookmarks, 410 Gone
and outages, as the reflector's listener hears of them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pytest

from kpng_py.brain.kube.access import ApiServerAccess
from kpng_py.brain.kube.client import ApiServerClient
from kpng_py.brain.kube.reflector import NODES, SERVICES, Reflector, Resource, Timing
from tests.support.fake_apiserver import FakeApiServer
from tests.support.kube_objects import api_node, api_service
from tests.support.process import wait_until

FAST = Timing(page=2, watch_seconds=(1, 1), error_delay=0.05, max_error_delay=0.2)


@dataclass
class Heard:
    """What the reflector told its listener."""

    changes: int = 0
    reaches: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)

    def changed(self) -> None:
        self.changes += 1

    def reached(self, resource: Resource) -> None:
        self.reaches.append(resource.name)

    def lost(self, resource: Resource, problem: str) -> None:
        self.losses.append(problem)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    for index in range(5):
        server.put("services", api_service(f"s{index}", f"10.96.0.{index + 1}"))
    server.put("nodes", api_node("node-a", zone="z1"))
    yield server
    server.stop()


Start = Callable[[Resource], tuple[Reflector, Heard]]


@pytest.fixture
def start(fake: FakeApiServer) -> Iterator[Start]:
    """start(resource) runs a reflector of it until the test ends."""
    stop = threading.Event()
    running: list[tuple[threading.Thread, ApiServerClient]] = []

    def run(resource: Resource) -> tuple[Reflector, Heard]:
        client = ApiServerClient(ApiServerAccess(fake.url))
        heard = Heard()
        reflector = Reflector(client, resource, heard, stop, FAST, random_unit=lambda: 0.5)
        thread = threading.Thread(target=reflector.run, daemon=True)
        thread.start()
        running.append((thread, client))
        assert reflector.synced.wait(10)
        return reflector, heard

    yield run
    stop.set()
    for thread, client in running:
        thread.join(10)
        client.close()


def _names(reflector: Reflector) -> list[str]:
    return sorted(reflector.snapshot()[0])


def test_a_list_of_several_pages_fills_the_store_at_the_lists_version(
        fake: FakeApiServer, start: Start) -> None:
    reflector, heard = start(SERVICES)
    assert _names(reflector) == [f"default/s{index}" for index in range(5)]
    assert reflector.snapshot()[1] == str(fake.version)
    assert fake.requests[:3] == ["list services"] * 3  # pages of 2
    assert heard.reaches == ["services"] and heard.changes >= 1


def test_the_store_keeps_only_what_the_brain_maps(start: Start) -> None:
    reflector, _ = start(NODES)
    (node,) = reflector.snapshot()[0].values()
    assert list(node) == ["metadata"]  # not its status
    assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "z1"
    services, _ = start(SERVICES)
    assert "managedFields" not in services.snapshot()[0]["default/s0"]["metadata"]


def test_events_change_the_store_and_a_bookmark_only_its_version(
        fake: FakeApiServer, start: Start) -> None:
    reflector, heard = start(SERVICES)
    fake.put("services", api_service("new", "10.96.1.1"))
    fake.delete("services", "default", "s0")
    wait_until(lambda: "default/s0" not in reflector.snapshot()[0], "the deletion applied")
    assert "default/new" in reflector.snapshot()[0]
    changes = heard.changes
    fake.bookmark("services")
    wait_until(lambda: reflector.snapshot()[1] == str(fake.version), "the bookmark's version")
    assert heard.changes == changes


def test_a_version_too_old_relists_at_once_and_is_no_loss(
        fake: FakeApiServer, start: Start) -> None:
    reflector, heard = start(SERVICES)
    fake.forget()
    fake.wait_for_request("list services", count=6)  # 3 pages, listed again
    wait_until(lambda: reflector.snapshot()[1] == str(fake.version), "the new list's version")
    assert heard.losses == [] and heard.reaches == ["services", "services"]


def test_an_outage_is_lost_and_the_return_relists_what_changed_meanwhile(
        fake: FakeApiServer, start: Start) -> None:
    reflector, heard = start(SERVICES)
    fake.down()
    # The watch cut, then lists refused until the server is back.
    wait_until(lambda: any("503 unavailable" in loss for loss in heard.losses),
               "the refused list reported")
    fake.delete("services", "default", "s1")  # heard of by the list after the outage
    fake.up()
    wait_until(lambda: "default/s1" not in reflector.snapshot()[0], "the relist")
    assert heard.reaches[-1] == "services"
