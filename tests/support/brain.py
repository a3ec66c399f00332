"""Fixtures of a brain's tests (tests/brain, tests/serve, tests/cmd): a state
file and a brain serving it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.state_files import Brain, StateFile


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for unix sockets (their paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="kpng-brain-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state_file(tmp_path: Path) -> StateFile:
    return StateFile(tmp_path / "state.yaml")


@pytest.fixture
def start_brain(state_file: StateFile, socket_dir: Path) -> Iterator:
    """start_brain(document) writes the state file and serves it."""
    brains: list[Brain] = []

    def start(document: dict | str) -> Brain:
        state_file.write(document)
        state_file.date_back()  # saved a while ago: no need to wait for it to settle
        brain = Brain(state_file, socket_dir / "brain.sock")
        brains.append(brain)
        return brain

    yield start
    for brain in brains:
        brain.close()
