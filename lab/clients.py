"""Clients run inside pods: curl, dig, and probe.py where no tool fits.

Each call returns what was seen (which pods answered, how many attempts
failed and how), so a check can compare it with what it expects and say
exactly what differed.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from lab.cluster import IPAddress, Pod
from lab.procs import CommandError, run
from lab.servers import WHOAMI_NAME

PROBE = str(Path(__file__).with_name("probe.py"))
CONNECT_TIMEOUT = 2.0


def host_literal(ip: IPAddress | str) -> str:
    """An address as it goes in a URL: `10.96.0.10`, `[fd00:10:96::a]`."""
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else str(ip)


@dataclass(frozen=True)
class HttpAnswer:
    pod: str
    port: int
    server_ip: IPAddress


@dataclass
class Sample:
    """Answers of `attempts` tries; `errors` are the distinct error texts."""

    attempts: int
    pods: Counter[str] = field(default_factory=Counter)
    answers: list[HttpAnswer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return self.attempts - sum(self.pods.values())

    def describe(self) -> str:
        got = ", ".join(f"{pod} x{n}" for pod, n in sorted(self.pods.items())) or "no answer"
        text = f"{self.attempts} attempts: {got}"
        if self.failures:
            text += f"; {self.failures} failed ({'; '.join(sorted(set(self.errors)))[:300]})"
        return text


def http(client: Pod, ip: IPAddress | str, port: int, attempts: int = 1,
         parallel: bool = True) -> Sample:
    """`attempts` GETs, each on a new connection (curl), at once or one by one."""
    url = f"http://{host_literal(ip)}:{port}/"
    done = _run_in(client, [
        "curl", "--silent", "--show-error", "--no-progress-meter", "--globoff",
        *(["--parallel", "--parallel-max", "32"] if parallel else []),
        "--connect-timeout", str(CONNECT_TIMEOUT), "--max-time", str(CONNECT_TIMEOUT + 1),
        "--header", "Connection: close",  # no reuse: every attempt is a new connection
        *([url] * attempts)])
    sample = Sample(attempts)
    for line in done.stdout.splitlines():
        pod, server_port, server_ip = line.split()
        sample.pods[pod] += 1
        sample.answers.append(HttpAnswer(pod, int(server_port), ipaddress.ip_address(server_ip)))
    sample.errors = [_curl_error(line) for line in done.stderr.splitlines() if line.strip()]
    return sample


def _curl_error(line: str) -> str:
    # "curl: (7) Failed to connect to 10.96.0.1 port 80 after 0 ms: Couldn't connect..."
    return line.split(": ", 2)[-1] if line.startswith("curl:") else line


def dns(client: Pod, ip: IPAddress | str, port: int = 53, tcp: bool = False,
        attempts: int = 1) -> Sample:
    """`attempts` TXT queries for the answering pod's name (dig, one socket each)."""
    queries = [arg for _ in range(attempts) for arg in (WHOAMI_NAME, "TXT")]
    done = _run_in(client, [
        "dig", f"@{ip}", "-p", str(port), "+short", "+tries=1", f"+timeout={int(CONNECT_TIMEOUT)}",
        *(["+tcp"] if tcp else []), *queries])
    sample = Sample(attempts)
    for line in done.stdout.splitlines():
        if line.startswith('"'):
            sample.pods[line.strip('"')] += 1
        elif line.startswith(";;"):
            sample.errors.append(line.lstrip("; "))
    return sample


def probe(client: Pod, *args: str) -> dict:
    """One probe.py run; its JSON answer."""
    done = _run_in(client, [sys.executable, PROBE, *args])
    try:
        return json.loads(done.stdout.splitlines()[-1])
    except (IndexError, ValueError) as err:
        raise CommandError(f"probe.py {' '.join(args)} printed no answer: "
                           f"{done.stderr.strip()[-500:]}") from err


@dataclass(frozen=True)
class PeerAnswer:
    """One exchange with lab/peer_server.py (probe.py ask)."""

    pod: str
    seen_as: IPAddress  # the client's address as the pod saw it
    peer: tuple[str, int] | None  # getpeername() (TCP, connected UDP)
    source: tuple[str, int] | None  # recvfrom() (unconnected UDP)


@dataclass
class PeerSample:
    """What `attempts` new sockets saw; `errors` are their errnos."""

    attempts: int
    answers: list[PeerAnswer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # of each failed attempt

    @property
    def pods(self) -> Counter[str]:
        return Counter(a.pod for a in self.answers)

    @property
    def failures(self) -> int:
        return self.attempts - len(self.answers)

    def describe(self) -> str:
        got = ", ".join(f"{pod} x{n}" for pod, n in sorted(self.pods.items())) or "no answer"
        seen = sorted({str(a.seen_as) for a in self.answers})
        text = f"{self.attempts} attempts: {got}" + (f" (client seen as {', '.join(seen)})"
                                                     if seen else "")
        if self.errors:
            errors = Counter(self.errors)
            text += (f"; {len(self.errors)} failed ("
                     + ", ".join(f"{e} x{n}" for e, n in sorted(errors.items()))
                     + f", after {max(self.seconds):.1f} s at most)")
        not_made = self.attempts - len(self.answers) - len(self.errors)
        if not_made:
            text += f"; {not_made} not made after that failure"
        return text


def ask(client: Pod, ip: IPAddress | str, port: int, attempts: int = 1, udp: bool = False,
        connected: bool = False, source: IPAddress | None = None,
        timeout: float = CONNECT_TIMEOUT, until_failure: bool = False) -> PeerSample:
    """`attempts` new sockets from `client` each ask the whoami server behind
    ip:port once (probe.py ask); with `until_failure`, none after the
    first that failed (the sample counts the attempts not made as failed)."""
    args = ["ask", str(ip), str(port), "--count", str(attempts), "--timeout", str(timeout),
            *(["--until-failure"] if until_failure else []),
            *(["--udp"] if udp else []), *(["--connected"] if connected else []),
            *(["--source", str(source)] if source is not None else [])]
    sample = PeerSample(attempts)
    for answer in probe(client, *args)["answers"]:
        if not answer["ok"]:
            sample.errors.append(answer["errno"])
            sample.seconds.append(answer["seconds"])
            continue
        sample.answers.append(PeerAnswer(
            answer["pod"], ipaddress.ip_address(answer["seen_as"][0]),
            tuple(answer["peer"]) if "peer" in answer else None,
            tuple(answer["source"]) if "source" in answer else None))
    return sample


def _run_in(client: Pod, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return run(client.command(argv), timeout=60, check=False)


class StreamingProbe:
    """A probe.py that runs until stopped, its JSON lines collected as they come."""

    def __init__(self, client: Pod, *args: str) -> None:
        self._popen = subprocess.Popen(client.command([sys.executable, PROBE, *args]),
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       start_new_session=True)
        self._lock = threading.Lock()
        self._lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._popen.stdout is not None
        for line in self._popen.stdout:
            with self._lock:
                self._lines.append(json.loads(line))

    def lines(self) -> list[dict]:
        with self._lock:
            return list(self._lines)

    def stop(self) -> list[dict]:
        """Close its stdin (it finishes its current round), return every line."""
        assert self._popen.stdin is not None
        try:
            self._popen.stdin.close()
            self._popen.wait(10)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        self._reader.join(5)
        return self.lines()

    def crash(self) -> str:
        """Why the probe ended on its own (empty while it runs or ended well)."""
        code = self._popen.poll()
        if not code:
            return ""
        assert self._popen.stderr is not None
        return f"probe.py exited {code}: {self._popen.stderr.read().strip()[-300:]}"
