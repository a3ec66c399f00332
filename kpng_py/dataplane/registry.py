"""The one list of backends, and what each backend declares about itself.

Every backend module (its own folder's `cli.py`, or `kpng_py/dataplane/print_backend.py`)
defines `BACKEND = BackendSpec(...)`: its `to-<name>` sink, flags and `create`,
its tool command if it has one (`kpng-py ebpf ...`) and the versions
`kpng-py version` reports. The command line reads this registry; adding a
backend is its module plus one line in BACKEND_MODULES.

A declaration module imports only what its flags need: `kpng-py --help`
imports every one of them, and must not pull in BCC or pyroute2.
"""

from __future__ import annotations

import argparse
import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kpng_py.dataplane.contract import Backend
    from kpng_py.metrics.metrics import Metrics

# In the order `kpng-py local --help` lists them.
BACKEND_MODULES = (
    "kpng_py.dataplane.print_backend",
    "backends.ebpf.cli",
    "backends.userspace.cli",
)

_NAME = re.compile(r"^[a-z][a-z0-9]*$")


class RegistryError(Exception):
    """A backend module that does not declare a usable backend."""


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
    """One backend as the command line sees it."""

    name: str  # `to-<name>`
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    # Builds the backend from the parsed flags; imports its heavy dependencies.
    create: Callable[[argparse.Namespace, Metrics], Backend]
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


def _declaration(module_name: str) -> BackendSpec:
    spec = getattr(importlib.import_module(module_name), "BACKEND", None)
    if not isinstance(spec, BackendSpec):
        raise RegistryError(f"{module_name} declares no `BACKEND = BackendSpec(...)`; add one "
                            "or remove it from kpng_py.dataplane.registry.BACKEND_MODULES")
    return spec


def _check_unique(what: str, names: list[str]) -> None:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RegistryError(f"{what} {', '.join(repeated)} is declared twice in "
                            "kpng_py.dataplane.registry.BACKEND_MODULES; give each backend its own")
