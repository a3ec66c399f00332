"""The build of a checkout, as the version tests and the image's test read it."""

from __future__ import annotations

from pathlib import Path

from kpng_py.cmd.version import Build, tree_build


def checkout_build(directory: Path) -> Build:
    """The build of a checkout's top folder (tree_build gives None elsewhere)."""
    build = tree_build(directory)
    assert build is not None, f"{directory} is no checkout's top folder"
    return build
