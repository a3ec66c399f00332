"""Following the state file: each good version is published once it has
settled; a half-written one never is; only regular files of bounded size are
read; a bad version keeps the last good state and is reported once."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml

from kpng_py.api import localv1
from kpng_py.brain.statefile import StateFileError
from kpng_py.brain.view import NodeView
from kpng_py.brain.watcher import Settle, StateFileWatcher
from tests.support.state_files import (
    WAIT_SECONDS,
    StateFile,
    endpoint,
    port,
    service,
    state,
    wait_until,
)

WEB = state(service("web", ("10.96.0.10",), [port("http")], [endpoint("10.1.0.1", pod="w0")]))
WEB_TWO = state(service("web", ("10.96.0.10",), [port("http")], [
    endpoint("10.1.0.1", pod="w0"), endpoint("10.1.0.2", pod="w1")]))
SETTLE = Settle(seconds=1.0, incomplete_seconds=5.0)  # the defaults, as documented


class _Clock:
    """The watcher's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _watcher(state_file: StateFile, document: dict | str = WEB,
             clock: Callable[[], float] | None = None, **options) -> StateFileWatcher:
    """A watcher polled by hand (its thread is not started), of a file saved
    a while ago."""
    state_file.write(document)
    state_file.date_back()
    return StateFileWatcher(state_file.path, clock=clock or _Clock(), **options)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kpng_py.brain.watcher" and r.levelno == logging.ERROR]


def _view(watcher: StateFileWatcher) -> NodeView:
    """Node n1's view of the current state."""
    return watcher.snapshots.current_view("n1")[1]


def _target_ports(watcher: StateFileWatcher) -> list[int]:
    """The target port of each service in force."""
    return [localv1.Service.FromString(value).Ports[0].TargetPort
            for (kind, _), value in sorted(_view(watcher).items()) if kind == localv1.ServicesSet]


def _poll_returns(watcher: StateFileWatcher) -> None:
    """One poll, which must come back (a FIFO blocks a plain open forever)."""
    poller = threading.Thread(target=watcher.poll, daemon=True)
    poller.start()
    poller.join(WAIT_SECONDS)
    assert not poller.is_alive(), "the poll hangs"


# -- settling ---------------------------------------------------------------------

def _published_once_read_the_same_for(seconds: float, watcher: StateFileWatcher,
                                      state_file: StateFile, clock: _Clock,
                                      document: dict | str, in_place: bool = False) -> None:
    """Save `document` (its mtime dated back): not published 0.1 s before
    it has read the same for `seconds`, published then."""
    assert watcher.snapshots.version == 1
    state_file.write(document, in_place=in_place)
    state_file.date_back()
    watcher.poll()  # first read: it may still be being written
    clock.advance(seconds - 0.1)
    watcher.poll()
    assert watcher.snapshots.version == 1
    clock.advance(0.1)
    watcher.poll()
    assert watcher.snapshots.version == 2


def test_a_new_version_is_published_once_it_has_settled(state_file: StateFile) -> None:
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    _published_once_read_the_same_for(SETTLE.seconds, watcher, state_file, clock, WEB_TWO)


def test_a_content_read_the_same_still_waits_for_its_mtime(state_file: StateFile) -> None:
    """Read the same for long enough, but written less than a second ago (by
    its mtime): the writer may be stalled right now."""
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    state_file.write(WEB_TWO)
    watcher.poll()
    clock.advance(SETTLE.incomplete_seconds)
    watcher.poll()
    assert watcher.snapshots.version == 1
    state_file.date_back()
    watcher.poll()
    assert watcher.snapshots.version == 2


def _web_with_target_port(target_port: int) -> str:
    return ("services:\n- service:\n    name: web\n    ports:\n    - name: http\n"
            f"      protocol: 1\n      port: 80\n      targetport: {target_port}\n")


