"""Fixtures of the commands' tests: `kpng-py file` runs against the brain's
state file and brain (tests/support/brain.py)."""

from tests.support.brain import socket_dir, start_brain, state_file

__all__ = ["socket_dir", "start_brain", "state_file"]
