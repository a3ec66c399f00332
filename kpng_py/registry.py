"""The one list of backends, and what each backend declares about itself.

Every backend module (its own folder's `cli.py`, or `kpng_py/print_backend.py`)
defines `BACKEND = BackendSpec(...)`: its `to-<name>` sink, flags and `create`,
its tool command if it has one (`kpng-py ebpf ...`), and, for a dataplane, how
a lab run (the e2e harness, the bench) starts, inspects and cleans it up. The
command line, the e2e harness and the bench all read this registry; adding a
backend is its module plus one line in BACKEND_MODULES.

A declaration module imports only what its flags need: `kpng-py --help`
imports every one of them, and must not pull in BCC or pyroute2.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kpng_py.backend import Backend
    from kpng_py.metrics import Metrics

# In the order `kpng-py local --help` lists them.
BACKEND_MODULES = (
    "kpng_py.print_backend",
    "backends.ebpf.cli",
    "backends.userspace.cli",
)

_NAME = re.compile(r"^[a-z][a-z0-9]*$")


class RegistryError(Exception):
    """A backend module that does not declare a usable backend."""


@dataclass(frozen=True)
class LabPlaces:
    """Where a lab run lets a backend keep its dataplane: all of it inside the
    run's own node namespace, cgroup and bpffs directory."""

    node_netns: str
    cgroup: Path  # the cgroup of the run's pods
    bpffs_dir: Path
    service_interface: str  # a link name for ClusterIPs, free in node_netns
    pod_cidrs: tuple[str, ...] = ()  # where the run's pods have their addresses


def kpng_py_command(*args: str) -> list[str]:
    """`kpng-py ARGS` as installed next to this Python (the venv's)."""
    return [str(Path(sys.executable).with_name("kpng-py")), *args]


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
class ToolCommand:
    """A top-level command of a backend's own, e.g. `kpng-py ebpf dump`."""

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]


@dataclass(frozen=True)
class BackendSpec:
    """One backend as the command line, the e2e harness and the bench see it."""

    name: str  # `to-<name>`, `hack/test_e2e.sh -b <name>`, the bench's contender
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    # Builds the backend from the parsed flags; imports its heavy dependencies.
    create: Callable[[argparse.Namespace, Metrics], Backend]
    lab: LabSupport | None  # None: no dataplane for a lab run to test
    tool: ToolCommand | None
    # What `kpng-py version` reports of the backend's own dependencies, by
    # name: a version, or why there is none.
    versions: Callable[[], dict[str, str]] = dict

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise RegistryError(f"backend name {self.name!r} is not lowercase letters and "
                                "digits (the sink is `to-<name>`)")
        if not self.help:
            raise RegistryError(f"backend {self.name!r} has no help text")

    @property
    def sink(self) -> str:
        return f"to-{self.name}"


def registered() -> tuple[BackendSpec, ...]:
    """Every backend of BACKEND_MODULES, in its order."""
    specs = tuple(_declaration(module) for module in BACKEND_MODULES)
    _check_unique("backend name", [spec.name for spec in specs])
    _check_unique("tool command", [spec.tool.name for spec in specs if spec.tool])
    return specs


def by_sink() -> dict[str, BackendSpec]:
    """Every backend by its sink name (`to-ebpf`)."""
    return {spec.sink: spec for spec in registered()}


def lab_backends() -> dict[str, BackendSpec]:
    """The backends a lab run can test, by name (`ebpf`)."""
    return {spec.name: spec for spec in registered() if spec.lab is not None}


def _declaration(module_name: str) -> BackendSpec:
    spec = getattr(importlib.import_module(module_name), "BACKEND", None)
    if not isinstance(spec, BackendSpec):
        raise RegistryError(f"{module_name} declares no `BACKEND = BackendSpec(...)`; add one "
                            "or remove it from kpng_py.registry.BACKEND_MODULES")
    return spec


def _check_unique(what: str, names: list[str]) -> None:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RegistryError(f"{what} {', '.join(repeated)} is declared twice in "
                            "kpng_py.registry.BACKEND_MODULES; give each backend its own")