def test_a_content_cut_inside_a_line_waits_much_longer(state_file: StateFile) -> None:
    """An in-place save cut inside `targetport: 8080` reads `targetport: 80`:
    valid, and wrong. Without a final newline it waits 5 s, not 1 s."""
    clock = _Clock()
    watcher = _watcher(state_file, _web_with_target_port(9090), clock=clock)
    full = _web_with_target_port(8080)
    state_file.write(full[:-len("80\n")], in_place=True)
    state_file.date_back()
    watcher.poll()
    clock.advance(SETTLE.seconds)
    watcher.poll()
    clock.advance(SETTLE.incomplete_seconds - SETTLE.seconds - 0.1)
    watcher.poll()
    assert watcher.snapshots.version == 1
    state_file.write(full, in_place=True)  # the writer goes on: a new content
    state_file.date_back()
    watcher.poll()
    clock.advance(SETTLE.seconds)
    watcher.poll()
    assert watcher.snapshots.version == 2
    assert _target_ports(watcher) == [8080]


@pytest.mark.parametrize("in_place, wait", [(True, SETTLE.incomplete_seconds),
                                             (False, SETTLE.seconds)])
def test_a_prefix_waits_longer_only_when_rewritten_in_place(state_file: StateFile,
                                                            in_place: bool, wait: float) -> None:
    """Deleting the last entries gives a prefix too: saved atomically (a new
    file renamed over the old one) it is no in-place rewrite caught early, and
    waits only the settle time."""
    clock = _Clock()
    two_services = state(service("api", ("10.96.0.11",), [port("grpc", number=9000)]),
                         service("web", ("10.96.0.10",), [port("http")]))
    watcher = _watcher(state_file, two_services, clock=clock)
    text = state_file.path.read_text()
    prefix = text[:text.index("- endpoints:", text.index("- endpoints:") + 1)]
    _published_once_read_the_same_for(wait, watcher, state_file, clock, prefix,
                                      in_place=in_place)
    assert list(_view(watcher)) == [(localv1.ServicesSet, "default/api")]


def test_the_settle_time_is_a_flag(state_file: StateFile) -> None:
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock, settle=Settle.after(0.3))
    _published_once_read_the_same_for(0.3, watcher, state_file, clock, WEB_TWO)


def test_rewriting_the_same_content_publishes_nothing(state_file: StateFile) -> None:
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    state_file.write(WEB, in_place=True)
    state_file.write(WEB)
    for _ in range(3):
        watcher.poll()
        clock.advance(SETTLE.seconds)
    assert watcher.snapshots.version == 1


def test_an_edit_that_keeps_size_and_timestamp_is_still_seen(state_file: StateFile) -> None:
    """Timestamps are coarse: two saves close together may leave the stat
    signature as it was. A recent file is read again to compare."""
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    state_file.write(state_file.path.read_text().replace("10.1.0.1", "10.1.0.2"),
                     in_place=True)
    watcher._seen_signature = watcher._signature()  # as if nothing had changed in stat
    watcher.poll()
    state_file.date_back(SETTLE.seconds)
    clock.advance(SETTLE.seconds)
    watcher.poll()
    assert watcher.snapshots.version == 2


# -- an in-place writer that stalls, for real -------------------------------------

def _ten_services(target_port: int) -> str:
    """Ten services (as the issue's reproduction); the one text to cut."""
    return yaml.safe_dump(state(*[
        service(f"svc-{i}", (f"10.96.0.{10 + i}",), [port("http", targetport=target_port)],
                [endpoint(f"10.1.{i}.1", pod=f"p{i}")])
        for i in range(10)]))


def _write_in_place_with_stalls(path: Path, text: str, cuts: list[int],
                                stalls: list[float]) -> None:
    """Write `text` over `path` as an editor saving in place does, stopping at
    each cut for its stall."""
    with path.open("w", encoding="utf-8") as out:
        start = 0
        for cut, stall in zip(cuts, stalls):
            out.write(text[start:cut])
            out.flush()
            start = cut
            time.sleep(stall)
        out.write(text[start:])


