"""What a kernel test needs of the machine: it skips with a reason (a failure
under CI=true) where it cannot run. The namespaces, cgroups and names
themselves are the lab's (lab/netns.py, lab/cgroups.py, lab/names.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lab.names import CGROUP2_ROOT

# Where the tests that need root, BPF or namespaces live (tests/conftest.py
# holds the `kernel` mark to it), and the folder pytest names tests from.
ROOT = Path(__file__).resolve().parents[2]
KERNEL_TESTS = ROOT / "tests" / "kernel"


def require_root() -> None:
    """Skip (a failure under CI=true) where network namespaces cannot be made."""
    _in_a_kernel_test()
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip`)")


def require_root_bpf() -> None:
    """Skip (a failure under CI=true) where kernel tests cannot run."""
    _in_a_kernel_test()
    if os.geteuid() != 0:
        pytest.skip("needs root for BPF, cgroups and network namespaces")
    if not CGROUP2_ROOT.is_dir() or not (CGROUP2_ROOT / "cgroup.procs").exists():
        pytest.skip(f"needs cgroup v2 mounted at {CGROUP2_ROOT}")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip`)")


def _in_a_kernel_test() -> None:
    """A test outside tests/kernel/ that asks for the kernel fails, naming
    where it belongs: it would run unmarked among the unit tests."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    test_file = current.split("::")[0]
    if test_file and not (ROOT / test_file).is_relative_to(KERNEL_TESTS):
        pytest.fail(f"{test_file} needs the kernel: move the test to "
                    f"{KERNEL_TESTS.relative_to(ROOT)}/ (the same folders) and mark it "
                    "`kernel`", pytrace=False)
