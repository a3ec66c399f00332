"""A backend set up on a thread of its own, alongside the watch client's
connect and first change set, for `kpng-py local`.

A backend's setup may take a second (the eBPF backend's BCC build in a
child process); the first change set takes longer to arrive and to be
turned into ServicePortChanges. So `run_backend` starts the setup, runs the
client at once, and the first `apply` waits for the setup to end. A failed
setup stops the client, and `raise_failure` raises its error in the main
thread, so the process reports it and exits as when setup ran first.
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping

from kpng_py.dataplane.contract import Backend, backend_not_programmed, backend_stages
from kpng_py.model import ServicePortChanges


class BackendNotSetUpError(RuntimeError):
    """apply() on a backend whose setup failed (the process is stopping)."""


class SetUpAlongside:
    """A Backend around `backend` whose setup runs on a thread."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._error: BaseException | None = None
        self._on_failure: Callable[[], None] = lambda: None
        self._thread = threading.Thread(target=self._set_up, name="backend-setup", daemon=True)

    def start(self, on_failure: Callable[[], None]) -> None:
        """Start the setup; `on_failure` is called (on the setup thread) if it fails."""
        self._on_failure = on_failure
        self._thread.start()

    def setup(self) -> None:
        self.start(lambda: None)

    def _set_up(self) -> None:
        try:
            self._backend.setup()
        except BaseException as err:  # re-raised in the main thread by raise_failure
            self._error = err
            self._on_failure()

    def apply(self, changes: ServicePortChanges) -> None:
        self._thread.join()
        if self._error is not None:
            raise BackendNotSetUpError(f"the backend's setup failed ({self._error}); "
                                       "the process stops") from self._error
        self._backend.apply(changes)

    def apply_stages(self) -> Mapping[str, float]:
        return backend_stages(self._backend)

    def not_programmed(self) -> Mapping[str, int]:
        return backend_not_programmed(self._backend)

    def close(self) -> None:
        """Wait for the setup; close the backend if it was set up."""
        if self._thread.ident is not None:
            self._thread.join()
        if self._error is None:
            self._backend.close()

    def raise_failure(self) -> None:
        """Raise what the setup raised, if it failed."""
        if self._error is not None:
            raise self._error
