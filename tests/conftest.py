"""Suite-wide policy: tests that cannot run here (no root, no BPF, missing
tool) skip with a reason, except under CI=true, where every skip is a failure:
CI machines have everything, so a skip there means a test silently did not run."""

from __future__ import annotations

import gc
import logging
import os
from typing import Iterator

import pytest

from kpng_py.runtime.logs import HANDLER_NAME
from lab.names import BPFFS_ROOT, RunNames
from tests.support.kernel import KERNEL_TESTS


@pytest.fixture(scope="session", autouse=True)
def _sweep_leftovers_of_killed_runs() -> None:
    """Kernel objects of an earlier run that was killed outright (a failing
    test cleans up itself) would otherwise pile up on the machine: those of
    test sessions, e2e runs and benches alike, by their owner's pid."""
    if os.geteuid() != 0:
        return
    from lab import teardown

    for removed in teardown.remove_stale_runs(_detach_programs):
        logging.getLogger("tests").warning("%s", removed)


@pytest.fixture(autouse=True)
def _unfreeze_collected_objects() -> Iterator[None]:
    """A full sync freezes what is alive (kpng_py/runtime/collector.py); in the test
    process that would be pytest's own objects too, kept from the collector
    for the rest of the session."""
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _no_logging_into_a_finished_test() -> Iterator[None]:
    """A test that runs a command in this process (`main([...])`) has it log
    to that test's stderr, which pytest closes after it: a line that a
    later test's thread logs would then fail to write. The handler goes with
    its test."""
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(handler)


def _detach_programs(names: RunNames) -> None:
    """Detach and unpin the BPF programs and maps a dead process left pinned."""
    from backends.ebpf.datapath.loader import cleanup  # BCC: only when there is something to sweep

    for pins in sorted(BPFFS_ROOT.iterdir()):
        if names.of_process(pins.name):
            cleanup(pins)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    del item, call
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {report.longrepr}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Kernel tests (root, BPF, namespaces) live in tests/kernel/ and only
    there, so that a test's folder says what it needs: a test there without
    the `kernel` mark, or one elsewhere with it, stops the run."""
    misplaced = [item.nodeid for item in items
                 if (item.get_closest_marker("kernel") is not None)
                 != item.path.is_relative_to(KERNEL_TESTS)]
    if misplaced:
        raise pytest.UsageError(
            "kernel tests belong in tests/kernel/ and must be marked `kernel`, others not: "
            + ", ".join(misplaced[:5])
            + (f" and {len(misplaced) - 5} more" if len(misplaced) > 5 else ""))
