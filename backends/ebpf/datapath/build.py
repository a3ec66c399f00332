"""The BCC build, in a short-lived child: `python -m backends.ebpf.datapath.build`.

Compiling with BCC maps LLVM and clang into the process (about 100 MiB, and
about 70 MiB more while compiling) and keeps them mapped for its lifetime. So
the backend process never imports bcc: it writes a BuildRequest to this
child's stdin; the child compiles and loads each variant of cflags in turn
until one loads, pins one program per hook into the request's directory
(BCC's BPF_TABLE_PINNED creates or reuses the pinned maps on the way), writes
a BuildResult to its stdout, and exits. The parent opens the pins.

The child writes its messages (BCC's and clang's) to the parent's stderr;
its stdout carries only the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import backends
from backends.ebpf.maps import libbpf

# A build that takes longer is taken for a hung child (a compile takes about a second).
BUILD_TIMEOUT_SECONDS = 300.0
_PACKAGE_ROOT = Path(backends.__file__).resolve().parent.parent


@dataclass(frozen=True)
class HookProgram:
    """One program to load and where to pin it."""

    pin: str          # its name under BuildRequest.pin_dir
    function: str     # the C function
    attach_type: int  # enum bpf_attach_type


@dataclass(frozen=True)
class BuildRequest:
    source: Path
    variants: tuple[tuple[str, ...], ...]  # cflags, tried in order
    hooks: tuple[HookProgram, ...]
    pin_dir: Path  # an empty directory on bpffs

    def to_json(self) -> str:
        return json.dumps({"source": str(self.source), "variants": self.variants,
                           "hooks": [[h.pin, h.function, h.attach_type] for h in self.hooks],
                           "pin_dir": str(self.pin_dir)})

    @classmethod
    def from_json(cls, text: str) -> BuildRequest:
        raw = json.loads(text)
        return cls(Path(raw["source"]), tuple(tuple(v) for v in raw["variants"]),
                   tuple(HookProgram(*hook) for hook in raw["hooks"]), Path(raw["pin_dir"]))


@dataclass(frozen=True)
class BuildError:
    """What a variant failed with: BCC's message, and the errno of an OSError."""

    message: str
    errno: int | None = None

    def as_exception(self) -> Exception:
        return OSError(self.errno, self.message) if self.errno is not None else Exception(
            self.message)


@dataclass(frozen=True)
class BuildResult:
    variant: int | None  # the index of the variant that loaded; None: none did
    errors: tuple[BuildError, ...]  # of the variants tried before it (or of all)

    def to_json(self) -> str:
        return json.dumps({"variant": self.variant,
                           "errors": [[e.message, e.errno] for e in self.errors]})

    @classmethod
    def from_json(cls, text: str) -> BuildResult:
        raw = json.loads(text)
        return cls(raw["variant"], tuple(BuildError(*error) for error in raw["errors"]))


class BuildFailed(Exception):
    """The child ended without a result (killed, crashed, hung)."""


def build_in_child(request: BuildRequest) -> BuildResult:
    """Run the build in a child process and wait for it (it is always reaped)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH"))))}
    try:
        done = subprocess.run([sys.executable, "-m", "backends.ebpf.datapath.build"],
                              input=request.to_json(), stdout=subprocess.PIPE, text=True,
                              cwd="/", env=env, timeout=BUILD_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired as err:
        raise BuildFailed(f"the build child did not finish within {BUILD_TIMEOUT_SECONDS:g} s "
                          "and was killed") from err
    if done.returncode != 0 or not done.stdout.strip():
        raise BuildFailed(f"the build child ended with status {done.returncode} and no result "
                          "(its messages are above)")
    return BuildResult.from_json(done.stdout)


def build(request: BuildRequest) -> BuildResult:
    """The child's work: the first variant that compiles and loads is pinned."""
    from bcc import BPF  # only ever in this child

    errors: list[BuildError] = []
    for index, cflags in enumerate(request.variants):
        try:
            bpf = BPF(src_file=str(request.source).encode(), cflags=list(cflags))
            programs = {hook.pin: bpf.load_func(hook.function.encode(), BPF.CGROUP_SOCK_ADDR,
                                                attach_type=hook.attach_type).fd
                        for hook in request.hooks}
        except Exception as err:  # BCC raises bare Exceptions
            errors.append(BuildError(str(err), err.errno if isinstance(err, OSError) else None))
            continue
        try:
            for pin, fd in programs.items():
                libbpf.obj_pin(fd, request.pin_dir / pin)
        except OSError as err:
            errors.append(BuildError(str(err), err.errno))
            return BuildResult(None, tuple(errors))
        finally:
            bpf.cleanup()
        return BuildResult(index, tuple(errors))
    return BuildResult(None, tuple(errors))


def main() -> int:
    result_fd = os.dup(1)
    os.dup2(2, 1)  # whatever BCC prints goes to stderr; stdout is the result's
    request = BuildRequest.from_json(sys.stdin.read())
    with os.fdopen(result_fd, "w") as out:
        out.write(build(request).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
