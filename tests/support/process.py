"""kpng-py commands as separate processes, the way users run them: their
stdout lines, their log, their /metrics and their memory."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Callable

from prometheus_client.parser import text_string_to_metric_families

from lab import procs

KPNG_PY = str(Path(sys.executable).with_name("kpng-py"))
WAIT_SECONDS = 10.0  # an upper bound for things that happen well within a second
# An upper bound for a backend's start, which compiles its programs with BCC:
# seconds on an idle machine, several times that on a loaded one.
START_SECONDS = 60.0
# Where a process's /healthz and /metrics go: any free loopback port (the
# port is read from the log), so parallel runs never compete for one.
LOOPBACK_PROBES = ("--healthz-bind-address", "127.0.0.1:0",
                   "--metrics-bind-address", "127.0.0.1:0")
# Backends run without /healthz and /metrics servers: parallel runs would
# compete for their fixed default ports.
NO_PROBES = ("--healthz-bind-address", "", "--metrics-bind-address", "")
_METRICS_ADDRESS = re.compile(r"serving /metrics address=(\S+)")


def wait_until(condition: Callable[[], bool], what: str,
               seconds: float = WAIT_SECONDS) -> None:
    """Wait, checking often, until `condition()` holds; fail the test after
    `seconds`."""
    try:
        procs.wait_until(what, condition, seconds, interval=0.01)
    except TimeoutError as err:
        raise AssertionError(f"timed out waiting for {what}") from err


class Process:
    """A kpng-py command whose stdout lines and log lines a test can wait for."""

    def __init__(self, *args: str, stderr: Path) -> None:
        self._stderr_path = stderr
        self._stderr = stderr.open("w")
        self.popen = subprocess.Popen([KPNG_PY, *args], stdout=subprocess.PIPE,
                                      stderr=self._stderr, text=True)
        self.pid = self.popen.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._metrics_url: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self) -> str:
        line = self._lines.get(timeout=WAIT_SECONDS)
        assert line is not None, f"kpng-py exited early; stderr:\n{self.stderr()}"
        return line

    def stderr(self) -> str:
        return self._stderr_path.read_text()

    def log_lines(self, containing: str) -> list[str]:
        return [line for line in self.stderr().splitlines() if containing in line]

    def wait_for_log(self, containing: str, count: int = 1,
                     seconds: float = WAIT_SECONDS) -> list[str]:
        """Wait until the log has `count` lines containing the text; returns them."""
        def logged() -> bool:
            assert self.popen.poll() is None or len(self.log_lines(containing)) >= count, (
                f"kpng-py exited ({self.popen.returncode}); stderr:\n{self.stderr()}")
            return len(self.log_lines(containing)) >= count

        wait_until(logged, f"{count} log lines with {containing!r}", seconds)
        return self.log_lines(containing)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """The process's /metrics (started with LOOPBACK_PROBES), as
        {(sample name, sorted labels): value}."""
        if self._metrics_url is None:
            (line,) = self.wait_for_log("serving /metrics")[:1]
            address = _METRICS_ADDRESS.search(line)
            assert address, line
            self._metrics_url = f"http://{address.group(1)}/metrics"
        with urllib.request.urlopen(self._metrics_url, timeout=WAIT_SECONDS) as response:
            text = response.read().decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def rss_kib(self) -> int:
        """Resident memory (VmRSS) in KiB."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        rss = re.search(r"^VmRSS:\s+(\d+) kB$", status, re.MULTILINE)
        assert rss, status
        return int(rss.group(1))

    def wait(self) -> int:
        code = self.popen.wait(WAIT_SECONDS)
        self._stderr.close()
        return code

    def terminate(self) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.wait()

    def kill(self) -> None:
        """SIGKILL (a crash: no clean-up of any kind runs)."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._stderr.close()


class Processes:
    """Starts kpng-py commands, each logging to its own file in `log_dir`;
    whatever still runs on exit is killed."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._started: list[Process] = []

    def start(self, *args: str) -> Process:
        process = Process(*args, stderr=self._log_dir / f"stderr-{len(self._started)}.log")
        self._started.append(process)
        return process

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self._started:
            process.kill()
