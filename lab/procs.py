"""Processes inside the cluster: servers, clients, the brain and the backend.

A process runs in a network namespace and, for pods, in the pod's cgroup.
It enters the namespace with `nsenter --net`, not `ip netns exec`: the latter
also mounts a fresh /sys, which hides /sys/fs/bpf and the cgroup2 mount that
the eBPF backend works with. It joins the cgroup before it execs, so every socket it creates
belongs to that cgroup (a cgroup sock_addr program sees a socket by the cgroup
it was created in). Long-running processes get a session of their own, so a
Ctrl-C on the terminal reaches only the harness, which then stops them in
order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

# `sh` moves itself into the cgroup, then execs `nsenter`, which execs the
# command: one pid from start to end, inside the cgroup from the start.
_JOIN_CGROUP = 'echo 0 >"$0/cgroup.procs" && exec "$@"'


def kpng_py_command(*args: str) -> list[str]:
    """`kpng-py ARGS` as installed next to this Python (the venv's)."""
    return [str(Path(sys.executable).with_name("kpng-py")), *args]


def in_namespace(netns: str, argv: Sequence[str], cgroup: Path | None = None) -> list[str]:
    command = ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]
    if cgroup is None:
        return command
    return in_cgroup(cgroup, command)


def in_cgroup(cgroup: Path, argv: Sequence[str]) -> list[str]:
    """`argv`, run from its start in `cgroup` (the same pid throughout)."""
    return ["sh", "-c", _JOIN_CGROUP, str(cgroup), *argv]


def sysctl(netns: str, *settings: str) -> None:
    run(in_namespace(netns, ["sysctl", "-q", "-w", *settings]))


class CommandError(Exception):
    """A set-up command failed; the message has the command and its output."""


def run(argv: Sequence[str], timeout: float = 30.0, stdin: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise CommandError(f"`{' '.join(argv)}` did not finish within {timeout} s") from err
    if check and done.returncode != 0:
        raise CommandError(f"`{' '.join(argv)}` exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


@dataclass
class Proc:
    """A long-running process with its output in `log`."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.running():
            os.kill(self.pid, signum)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if it still runs after `timeout` seconds."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(timeout)

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def describe_exit(self) -> str:
        return (f"{self.name} (pid {self.pid}) exited with code {self.popen.returncode}; "
                f"last lines of {self.log}:\n{self.log_tail()}")


def spawn(name: str, argv: Sequence[str], log: Path) -> Proc:
    with open(log, "ab") as out:
        popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(name, popen, log)


def start_ready(argv: Sequence[str], what: str, **popen_args) -> subprocess.Popen[str]:
    """Start a helper that prints "ready" once it serves (a server, an agent);
    RuntimeError, with the helper killed, when it says anything else."""
    proc = subprocess.Popen(list(argv), text=True, stdout=subprocess.PIPE, **popen_args)
    said = proc.stdout.readline() if proc.stdout else ""
    if said.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{what} did not start (said {said!r}, exit code {proc.wait()})")
    return proc


def wait_until(what: str, ready: Callable[[], bool], timeout: float,
               interval: float = 0.05) -> None:
    """Poll `ready()` until it is true; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout} s")
        time.sleep(interval)


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class JsonLog:
    """Follows a process's JSON log lines as the file grows: each record with
    the time.monotonic() at which a poll first saw it, and the `sync applied`
    lines counted."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""
        self.records: list[tuple[float, dict]] = []
        self.syncs = 0

    def poll(self) -> None:
        now = time.monotonic()
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:  # tracebacks, BCC warnings
                continue
            if not isinstance(record, dict):
                continue
            self.records.append((now, record))
            if record.get("msg") == "sync applied":
                self.syncs += 1
