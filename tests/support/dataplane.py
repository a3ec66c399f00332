"""Backends of the dataplane's tests."""

from __future__ import annotations

from kpng_py.model import ServicePortChanges


class OldBackend:
    """A backend of another package, older than the contract's apply_stages
    and not_programmed: setup, apply and close only."""

    def setup(self) -> None:
        pass

    def apply(self, changes: ServicePortChanges) -> None:
        pass

    def close(self) -> None:
        pass
