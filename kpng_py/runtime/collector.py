"""Keeping Python's cyclic garbage collector out of a change set's way.

A full sync at 10 000 service ports builds millions of objects that live as
long as the node state (decoded values, model objects, the programmer's
mirror). The collector's generation-0 threshold (700 allocations) makes it
walk them over and over while they are being built, and once more every
time they are promoted: about 40 % of a full sync's apply time, for nothing,
because almost none of them is garbage, and what is garbage is freed by
reference counting.

So a change set is applied with the collector paused (from its first ops
to its Sync when it is applied as it arrives), and after a full sync
the objects then alive are frozen (`gc.freeze`): moved out of the
generations the collector walks, which would otherwise walk the new state
three times more as it is promoted. Freed frozen objects are still released
by reference counting; only a reference cycle made during that one change
set would outlive its use (the state model's values are frozen dataclasses
and tuples, without cycles). A collection before freezing would cost one
more walk of the whole state, which is what this avoids.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


class CollectorPause:
    """The collector paused from `pause` (the first of several calls) to
    `resume`: across calls for a change set applied as its ops arrive, around
    one block for `collector_paused`."""

    def __init__(self) -> None:
        self._was_enabled: bool | None = None  # None: not paused

    def pause(self) -> None:
        if self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()

    def resume(self) -> None:
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Paused from here on; resumed at once if the block raises (the
        change set is then given up)."""
        self.pause()
        try:
            yield
        except BaseException:
            self.resume()
            raise


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's previous
    setting comes back after it, also when the block raises."""
    pause = CollectorPause()
    pause.pause()
    try:
        yield
    finally:
        pause.resume()


def freeze_survivors() -> None:
    """Move every object alive now out of the collector's generations (after
    a full sync: the new state is long-lived)."""
    gc.freeze()
