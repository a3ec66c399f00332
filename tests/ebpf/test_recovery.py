"""The mirror recovered by a forked child (backends/ebpf/recovery.py) is the
one recovered here, strays and unnamed backends included; a child that
fails, or a machine of one CPU, costs nothing but time (no root: fake maps)."""

from __future__ import annotations

import ipaddress
import logging
import marshal
import os
from dataclasses import replace

import pytest

from backends.ebpf import recovery
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import Recovered
from backends.ebpf.recovery import recovered_beside, recovered_here
from tests.ebpf.test_contents import fake_maps


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine is taken to have a CPU to spare (CI's have two)."""
    monkeypatch.setattr(recovery, "spare_cpu", lambda: True)


def comparable(recovered: Recovered) -> Recovered:
    """With its stray keys as bytes (ctypes structures compare as objects)."""
    return replace(recovered, stray_keys=tuple(bytes(key) for key in recovered.stray_keys))


def dump_state_with_an_unnamed_backend():
    services, backends = fake_maps()
    backends.put_many([400], [maps.BackendValue(
        addr=maps.L4Addr.of(ipaddress.ip_address("10.244.0.7"), 8080), service_id=11)])
    return services, backends


def test_a_child_recovers_what_this_process_would(forks: list[int]) -> None:
    pair = dump_state_with_an_unnamed_backend()
    here = recovered_here(*pair)
    assert here.unnamed and here.stray_keys and here.stray_backends  # every part is sent
    assert comparable(recovered_beside(*pair)) == comparable(here)
    assert len(forks) == 1


def test_a_recovery_reads_back_from_its_plain_values_as_it_was() -> None:
    here = recovered_here(*dump_state_with_an_unnamed_backend())
    assert comparable(Recovered.decode(marshal.loads(marshal.dumps(here.encode())))) == (
        comparable(here))


def test_a_child_that_fails_has_the_maps_recovered_here(
        forks: list[int], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    parent, read = os.getpid(), recovery.read_contents

    def read_contents(services, backends):
        if os.getpid() != parent:
            os._exit(3)  # as a child killed or out of memory would end
        return read(services, backends)

    monkeypatch.setattr(recovery, "read_contents", read_contents)
    pair = dump_state_with_an_unnamed_backend()
    with caplog.at_level(logging.INFO, logger=recovery.__name__):
        assert comparable(recovered_beside(*pair)) == comparable(recovered_here(*pair))
    assert len(forks) == 1
    assert "the child failed" in caplog.text


def test_on_one_cpu_the_maps_are_recovered_here(forks: list[int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "spare_cpu", lambda: False)
    pair = dump_state_with_an_unnamed_backend()
    assert comparable(recovered_beside(*pair)) == comparable(recovered_here(*pair))
    assert forks == []


def test_a_recovery_ahead_forks_at_once_and_its_first_recovery_takes_that_child(
        forks: list[int]) -> None:
    pair = dump_state_with_an_unnamed_backend()
    ahead = recovery.RecoveryAhead(*pair)
    assert len(forks) == 1
    here = comparable(recovered_here(*pair))
    assert comparable(ahead(*pair)) == here
    assert len(forks) == 1
    assert comparable(ahead(*pair)) == here  # after a failed write: a new child
    assert len(forks) == 2
    ahead.close()  # nothing left to stop


def test_a_recovery_ahead_that_is_never_asked_leaves_no_child(forks: list[int]) -> None:
    ahead = recovery.RecoveryAhead(*dump_state_with_an_unnamed_backend())
    ahead.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(forks[0], os.WNOHANG)  # reaped


def test_a_recovery_ahead_asked_for_other_maps_recovers_those(forks: list[int]) -> None:
    ahead = recovery.RecoveryAhead(*dump_state_with_an_unnamed_backend())
    other = dump_state_with_an_unnamed_backend()
    other[1].delete_many([400])
    assert comparable(ahead(*other)) == comparable(recovered_here(*other))
    assert len(forks) == 2  # its own child, the first one still unasked
    ahead.close()
