"""What a kernel test needs of the machine: it skips with a reason (a failure
under CI=true) where it cannot run. The namespaces, cgroups and names
themselves are the lab's (lab/netns.py, lab/cgroups.py, lab/names.py)."""

from __future__ import annotations

import os
import shutil

import pytest

from lab.names import CGROUP2_ROOT

# Where the tests that need root, BPF or namespaces live (tests/conftest.py
# holds the `kernel` mark to it).
KERNEL_TESTS = "tests/kernel/"


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
    if current and not current.startswith(KERNEL_TESTS):
        pytest.fail(f"{current.split('::')[0]} needs the kernel: move the test to "
                    f"{KERNEL_TESTS} (the same folders) and mark it `kernel`", pytrace=False)
