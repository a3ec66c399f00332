"""Watches the state file and publishes each good version of it.

Polling (every 0.2 s by default) rather than inotify: it follows a path, so it
works the same whether an editor rewrites the file in place or replaces it
with a new one, and it needs no library. A poll reads the file only when its
stat signature (device, inode, size, mtime, ctime) changed, or while its mtime
is recent: timestamps are coarse, so two writes close together can leave the
signature unchanged.

A new content is parsed once it reads the same on two polls in a row, so a
save caught half-written is not served. A file that cannot be read or parsed
keeps the last good state in force and is reported once (one error log line
per bad version, not per poll).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

from kpng_py.brain.source import StateSnapshots
from kpng_py.brain.statefile import ClusterState, StateFileError, parse_state
from kpng_py.logs import fields

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
# Re-read a file whose mtime is younger than this even if its stat looks the
# same: a write within one timestamp tick of the previous one keeps the mtime.
_RECENT_SECONDS = 2.0


class _Signature(NamedTuple):
    """What stat says of the file; any change means it may have a new content."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


class StateFileWatcher:
    """Loads the file (raising StateFileError if it is unusable), then, once
    started, publishes each new good version to `snapshots`."""

    def __init__(self, path: Path, poll_seconds: float = POLL_SECONDS) -> None:
        self.path = path
        self._poll_seconds = poll_seconds
        signature = self._signature()
        self._applied = self._read()
        state = parse_state(self._applied, str(path))
        self.snapshots = StateSnapshots(state)
        self._seen_signature: _Signature | None = signature
        self._candidate: bytes | None = None  # new content, waiting to read the same twice
        # The problem last logged, and the content it was about (None: unreadable).
        self._reported: tuple[bytes | None, str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        _log_loaded(path, self.snapshots.version, state)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="state-file-watcher",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> StateFileWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            try:
                self.poll()
            except Exception:  # a bug must not stop the brain from following the file
                log.exception("watching the state file failed; trying again",
                              extra=fields(file=str(self.path)))

    def poll(self) -> None:
        """One look at the file (the watcher thread calls this)."""
        try:
            signature = self._signature()
            if signature == self._seen_signature and self._candidate is None \
                    and time.time() - signature.mtime_ns / 1e9 > _RECENT_SECONDS:
                return
            self._seen_signature = signature
            data = self._read()
        except StateFileError as err:
            self._seen_signature = None
            self._report(None, str(err))
            return
        if data == self._applied:
            self._candidate = None
            self._reported = None
            return
        if data != self._candidate:
            self._candidate = data  # wait one poll: it may be half-written
            return
        self._candidate = None
        try:
            state = parse_state(data, str(self.path))
        except StateFileError as err:
            self._report(data, str(err))
            return
        self._applied = data
        self._reported = None
        if self.snapshots.publish(state):
            _log_loaded(self.path, self.snapshots.version, state)

    def _signature(self) -> _Signature:
        try:
            st = os.stat(self.path)
        except OSError as err:
            raise StateFileError(f"{self.path}: cannot read: {err.strerror}") from err
        return _Signature(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as err:
            raise StateFileError(f"{self.path}: cannot read: {err.strerror}") from err

    def _report(self, data: bytes | None, problem: str) -> None:
        if self._reported == (data, problem):
            return
        self._reported = (data, problem)
        log.error("state file rejected, the last good state stays in force: %s", problem,
                  extra=fields(file=str(self.path)))


def _log_loaded(path: Path, version: int, state: ClusterState) -> None:
    log.info("state file loaded", extra=fields(
        file=str(path), version=version, nodes=len(state.nodes),
        services=len(state.services),
        endpoints=sum(len(s.endpoints) for s in state.services)))
