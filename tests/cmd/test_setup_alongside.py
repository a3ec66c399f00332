"""kpng-py local sets its backend up alongside the watch client: the first
apply waits for the setup, and a failed setup stops the client and is raised
where the process reports it (kpng_py/cmd/setup_alongside.py)."""

from __future__ import annotations

import threading

import pytest

from kpng_py.cmd.setup_alongside import BackendNotSetUpError, SetUpAlongside
from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.model import ServicePortChanges


class SlowBackend:
    """A backend whose setup waits for `release` and records what ran in which order."""

    def __init__(self, fails: bool = False) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []
        self._fails = fails

    def setup(self) -> None:
        self.release.wait()
        self.calls.append("setup")
        if self._fails:
            raise BackendSetupError("no cgroup v2 filesystem is mounted; mount one")

    def apply(self, changes: ServicePortChanges) -> None:
        self.calls.append("apply")

    def close(self) -> None:
        self.calls.append("close")

    def apply_stages(self) -> dict[str, float]:
        return {"plan_ms": 1.0}

    def not_programmed(self) -> dict[str, int]:
        return {"capacity": 2}


def test_the_first_apply_waits_for_the_setup() -> None:
    backend = SlowBackend()
    alongside = SetUpAlongside(backend)
    alongside.start(on_failure=lambda: pytest.fail("the setup did not fail"))
    releaser = threading.Timer(0.2, backend.release.set)  # after apply() was called
    releaser.start()
    alongside.apply(ServicePortChanges(full=True))
    releaser.join()
    alongside.close()
    alongside.raise_failure()
    assert backend.calls == ["setup", "apply", "close"]
    # The backend's own methods.
    assert (alongside.apply_stages(), alongside.not_programmed()) == ({"plan_ms": 1.0},
                                                                      {"capacity": 2})


def test_a_failed_setup_stops_the_client_and_is_raised_as_it_was() -> None:
    backend = SlowBackend(fails=True)
    alongside = SetUpAlongside(backend)
    stopped = threading.Event()
    alongside.start(on_failure=stopped.set)
    backend.release.set()
    stopped.wait(timeout=60)
    assert stopped.is_set()
    with pytest.raises(BackendNotSetUpError, match="setup failed .no cgroup v2 filesystem"):
        alongside.apply(ServicePortChanges(full=True))
    alongside.close()  # a backend that was never set up is not closed
    with pytest.raises(BackendSetupError, match="^no cgroup v2 filesystem is mounted; mount one$"):
        alongside.raise_failure()
    assert backend.calls == ["setup"]


def test_a_backend_never_started_is_still_closed() -> None:
    backend = SlowBackend()
    SetUpAlongside(backend).close()
    assert backend.calls == ["close"]