def test_an_in_place_writer_that_stalls_is_never_served_half_written(
        state_file: StateFile, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's reproduction: an in-place save stalling 0.3 s and 0.8 s,
    cut at a line's end (a valid file with some services only), inside
    `targetport: 8080` (valid, port 80) and elsewhere. Only the whole new
    file is ever published."""
    state_file.write(_ten_services(8081))
    state_file.date_back()
    watcher = StateFileWatcher(state_file.path, poll_seconds=0.05)
    new = _ten_services(8080)
    at_line_end = new.index("- endpoints:", len(new) // 2)
    in_target_port = new.index("targetport: 8080", len(new) * 3 // 4) + len("targetport: 80")
    cuts = [len(new) // 5, len(new) // 3, at_line_end, in_target_port]
    with watcher:
        _write_in_place_with_stalls(state_file.path, new, cuts, [0.3, 0.8, 0.8, 0.8])
        wait_until(lambda: _target_ports(watcher) == [8080] * 10, "the new version")
    assert watcher.snapshots.version == 2  # and no version in between
    assert _errors(caplog) == []


def test_a_file_being_written_as_the_brain_starts_is_waited_for(
        state_file: StateFile) -> None:
    state_file.write(_ten_services(8081))
    new = _ten_services(8080)
    writer = threading.Thread(target=_write_in_place_with_stalls, args=(
        state_file.path, new, [len(new) // 2], [0.8]))
    writer.start()
    try:
        time.sleep(0.2)  # the file is half-written now
        watcher = StateFileWatcher(state_file.path, poll_seconds=0.05)
    finally:
        writer.join()
    assert watcher.snapshots.version == 1
    assert _target_ports(watcher) == [8080] * 10


# -- what is read -----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_only_a_regular_file_is_read(state_file: StateFile, caplog: pytest.LogCaptureFixture,
                                     kind: str) -> None:
    """A FIFO would block the open forever, /dev/zero would be read until memory
    runs out: refused at start, and later with one error, the state kept."""
    def replace_with_special() -> None:
        state_file.path.unlink()
        if kind == "fifo":
            os.mkfifo(state_file.path)
        elif kind == "device":
            state_file.path.symlink_to("/dev/zero")
        else:
            state_file.path.mkdir()

    expected = {"fifo": "is a FIFO", "device": "is a character device",
                "directory": "is a directory"}[kind]
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    good = _view(watcher)
    replace_with_special()
    for _ in range(3):
        _poll_returns(watcher)
        clock.advance(SETTLE.seconds)
    assert watcher.snapshots.version == 1 and _view(watcher) == good
    (error,) = _errors(caplog)
    assert error.endswith(f"{state_file.path}: {expected}; the state file must be a regular file")

    with pytest.raises(StateFileError, match=f"{expected}; the state file must be a regular"):
        StateFileWatcher(state_file.path)


def test_a_file_over_the_size_limit_is_refused(state_file: StateFile,
                                               caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock, max_size=4096)
    state_file.write(WEB_TWO)
    limit_size = 4096 - len(state_file.path.read_bytes())
    state_file.write(state_file.path.read_text() + "#" * (limit_size - 1) + "\n")
    assert state_file.path.stat().st_size == 4096  # the limit itself is fine
    state_file.date_back()
    watcher.poll()
    clock.advance(SETTLE.seconds)
    watcher.poll()
    assert watcher.snapshots.version == 2

    state_file.write(state_file.path.read_text() + "#\n")
    for _ in range(3):
        watcher.poll()
        clock.advance(SETTLE.seconds)
    assert watcher.snapshots.version == 2
    (error,) = _errors(caplog)
    assert error.endswith(f"{state_file.path}: 4098 bytes is more than --max-file-size "
                          "(4096 bytes); raise --max-file-size")
    with pytest.raises(StateFileError, match="is more than --max-file-size"):
        StateFileWatcher(state_file.path, max_size=4096)


# -- bad versions -----------------------------------------------------------------

def test_a_bad_version_keeps_the_last_good_state_and_is_reported_once(
        state_file: StateFile, caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    good = _view(watcher)
    text = state_file.path.read_text()

    def save_and_settle(document: dict | str) -> None:
        state_file.write(document)
        state_file.date_back()
        for _ in range(5):
            watcher.poll()
            clock.advance(SETTLE.seconds)

    save_and_settle(text.replace("10.1.0.1", "10.1.0.300"))
    assert watcher.snapshots.version == 1
    assert _view(watcher) == good
    (error,) = _errors(caplog)
    assert f"{state_file.path}:" in error
    assert error.endswith(
        "services[0].endpoints[0].endpoint.ips.v4[0]: '10.1.0.300' is not an IP address")

    save_and_settle(text.replace("10.1.0.1", "10.1.0.301"))  # another bad version
    assert len(_errors(caplog)) == 2
    save_and_settle(WEB_TWO)
    assert watcher.snapshots.version == 2
    assert len(_errors(caplog)) == 2


def test_a_bad_version_that_looks_cut_short_says_how_to_save(
        state_file: StateFile, caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    state_file.write("services:\n- service: {name: web, ports: [{protocol: 1, port: 8",
                     in_place=True)
    state_file.date_back()
    watcher.poll()
    clock.advance(SETTLE.incomplete_seconds)
    watcher.poll()
    (error,) = _errors(caplog)
    assert "not valid YAML" in error
    assert error.endswith("if it was being written, save it atomically instead: write a "
                          f"temporary file in the same directory and rename it over "
                          f"{state_file.path}")


def test_a_missing_file_keeps_the_state_until_it_is_back(
        state_file: StateFile, caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    watcher = _watcher(state_file, clock=clock)
    state_file.path.unlink()
    for _ in range(3):
        watcher.poll()
    (error,) = _errors(caplog)
    assert error.endswith(f"{state_file.path}: cannot read: No such file or directory")
    assert watcher.snapshots.version == 1
    state_file.write(WEB_TWO)
    state_file.date_back()
    watcher.poll()
    clock.advance(SETTLE.seconds)
    watcher.poll()
    assert watcher.snapshots.version == 2


def test_a_file_that_is_unusable_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="cannot read: No such file"):
        StateFileWatcher(tmp_path / "missing.yaml")
    bad = StateFile(tmp_path / "bad.yaml")
    bad.write("services: {\n")
    with pytest.raises(StateFileError, match=r"bad.yaml:\d+: not valid YAML: "):
        StateFileWatcher(bad.path)


# -- stopping -----------------------------------------------------------------------

def test_stop_does_not_wait_for_a_parse_in_progress(
        state_file: StateFile, monkeypatch: pytest.MonkeyPatch) -> None:
    """A big file parses for minutes; a stopping brain must not wait for it,
    and what it parsed is not published after the stop."""
    watcher = _watcher(state_file, poll_seconds=0.05, settle=Settle(0.1, 0.1),
                       clock=time.monotonic)
    parsing, release = threading.Event(), threading.Event()
    real_read = watcher._reader.read

    def slow_read(data: bytes):
        parsing.set()
        release.wait()
        return real_read(data)

    monkeypatch.setattr(watcher._reader, "read", slow_read)
    watcher.start()
    try:
        state_file.write(WEB_TWO)
        state_file.date_back()
        assert parsing.wait(WAIT_SECONDS), "the new version was not parsed"
        stopper = threading.Thread(target=watcher.stop, daemon=True)
        stopper.start()
        stopper.join(WAIT_SECONDS)
        assert not stopper.is_alive(), "stop() waits for the parse"
    finally:
        release.set()
    thread = watcher._thread
    assert thread is not None
    wait_until(lambda: not thread.is_alive(), "the watcher thread's end")
    assert watcher.snapshots.version == 1
