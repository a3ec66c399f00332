"""Property: whatever the brain sends, the BPF maps hold exactly what `to-print`
shows for the same stream, and no map entry outlives its service.

The machine of tests/support/map_machine.py on real maps (a dedicated bpffs
directory; no program is attached);
tests/ebpf/programmer/test_service_programmer.py runs it on the dict fakes.
Profiles: "ci" (about 15 s alone) and "long" (HYPOTHESIS_PROFILE=long).
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest
from hypothesis.stateful import run_state_machine_as_test

from backends.ebpf.datapath.loader import Datapath
from backends.ebpf.maps import layout as maps
from backends.ebpf.programmer.service_programmer import Capacity
from tests.support.ebpf_datapath import loaded
from tests.support.map_machine import PROFILES, MapMachine, MapPair

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def datapath() -> Iterator[Datapath]:
    with loaded(services=4096, backends=4096, reverse_nat=64, affinity=64) as created:
        yield created


def test_maps_hold_what_to_print_shows(datapath: Datapath) -> None:
    services, endpoints = datapath.maps[maps.SERVICES.pin], datapath.maps[maps.ENDPOINTS.pin]
    pair = MapPair(services, endpoints, Capacity(services.info().max_entries,
                                                 endpoints.info().max_entries))

    class OnTheseMaps(MapMachine):
        def __init__(self) -> None:
            super().__init__(pair)

    run_state_machine_as_test(OnTheseMaps,
                              settings=PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")])
