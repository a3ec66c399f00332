"""The lab's facts about the registry's backends (lab/backends.py): one entry
for each backend with a dataplane, in flags that backend really has, keeping
its dataplane inside a run's places."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from kpng_py.dataplane import registry
from lab import backends
from lab.backends import LabBackend, LabBackendError, LabPlaces, lab_backends

PLACES = LabPlaces(node_netns="kpe2e-1-node", cgroup=Path("/sys/fs/cgroup/unified/kpe2e-1"),
                   bpffs_dir=Path("/sys/fs/bpf/kpe2e-1"), service_interface="kpe1svc")


def test_every_backend_with_a_dataplane_has_lab_facts() -> None:
    """`to-print` alone has no dataplane for a lab run to test."""
    names = [spec.name for spec in registry.registered()]
    assert list(lab_backends()) == [name for name in names if name != "print"]
    assert {backend.sink for backend in lab_backends().values()} == {"to-ebpf", "to-userspace"}


@pytest.mark.parametrize("backend", lab_backends().values(), ids=lambda backend: backend.name)
def test_the_lab_flags_are_flags_the_backend_has(backend: LabBackend) -> None:
    parser = argparse.ArgumentParser(prog=backend.sink, exit_on_error=False)
    registry.by_sink()[backend.sink].add_arguments(parser)
    lab = backend.support
    flags = [*lab.flags(PLACES), *lab.capacity_flags(1000, 10_000)]
    assert all(isinstance(flag, str) for flag in flags)
    parser.parse_args(flags)
    assert lab.inspect(PLACES) and all(isinstance(arg, str) for arg in lab.inspect(PLACES))
    cleanup = lab.cleanup(PLACES)
    assert cleanup is None or (cleanup and all(isinstance(arg, str) for arg in cleanup))
    assert lab.sockets_per_service_port >= 0


def test_the_lab_runs_each_dataplane_inside_its_places() -> None:
    ebpf, userspace = (lab_backends()[name].support for name in ("ebpf", "userspace"))
    assert ebpf.flags(PLACES) == ["--cgroup", str(PLACES.cgroup),
                                  "--bpffs-dir", str(PLACES.bpffs_dir)]
    assert userspace.flags(PLACES) == ["--interface", PLACES.service_interface]
    pods = ("10.244.0.0/16", "fd00:10:244::/56")
    assert userspace.flags(dataclasses.replace(PLACES, pod_cidrs=pods)) == [
        "--interface", PLACES.service_interface, "--cluster-cidr", ",".join(pods)]
    assert userspace.inspect(PLACES)[:3] == ["ip", "-n", PLACES.node_netns]
    # Nothing pinned there (the directory does not exist): nothing to clean up.
    assert ebpf.cleanup(PLACES) is None and userspace.cleanup(PLACES) is None


def test_ebpf_cleanup_removes_the_pins_of_its_places(tmp_path: Path) -> None:
    places = dataclasses.replace(PLACES, bpffs_dir=tmp_path)
    command = lab_backends()["ebpf"].support.cleanup(places)
    assert command is not None and Path(command[0]).name == "kpng-py"
    assert command[1:] == ["ebpf", "cleanup", "--cgroup", str(PLACES.cgroup),
                           "--bpffs-dir", str(tmp_path)]


def test_ebpf_capacity_makes_room_for_every_endpoint() -> None:
    flags = lab_backends()["ebpf"].support.capacity_flags(30_000, 300_000)
    sizes = dict(zip(flags[::2], map(int, flags[1::2])))
    assert sizes["--map-size-services"] >= 330_000 * 5 // 4
    assert sizes["--map-size-backends"] >= 300_000 * 5 // 4


def test_lab_facts_for_a_backend_the_registry_does_not_list_are_named(monkeypatch) -> None:
    monkeypatch.setattr(backends, "LAB_SUPPORT",
                        {**backends.LAB_SUPPORT, "gone": backends.LAB_SUPPORT["userspace"]})
    with pytest.raises(LabBackendError, match="facts for gone, which kpng_py.dataplane.registry"):
        lab_backends()
