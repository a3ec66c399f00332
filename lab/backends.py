"""How a lab run (the e2e harness, the bench) drives the backends of
kpng_py.dataplane.registry that have a dataplane.

The registry is the one list of backends and holds what the product needs of
each (its sink, flags, tool command). What only a lab run needs is here, one
entry per backend under its registry name: the flags that keep its dataplane
in the run's places, room for a scenario, the commands that show and remove
what it programmed, and the traits the checks and the bench go by. A
registered backend without an entry (`to-print`: no dataplane) is one a lab
run does not test; an entry for a name the registry does not list is an
error that names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kpng_py.dataplane import registry
from lab.procs import kpng_py_command


class LabBackendError(Exception):
    """Lab facts for a backend that kpng_py.dataplane.registry does not list."""


@dataclass(frozen=True)
class LabPlaces:
    """Where a lab run lets a backend keep its dataplane: all of it inside the
    run's own node namespace, cgroup and bpffs directory."""

    node_netns: str
    cgroup: Path  # the cgroup of the run's pods
    bpffs_dir: Path
    service_interface: str  # a link name for ClusterIPs, free in node_netns
    pod_cidrs: tuple[str, ...] = ()  # where the run's pods have their addresses


@dataclass(frozen=True)
class LabSupport:
    """How a lab run drives a dataplane backend, and what it may expect of it."""

    # The sink's flags that keep the dataplane in the run's places.
    flags: Callable[[LabPlaces], list[str]]
    # Flags that make room for (service ports, endpoints) (e.g. map sizes).
    capacity_flags: Callable[[int, int], list[str]]
    # A command that shows what the backend programmed (saved with the logs).
    inspect: Callable[[LabPlaces], list[str]]
    # The command that removes what the backend leaves outside the run's
    # namespaces (kernel state that outlives its process); None when there is
    # nothing to remove.
    cleanup: Callable[[LabPlaces], list[str] | None]
    # Whether every packet to a ClusterIP is translated inside the pod (a
    # socket-level balancer), so that none may ever reach the node.
    translates_in_pod: bool
    # Whether the dataplane outlives the process (kernel state), so that a
    # restart neither refuses a new connection nor breaks an established one.
    # A userspace proxy cannot: its sockets die with it (kube-proxy's
    # userspace mode behaved the same).
    survives_restart: bool
    # Listening sockets the backend holds open per service port (the bench
    # checks that the open-files limit allows them).
    sockets_per_service_port: int
    # A command that prints every translation as it happens until SIGTERM
    # (`--json`: one object per line); None when the backend has none. The
    # e2e checks its lines, the bench what it costs.
    trace: Callable[[LabPlaces], list[str]] | None = None


@dataclass(frozen=True)
class LabBackend:
    """A registered backend that a lab run can test."""

    name: str  # the registry's: `hack/test_e2e.sh -b <name>`, the bench's contender
    sink: str  # `to-<name>`
    support: LabSupport


def lab_backends() -> dict[str, LabBackend]:
    """The backends a lab run can test, by name (`ebpf`), in the registry's order."""
    specs = registry.registered()
    unknown = sorted(set(LAB_SUPPORT) - {spec.name for spec in specs})
    if unknown:
        raise LabBackendError(f"lab.backends.LAB_SUPPORT has facts for {', '.join(unknown)}, "
                              "which kpng_py.dataplane.registry.BACKEND_MODULES does not "
                              "list; register the backend or remove its entry")
    return {spec.name: LabBackend(spec.name, spec.sink, LAB_SUPPORT[spec.name])
            for spec in specs if spec.name in LAB_SUPPORT}


def _ebpf_capacity_flags(service_ports: int, endpoints: int) -> list[str]:
    # a master entry per frontend plus a slot per backend; a backend per endpoint
    return ["--map-size-services", str(_ebpf_capacity(service_ports + endpoints)),
            "--map-size-backends", str(_ebpf_capacity(endpoints))]


def _ebpf_capacity(entries: int) -> int:
    """Room for `entries` and a quarter more, as a power of two."""
    size = 1024
    while size < entries * 5 // 4:
        size *= 2
    return size


def _ebpf_cleanup(places: LabPlaces) -> list[str] | None:
    # The pins under --bpffs-dir are what keeps the programs attached and the
    # maps alive after the process: without them, nothing of it is left.
    if not places.bpffs_dir.exists():
        return None
    return kpng_py_command("ebpf", "cleanup", "--cgroup", str(places.cgroup),
                           "--bpffs-dir", str(places.bpffs_dir))


def _userspace_flags(places: LabPlaces) -> list[str]:
    cluster_cidrs = ["--cluster-cidr", ",".join(places.pod_cidrs)] if places.pod_cidrs else []
    return ["--interface", places.service_interface, *cluster_cidrs]


# Each dataplane backend of kpng_py.dataplane.registry, under its name.
LAB_SUPPORT = {
    "ebpf": LabSupport(
        flags=lambda places: ["--cgroup", str(places.cgroup),
                              "--bpffs-dir", str(places.bpffs_dir)],
        capacity_flags=_ebpf_capacity_flags,
        inspect=lambda places: kpng_py_command("ebpf", "dump",
                                               "--bpffs-dir", str(places.bpffs_dir)),
        cleanup=_ebpf_cleanup,
        translates_in_pod=True, survives_restart=True, sockets_per_service_port=0,
        trace=lambda places: kpng_py_command("ebpf", "trace", "--json",
                                             "--bpffs-dir", str(places.bpffs_dir))),
    "userspace": LabSupport(
        flags=_userspace_flags,
        capacity_flags=lambda service_ports, endpoints: [],
        inspect=lambda places: ["ip", "-n", places.node_netns, "addr", "show",
                                "dev", places.service_interface],
        # Its interface and sockets go with the node's namespace and its process.
        cleanup=lambda places: None,
        translates_in_pod=False, survives_restart=False, sockets_per_service_port=1),
}
