"""`make demo KEEP=1`: the demo keeps its cluster up, says how to enter the
client pod (and that shell reaches a ClusterIP), and tears down on Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from pathlib import Path
from typing import IO

import pytest

from lab import teardown
from lab.names import RunNames
from tests.support.kernel import require_root_bpf
from tests.support.process import START_SECONDS

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]


def lines_until(out: IO[str], marker: str, seen: list[str]) -> str:
    """Lines of the demo up to the one containing `marker` (which is returned)."""
    for line in out:
        seen.append(line)
        if marker in line:
            return line
    raise AssertionError(f"the demo ended before {marker!r}:\n{''.join(seen)}")


def kill_and_clean_up(demo: subprocess.Popen) -> None:
    demo.kill()
    demo.wait()
    subprocess.run([str(ROOT / "hack" / "demo.sh"), "--down"], capture_output=True)


def test_a_kept_demo_can_be_entered_and_is_torn_down_on_ctrl_c() -> None:
    require_root_bpf()
    # Started with SIGINT ignored, as a non-interactive shell starts a
    # background job (how CI may run the suite): Ctrl-C must still end it.
    # The shell ignores it (an ignored signal stays so across exec): Python
    # code run between fork and exec (preexec_fn) would also run the fork
    # handlers of libraries this test process holds, grpcio's among them.
    demo = subprocess.Popen(["bash", "-c", 'trap "" INT; exec "$0" "$@"',
                             str(ROOT / "hack" / "demo.sh"), "-i", "ipv4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "KEEP": "1"})
    names = RunNames(demo.pid)  # bash and demo.sh exec the demo: same process
    seen: list[str] = []
    try:
        assert demo.stdout is not None
        vip = re.search(r"curl http://([\d.]+)/", lines_until(demo.stdout, "curl http://", seen))
        assert vip, seen
        lines_until(demo.stdout, "== kept up", seen)
        enter = shlex.split(next(demo.stdout))
        assert enter[-1] == "bash", enter
        curl = ["curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
                f"http://{vip.group(1)}/"]
        answer = subprocess.run([*enter, "-c", shlex.join(curl)], capture_output=True,
                                text=True, timeout=30)
        assert answer.stdout == "200", answer
        demo.send_signal(signal.SIGINT)
        try:
            code = demo.wait(timeout=START_SECONDS)
        except subprocess.TimeoutExpired:
            kill_and_clean_up(demo)  # what it printed says which teardown step hangs
            pytest.fail(f"the demo still ran {START_SECONDS} s after Ctrl-C:\n"
                        + "".join(seen) + demo.stdout.read())
        assert code == 0, "".join(seen) + demo.stdout.read()
    finally:
        if demo.poll() is None:
            kill_and_clean_up(demo)
    assert teardown.leftovers(names) == []
