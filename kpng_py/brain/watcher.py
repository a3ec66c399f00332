"""Watches the state file and publishes each good version of it.

Polling (every 0.2 s by default) rather than inotify: it follows a path, so it
works the same whether an editor rewrites the file in place or replaces it
with a new one, and it needs no library. A poll reads the file only when its
stat signature (device, inode, size, mtime, ctime) changed, or while its mtime
is recent, or while a new content is settling: timestamps are coarse, so two
writes close together can leave the signature unchanged.

A writer that saves in place (open, truncate, write) shows every reader a
half-written file for as long as it takes, and it may stall at any point. A
new content is therefore used only once it has settled: read the same for
`Settle.seconds` (1 s) and not modified for as long by its mtime, whichever
is later. A content that looks cut short waits `Settle.incomplete_seconds`
(5 s): one that does not end with a newline (a save cut inside a line:
`targetport: 80` of `8080`), and one that is a proper prefix of the content
in force read from the same file (an in-place rewrite caught before its first
changed byte; the empty file of a fresh truncation). A prefix is also what
deleting the last entries gives, so such an in-place edit is slower to apply,
never refused; a new file renamed over the old one is not an in-place rewrite
and waits only the settle time. No delay makes a stalled in-place save safe;
an atomic save (a temporary file in the same directory renamed over this one)
is: a reader sees the old file or the new. A writer that only ever saves
atomically may lower the settle time (`kpng-py file --settle`).

Only a regular file is read, of at most `max_size` bytes: a FIFO would block
the open, a device could be read forever. Standard input (`-i -`) is read
once, to its end (and at most `max_size` bytes), and served as read. A file that cannot be read or
parsed keeps the last good state in force and is reported once (one error log
line per bad version, not per poll).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from kpng_py.brain.settings import DEFAULT_MAX_FILE_SIZE, STDIN, Settle
from kpng_py.brain.source import StateSnapshots
from kpng_py.brain.statefile import ClusterState, StateFileError, StateReader
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
# Re-read a file whose mtime is younger than this even if its stat looks the
# same: a write within one timestamp tick of the previous one keeps the mtime.
_RECENT_SECONDS = 2.0
# stop() waits this long for a poll in progress, and no longer: a big parse
# must not hold up a stopping brain (the thread is a daemon).
_STOP_WAIT_SECONDS = 1.0
_ATOMIC_SAVE_HINT = ("if it was being written, save it atomically instead: write a temporary "
                     "file in the same directory and rename it over {path}")
_FILE_TYPES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"))


class _Signature(NamedTuple):
    """What stat says of the file; any change means it may have a new content."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


@dataclass(frozen=True)
class _Candidate:
    """A new content, and when this watcher first read it (monotonic)."""

    data: bytes
    since: float


