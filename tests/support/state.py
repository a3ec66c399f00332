"""The state model's change sets in tests that end their ops with a Sync."""

from __future__ import annotations

from typing import Iterable

from kpng_py.api import localv1 as L
from kpng_py.model import ServicePortChanges
from kpng_py.state.tracker import NodeState


def apply_synced(state: NodeState, ops: Iterable[L.OpItem]) -> ServicePortChanges:
    """The change set `state.apply` gives for ops with a Sync among them."""
    changes = state.apply(ops)
    assert changes is not None, "the ops hold no Sync: nothing reached the backend"
    return changes
