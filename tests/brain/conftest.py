"""Fixtures of the brain's tests: a state file and a brain serving it."""

from __future__ import annotations

from tests.support.brain import socket_dir, start_brain, state_file

__all__ = ["socket_dir", "start_brain", "state_file"]
