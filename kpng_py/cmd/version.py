"""`kpng-py version`: what an operator quotes in a bug report, and which build
of the tree runs.

A build's version is the tree's base version (`kpng_py.__version__`), the
number of commits in its history and its commit, and whether the tree had
changes not committed: `0.1.0+332.g87621f711c83`, `...dirty`. In a checkout
it is read from git; an image has no .git (`.dockerignore`), so its build
records the version computed on the host (`python -m kpng_py.cmd.version
--record VERSION`, run by deploy/Dockerfile with what hack/image.sh passes)
in `BUILD_FILE`. An image tag may not contain '+': `Build.image_tag`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from kpng_py import __version__
from kpng_py.dataplane.registry import BackendSpec

# The checkout the package runs from, and the file an image build writes into
# the package (kpng_py/BUILD_VERSION).
SOURCE_DIR = Path(__file__).resolve().parents[2]
BUILD_FILE = Path(__file__).resolve().parents[1] / "BUILD_VERSION"
LIBRARIES = ("grpcio", "grpclib", "protobuf", "pyroute2", "urllib3")
_COMMIT_DIGITS = 12
_BUILD = re.compile(r"(?P<base>[0-9]+\.[0-9]+\.[0-9]+)\+(?P<commits>[0-9]+)"
                    rf"\.g(?P<commit>[0-9a-f]{{{_COMMIT_DIGITS}}})(?P<dirty>\.dirty)?")


@dataclass(frozen=True, slots=True)
class Build:
    """One build of the tree."""

    base: str  # the tree's base version, e.g. 0.1.0
    commits: int  # in the history of its commit
    commit: str  # its first 12 hex digits
    dirty: bool  # the tree had changes not committed

    @classmethod
    def parse(cls, text: str) -> Build:
        found = _BUILD.fullmatch(text)
        if found is None:
            raise ValueError(f"{text!r} is no kpng-py build version: expected BASE+COMMITS.gHASH "
                             "with a 12-digit commit hash and an optional .dirty, e.g. "
                             "0.1.0+332.g87621f711c83 (python -m kpng_py.cmd.version prints a "
                             "checkout's)")
        return cls(found["base"], int(found["commits"]), found["commit"],
                   found["dirty"] is not None)

    @property
    def version(self) -> str:
        """PEP 440: the base version, and as its local part the commits and the commit."""
        return f"{self.base}+{self.commits}.g{self.commit}" + (".dirty" if self.dirty else "")

    @property
    def image_tag(self) -> str:
        """The version as a container image tag, which may not contain '+'."""
        return self.version.replace("+", "-")

    @property
    def source(self) -> str:
        """The commit, `-dirty` when the tree had changes not committed."""
        return self.commit + ("-dirty" if self.dirty else "")


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                              text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def tree_build(directory: Path = SOURCE_DIR) -> Build | None:
    """The build of the git checkout whose top is `directory`, or None if it
    is none (an image, an installed package, a folder inside another
    repository)."""
    head = _git(directory, "rev-parse", "--show-toplevel", "HEAD")
    if head is None or len(lines := head.splitlines()) != 2:
        return None
    top, commit = lines
    if Path(top).resolve() != directory.resolve():
        return None
    commits = _git(directory, "rev-list", "--count", "HEAD")
    changes = _git(directory, "status", "--porcelain")  # untracked files too: an image copies them
    if commits is None or changes is None:
        return None
    return Build(__version__, int(commits), commit[:_COMMIT_DIGITS], changes != "")


def recorded_build(path: Path = BUILD_FILE) -> Build | None:
    """The build an image build recorded at `path`, None if there is none."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return Build.parse(text)


def current_build(directory: Path = SOURCE_DIR, path: Path = BUILD_FILE) -> Build | None:
    """This code's build: its checkout's, else the one its image recorded
    (ValueError if that record is damaged)."""
    return tree_build(directory) or recorded_build(path)


def running(directory: Path = SOURCE_DIR, path: Path = BUILD_FILE) -> tuple[str, str]:
    """The version and the commit this code runs as: its build's, else the
    base version and why the commit is unknown."""
    try:
        build = current_build(directory, path)
    except ValueError as err:
        return __version__, f"unknown ({path} is damaged: {err})"
    return (build.version, build.source) if build else (__version__, "unknown")


def record(version: str, path: Path = BUILD_FILE) -> Build:
    """Write `version` (computed from git on the host) to `path`, as an image
    build does; it must be a build of this tree's base version."""
    build = Build.parse(version)
    if build.base != __version__:
        raise ValueError(f"{version!r} is a build of {build.base}, but this tree is "
                         f"{__version__}: compute it from this tree (hack/image.sh)")
    path.write_text(build.version + "\n", encoding="utf-8")
    return build


def library_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def version_report(backends: Iterable[BackendSpec]) -> dict[str, str]:
    version, commit = running()
    report = {"kpng-py": version, "commit": commit,
              "python": platform.python_version(), "kernel": platform.release()}
    report.update({name: library_version(name) for name in LIBRARIES})
    for spec in backends:
        report.update(spec.versions())
    return report


class PrintVersion(argparse.Action):
    """`kpng-py --version`: the build's version (read only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 help: str = "print kpng-py's version and exit") -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"kpng-py {running()[0]}")
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kpng_py.cmd.version`: a checkout's build for hack/image.sh, or
    `--record VERSION` in an image build."""
    parser = argparse.ArgumentParser(
        prog="python -m kpng_py.cmd.version",
        description="Print this checkout's build version (from git), or record one in "
                    f"{BUILD_FILE.name} (an image build, which has no .git).")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--image-tag", action="store_true",
                      help="print it as an image tag (no '+')")
    what.add_argument("--record", metavar="VERSION",
                      help=f"write VERSION, computed on the host, to {BUILD_FILE}")
    args = parser.parse_args(argv)
    if args.record is not None:
        try:
            record(args.record)
        except ValueError as err:
            print(f"kpng-py: error: {err}", file=sys.stderr)
            return 2
        return 0
    build = tree_build()
    if build is None:
        print(f"kpng-py: error: {SOURCE_DIR} is no git checkout (or git is missing): a "
              "build version is computed from one", file=sys.stderr)
        return 1
    print(build.image_tag if args.image_tag else build.version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
