"""`kpng-py version`: what an operator quotes in a bug report."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Iterable

from kpng_py import __version__
from kpng_py.registry import BackendSpec

SOURCE_DIR = Path(__file__).resolve().parent.parent
LIBRARIES = ("grpcio", "grpclib", "protobuf", "pyroute2")


def source_commit(directory: Path = SOURCE_DIR) -> str:
    """The git commit the code runs from, `-dirty` when changed, or
    "unknown" outside a checkout (an image built without .git)."""
    try:
        done = subprocess.run(["git", "-C", str(directory), "describe", "--always", "--dirty",
                               "--abbrev=12", "--match=NONE"],
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def library_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def version_report(backends: Iterable[BackendSpec]) -> dict[str, str]:
    report = {"kpng-py": __version__, "commit": source_commit(),
              "python": platform.python_version(), "kernel": platform.release()}
    report.update({name: library_version(name) for name in LIBRARIES})
    for spec in backends:
        report.update(spec.versions())
    return report
