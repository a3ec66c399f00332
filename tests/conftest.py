"""Suite-wide policy: tests that cannot run here (no root, no BPF, missing
tool) skip with a reason, except under CI=true, where every skip is a failure:
CI machines have everything, so a skip there means a test silently did not run."""

from __future__ import annotations

import logging
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _sweep_leftovers_of_killed_runs() -> None:
    """Kernel objects of an earlier run that was killed outright (a failing
    test cleans up itself) would otherwise pile up on the machine."""
    if os.geteuid() != 0:
        return
    from tests.support.kernel import sweep_stale

    for removed in sweep_stale():
        logging.getLogger("tests").warning("removed a leftover of a killed run: %s", removed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    del item, call
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {report.longrepr}"