class StateFileWatcher:
    """Loads the file once it has settled (raising StateFileError if it is
    unusable), then, once started, publishes each new good version to
    `snapshots`."""

    def __init__(self, path: Path, poll_seconds: float = POLL_SECONDS,
                 max_size: int = DEFAULT_MAX_FILE_SIZE, settle: Settle = Settle(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._poll_seconds = poll_seconds
        self._max_size = max_size
        self._settle = settle
        self._clock = clock
        self._applied = b""
        # The file (device, inode) the content in force was read from.
        self._applied_file: tuple[int, int] = (0, 0)
        signature, self._applied = self._first_content()
        # What the last look saw of the file (None: the look failed).
        self._seen_signature: _Signature | None = signature
        self._applied_file = signature[:2]
        self._reader = StateReader(str(path))  # re-reads only the services edited
        state = self._reader.read(self._applied)
        self.snapshots = StateSnapshots(state)
        self._candidate: _Candidate | None = None
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
        if self._thread is None:
            return
        self._thread.join(_STOP_WAIT_SECONDS)
        if self._thread.is_alive():
            log.info("not waiting for the state file being parsed",
                     extra=fields(file=str(self.path)))

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
                    and not _modified_within(signature, _RECENT_SECONDS):
                return
            self._seen_signature = signature
            data = self._read()
        except StateFileError as err:
            self._seen_signature = None
            self._candidate = None
            self._report(None, str(err))
            return
        if data == self._applied or (self._reported and self._reported[0] == data):
            self._candidate = None  # in force, or rejected (and reported) already
            if data == self._applied:
                self._reported = None
            return
        if self._candidate is None or self._candidate.data != data:
            self._candidate = _Candidate(data, self._clock())
        if not self._settled(self._candidate, signature):
            return
        self._candidate = None
        self._use(data, signature)

    def _use(self, data: bytes, signature: _Signature) -> None:
        try:
            state = self._reader.read(data)
        except StateFileError as err:
            problem = str(err)
            if self._looks_cut(data, signature):
                problem += "; " + _ATOMIC_SAVE_HINT.format(path=self.path)
            self._report(data, problem)
            return
        if self._stop.is_set():
            return  # stopped while parsing: nobody is served any more
        self._applied, self._applied_file = data, signature[:2]
        self._reported = None
        if self.snapshots.publish(state):
            _log_loaded(self.path, self.snapshots.version, state)

    def _first_content(self) -> tuple[_Signature, bytes]:
        """The file's content at start, once it has settled: a file saved a
        while ago is used at once, one being written as the brain starts is
        waited for as an edited one is."""
        signature, data = self._signature(), self._read()
        if not _modified_within(signature, self._wait_for(data, signature)):
            return signature, data
        log.info("waiting for the state file to settle", extra=fields(file=str(self.path)))
        candidate = _Candidate(data, self._clock())
        while not self._settled(candidate, signature):
            time.sleep(self._poll_seconds)
            signature, data = self._signature(), self._read()
            if data != candidate.data:
                candidate = _Candidate(data, self._clock())
        return signature, data

    def _settled(self, candidate: _Candidate, signature: _Signature) -> bool:
        wait = self._wait_for(candidate.data, signature)
        return self._clock() - candidate.since >= wait \
            and not _modified_within(signature, wait)

    def _wait_for(self, data: bytes, signature: _Signature) -> float:
        return (self._settle.incomplete_seconds if self._looks_cut(data, signature)
                else self._settle.seconds)

    def _looks_cut(self, data: bytes, signature: _Signature) -> bool:
        """Cut inside a line, or a proper prefix of the content in force
        read from the same file (an in-place rewrite)."""
        return not data.endswith(b"\n") or (
            signature[:2] == self._applied_file and data != self._applied
            and self._applied.startswith(data))

    def _signature(self) -> _Signature:
        try:
            st = os.stat(self.path)
        except OSError as err:
            raise StateFileError(f"{self.path}: cannot read: {err.strerror}") from err
        self._check(st)
        return _Signature(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _read(self) -> bytes:
        """The file's bytes. It was checked by stat to be a regular file; it is
        opened without blocking (it may have been replaced by a FIFO since),
        checked again, and read no further than the size limit."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise StateFileError(f"{self.path}: cannot read: {err.strerror}") from err
        try:
            self._check(os.fstat(fd))
            data = _read_at_most(fd, self._max_size + 1)
        except OSError as err:
            raise StateFileError(f"{self.path}: cannot read: {err.strerror}") from err
        finally:
            os.close(fd)
        if len(data) > self._max_size:
            raise _too_big(self.path, f"more than {self._max_size} bytes", self._max_size)
        return data

    def _check(self, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _FILE_TYPES if test(st.st_mode)),
                        "not a regular file")
            raise StateFileError(f"{self.path}: is {kind}; the state file must be a "
                                 "regular file")
        if st.st_size > self._max_size:
            raise _too_big(self.path, f"{st.st_size} bytes", self._max_size)

    def _report(self, data: bytes | None, problem: str) -> None:
        if self._reported == (data, problem):
            return
        self._reported = (data, problem)
        log.error("state file rejected, the last good state stays in force: %s", problem,
                  extra=fields(file=str(self.path)))


def read_standard_input(max_size: int = DEFAULT_MAX_FILE_SIZE, fd: int = 0) -> StateSnapshots:
    """The state read once from standard input (`-i -`), to its end: a
    stream has no edits to follow. StateFileError if it is bigger than
    `max_size` or not a good state."""
    try:
        data = _read_at_most(fd, max_size + 1)
    except OSError as err:
        raise StateFileError(f"{STDIN}: cannot read standard input: {err.strerror}") from err
    if len(data) > max_size:
        raise _too_big(STDIN, f"more than {max_size} bytes", max_size)
    state = StateReader(str(STDIN)).read(data)
    snapshots = StateSnapshots(state)
    _log_loaded(STDIN, snapshots.version, state)
    return snapshots


def _too_big(path: Path, size: str, max_size: int) -> StateFileError:
    return StateFileError(f"{path}: {size} is more than --max-file-size ({max_size} bytes); "
                          "raise --max-file-size")


def _modified_within(signature: _Signature, seconds: float) -> bool:
    """Whether the mtime is less than `seconds` old. An mtime in the future
    (another host's clock) tells nothing: then only what was read counts."""
    age = time.time() - signature.mtime_ns / 1e9
    return 0 <= age < seconds


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def _log_loaded(path: Path, version: int, state: ClusterState) -> None:
    log.info("state file loaded", extra=fields(
        file=str(path), version=version, nodes=len(state.nodes),
        services=len(state.services),
        endpoints=sum(len(s.endpoints) for s in state.services)))
