"""Network namespaces of the tests' own: uniquely named (names.unique_name),
loopback up, no route out, removed on exit, also when the test fails."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from typing import Iterator, Sequence

from lab.names import unique_name


def run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kwargs)


class NetNS:
    """A named network namespace (`ip netns`), loopback up, no route out."""

    def __init__(self, name: str) -> None:
        self.name = name

    def create(self) -> NetNS:
        run(["ip", "netns", "add", self.name])
        self.ip("link", "set", "lo", "up")
        return self

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "pids", self.name], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def exec_args(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def run(self, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
        return run(self.exec_args(*cmd), **kwargs)

    def ip(self, *args: str) -> subprocess.CompletedProcess:
        return run(["ip", "-n", self.name, *args])


@contextmanager
def netns(prefix: str = "kpt") -> Iterator[NetNS]:
    ns = NetNS(unique_name(prefix)).create()
    try:
        yield ns
    finally:
        ns.delete()
