"""Following the state file: each good version is published once it reads the
same twice; a bad one keeps the last good state and is reported once."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from kpng_py.brain.statefile import StateFileError
from kpng_py.brain.view import NodeView
from kpng_py.brain.watcher import StateFileWatcher
from tests.brain.helpers import StateFile, endpoint, port, service, state

WEB = state(service("web", ("10.96.0.10",), [port("http")], [endpoint("10.1.0.1", pod="w0")]))
WEB_TWO = state(service("web", ("10.96.0.10",), [port("http")], [
    endpoint("10.1.0.1", pod="w0"), endpoint("10.1.0.2", pod="w1")]))


def _watcher(state_file: StateFile, document: dict | str = WEB) -> StateFileWatcher:
    """A watcher polled by hand (its thread is not started)."""
    state_file.write(document)
    return StateFileWatcher(state_file.path)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kpng_py.brain.watcher" and r.levelno == logging.ERROR]


def _view(watcher: StateFileWatcher) -> NodeView:
    """Node n1's view of the current state."""
    now = threading.Event()
    now.set()
    current = watcher.snapshots.wait_view("n1", None, now)
    assert current is not None
    return current[1]


def test_a_new_version_is_published_once_it_reads_the_same_twice(state_file: StateFile) -> None:
    watcher = _watcher(state_file)
    assert watcher.snapshots.version == 1
    state_file.write(WEB_TWO)
    watcher.poll()
    assert watcher.snapshots.version == 1  # it may still be half-written
    watcher.poll()
    assert watcher.snapshots.version == 2


def test_a_half_written_save_is_not_served(state_file: StateFile) -> None:
    watcher = _watcher(state_file)
    full = state_file.path.read_text().replace("10.1.0.1", "10.1.0.9")
    state_file.write(full[: len(full) // 2], in_place=True)
    watcher.poll()
    state_file.write(full, in_place=True)
    watcher.poll()
    assert watcher.snapshots.version == 1
    watcher.poll()
    assert watcher.snapshots.version == 2


def test_rewriting_the_same_content_publishes_nothing(state_file: StateFile) -> None:
    watcher = _watcher(state_file)
    state_file.write(WEB, in_place=True)
    state_file.write(WEB)
    for _ in range(3):
        watcher.poll()
    assert watcher.snapshots.version == 1


def test_an_edit_that_keeps_size_and_timestamp_is_still_seen(state_file: StateFile) -> None:
    """Timestamps are coarse: two saves close together may leave the stat
    signature as it was. A recent file is read again to compare."""
    watcher = _watcher(state_file)
    state_file.write(state_file.path.read_text().replace("10.1.0.1", "10.1.0.2"),
                     in_place=True)
    watcher._seen_signature = watcher._signature()  # as if nothing had changed in stat
    watcher.poll()
    watcher.poll()
    assert watcher.snapshots.version == 2


def test_a_bad_version_keeps_the_last_good_state_and_is_reported_once(
        state_file: StateFile, caplog: pytest.LogCaptureFixture) -> None:
    watcher = _watcher(state_file)
    good = _view(watcher)
    text = state_file.path.read_text()
    state_file.write(text.replace("10.1.0.1", "10.1.0.300"))
    for _ in range(5):
        watcher.poll()
    assert watcher.snapshots.version == 1
    assert _view(watcher) == good
    (error,) = _errors(caplog)
    assert f"{state_file.path}:" in error
    assert "services[0].endpoints[0].endpoint.ips.v4[0]: '10.1.0.300' is not an IP address" \
        in error

    state_file.write(text.replace("10.1.0.1", "10.1.0.301"))  # another bad version
    for _ in range(3):
        watcher.poll()
    assert len(_errors(caplog)) == 2

    state_file.write(WEB_TWO)
    watcher.poll()
    watcher.poll()
    assert watcher.snapshots.version == 2
    assert len(_errors(caplog)) == 2


def test_a_missing_file_keeps_the_state_until_it_is_back(
        state_file: StateFile, caplog: pytest.LogCaptureFixture) -> None:
    watcher = _watcher(state_file)
    state_file.path.unlink()
    for _ in range(3):
        watcher.poll()
    (error,) = _errors(caplog)
    assert error.endswith(f"{state_file.path}: cannot read: No such file or directory")
    assert watcher.snapshots.version == 1
    state_file.write(WEB_TWO)
    watcher.poll()
    watcher.poll()
    assert watcher.snapshots.version == 2


def test_a_file_that_is_unusable_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="cannot read: No such file"):
        StateFileWatcher(tmp_path / "missing.yaml")
    bad = StateFile(tmp_path / "bad.yaml")
    bad.write("services: {")
    with pytest.raises(StateFileError, match=r"bad.yaml:\d+: not valid YAML: "):
        StateFileWatcher(bad.path)
